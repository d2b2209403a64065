"""The host folder of one sandbox's Harbor trial: where Harbor's backends and verifier put what they bring back.

Harbor's `TrialPaths` lays out a trial dir (`agent/`, `verifier/`, `artifacts/`, ...): the verifier downloads
`/logs/verifier` into it and reads the reward there, and the docker backend keeps its compose files in it. Each
sandbox gets its own, made when its start begins and removed when it is stopped.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harbor.models.trial.paths import TrialPaths


@dataclass
class TrialDir:
    """One sandbox's trial dir on the host.

    Args:
        path: The folder.
        paths: Harbor's layout of it.
    """

    path: str
    paths: TrialPaths

    @classmethod
    def make(cls, short_name: str) -> TrialDir:
        """A new, empty trial dir named after the task (`raygrpo-harbor-<task>-<random>` under the temp dir)."""
        from harbor.models.trial.paths import TrialPaths

        path = tempfile.mkdtemp(prefix=f"raygrpo-harbor-{short_name[:40]}-")
        paths = TrialPaths(trial_dir=Path(path))
        paths.mkdir()
        return cls(path, paths)

    async def remove(self) -> None:
        """Remove it and everything in it, off the event loop: under load a tree of file system calls there delays
        other starts past their create slots. The thread finishes the removal even if the caller is cancelled."""
        await asyncio.to_thread(shutil.rmtree, self.path, ignore_errors=True)
