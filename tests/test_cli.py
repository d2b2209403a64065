"""The `raygrpo` command as a user runs it: exit codes, Ctrl-C, and secrets that must not leak.

Each test runs the CLI in a subprocess with its own local Ray, against an ORS server in the test process whose own
session registry is the leak check.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e_support import NapEnvironment
from tests.ors_utils import SecretEnvironment, ors_server, wait_until

SUPPORT = str(Path(__file__).with_name("e2e_support.py"))
FAKE_SECRET = "sk-fake-raygrpo-7f3a9c1e"


def _write_config(path: Path, body: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(body))
    return path


def _cli(args: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "raygrpo.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})}, start_new_session=True, **kwargs,
    )


@pytest.mark.timeout(60)
def test_bad_config_key_exits_2_naming_the_field(tmp_path):
    proc = _cli(["rollout", "examples/echo/rollout.yaml", "--out", str(tmp_path), "--set", "rollout.max_turnz=3"])
    out, err = proc.communicate(timeout=50)
    assert proc.returncode == 2
    assert "rollout.max_turnz" in err and "Extra inputs are not permitted" in err


def _ray_sessions() -> set[str]:
    root = Path(tempfile.gettempdir()) / "ray"
    return {p.name for p in root.glob("session_2*")} if root.is_dir() else set()


@pytest.mark.parametrize("case, field, cause", [
    ("missing file", "envs.echo.environment", "does not exist"),
    ("missing class", "envs.echo.environment", "has no attribute 'Nope'"),
    ("not an Environment", "envs.echo.environment", "is not an openreward.environments.Environment subclass"),
    ("missing policy function", "policy.script", "has no attribute 'nope'"),
    ("missing task folder", "envs.tasks.path", "does not exist"),
])
@pytest.mark.timeout(90)
def test_what_a_config_names_is_resolved_before_ray_starts(tmp_path, case, field, cause):
    """Exit 2 with one line that names the field, and no Ray session was started for it."""
    echo = Path("examples/echo").resolve()
    overrides = {
        "missing file": ["envs.echo.environment=no_such_env.py:EchoEnvironment"],
        "missing class": [f"envs.echo.environment={echo}/env.py:Nope"],
        "not an Environment": [f"envs.echo.environment={echo}/env.py:TRAIN_TARGETS"],
        "missing policy function": [f"policy.script={echo}/policies.py:nope"],
        "missing task folder": ["envs.tasks.kind=harbor", f"envs.tasks.path={tmp_path}/no-such-suite"],
    }[case]
    before = _ray_sessions()
    started = time.monotonic()
    proc = _cli(["rollout", "examples/echo/rollout.yaml", "--out", str(tmp_path / "out"),
                 *[a for o in overrides for a in ("--set", o)]])
    out, err = proc.communicate(timeout=80)
    elapsed = time.monotonic() - started
    print(f"\n{case}: exit {proc.returncode} in {elapsed:.1f} s: {err.strip()}")
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"raygrpo: {field}: ") and cause in lines[0], err
    assert _ray_sessions() == before  # no Ray session directory was created
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(300)
def test_ctrl_c_keeps_finished_trajectories_and_closes_every_session(tmp_path):
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        config = _write_config(tmp_path / "nap.yaml", {
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 12}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:nap_by_task"},
            "rollout": {"group_size": 1},
            "workers": {"num_env_actors": 1, "max_concurrent_per_actor": 12},
            "ray": {"num_cpus": 2},
        })
        out = tmp_path / "run"
        proc = _cli(["rollout", str(config), "--out", str(out), "--no-progress"])
        try:
            # Tasks 0-3 finish quickly; the others nap for a minute. Interrupt once the quick ones are written.
            lines = lambda: (out / "trajectories.jsonl").read_text().count("\n") if (out / "trajectories.jsonl").exists() else 0  # noqa: E731
            ready = wait_until(lambda: (lines() >= 4 and NapEnvironment.napping == 8) or proc.poll() is not None, 150)
            if not ready or proc.poll() is not None:
                os.killpg(proc.pid, signal.SIGKILL)
                _, err = proc.communicate(timeout=30)
                pytest.fail(f"run not in the expected state: {lines()} lines, {NapEnvironment.napping} naps; {err[-3000:]}")
            os.killpg(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130, err
        assert wait_until(lambda: server.live_sessions() == 0, 15), server.live_sessions()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert summary["completed"] == 4 and summary["requested"] == 12
    assert summary["status_counts"] == {"ok": 4, "cancelled": 8}
    assert summary["leaked_envs"] == 0
    assert NapEnvironment.live == 0


@pytest.mark.timeout(180)
def test_exported_secret_reaches_the_environment_and_nowhere_else(tmp_path, request):
    SecretEnvironment.received.clear()
    # Ray's own temp dir (its session logs), short enough for the Unix socket paths inside it.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rg-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    with ors_server(SecretEnvironment) as server:
        config = _write_config(tmp_path / "secret.yaml", {
            "envs": {"vault": {"kind": "ors", "url": server.url, "secrets": {"probe_token": "RAYGRPO_TEST_SECRET"}}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:call_check"},
            "rollout": {"group_size": 2},
            "workers": {"num_env_actors": 1},
            "ray": {"num_cpus": 2},
        })
        out = tmp_path / "run"
        proc = _cli(["-v", "rollout", str(config), "--out", str(out), "--no-progress"],
                    env={"RAYGRPO_TEST_SECRET": FAKE_SECRET, "RAY_TMPDIR": str(ray_tmp)})
        stdout, stderr = proc.communicate(timeout=150)
        assert proc.returncode == 0, stderr
    assert json.loads((out / "summary.json").read_text())["reward_mean"] == 1.0
    assert SecretEnvironment.received and all(r.get("probe_token") == FAKE_SECRET for r in SecretEnvironment.received)
    assert FAKE_SECRET not in stdout and FAKE_SECRET not in stderr
    searched = 0
    for root in (out, ray_tmp):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                searched += 1
                assert FAKE_SECRET.encode() not in path.read_bytes(), path
    assert searched > 5  # the run dir and Ray's session logs were really there
