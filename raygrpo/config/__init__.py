"""The run config: one YAML file per run, validated by pydantic, with `--set dotted.key=value` overrides.

Pure data, at the bottom of the package with the environment specs (`raygrpo.specs`): it imports nothing above them.

- `run`: `RunConfig` (what one run needs), `WorkersConfig`, `RayConfig`;
- `rollout`: `RolloutConfig` (group size, limits of the agent loop);
- `policy`: `PolicyConfig`, `SamplingConfig`, `VLLMServeConfig`;
- `train`: `TrainConfig`, `LearnerConfig`, `WarmupConfig`;
- `trainer`: the checks of the `trainer:` mapping (TRL's `GRPOConfig` options) at load, raygrpo's defaults for it;
- `loading`: `load_config`, `apply_overrides`, `ConfigError`.
"""

from raygrpo.config.loading import ConfigError, apply_overrides, format_validation_error, load_config
from raygrpo.config.policy import PolicyConfig, SamplingConfig, VLLMServeConfig
from raygrpo.config.rollout import RolloutConfig
from raygrpo.config.run import RayConfig, RunConfig, WorkersConfig
from raygrpo.config.train import LearnerConfig, TrainConfig, WarmupConfig

__all__ = [
    "ConfigError",
    "LearnerConfig",
    "PolicyConfig",
    "RayConfig",
    "RolloutConfig",
    "RunConfig",
    "SamplingConfig",
    "TrainConfig",
    "VLLMServeConfig",
    "WarmupConfig",
    "WorkersConfig",
    "apply_overrides",
    "format_validation_error",
    "load_config",
]
