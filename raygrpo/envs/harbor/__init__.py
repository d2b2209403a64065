"""Harbor task folders as raygrpo environments: one suite's sandboxes, episodes, verifier and warm pool.

- `provider.py`: `HarborProvider`, one per suite per env pool actor; it assembles the parts below.
- `context.py`: `SuiteContext`, what the parts share (spec, label, gate, leases, docker support, the task cache, the
  sandboxes not closed yet); frozen, and it holds no part.
- `tasks.py`, `network.py`, `tooling.py`, `shell_words.py`, `offline.py`: what a task folder asks for, read before
  anything starts.
- `environment.py`, `sandbox.py`, `starts.py`, `warm.py`, `leases.py`, `docker.py`, `files.py`, `faults.py`: one
  sandbox from create to stop, started ahead or hedged, leased, and what raygrpo adds to Harbor's backends.
- `adapter.py`, `harness.py`, `trial.py`, `verify.py`, `rewards.py`, `solution.py`: one episode: the tools the model
  sees, the verifier's run and its reward, the reference solution.

`HarborProvider` is importable from here, lazily (`raygrpo.envs.harbor:HarborProvider` was its path before the
package had folders).
"""

from __future__ import annotations

from typing import Any

__all__ = ["HarborProvider"]


def __getattr__(name: str) -> Any:
    if name == "HarborProvider":
        from raygrpo.envs.harbor.provider import HarborProvider

        return HarborProvider
    raise AttributeError(f"module 'raygrpo.envs.harbor' has no attribute {name!r}")
