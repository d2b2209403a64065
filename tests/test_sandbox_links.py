"""What a model plants in its sandbox does not reach the host: the host never writes or reads through a link the
sandbox made (the tests' upload, log collection, downloads), and the local sandbox sees none of the host's secrets,
other sandboxes, or the task's own tests and solution, though they lie in the host trees it sees read-only."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from tests.harbor_utils import bash_script, make_task, tool_texts
from tests.sandbox_utils import assert_no_leaks, make_env
from tests.sandbox_utils import make_task as make_sandbox_task
from tests.test_harbor_adapter import nothing_left, renderer, rollout, root, spec_for  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sroot(tmp_path: Path) -> Path:
    root = tmp_path / "sandboxes"
    yield root
    assert_no_leaks(root)


async def test_a_planted_tests_link_is_replaced_not_written_through(renderer, root, tmp_path):
    """The model links `/tests/test.sh` to a script of its own at a path it knows on the host too: the verifier's
    upload replaces the link (the host file stays as it was) and the task's real test runs: its 0.0, not 1.0."""
    host_file = tmp_path / "fake.sh"
    host_file.write_text("host file, not the sandbox's\n")
    make_task(tmp_path / "suite", "t")
    plant = (f"mkdir -p {tmp_path} && printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > {host_file}"
             f" && chmod +x {host_file} && mkdir -p /tests && ln -sf {host_file} /tests/test.sh && ls -l /tests")
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script(plant))
    assert "test.sh ->" in tool_texts(traj)[0]
    assert host_file.read_text() == "host file, not the sandbox's\n"
    assert traj.reward == 0.0, traj.verifier
    await nothing_left(root)


async def test_links_planted_in_logs_are_not_read_on_the_host(renderer, root, tmp_path, monkeypatch):
    """Links in `/logs` to the process's environment and to a host file: the kept logs (a failed rollout's) hold
    neither the env pool's secrets nor the file's content."""
    monkeypatch.setenv("RAYGRPO_TEST_PROVIDER_KEY", "sk-secret-of-the-env-pool")
    secret = tmp_path / "host-only.txt"
    secret.write_text("HOST-ONLY-CONTENT\n")
    make_task(tmp_path / "suite", "t")
    plant = (f"ln -s /proc/self/environ /logs/agent/env.txt; ln -s {secret} /logs/agent/file.txt;"
             f" ln -s {tmp_path} /logs/agent/dir; ln -sf /proc/self/environ /logs/verifier/notes.txt; ls /logs/agent")
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script(plant))
    assert traj.reward == 0.0 and "logs" in traj.verifier, traj.verifier
    blob = json.dumps(traj.verifier)
    assert "sk-secret-of-the-env-pool" not in blob and "HOST-ONLY-CONTENT" not in blob
    assert not any(key.startswith("agent/") for key in traj.verifier["logs"]), list(traj.verifier["logs"])
    await nothing_left(root)


async def test_transfers_never_follow_a_link_of_the_sandbox(tmp_path, sroot):
    """Uploads, downloads and Harbor's `empty_dirs` on paths where the sandbox put links (to a host folder it does
    not see): the host folder is neither written, read, nor emptied."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("host file\n")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "new.txt").write_text("uploaded\n")
    (src / "keep.txt").write_text("uploaded\n")
    env, _, _ = make_env(make_sandbox_task(tmp_path), tmp_path / "trials", sroot)
    await env.start(force_build=False)
    try:
        r = await env.exec(f"mkdir -p /app/dl && ln -s {outside} /app/sub && ln -s {outside}/keep.txt /app/keep.txt"
                           f" && ln -s {outside} /app/dl/link && ln -s {outside}/keep.txt /app/dl/file"
                           f" && echo real > /app/dl/real.txt && ln -s {outside} /app/gone")
        assert r.return_code == 0, r.stderr
        await env.upload_dir(src, "/app")
        await env.upload_file(src / "keep.txt", "/app/keep.txt")
        assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
        assert (outside / "keep.txt").read_text() == "host file\n"
        r = await env.exec("cat /app/keep.txt")
        assert r.stdout == "uploaded\n", r.stdout  # the link replaced

        await env.download_dir("/app/dl", tmp_path / "dl")
        assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["real.txt"]
        await env.download_file("/app/dl/file", tmp_path / "one.txt")
        assert (tmp_path / "one.txt").read_bytes() == b""  # as the sandbox sees it: the link leads nowhere there
    except FileNotFoundError:
        pass  # the sandbox cannot read it either: also never the host file
    finally:
        try:
            assert not (tmp_path / "one.txt").exists() or b"host file" not in (tmp_path / "one.txt").read_bytes()
            if env.is_running():
                await env.empty_dirs(["/app/gone"], chmod=True)
                assert (outside / "keep.txt").read_text() == "host file\n" and oct(outside.stat().st_mode)[-3:] != "777"
        finally:
            await env.stop(delete=True)


async def test_the_host_s_secrets_and_the_sandbox_root_are_hidden(tmp_path):
    """Under a tree the sandbox sees (`/srv`): the sandbox root, the task's folder (tests, solution) and another
    sandbox's files are not visible; `/etc/shadow` reads empty while `/etc/passwd` and `/etc/ssl` stay; the sandbox
    root's host path is in no environment inside."""
    if not os.access("/srv", os.W_OK):
        pytest.skip("needs a writable /srv")
    base = Path("/srv") / f"raygrpo-test-{uuid.uuid4().hex[:8]}"
    sroot, tasks = base / "sandboxes", base / "tasks"
    try:
        task = make_sandbox_task(tasks, task_toml_env='network_mode = "no-network"\n')
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text("echo THE-ORACLE\n")
        a, _, _ = make_env(task, tmp_path / "trials", sroot)
        b, _, _ = make_env(task, tmp_path / "trials", sroot)
        await a.start(force_build=False)
        await b.start(force_build=False)
        try:
            await b.exec("echo 42 > /app/answer.txt")
            r = await a.exec(
                f"ls -A {sroot} {tasks}; cat {task}/solution/solve.sh {task}/tests/test.sh"
                f" {sroot}/{b.sandbox_id}/fs/app/answer.txt; echo shadow=$(wc -c < /etc/shadow);"
                " head -c 4 /etc/passwd; echo; ls /etc/ssl | head -1")
            out = r.stdout + r.stderr
            assert "THE-ORACLE" not in out and "42" not in out.splitlines() and "reward.txt" not in out, out
            assert "shadow=0" in out and "root" in out and "certs" in out, out
            r = await a.exec("env; cat /proc/[0-9]*/environ | tr '\\0' '\\n'")
            assert "RAYGRPO_SANDBOX_ID" in r.stdout and str(sroot) not in r.stdout + (r.stderr or ""), r.stdout
        finally:
            await a.stop()
            await b.stop()
        assert_no_leaks(sroot)
    finally:
        shutil.rmtree(base, ignore_errors=True)
