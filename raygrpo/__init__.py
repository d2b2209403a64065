"""raygrpo: GRPO for LLM agents on Ray, with rollouts on OpenReward (ORS) environments and Harbor sandboxes.

What a library user calls, imported lazily (PEP 562): `import raygrpo` loads neither Ray, TRL nor transformers.

    import raygrpo

    cfg = raygrpo.load_config("examples/echo/rollout.yaml", ["rollout.group_size=2"])
    summary = raygrpo.collect(cfg, "runs/echo")          # what `raygrpo rollout` does
    raygrpo.train(cfg, "runs/echo-train")                # what `raygrpo train` does

- configs: `load_config`, `RunConfig`, `ConfigError`;
- running: `collect` (rollouts, no training), `train` (GRPO), `run_check` (does each Harbor task's verifier tell
  its reference solution from doing nothing);
- records: `Trajectory`, `TaskRef`, `Turn`, `Status`, `SamplingParams`;
- protocols a user implements: `PolicyClient` (with `GenerationContext`), `EnvAdapter`, `EnvProvider`;
- `format_tool_call`: a tool call written as the model must write it.

The folders are the layers (docs/architecture.md). Modules that moved keep their old import paths for now, with a
`DeprecationWarning` naming the new one (`raygrpo.core.moved`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from raygrpo.core import moved as _moved

_moved.install()

_EXPORTS: dict[str, str] = {
    "load_config": "raygrpo.config.loading",
    "ConfigError": "raygrpo.config.loading",
    "RunConfig": "raygrpo.config.run",
    "collect": "raygrpo.driver.collect",
    "train": "raygrpo.train.run",
    "run_check": "raygrpo.driver.check",
    "Trajectory": "raygrpo.core.types",
    "TaskRef": "raygrpo.core.types",
    "Turn": "raygrpo.core.types",
    "Status": "raygrpo.core.types",
    "SamplingParams": "raygrpo.core.types",
    "PolicyClient": "raygrpo.policy.base",
    "GenerationContext": "raygrpo.policy.base",
    "EnvAdapter": "raygrpo.envs.base",
    "EnvProvider": "raygrpo.envs.base",
    "format_tool_call": "raygrpo.agent.toolcalls",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from raygrpo.agent.toolcalls import format_tool_call
    from raygrpo.config.loading import ConfigError, load_config
    from raygrpo.config.run import RunConfig
    from raygrpo.core.types import SamplingParams, Status, TaskRef, Trajectory, Turn
    from raygrpo.driver.check import run_check
    from raygrpo.driver.collect import collect
    from raygrpo.envs.base import EnvAdapter, EnvProvider
    from raygrpo.policy.base import GenerationContext, PolicyClient
    from raygrpo.train.run import train


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raygrpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
