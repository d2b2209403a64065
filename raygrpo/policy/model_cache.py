"""Where raygrpo keeps the models it builds or converts itself, and how a cached folder is written safely.

The tiny test model, a converted `.gguf` file and the SmolLM2 wheel all live under one cache root: `cache_dir` when
given, else `$RAYGRPO_CACHE`, else `~/.cache/raygrpo`. Each folder is built in a temporary folder beside its final
name and renamed into place, so a reader never sees a half-written model and two processes racing to build it both
end up using the one that got there first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root(cache_dir: str | None = None) -> Path:
    """The cache root: `cache_dir`, else `$RAYGRPO_CACHE`, else `~/.cache/raygrpo`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("RAYGRPO_CACHE")
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/raygrpo").expanduser()


def is_complete(path: Path) -> bool:
    """Whether `path` holds a finished model folder (one a build renamed into place)."""
    return (path / "config.json").is_file() and (path / "tokenizer.json").is_file() and (path / ".complete").is_file()


def build_atomically(final: Path, build: Callable[[Path], object]) -> Path:
    """Return `final`, first running `build(tmp)` in a temporary folder beside it and renaming that into place
    unless a finished folder is already there."""
    if is_complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        (tmp / ".complete").write_text("ok\n")
        try:
            os.rename(tmp, final)  # atomic; fails if another process renamed its copy first
        except OSError:
            if not is_complete(final):
                # A stale, incomplete folder (e.g. a crash of a build that did not use this scheme): replace it.
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
