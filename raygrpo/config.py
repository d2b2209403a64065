"""The run config: one YAML file per run, validated by pydantic, with `--set dotted.key=value` overrides.

Unknown keys and bad values are errors that name the field (`envs.echo.num_taks: Extra inputs are not permitted`).
Relative paths in the file (embedded environments, scripted policies) are resolved against the file's folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from raygrpo.policy.config import PolicyConfig, SamplingConfig
from raygrpo.rollout import RolloutConfig
from raygrpo.specs.harbor import HarborSpec
from raygrpo.specs.ors import ORSSpec
from raygrpo.train.config import TrainConfig, check_trainer_mapping


def _env_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("kind", "ors")
    return getattr(value, "kind", None)


#: One environment of a run: an ORS environment (`kind: ors`, the default) or a Harbor task suite (`kind: harbor`).
EnvSpec = Annotated[
    Annotated[ORSSpec, Tag("ors")] | Annotated[HarborSpec, Tag("harbor")],
    Discriminator(_env_kind, custom_error_type="env_kind", custom_error_message="kind must be 'ors' or 'harbor'"),
]


class ConfigError(ValueError):
    """A run config that cannot be used; the message names the field."""


class WorkersConfig(BaseModel):
    """The env pool actors and how the orchestrator uses them.

    Args:
        num_env_actors: Env pool actors to start (N); each runs up to `max_concurrent_per_actor` rollouts (K).
        max_concurrent_per_actor: Rollouts, hence live environments, per actor at once.
        actor_num_cpus: CPUs Ray reserves per env pool actor (they mostly wait on I/O, so a fraction is fine).
        max_retries: Retries of one rollout after an infrastructure failure (env or policy error), then it is kept
            unscored with its status.
    """

    model_config = ConfigDict(extra="forbid")

    num_env_actors: int = Field(2, ge=1)
    max_concurrent_per_actor: int = Field(64, ge=1)
    actor_num_cpus: float = Field(0.25, ge=0)
    max_retries: int = Field(2, ge=0)


class RayConfig(BaseModel):
    """Where Ray runs.

    Args:
        address: None starts a local Ray on 127.0.0.1; `"auto"` joins the cluster this process runs in (e.g. under
            `ray job submit`); any other value is passed to `ray.init(address=...)`.
        num_cpus: CPUs a local Ray advertises (None: Ray's default, the machine's cores).
    """

    model_config = ConfigDict(extra="forbid")

    address: str | None = None
    num_cpus: int | None = Field(None, ge=1)


class RunConfig(BaseModel):
    """Everything one run needs.

    Args:
        envs: Environments by name: ORS environments (`kind: ors`, the default) and Harbor task suites
            (`kind: harbor`). A name appears in every trajectory's task reference.
        model: Path to a Hugging Face model folder whose tokenizer (and, for the transformers engine, weights) the run
            uses, or `"tiny"` for a tiny random model built locally on first use.
        policy: Which policy writes the assistant turns (default: the transformers engine running `model`).
        sampling: Sampling settings of every generation.
        rollout: Limits of each rollout and the group size.
        workers: Env pool actors and retries.
        ray: Where Ray runs.
        seed: Seed for task order, sampling and training.
        train: `raygrpo train` settings: sync or async mode, mixture weights, evaluation, the learner, warm-up.
        trainer: Options of TRL's `GRPOConfig` for `raygrpo train` (learning rate, batch size, `max_steps`,
            `beta`, `save_steps`, ...), validated by `GRPOConfig` itself. The fields raygrpo sets are refused here
            by name (see `raygrpo.train.config.OWNED_TRAINER_FIELDS`).
        eval_envs: Environments evaluated every `train.eval_every` steps (same schema as `envs`); names must
            differ from those in `envs`.
    """

    model_config = ConfigDict(extra="forbid")

    envs: dict[str, EnvSpec]
    model: str = "tiny"
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    seed: int = 0
    train: TrainConfig = Field(default_factory=TrainConfig)
    trainer: dict[str, Any] = Field(default_factory=dict)
    eval_envs: dict[str, EnvSpec] = Field(default_factory=dict)

    _base_dir: str = PrivateAttr(default_factory=os.getcwd)

    @field_validator("envs")
    @classmethod
    def _at_least_one_env(cls, envs: dict[str, Any]) -> dict[str, Any]:
        if not envs:
            raise ValueError("at least one environment is needed")
        return envs

    @field_validator("trainer")
    @classmethod
    def _trainer_fields(cls, trainer: dict[str, Any]) -> dict[str, Any]:
        return check_trainer_mapping(trainer)

    @model_validator(mode="after")
    def _train_names(self) -> RunConfig:
        clash = sorted(set(self.envs) & set(self.eval_envs))
        if clash:
            raise ValueError(f"eval_envs: names {clash} are already used in envs; give eval environments own names")
        unknown = sorted(set(self.train.mixture or {}) - set(self.envs))
        if unknown:
            raise ValueError(f"train.mixture: {unknown} are not environments in envs ({sorted(self.envs)})")
        if self.train.eval_every and not self.eval_envs:
            raise ValueError("train.eval_every is set but eval_envs is empty: nothing to evaluate")
        return self

    @property
    def base_dir(self) -> str:
        """Folder that relative paths in the config are resolved against (the config file's folder)."""
        return self._base_dir


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set {item!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, _number(value)


def _number(value: Any) -> Any:
    """YAML 1.1 reads `1e-3` (no dot) as a string; take it as the number it means."""
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else value
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides (values parsed as YAML scalars or flow collections) to a raw config."""
    for item in overrides:
        parts, value = _parse_override(item)
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(f"--set {item!r}: {where} is not a mapping")
            node = child
        node[parts[-1]] = value
    return data


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = list(err["loc"])
        if len(loc) > 2 and loc[0] in ("envs", "eval_envs") and loc[2] in ("ors", "harbor"):
            del loc[2]  # the union member's tag: users write envs.<name>.<field>
        where = ".".join(str(p) for p in loc) or "(root)"
        lines.append(f"{where}: {err['msg']}")
    return "invalid run config:\n  " + "\n  ".join(lines)


def load_config(path: str | os.PathLike[str] | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> RunConfig:
    """Read, override and validate a run config.

    Args:
        path: YAML file; relative paths inside it resolve against its folder.
        overrides: `dotted.key=value` strings applied before validation.
        data: A config given as a mapping instead of a file (then relative paths resolve against the cwd).
    """
    base_dir = os.getcwd()
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file not found: {file}")
        try:
            data = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
        base_dir = str(file.resolve().parent)
    if not isinstance(data, dict):
        raise ConfigError("a run config must be a YAML mapping")
    data = apply_overrides(dict(data), overrides or [])
    try:
        # Specs resolve their relative paths (task folders, harness files) against the config file's folder.
        cfg = RunConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    cfg._base_dir = base_dir
    return cfg
