"""A process's own scratch folder under the temp dir, which outlives no owner for long.

Host folders that a process makes for its own short-lived work (Harbor trial dirs and their spare skeletons) go into
one folder per process, `<tmp>/raygrpo-proc-<pid>-<random>/`, removed when the process exits. A process that is
killed (`ray.kill` of an env pool actor, SIGKILL, a node's OOM killer) runs no exit handler, so its folder would stay
in the temp dir for good; the next process that makes its own folder there removes every folder whose owner is gone.

Whether the owner is gone is the kernel's word, not a pid's: the owner holds an exclusive `flock` on the folder's
`.owner` file for as long as it lives (the kernel drops it when the process dies), and a folder is removed only by a
process that gets that lock. A reused pid, a process in another PID namespace sharing the temp dir, or a folder
seen between its creation and its lock cannot be mistaken for an orphan: a folder is created under a hidden name,
locked, then renamed into place.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "raygrpo-proc-"
#: Names a folder carries while it is being made (before its lock is held) and while an orphan is being removed.
_MAKING = ".raygrpo-proc-making-"
_REMOVING = ".raygrpo-proc-removing-"
OWNER_FILE = ".owner"
#: A folder still under its making name after this long was left by a process killed while making it.
MAKING_GRACE_S = 60.0

_lock = threading.Lock()
#: The temp dir scratch folders are made in: the one of the first use, kept when `use_as_tempdir` moves the temp dir
#: into the folder (a forked child makes its own beside its parent's, not inside it).
_parent: Path | None = None
#: What `use_as_tempdir` replaced (`tempfile.tempdir`, `$TMPDIR`), restored when the folder goes.
_saved_tempdir: tuple[str | None, str | None] | None = None
_folder: Path | None = None
_owner_fd: int | None = None
_owner_pid: int | None = None


def _reset_lock_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_reset_lock_in_child)


def process_scratch() -> Path:
    """This process's scratch folder (made on first use, in the temp dir of that moment); making it first removes
    the folders of owners that are gone (`sweep_orphans`)."""
    global _folder, _owner_fd, _owner_pid, _parent
    with _lock:
        if _folder is not None and _owner_pid == os.getpid() and _folder.is_dir():
            return _folder
        # First use, or a forked child (the parent's folder and lock are the parent's, never removed from here), or
        # the folder was removed under this process.
        if _owner_fd is not None:
            os.close(_owner_fd)
        if _parent is None:
            _parent = Path(tempfile.gettempdir())
        parent = _parent
        sweep_orphans(parent)
        making = Path(tempfile.mkdtemp(prefix=_MAKING, dir=parent))
        fd = os.open(making / OWNER_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        folder = parent / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(making, folder)
        first = _owner_pid is None
        _folder, _owner_fd, _owner_pid = folder, fd, os.getpid()
        if first:
            atexit.register(remove_process_scratch)
        return folder


def shared_tempdir() -> Path:
    """The temp dir this node's processes share (where scratch folders are made): the temp dir of the moment, or the
    one `use_as_tempdir` moved this process's away from. Node-wide locks and marks go here, never in the process's
    own temp dir, which no other process sees."""
    with _lock:
        if _parent is not None:
            return _parent
        if _saved_tempdir is not None and _saved_tempdir[0] is not None:
            return Path(_saved_tempdir[0])
    return Path(tempfile.gettempdir())


def use_as_tempdir() -> Path:
    """Make this process's temp dir (`tempfile.tempdir`, and `$TMPDIR` for its children) a `tmp/` folder inside its
    scratch folder; that folder.

    What libraries make in the temp dir then goes with the scratch folder: Harbor's docker environment keeps its
    compose files in `TemporaryDirectory()`s, which a killed env pool actor left in the temp dir for good; inside
    the scratch folder the next process's sweep removes them. `remove_process_scratch` puts the temp dir back.
    """
    global _saved_tempdir
    tmp = process_scratch() / "tmp"
    tmp.mkdir(exist_ok=True)
    with _lock:
        if _saved_tempdir is None:
            _saved_tempdir = (tempfile.tempdir, os.environ.get("TMPDIR"))
        tempfile.tempdir = str(tmp)
        os.environ["TMPDIR"] = str(tmp)
    return tmp


def _restore_tempdir() -> None:
    global _saved_tempdir
    if _saved_tempdir is None:
        return
    tempfile.tempdir, env = _saved_tempdir
    if env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = env
    _saved_tempdir = None


def remove_process_scratch() -> None:
    """Remove this process's scratch folder and everything in it (at exit; a later `process_scratch` makes a new
    one), with the temp dir put back where `use_as_tempdir` moved it. Nothing happens in a forked child that never
    made its own."""
    global _folder, _owner_fd
    with _lock:
        if _folder is None or _owner_pid != os.getpid():
            return
        folder, fd = _folder, _owner_fd
        _folder = _owner_fd = None
        _restore_tempdir()
    shutil.rmtree(folder, ignore_errors=True)
    if fd is not None:
        os.close(fd)


def sweep_orphans(parent: str | os.PathLike | None = None) -> list[Path]:
    """Remove every scratch folder in `parent` (default: the temp dir) whose owner process is gone; the folders
    removed. Never raises: a folder that cannot be read or removed is left for a later sweep."""
    parent = Path(parent if parent is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        name = entry.name
        if not name.startswith((PREFIX, _REMOVING, _MAKING)):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if _orphan_removed(Path(entry.path)):
                removed.append(Path(entry.path))
        except OSError as exc:
            logger.debug("scratch folder %s left for a later sweep: %s", entry.path, exc)
    if removed:
        logger.info("removed %d scratch folder(s) of processes that are gone from %s", len(removed), parent)
    return removed


def _orphan_removed(folder: Path) -> bool:
    """Remove `folder` if its owner's lock can be taken; whether it was. A folder still being made is left alone
    until it is `MAKING_GRACE_S` old (its maker may not hold the lock yet)."""
    if folder.name.startswith(_MAKING) and time.time() - folder.stat().st_mtime < MAKING_GRACE_S:
        return False
    try:
        fd = os.open(folder / OWNER_FILE, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        if not folder.name.startswith(_MAKING):
            return False  # being removed by another sweep
        shutil.rmtree(folder, ignore_errors=True)  # its maker died before making the owner file
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its owner lives (or another sweep is removing it)
        claimed = folder
        if not folder.name.startswith(_REMOVING):
            # Claimed by a rename while the lock is held, so that no two sweeps remove it at once.
            claimed = folder.with_name(f"{_REMOVING}{uuid.uuid4().hex[:8]}")
            with contextlib.suppress(FileNotFoundError):
                os.rename(folder, claimed)
        shutil.rmtree(claimed, ignore_errors=True)
        return not claimed.exists()
    finally:
        os.close(fd)
