"""Owner labels, heartbeats and the orphan reaper, with real owner processes killed by signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raygrpo.sandbox.orphans import reap_orphans
from raygrpo.sandbox.os_probe import sandbox_mounts, sandbox_processes
from raygrpo.sandbox.owners import HEARTBEAT_INTERVAL_S, live_sandboxes
from tests.sandbox_utils import (
    assert_no_leaks,
    make_env,
    make_task,
    mounts_mentioning,
    pid_namespace,
    pids_in_namespace,
    processes_mentioning,
    spawn_owner,
    wait_until,
)


@pytest.fixture
def sroot(tmp_path: Path) -> Path:
    root = tmp_path / "sandboxes"
    yield root
    assert_no_leaks(root)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


@pytest.mark.timeout(90)
def test_sigkilled_owner_takes_its_sandboxes_down_and_the_reaper_removes_them(tmp_path: Path, sroot: Path):
    task = make_task(tmp_path)
    owner, started = spawn_owner(task, tmp_path / "trials", sroot, count=2)
    try:
        namespaces = [pid_namespace(s["init"]) for s in started]
        assert all(len(pids_in_namespace(ns)) >= 3 for ns in namespaces)  # init, sleep infinity, the sleeps
        infos = {s.sandbox_id: s for s in live_sandboxes(sroot)}
        assert set(infos) == {s["id"] for s in started}
        assert all(i.owner["pid"] == owner.pid and i.owner_alive and i.pids for i in infos.values())
        assert all(i.owner["owner_id"] == "owner-2" for i in infos.values())
        assert reap_orphans(sroot) == []  # a live owner's sandboxes are not orphans
        assert sandbox_mounts(sroot)  # they are mounted (in their own mount namespaces)

        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        t0 = time.monotonic()
        # --die-with-parent: every process of both sandboxes dies with the owner, setsid'd ones included.
        assert wait_until(lambda: all(pids_in_namespace(ns) == [] for ns in namespaces), timeout=5)
        died_s = time.monotonic() - t0
        assert wait_until(lambda: not processes_mentioning(str(sroot)), timeout=5)
        assert all(Path(s["dir"]).exists() for s in started)  # the directories remain until reaped
        assert all(not i.owner_alive for i in live_sandboxes(sroot))
        reaped = reap_orphans(sroot)
        reap_s = time.monotonic() - t0
        assert sorted(reaped) == sorted(s["id"] for s in started)
        assert not any(Path(s["dir"]).exists() for s in started)
        assert live_sandboxes(sroot) == [] and sandbox_mounts(sroot) == [] and sandbox_processes(sroot) == []
        assert mounts_mentioning(str(sroot)) == []
        print(f"owner SIGKILL: sandbox processes gone after {died_s:.2f} s, reaped after {reap_s:.2f} s")
    finally:
        _kill(owner)


@pytest.mark.timeout(90)
def test_stale_heartbeat_of_a_frozen_owner_is_reaped(tmp_path: Path, sroot: Path):
    owner, started = spawn_owner(make_task(tmp_path), tmp_path / "trials", sroot, count=1)
    try:
        ns = pid_namespace(started[0]["init"])
        (info,) = live_sandboxes(sroot)
        assert info.heartbeat_age_s is not None and info.heartbeat_age_s < HEARTBEAT_INTERVAL_S + 1
        os.kill(owner.pid, signal.SIGSTOP)  # alive but frozen: its heartbeat stops
        stale_after = HEARTBEAT_INTERVAL_S + 1.0
        assert reap_orphans(sroot, stale_after_s=stale_after) == []
        time.sleep(stale_after + 0.5)
        assert reap_orphans(sroot, stale_after_s=stale_after) == [started[0]["id"]]
        assert pids_in_namespace(ns) == []
        assert not Path(started[0]["dir"]).exists()
    finally:
        os.kill(owner.pid, signal.SIGCONT)
        _kill(owner)


@pytest.mark.timeout(60)
async def test_heartbeat_is_refreshed_and_own_sandboxes_are_never_reaped(tmp_path: Path, sroot: Path):
    env, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot, kwargs={"owner_id": "me"})
    await env.start(force_build=False)
    try:
        hb = env.host_dir / "heartbeat"
        first = hb.stat().st_mtime
        assert wait_until(lambda: hb.stat().st_mtime > first, timeout=HEARTBEAT_INTERVAL_S * 2 + 1)
        assert reap_orphans(sroot, stale_after_s=0.0) == []  # ours, and we are alive
        (info,) = live_sandboxes(sroot)
        assert info.owner["pid"] == os.getpid() and info.owner["owner_id"] == "me"
        assert info.init_pid == env.init_pid and env.init_pid in info.pids
    finally:
        await env.stop(delete=True)


REAPER = """
import json, sys
from raygrpo.sandbox.orphans import reap_orphans
sys.stdin.readline()  # start together
print(json.dumps(reap_orphans({root!r})), flush=True)
"""


@pytest.mark.timeout(120)
def test_concurrent_reapers_reap_each_orphan_once(tmp_path: Path, sroot: Path):
    owner, started = spawn_owner(make_task(tmp_path), tmp_path / "trials", sroot, count=6)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(timeout=10)
    reapers = [
        subprocess.Popen(
            [sys.executable, "-c", REAPER.format(root=str(sroot))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        time.sleep(0.5)  # let them import
        for r in reapers:
            r.stdin.write("go\n")
            r.stdin.flush()
        import json

        results = [json.loads(r.stdout.readline()) for r in reapers]
    finally:
        for r in reapers:
            _kill(r)
    reaped = [sid for result in results for sid in result]
    assert sorted(reaped) == sorted(s["id"] for s in started), results  # each exactly once
    assert list(sroot.iterdir()) == []
