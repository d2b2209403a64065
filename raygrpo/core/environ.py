"""Environment variables every raygrpo process sets for the libraries underneath (driver and actors alike)."""

from __future__ import annotations

import os

#: Variables every raygrpo process should see; the user's own values win.
PROCESS_ENV: dict[str, str] = {
    # The openreward SDK otherwise asks PyPI for a newer version on every client it builds.
    "OPENREWARD_DISABLE_UPDATE_CHECK": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # Ray runs async actors on uvloop whenever it is installed (vLLM's dependencies install it). raygrpo's sandboxes
    # manage their processes through asyncio's own subprocess and child-watcher semantics, which it was built and
    # tested on; under uvloop, sandbox stops under load failed ("'str' object cannot be interpreted as an integer")
    # and left folders behind.
    "RAY_USE_UVLOOP": "0",
}


def apply_process_env() -> None:
    """Set `PROCESS_ENV` in this process where the user has not set the variables already."""
    for key, value in PROCESS_ENV.items():
        os.environ.setdefault(key, value)
