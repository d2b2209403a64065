"""The host folder of one sandbox's Harbor trial: where Harbor's backends and verifier put what they bring back.

Harbor's `TrialPaths` lays out a trial dir (`agent/`, `verifier/`, `artifacts/`, ...): the verifier downloads
`/logs/verifier` into it and reads the reward there, and the docker backend keeps its compose files in it. Each
sandbox gets its own, made when its start begins and removed when it is stopped.

Creating a directory is the dearest file system call on a journaled disk (on the development machine's ext4 a
`mkdir` costs 0.2-0.3 ms of kernel CPU, a `rename` or `unlink` a tenth of that), and a trial dir is four of them. So a
removed trial dir whose contents could be deleted is kept as a spare skeleton (empty `agent/`, `verifier/`,
`artifacts/`, the modes and owner it was made with) under a spare name, and the next trial dir is a spare renamed to
a fresh name: every sandbox still gets its own path, holding nothing but the empty layout, and its old path is gone
once it is removed. Trial dirs and spares live in the process's scratch folder (`raygrpo.core.scratch`), removed when the
process exits, or by the next process when it was killed. A sandbox that mounts the trial dir
(`capabilities.mounted`: docker, the local bubblewrap backend) could write into it after a stop that failed, so its
trial dir is never reused (`keep_fresh`).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from raygrpo.core.scratch import process_scratch

if TYPE_CHECKING:
    from harbor.models.trial.paths import TrialPaths

#: Spare skeletons kept per process at most (each is four empty directories).
MAX_SPARES = 256
#: Entries a removal deletes on the event loop at most; a trial dir holding more is deleted in a thread.
INLINE_ENTRIES = 16
#: The subdirectories `TrialPaths.mkdir` makes (`agent/`, `verifier/`, `artifacts/`).
_LAYOUT = ("agent", "verifier", "artifacts")

_spares: list[str] = []
#: Trial dirs (paths) whose sandbox mounts them: removed, never kept as spares.
_fresh_only: set[str] = set()
_spares_lock = threading.Lock()
#: The process the spares belong to (a forked child starts without them).
_spares_pid = os.getpid()


def _identity(path: str) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_mode, st.st_uid, st.st_gid


@dataclass
class TrialDir:
    """One sandbox's trial dir on the host.

    Args:
        path: The folder.
        paths: Harbor's layout of it.
        identity: Mode, uid and gid of the folder and of each layout subdirectory as made (a removal keeps the
            skeleton as a spare only when they are unchanged).
    """

    path: str
    paths: TrialPaths
    identity: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def make(cls, short_name: str) -> TrialDir:
        """A new, empty trial dir named after the task (`raygrpo-harbor-<task>-<random>` in the process's scratch
        folder)."""
        from harbor.models.trial.paths import TrialPaths

        prefix = f"raygrpo-harbor-{short_name[:40]}-"
        with _spares_lock:
            _forget_if_forked()
            spare = _spares.pop() if _spares else None
        if spare is not None:
            # 16 random hex digits: a name already taken (an empty dir there would be replaced) is out of reach.
            path = os.path.join(os.path.dirname(spare), prefix + uuid.uuid4().hex[:16])
            try:
                os.rename(spare, path)
            except OSError:
                shutil.rmtree(spare, ignore_errors=True)
            else:
                identity = (_identity(path), *(_identity(os.path.join(path, d)) for d in _LAYOUT))
                return cls(path, TrialPaths(trial_dir=Path(path)), identity)
        path = tempfile.mkdtemp(prefix=prefix, dir=process_scratch())
        paths = TrialPaths(trial_dir=Path(path))
        paths.mkdir()
        identity = (_identity(path), *(_identity(os.path.join(path, d)) for d in _LAYOUT))
        return cls(path, paths, identity)

    async def remove(self) -> None:
        """Remove it and everything in it. A trial dir holding only a few files is emptied on the event loop and
        kept as a spare skeleton; a bigger one is removed in a thread (under load a tree of file system calls on
        the loop delays other starts past their create slots), which finishes even if the caller is cancelled."""
        entries = None if _fresh_only and self.path in _fresh_only else _contents(self.path)
        _fresh_only.discard(self.path)
        if entries is not None and len(entries) <= INLINE_ENTRIES:
            if _empty_into_spare(self.path, entries, self.identity):
                return
        await asyncio.to_thread(shutil.rmtree, self.path, ignore_errors=True)


def keep_fresh(trial_dir: Path | str) -> None:
    """The sandbox of this trial dir mounts it: its removal deletes it rather than keeping it as a spare."""
    _fresh_only.add(str(trial_dir))


def _contents(path: str) -> list[os.DirEntry] | None:
    """Everything inside the layout subdirectories and any other entry of the trial dir; None when the trial dir
    is not the bare layout plus files (a layout directory is missing or replaced, or it cannot be read)."""
    found: list[os.DirEntry] = []
    layout = set(_LAYOUT)
    try:
        with os.scandir(path) as top:
            for entry in top:
                if entry.name in layout and entry.is_dir(follow_symlinks=False):
                    layout.discard(entry.name)
                    with os.scandir(entry.path) as sub:
                        found.extend(sub)
                else:
                    found.append(entry)
    except OSError:
        return None
    return None if layout else found


def _empty_into_spare(path: str, entries: list[os.DirEntry], identity: tuple[tuple[int, int, int], ...]) -> bool:
    """Delete `entries` (files, links; any directory among them makes it give up) and rename the emptied skeleton
    to a spare; False when the dir is not reusable (the caller then removes what is left)."""
    if len(_spares) >= MAX_SPARES:
        return False
    try:
        if any(entry.is_dir(follow_symlinks=False) for entry in entries):
            return False
        if identity != (_identity(path), *(_identity(os.path.join(path, d)) for d in _LAYOUT)):
            return False  # a backend changed the modes or owner: the next trial starts from a fresh dir
        for entry in entries:
            os.unlink(entry.path)
        spare = os.path.join(os.path.dirname(path), f"raygrpo-harbor-spare-{uuid.uuid4().hex[:8]}")
        os.rename(path, spare)
    except OSError:
        return False
    with _spares_lock:
        _forget_if_forked()
        _spares.append(spare)
    return True


def _forget_if_forked() -> None:
    global _spares_pid
    if _spares_pid != os.getpid():
        _spares_pid = os.getpid()
        _spares.clear()


def remove_spares() -> None:
    """Remove this process's spare trial dir skeletons (safe to call any time; its scratch folder's removal at exit
    takes them too)."""
    with _spares_lock:
        _forget_if_forked()
        spares = list(_spares)
        _spares.clear()
    for spare in spares:
        shutil.rmtree(spare, ignore_errors=True)
