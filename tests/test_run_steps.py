"""Which parts of a Dockerfile's `RUN` steps the local sandbox runs (`raygrpo.sandbox.run_steps`), on the forms task
Dockerfiles use; and a sandbox whose `RUN` fails starts anyway, saying so once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from raygrpo.sandbox.run_steps import plan_run, split_commands
from tests.sandbox_utils import make_env, make_task

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("args, runs, skipped", [
    ("apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*", "", 3),
    ("pip install --no-cache-dir pytest==8.4.1 && mkdir -p /app/data", "mkdir -p /app/data", 1),
    ("DEBIAN_FRONTEND=noninteractive apt-get install -y jq; echo ok > /app/ok", "echo ok > /app/ok", 1),
    ("curl -LsSf https://astral.sh/uv/install.sh | sh", "", 1),
    ("--mount=type=cache,target=/root/.cache python3 -m pip install numpy", "", 1),
    ("useradd -m agent && chown -R agent /app", "chown -R agent /app", 1),
    ('for v in v1 v2; do echo "<h1>$v</h1>" > /srv/$v.html; done', 'for v in v1 v2; do echo "<h1>$v</h1>" > /srv/$v.html; done', 0),
    ("printf 'a;b && c\\n' > /app/x && ln -s /app/x /app/y", "printf 'a;b && c\\n' > /app/x && ln -s /app/x /app/y", 0),
    ('["/bin/sh", "-c", "echo hi > /app/hi"]', "/bin/sh -c 'echo hi > /app/hi'", 0),
])
def test_installs_are_taken_out_and_the_rest_runs(args, runs, skipped):
    step = plan_run(3, args, "/app", {"A": "1"})
    assert (step.command, len(step.skipped), step.workdir, step.env) == (runs, skipped, "/app", {"A": "1"})


def test_split_commands_respects_quotes_and_groups():
    assert split_commands("a && 'b && c'; (d; e) && f\ng") == ["a", "'b && c'", "(d; e)", "f", "g"]


async def test_a_failing_run_is_reported_once_and_the_sandbox_starts(tmp_path: Path, caplog):
    caplog.set_level(logging.WARNING, logger="raygrpo.sandbox.dockerfile")
    task = make_task(tmp_path, dockerfile=(
        "FROM debian:bookworm-slim\nWORKDIR /app\nRUN mkdir -p data && echo 7 > data/n\n"
        "RUN ln -s /app/data /usr/share/data-link\nRUN cat data/n > data/copy\n"))
    (tmp_path / "sb").mkdir()
    for attempt in range(2):
        env = make_env(task, tmp_path / f"trials{attempt}", tmp_path / "sb")[0]
        await env.start(force_build=False)
        try:
            assert (await env.exec("cat data/n data/copy")).stdout == "7\n7\n"
        finally:
            await env.stop(delete=True)
    failures = [r.getMessage() for r in caplog.records if "RUN failed" in r.getMessage()]
    assert len(failures) == 1 and ":4: RUN failed in the local sandbox (exit 1)" in failures[0]
    assert "Read-only file system" in failures[0]
