"""Run folders on a node: `<base>/<run id>/`, who is using them, and removing what crashed runs left in them.

A run's local sandboxes on a node live in `<base>/<run id>/` (base: `$RAYGRPO_SANDBOX_ROOT` of the process, else
`/tmp/raygrpo-sandboxes`). Every process that starts sandboxes there (an env pool actor; the driver on its own node)
marks the folder as in use with `.user-<pid>.json` (its `owner_record`, its mtime refreshed by the process's heartbeat
thread) for as long as it uses the folder (`RunFolder`); leaving removes the mark, then the folder when nothing else
is in it, so clean runs leave no empty folders behind.

`reap_base` is what a node does for crashed runs (a killed driver, a lost actor, a lost node that came back): in every
run folder under the base it reaps the orphaned sandboxes (`raygrpo.sandbox.orphans.reap_orphans`: owner dead or
silent), kills processes still marked with a sandbox of that folder whose directory is gone, drops the marks of
users that are gone, and removes the folder once it is empty. A live run is never touched: its sandboxes' owners are
alive and beating, and its folder keeps the marks of its live users, so it is never empty.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from raygrpo.sandbox.orphans import reap_orphans
from raygrpo.sandbox.os_probe import DEFAULT_ROOT, ROOT_ENV, process_env_marks
from raygrpo.sandbox.owners import (
    CLAIM_PREFIX,
    HOSTNAME,
    is_run_folder,
    keep_beating,
    owner_alive,
    owner_record,
    read_json,
    stop_beating,
)

logger = logging.getLogger(__name__)

#: A user's mark in a run folder: this prefix, its pid, `.json`.
USER_PREFIX = ".user-"
#: A mark whose owner is on another host (a shared file system) is stale once its mtime is older than this.
STALE_AFTER_S = 30.0


def base_root(root: str | os.PathLike | None = None) -> Path:
    """The folder that holds a node's run folders: `root`, else `$RAYGRPO_SANDBOX_ROOT`, else the default."""
    return Path(root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


class RunFolder:
    """This process's use of `<base>/<run id>/`: `enter()` creates it (if need be) and marks it; `leave()` drops the
    mark and removes the folder when it is then empty.

    Args:
        base: The base folder (see `base_root`).
        run_id: The run.
    """

    def __init__(self, base: str | os.PathLike | None, run_id: str) -> None:
        self.path = base_root(base) / run_id
        self.mark = self.path / f"{USER_PREFIX}{os.getpid()}.json"

    def enter(self) -> Path:
        """Create the folder and this process's mark (retried when a reaper removed the empty folder meanwhile);
        returns the folder."""
        data = json.dumps(owner_record())
        for _ in range(10):
            self.path.mkdir(parents=True, exist_ok=True)
            try:
                self.mark.write_text(data)
            except FileNotFoundError:
                continue  # emptied and removed by a reaper between the two steps: make it again
            keep_beating(self.mark)
            return self.path
        raise OSError(f"cannot mark run folder {self.path}: it keeps vanishing")

    def leave(self) -> bool:
        """Drop this process's mark and remove the folder if nothing else is in it; returns whether it was removed."""
        stop_beating(self.mark)
        self.mark.unlink(missing_ok=True)
        return remove_if_empty(self.path)


def remove_if_empty(path: Path) -> bool:
    """Remove a directory that is empty (an atomic `rmdir`: a folder something was just put into stays)."""
    try:
        path.rmdir()
    except OSError:
        return False
    return True


def _user_gone(mark: Path, stale_after_s: float) -> bool:
    owner = read_json(mark)
    if owner is None:
        try:  # being written, or its writer died mid-write: judge by age
            return time.time() - mark.stat().st_mtime > stale_after_s
        except OSError:
            return False
    if not owner_alive(owner):
        return True
    if owner.get("hostname") == HOSTNAME:
        return False
    try:
        return time.time() - mark.stat().st_mtime > stale_after_s
    except OSError:
        return False


def live_users(folder: Path, stale_after_s: float = STALE_AFTER_S) -> list[Path]:
    """The marks of the processes still using a run folder."""
    with contextlib.suppress(OSError):
        return [p for p in folder.glob(f"{USER_PREFIX}*.json") if not _user_gone(p, stale_after_s)]
    return []


@dataclass
class BaseReap:
    """What `reap_base` removed under one base folder.

    Args:
        base: The base folder.
        sandboxes: `<run id>/<sandbox id>` of every orphaned sandbox reaped (processes killed, directory removed).
        processes: Pids killed that carried the marks of a sandbox whose directory was already gone.
        marks: Marks of gone users removed, as `<run id>/<mark>`.
        folders: Run folders removed, empty once their orphans were reaped.
        live_runs: Run folders left alone because a live process still uses them or a live sandbox is in them.
    """

    base: str
    sandboxes: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    marks: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    live_runs: list[str] = field(default_factory=list)

    @property
    def removed_anything(self) -> bool:
        return bool(self.sandboxes or self.processes or self.folders)

    def lines(self) -> list[str]:
        """A line per thing removed (what `raygrpo reap` prints)."""
        out = [f"removed sandbox {s} under {self.base} (its owner is gone)" for s in self.sandboxes]
        out += [f"killed process {p} of a sandbox whose folder was gone" for p in self.processes]
        out += [f"removed run folder {self.base}/{f}" for f in self.folders]
        return out

    def to_dict(self) -> dict:
        return {"base": self.base, "sandboxes": self.sandboxes, "processes": self.processes, "marks": self.marks,
                "folders": self.folders, "live_runs": self.live_runs}


def _stray_processes(folder: Path, marks: dict[int, tuple[str | None, str | None]]) -> list[int]:
    """Pids among `marks` (`process_env_marks()`) marked with a sandbox of `folder` whose sandbox directory (or a
    reaper's claim of it) is gone."""
    root = str(folder)
    out = []
    for pid, (sroot, sid) in marks.items():
        if sroot != root or not sid or (folder / sid).exists():
            continue
        if any(folder.glob(f"{CLAIM_PREFIX}{sid}.*")):
            continue  # being reaped right now
        out.append(pid)
    return out


def reap_base(root: str | os.PathLike | None = None, stale_after_s: float = 10.0,
              only_run: str | None = None) -> BaseReap:
    """Reap what crashed runs left under a base folder (see the module docstring): orphaned sandboxes of every run
    folder (and any directly under the base), processes of sandboxes whose folder is gone in runs nobody uses any
    more, marks of gone users, and run folders left empty.

    Args:
        root: The base folder (see `base_root`).
        stale_after_s: A sandbox whose heartbeat is older than this is orphaned even when its owner pid looks alive.
        only_run: Look at this run's folder only.

    Safe to run from several processes at once, and while other runs use the base.
    """
    base = base_root(root)
    report = BaseReap(str(base))
    if not base.is_dir():
        return report
    if only_run is None:
        report.sandboxes += reap_orphans(base, stale_after_s)  # sandboxes made straight under the base
        folders = [Path(e.path) for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
    else:
        folders = [base / only_run]
    marks: dict[int, tuple[str | None, str | None]] | None = None  # every process's sandbox marks, read once
    for folder in sorted(f for f in folders if is_run_folder(f) and f.is_dir()):
        run = folder.name
        report.sandboxes += [f"{run}/{sid}" for sid in reap_orphans(folder, stale_after_s)]
        users = list(folder.glob(f"{USER_PREFIX}*.json"))
        gone = [m for m in users if _user_gone(m, STALE_AFTER_S)]
        if len(gone) == len(users):  # nobody uses this run here any more
            if marks is None:
                marks = process_env_marks()
            for pid in _stray_processes(folder, marks):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    report.processes.append(pid)
        for mark in gone:
            mark.unlink(missing_ok=True)
            report.marks.append(f"{run}/{mark.name}")
        if remove_if_empty(folder):
            report.folders.append(run)
        else:
            report.live_runs.append(run)
    for line in report.lines():
        logger.warning("%s", line)
    return report
