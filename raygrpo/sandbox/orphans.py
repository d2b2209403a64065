"""Reaping orphaned sandboxes: local ones whose owner process died or stopped beating (see
`raygrpo.sandbox.owners`), and docker ones whose owner died (see `raygrpo.docker.owners`).

A sandbox is an *orphan* when its owner process is gone (same host and boot: the pid is dead or now belongs to
another process) or its heartbeat is older than `stale_after_s`. `reap_orphans` kills an orphan's processes (its
PID-namespace init; the kernel then kills everything else in the namespace) and removes its directory. Several
processes may reap at once: a reaper first claims a sandbox by renaming its directory (atomic), so each orphan is
reaped exactly once. An owner makes and removes its sandbox's directory under such a claim too (`Registration`), so a
directory under a sandbox's own name always has its `owner.json`, and a claim whose process is gone is taken over.
`OrphanReaper` runs both kinds of reaping periodically from a thread: the driver runs one over
its run's sandboxes, every env pool actor one over its node's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

from raygrpo.docker.engine import DockerUnavailable, may_have_docker
from raygrpo.docker.owners import reap_docker_orphans
from raygrpo.sandbox.os_probe import DEFAULT_ROOT, ROOT_ENV, pid_alive
from raygrpo.sandbox.owners import (
    CLAIM_PREFIX,
    HOSTNAME,
    STOPPED_MARK,
    claim_path,
    heartbeat_age,
    is_run_folder,
    kill_sandbox_processes,
    live_sandboxes,
    owner_alive,
    read_json,
    remove_tree,
    sandbox_root,
)

logger = logging.getLogger(__name__)


def _is_orphan(d: Path, stale_after_s: float) -> bool:
    if (d / STOPPED_MARK).exists():
        return False
    owner = read_json(d / "owner.json")
    age = heartbeat_age(d)
    if owner is None:
        # Being created, or its owner died while creating it: judge by the directory's age.
        try:
            age = time.time() - d.stat().st_mtime
        except OSError:
            return False
        return age > stale_after_s
    if owner.get("pid") == os.getpid() and owner.get("hostname") == HOSTNAME:
        return False  # ours, and we are alive
    if not owner_alive(owner):
        return True
    return age is None or age > stale_after_s


def reap_orphans(root: str | os.PathLike | None = None, stale_after_s: float = 10.0) -> list[str]:
    """Kill and remove every orphaned sandbox under `root`; return the ids reaped by this call.

    Args:
        root: the sandboxes' root (default `$RAYGRPO_SANDBOX_ROOT` or `/tmp/raygrpo-sandboxes`).
        stale_after_s: a heartbeat older than this marks the sandbox orphaned even when its owner pid looks alive
            (a frozen owner, or one on another host sharing the root). Keep it well above the 2 s heartbeat.

    Safe to call concurrently from several processes: each orphan is claimed by an atomic rename first.
    """
    base = sandbox_root(root)
    reaped: list[str] = []
    for entry in list(os.scandir(base)):
        name = entry.name
        d = Path(entry.path)
        if not entry.is_dir(follow_symlinks=False):
            continue
        if name.startswith(CLAIM_PREFIX):
            # A claim left by a reaper that died mid-reap: take it over when that reaper is gone.
            sid, _, claimer = name[len(CLAIM_PREFIX) :].rpartition(".")
            if claimer.isdigit() and pid_alive(int(claimer)):
                continue
        elif name.startswith(".") or is_run_folder(d):
            continue  # a run's folder under the base holds sandboxes; it is not one (`raygrpo.sandbox.run_folders`)
        else:
            sid = name
            if not _is_orphan(d, stale_after_s):
                continue
        claim = claim_path(base, sid)
        try:
            os.rename(d, claim)
        except (FileNotFoundError, OSError):
            continue  # another reaper (or the owner's stop) got there first
        owner = read_json(claim / "owner.json") or {}
        logger.warning(
            "reaping orphaned sandbox %s (owner pid %s on %s, owner id %s, heartbeat %s s old)",
            sid,
            owner.get("pid"),
            owner.get("hostname"),
            owner.get("owner_id"),
            None if (age := heartbeat_age(claim)) is None else round(age, 1),
        )
        kill_sandbox_processes(claim, sid, base)
        remove_tree(claim)
        reaped.append(sid)
    return reaped


class OrphanReaper:
    """Runs `reap_orphans(root)` and, where this machine may have a Docker engine, `reap_docker_orphans()` every
    `interval_s` from a daemon thread, until `close()`.

    The driver runs one over its run's sandbox root, and every env pool actor one over its node's (sandbox dirs and
    docker engines are node-local, so each node needs a reaper of its own). A thread, not an asyncio task: a busy
    event loop must not delay reaping, and reaping blocks on the file system and on docker.

    Args:
        root: The sandboxes' root to watch (None: `$RAYGRPO_SANDBOX_ROOT` or the default, read at each pass).
        interval_s: Seconds between passes.
    """

    def __init__(self, root: str | os.PathLike | None = None, interval_s: float = 5.0) -> None:
        self.root = root
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="raygrpo-reaper", daemon=True)
        self._thread.start()

    def _loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.reap()

    def reap(self) -> list[str]:
        """One pass now, over the local sandboxes under the root and the docker sandboxes of this host; returns the
        ids (compose projects for docker) reaped, logged as a warning. Never raises."""
        reaped: list[str] = []
        path = Path(self.root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
        if path.is_dir():
            try:
                reaped += reap_orphans(path)
            except Exception:  # noqa: BLE001 - the reaper must keep going
                logger.warning("reaping orphaned sandboxes under %s failed", path, exc_info=True)
        if may_have_docker():
            try:
                reaped += reap_docker_orphans()
            except DockerUnavailable as exc:
                logger.debug("no docker sandboxes reaped: %s", exc)
            except Exception:  # noqa: BLE001 - the reaper must keep going
                logger.warning("reaping orphaned docker sandboxes failed", exc_info=True)
        if reaped:
            logger.warning("reaped %d orphaned sandbox(es): %s", len(reaped), ", ".join(reaped))
        return reaped

    def close(self) -> int:
        """Stop the thread, reap once more, and return how many local sandboxes under the root are still alive
        (removing the root when none is)."""
        self._stop.set()
        self._thread.join(timeout=30)
        self.reap()
        path = Path(self.root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
        if not path.is_dir():
            return 0
        left = len(live_sandboxes(path))
        if left == 0 and self.root is not None:
            with contextlib.suppress(OSError):
                path.rmdir()
        return left
