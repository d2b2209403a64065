"""OpenReward Standard (ORS) environments: sessions of an ORS server as raygrpo environments.

- `adapter.py`: `ORSProvider` (one SDK client per event loop) and `ORSAdapter` (one session).
- `client.py`: the SDK client of an `ORSSpec`; `listing.py`: a server's tasks, listed on the driver.
- `tools.py`: tool schemas and prompts as the model sees them; `server.py`: serving an environment in-process.

The provider and adapter are importable from here, lazily (`raygrpo.envs.ors:ORSProvider` was their path before
the package had folders).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = ("ORSProvider", "ORSAdapter", "ORSSessionError", "ORSTimeoutError")
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module("raygrpo.envs.ors.adapter"), name)
    raise AttributeError(f"module 'raygrpo.envs.ors' has no attribute {name!r}")
