"""`raygrpo reap` on the local backend: what a `kill -9`'d run left in its sandbox folders is removed, and a
concurrent run under the same sandbox root is never touched and completes.

Each run is a real `raygrpo rollout` process (its own local Ray) on the example Harbor suite with a policy whose
commands sleep, so both runs hold sandboxes for a while. The verdicts come from the file system and the OS.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from raygrpo.sandbox.os_probe import pid_alive, sandbox_processes
from raygrpo.sandbox.owners import read_json
from tests.ors_utils import wait_until
from tests.test_lease_crash import Run, wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.ray]

REPO = Path(__file__).resolve().parent.parent

SLOW = '''
from raygrpo.agent.toolcalls import format_tool_call


def slow(ctx):
    """Two sleeping bash calls, then stop."""
    done = sum(1 for m in ctx.messages if m.get("role") == "tool")
    return format_tool_call("bash", {"command": "sleep 3"}) if done < 2 else "Done."
'''
SETS = ["policy.kind=scripted", "policy.script=slow.py:slow", "workers.num_env_actors=1",
        "workers.max_concurrent_per_actor=4", "ray.num_cpus=2"]


def _sandboxes(folder: Path) -> list[Path]:
    return [d for d in folder.iterdir() if (d / "owner.json").exists()] if folder.is_dir() else []


def _run_folders(base: Path) -> set[Path]:
    return {d for d in base.iterdir() if d.name.startswith("run-")} if base.is_dir() else set()


def test_reap_removes_a_killed_runs_sandboxes_and_a_concurrent_run_completes(tmp_path):
    base = tmp_path / "sandboxes"
    folders = {}
    for name in ("A", "B"):
        folders[name] = Path(shutil.copytree(REPO / "examples" / "harbor_local", tmp_path / name))
        (folders[name] / "slow.py").write_text(SLOW)
    env = {"RAYGRPO_SANDBOX_ROOT": str(base), "PYTHONPATH": str(REPO)}  # this checkout's raygrpo, whatever is installed
    sets = tuple(arg for s in SETS for arg in ("--set", s))
    survivor = Run(folders["A"], tmp_path / "leases", env, sets)
    victim = None
    try:
        (a_folder,) = wait_for("the survivor's run folder", lambda: _run_folders(base), 150, survivor)
        wait_for("the survivor's sandboxes", lambda: _sandboxes(a_folder), 150, survivor)
        victim = Run(folders["B"], tmp_path / "leases", env, sets)
        (b_folder,) = wait_for("the victim's run folder", lambda: _run_folders(base) - {a_folder}, 150, victim)
        victims = wait_for("the victim's sandboxes", lambda: _sandboxes(b_folder), 150, victim)
        owners = {(o["pid"], o["pid_start"]) for d in victims if (o := read_json(d / "owner.json"))}
        os.kill(victim.proc.pid, signal.SIGKILL)  # the driver alone, as a crash would
        victim.proc.wait(30)
        # Its actors go with its Ray, and their sandboxes with them; the folders stay.
        assert wait_until(lambda: not any(pid_alive(p, s) for p, s in owners), 60), owners
        assert _sandboxes(b_folder)

        done = subprocess.run([sys.executable, "-m", "raygrpo.cli", "reap", "--sandbox-root", str(base),
                               "--lease-dir", str(tmp_path / "no-leases")], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert survivor.proc.poll() is None, "the survivor finished before the reap: make its run longer"
        assert not b_folder.exists() and sandbox_processes(b_folder) == []
        assert f"removed run folder {base}/{b_folder.name}" in done.stdout, done.stdout
        removed = [line for line in done.stdout.splitlines() if line.startswith(f"{socket.gethostname()}: removed sandbox")]
        assert removed and all(b_folder.name in line for line in removed), done.stdout
        assert a_folder.is_dir() and "1 live run(s) untouched" in done.stdout, done.stdout
        print(done.stdout)

        assert survivor.proc.wait(200) == 0, survivor.output()
    finally:
        for run in (survivor, victim):
            if run is not None:
                run.stop()
    summary = json.loads((folders["A"] / "out" / "summary.json").read_text())
    assert summary["status_counts"] == {"ok": 18} and summary["leaked_envs"] == 0
    assert list(base.iterdir()) == []  # the survivor's folder went at its end

