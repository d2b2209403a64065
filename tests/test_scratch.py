"""Scratch folders: a killed process's trial dirs and spares do not stay in the temp dir, a live one's are never
touched, a process that exits removes its own, and so does an env pool actor's shutdown before its kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raygrpo.core import scratch
from raygrpo.sandbox.os_probe import pid_alive
from tests.sandbox_utils import wait_until

pytestmark = pytest.mark.timeout(120)

# A process that makes a trial dir (a file in it) and a spare through `TrialDir`, as an env pool actor does, prints
# its scratch folder, then waits for a line on stdin before exiting normally.
_OWNER = textwrap.dedent("""
    import asyncio, sys
    from raygrpo.envs.harbor.trial import TrialDir
    from raygrpo.core.scratch import process_scratch

    async def main():
        live = TrialDir.make("task")
        (live.paths.verifier_dir / "reward.txt").write_text("1.0")
        spare = TrialDir.make("task")
        await spare.remove()

    asyncio.run(main())
    print(process_scratch(), flush=True)
    sys.stdin.readline()
""")


def _owner(tmp: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-c", _OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    folder = Path(proc.stdout.readline().strip())
    assert folder.parent == tmp and folder.name.startswith(scratch.PREFIX), folder
    contents = sorted(p.name.rsplit("-", 1)[0] for p in folder.iterdir())
    assert contents == [".owner", "raygrpo-harbor-spare", "raygrpo-harbor-task"], contents
    return proc, folder


def test_a_killed_owners_folder_is_swept_and_a_live_ones_is_not(tmp_path):
    killed, killed_folder = _owner(tmp_path)
    live, live_folder = _owner(tmp_path)
    try:
        assert scratch.sweep_orphans(tmp_path) == []
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert killed_folder.is_dir()  # no exit handler ran

        assert scratch.sweep_orphans(tmp_path) == [killed_folder]
        assert not killed_folder.exists()
        assert (live_folder / ".owner").is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == [live_folder.name]

        live.stdin.write("\n")
        live.stdin.flush()
        assert live.wait(timeout=30) == 0
        assert list(tmp_path.iterdir()) == []  # removed by its owner at exit
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_making_its_own_folder_sweeps_what_killed_processes_left(tmp_path):
    code = ("import os; from raygrpo.core.scratch import process_scratch; print(process_scratch(), flush=True); "
            "os.kill(os.getpid(), 9)")
    env = {**os.environ, "TMPDIR": str(tmp_path)}

    def run(source: str) -> Path:
        return Path(subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env,
                                   timeout=60).stdout.strip())

    first = run(code)
    assert first.is_dir()  # killed: no exit handler ran
    second = run(code)
    assert second.is_dir() and not first.exists()  # the second swept the first when it made its own
    run(code.replace("os.kill(os.getpid(), 9)", ""))
    assert list(tmp_path.iterdir()) == []  # the third swept the second, and removed its own at exit


def test_a_folder_being_made_is_left_alone_until_it_is_old(tmp_path):
    making = tmp_path / f"{scratch._MAKING}abc"
    making.mkdir()
    assert scratch.sweep_orphans(tmp_path) == []
    old = time.time() - scratch.MAKING_GRACE_S - 1
    os.utime(making, (old, old))
    assert scratch.sweep_orphans(tmp_path) == [making]
    assert not making.exists()
    other = tmp_path / "raygrpo-unrelated"
    other.mkdir()
    assert scratch.sweep_orphans(tmp_path) == [] and other.is_dir()


def test_a_forked_child_makes_its_own_folder_and_leaves_its_parents(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "_folder", None)
    monkeypatch.setattr(scratch, "_owner_fd", None)
    monkeypatch.setattr(scratch, "_owner_pid", None)
    parent = scratch.process_scratch()
    try:
        pid = os.fork()
        if pid == 0:  # the child: its exit handler's work, then a folder of its own
            try:
                scratch.remove_process_scratch()
                child = scratch.process_scratch()
                ok = parent.is_dir() and child != parent and child.is_dir()
                scratch.remove_process_scratch()
                os._exit(0 if ok and not child.exists() else 1)
            finally:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert parent.is_dir() and (parent / ".owner").is_file()
        assert scratch.sweep_orphans(tmp_path) == []  # still held by this process
    finally:
        scratch.remove_process_scratch()
    assert list(tmp_path.iterdir()) == []


def _env_pool_actor():
    from raygrpo.actors.env_pool import EnvPoolActor
    from raygrpo.config import load_config
    from raygrpo.driver.resolve import resolve_run
    from raygrpo.agent.worker import WorkerSettings

    suite = Path(__file__).resolve().parent.parent / "examples" / "harbor_local" / "tasks"
    cfg = load_config(data={"envs": {"suite": {"kind": "harbor", "path": str(suite), "indices": [0]}},
                            "policy": {"kind": "noop"}})
    settings = WorkerSettings(name="scratch", envs=dict(cfg.envs), policy=cfg.policy, model=cfg.model,
                              sampling=cfg.sampling, rollout=cfg.rollout, max_concurrent_per_actor=1)
    return EnvPoolActor.options(num_cpus=0).remote(settings), resolve_run(cfg).tasks_by_env["suite"][0]


def _scratch_after_a_rollout(actor, task) -> Path:
    import ray

    traj = ray.get(actor.run.remote(task), timeout=120)
    assert traj.status == "ok", traj.error
    folder = Path(ray.get(actor.__ray_call__.remote(lambda self: str(scratch._folder)), timeout=30))
    assert folder.is_dir() and (folder / scratch.OWNER_FILE).is_file()
    return folder


@pytest.mark.ray
def test_an_env_pool_actor_removes_its_folder_when_shut_down_and_a_killed_ones_is_swept(ray_local):
    import ray

    actor, task = _env_pool_actor()
    try:
        folder = _scratch_after_a_rollout(actor, task)
        ray.get(actor.shutdown.remote(), timeout=60)
        assert not folder.exists()  # before the kill, which runs no exit handler
    finally:
        ray.kill(actor)

    actor, task = _env_pool_actor()
    pid = ray.get(actor.pid.remote(), timeout=60)
    folder = _scratch_after_a_rollout(actor, task)
    ray.kill(actor)
    wait_until(lambda: not pid_alive(pid), 30, 0.1)
    assert folder.is_dir()  # killed without its shutdown: left
    assert folder in scratch.sweep_orphans(folder.parent)
    assert not folder.exists()


# A process that moves its temp dir into its scratch folder (as an env pool actor does), then makes a folder the way
# Harbor's docker environment keeps its compose files (`TemporaryDirectory()` in the default temp dir), prints both,
# and waits to be killed.
_TEMP_USER = textwrap.dedent("""
    import os, sys, tempfile
    from raygrpo.core.scratch import process_scratch, use_as_tempdir

    use_as_tempdir()
    compose = tempfile.TemporaryDirectory()
    open(os.path.join(compose.name, "docker-compose-mounts.json"), "w").write("{}")
    print(process_scratch(), compose.name, os.environ["TMPDIR"], flush=True)
    sys.stdin.readline()
""")


def test_a_killed_actors_temp_folders_go_with_its_scratch_folder(tmp_path):
    """Harbor's compose temp folders of an env pool actor killed mid-run are removed by the next process's sweep:
    the actor's temp dir is inside its scratch folder, not the shared temp dir."""
    proc = subprocess.Popen([sys.executable, "-c", _TEMP_USER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        folder, compose, tmpdir = (Path(p) for p in proc.stdout.readline().split())
        assert folder.parent == tmp_path and folder in compose.parents and folder in tmpdir.parents
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert compose.is_dir()  # no exit handler ran
        assert scratch.sweep_orphans(tmp_path) == [folder]
        assert list(tmp_path.iterdir()) == []
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_the_temp_dir_comes_back_when_the_scratch_folder_goes(tmp_path, monkeypatch):
    """`use_as_tempdir` moves `tempfile`'s temp dir and `$TMPDIR` into the scratch folder; removing the folder (an
    actor's shutdown) puts both back, so nothing later makes files in a folder that is gone."""
    code = textwrap.dedent("""
        import os, tempfile
        from raygrpo.core.scratch import remove_process_scratch, use_as_tempdir
        before = tempfile.gettempdir()
        tmp = use_as_tempdir()
        assert tempfile.gettempdir() == str(tmp) and os.environ["TMPDIR"] == str(tmp)
        assert tempfile.mkdtemp().startswith(str(tmp))
        remove_process_scratch()
        assert not tmp.exists() and tempfile.gettempdir() == before and os.environ["TMPDIR"] == before, before
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.stdout.strip() == "ok", out.stderr
    assert list(tmp_path.iterdir()) == []


def test_node_wide_locks_stay_in_the_shared_temp_dir_when_the_process_moves_its_own(tmp_path):
    """An env pool actor's temp dir is its private scratch folder (`use_as_tempdir`); the docker build locks must stay
    where every process of the node looks, or two actors build one image at once (and leave one of the two images
    dangling)."""
    code = textwrap.dedent("""
        import tempfile
        from raygrpo.core.scratch import shared_tempdir, use_as_tempdir
        before = tempfile.gettempdir()
        tmp = use_as_tempdir()
        from raygrpo.envs.harbor.docker import build_lock_path  # imported after the move, as in an actor
        assert tempfile.gettempdir() == str(tmp) and str(shared_tempdir()) == before, (shared_tempdir(), before)
        path = build_lock_path("hb__x")
        assert path.parent.parent == shared_tempdir() and str(tmp) not in str(path), path
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.stdout.strip().endswith("ok"), out.stderr[-2000:]
