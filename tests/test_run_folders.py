"""Run folders under a node's sandbox root: what crashed runs left is reaped, a live run is never touched, a run's
leftovers are counted on the node where they are (`raygrpo.sandbox.run_folders`, `raygrpo.sandbox.node_reap`).

The sandboxes here are directories with owner labels and processes carrying a sandbox's marks, owned by real
processes of the test (alive, or killed): what the reaper judges is the OS's view of them, not a real bubblewrap
sandbox (those are `tests/test_sandbox_reaper.py` and `tests/test_local_crash_reap.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raygrpo.sandbox.node_reap import reap_node, run_leftovers_here
from raygrpo.sandbox.os_probe import ID_ENV, ROOT_ENV, pid_alive, proc_start_time
from raygrpo.sandbox.orphans import reap_orphans
from raygrpo.sandbox.owners import Registration, owner_record
from raygrpo.sandbox.run_folders import RunFolder, live_users, reap_base

pytestmark = pytest.mark.timeout(60)

DEAD_RUN = "run-0123456789ab"
LIVE_RUN = "run-ba9876543210"


def _sleeper(**env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, **env})


def _dead_owner() -> dict:
    """An owner record of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    record = {**owner_record(), "pid": proc.pid, "pid_start": proc_start_time(proc.pid) or 1.0}
    proc.wait(10)
    return record


def _sandbox(folder: Path, sid: str, owner: dict) -> Path:
    d = folder / sid
    d.mkdir(parents=True)
    (d / "owner.json").write_text(json.dumps(owner))
    (d / "heartbeat").touch()
    return d


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(10)


def test_a_crashed_runs_folder_is_reaped_and_a_live_run_is_untouched(tmp_path, procs):
    base = tmp_path / "sandboxes"
    dead = base / DEAD_RUN
    dead_owner = _dead_owner()
    _sandbox(dead, "t0-aaaaaaaa", dead_owner)
    _sandbox(dead, "t1-bbbbbbbb", dead_owner)
    (dead / f".user-{dead_owner['pid']}.json").write_text(json.dumps(dead_owner))
    # A process of a sandbox whose directory is already gone (its reaper died half-way).
    procs.append(stray := _sleeper(**{ROOT_ENV: str(dead), ID_ENV: "t2-cccccccc"}))
    # The live run: this process uses the folder and owns a sandbox in it (beating), whose process runs.
    live = RunFolder(base, LIVE_RUN)
    live.enter()
    reg = Registration(base / LIVE_RUN, "t0-dddddddd")
    reg.create()
    procs.append(live_proc := _sleeper(**{ROOT_ENV: str(base / LIVE_RUN), ID_ENV: "t0-dddddddd"}))
    empty_old = base / "run-00000000000f"  # an empty folder of an old run
    empty_old.mkdir()
    time.sleep(0.5)  # let the sleepers exec (their environment is read from /proc)

    report = reap_base(base)
    assert sorted(report.sandboxes) == [f"{DEAD_RUN}/t0-aaaaaaaa", f"{DEAD_RUN}/t1-bbbbbbbb"]
    assert report.processes == [stray.pid] and stray.wait(10) == -9
    assert sorted(report.folders) == sorted([DEAD_RUN, empty_old.name]) and not dead.exists() and not empty_old.exists()
    assert report.live_runs == [LIVE_RUN]
    assert reg.dir.is_dir() and live_proc.poll() is None and live_users(base / LIVE_RUN) == [live.mark]
    assert any(f"removed run folder {base}/{DEAD_RUN}" == line for line in report.lines())

    reg.release()
    assert live.leave() and not (base / LIVE_RUN).exists()  # the run's end removes its emptied folder
    assert reap_node(base).local.removed_anything is False


KILLED_MIDWAY = r"""
import os, signal, sys
from pathlib import Path
from raygrpo.sandbox import owners

folder, stage = Path(sys.argv[1]), sys.argv[2]
reg = owners.Registration(folder, "t0-aaaaaaaa")


def killed(path, *_):
    # The SIGKILL lands here: while the label is being written, or after the removal took the label (as
    # `shutil.rmtree` may, in whatever order the directory lists) and before the rest of the tree went.
    if stage == "removing":
        (path / "owner.json").unlink()
    os.kill(os.getpid(), signal.SIGKILL)


if stage == "creating":
    owners._write_json = killed
    reg.create()
else:
    reg.create()
    (reg.dir / "fs").mkdir()
    (reg.dir / "fs" / "data.txt").write_text("x" * 4096)
    owners.remove_tree = killed
    reg.release()
"""


@pytest.mark.parametrize("stage", ["creating", "removing"])
def test_an_owner_killed_while_making_or_removing_its_sandbox_leaves_nothing_the_next_reap_keeps(tmp_path, stage):
    # CI (stop 52): a run's driver was killed while an actor removed a finished sandbox; the directory lost its
    # owner.json before the rest, so the next run's start-up reap took it for one being created and kept it.
    base = tmp_path / "sandboxes"
    folder = base / DEAD_RUN
    folder.mkdir(parents=True)
    owner = subprocess.run([sys.executable, "-c", KILLED_MIDWAY, str(folder), stage], timeout=30,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert owner.returncode == -9
    assert list(folder.iterdir()) != []  # the kill left something behind
    report = reap_base(base, stale_after_s=60.0)  # as an env pool actor's start-up reap does
    assert report.sandboxes == [f"{DEAD_RUN}/t0-aaaaaaaa"], report
    assert report.folders == [DEAD_RUN] and not base.joinpath(DEAD_RUN).exists()


def test_a_dead_users_mark_alone_does_not_spare_a_folder_but_a_live_one_does(tmp_path, procs):
    base = tmp_path / "sandboxes"
    folder = base / DEAD_RUN
    folder.mkdir(parents=True)
    owner = _dead_owner()
    (folder / f".user-{owner['pid']}.json").write_text(json.dumps(owner))
    procs.append(stray := _sleeper(**{ROOT_ENV: str(folder), ID_ENV: "gone-00000000"}))
    mine = RunFolder(base, DEAD_RUN)
    mine.enter()  # a live user: strays of its run are not touched (its sandbox may be starting)
    time.sleep(0.5)
    report = reap_base(base)
    assert report.processes == [] and stray.poll() is None and report.live_runs == [DEAD_RUN]
    assert report.marks == [f"{DEAD_RUN}/.user-{owner['pid']}.json"]
    assert mine.leave() and not folder.exists()


def test_the_orphan_reaper_never_takes_a_run_folder_for_a_sandbox(tmp_path):
    base = tmp_path / "sandboxes"
    folder = base / LIVE_RUN
    folder.mkdir(parents=True)
    old = time.time() - 3600
    os.utime(folder, (old, old))  # an old directory without owner.json looks like a sandbox that never started
    assert reap_orphans(base) == [] and folder.is_dir()


def test_a_runs_leftovers_are_counted_on_their_node_after_its_orphans_are_reaped(tmp_path):
    base = tmp_path / "sandboxes"
    folder = base / DEAD_RUN
    _sandbox(folder, "t0-aaaaaaaa", _dead_owner())
    planted = Registration(folder, "planted-eeeeeeee")  # left behind on purpose: its owner (this test) lives
    planted.create()
    try:
        found = run_leftovers_here(DEAD_RUN, base)
        assert found.reaped == [f"{DEAD_RUN}/t0-aaaaaaaa"]
        assert found.sandboxes == ["planted-eeeeeeee"] and found.count == 1 and found.node
        assert found.folder_removed is False
    finally:
        planted.release()
    found = run_leftovers_here(DEAD_RUN, base)
    assert found.count == 0 and found.folder_removed and not folder.exists()
    assert pid_alive(os.getpid())


def test_a_live_owner_stays_alive_when_the_wall_clock_is_stepped(tmp_path, monkeypatch):
    """A clock step (NTP on a fresh VM) moves the kernel's boot time, and with it every epoch start time; seen in
    CI as a live owner's sandbox reaped. The start time an owner record holds is counted from boot instead."""
    import psutil._pslinux as pslinux

    reg = Registration(tmp_path, "stepped")
    reg.create()
    try:
        owner = json.loads((reg.dir / "owner.json").read_text())
        stepped = pslinux.boot_time() + 1.0
        monkeypatch.setattr(pslinux, "boot_time", lambda: stepped)
        assert pid_alive(owner["pid"], owner["pid_start"])
        assert reap_orphans(tmp_path) == [] and reg.dir.exists()
    finally:
        reg.release()
