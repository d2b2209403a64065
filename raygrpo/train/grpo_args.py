"""TRL's `GRPOConfig` from the run config's `trainer:` mapping, validated by `GRPOConfig` itself.

Every TRL option keeps its name, default and documentation; the fields raygrpo sets from the rest of the run config
are refused by name when the config loads (`raygrpo.config.train.OWNED_TRAINER_FIELDS`).
"""

from __future__ import annotations

from typing import Any

from raygrpo.config.train import TRAINER_DEFAULTS, check_trainer_mapping


def _coerce(name: str, value: Any, annotation: str) -> Any:
    """GRPOConfig does not check types: turn numeric strings (YAML 1.1 reads `1e-3` as one) into numbers, and refuse
    other strings for numeric fields by name, before they fail deep inside the optimizer."""
    if not isinstance(value, str) or "str" in annotation or not ("float" in annotation or "int" in annotation):
        return value
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"trainer.{name}: expected a number, got {value!r}") from None
    return int(number) if "float" not in annotation and number.is_integer() else number


def build_grpo_config(trainer: dict[str, Any], **owned: Any):
    """Validate the `trainer:` mapping with TRL's own `GRPOConfig`, adding raygrpo's defaults and owned fields.

    Raises `ValueError` naming `trainer.<field>` for an unknown field or a value `GRPOConfig` rejects.
    """
    import dataclasses

    from trl import GRPOConfig

    check_trainer_mapping(trainer)
    fields = {f.name: str(f.type) for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(trainer) - set(fields))
    if unknown:
        raise ValueError("; ".join(f"trainer.{k}: not a GRPOConfig field" for k in unknown))
    trainer = {k: _coerce(k, v, fields[k]) for k, v in trainer.items()}
    kwargs = {**TRAINER_DEFAULTS, **trainer, **owned}
    try:
        return GRPOConfig(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"trainer: GRPOConfig rejected the settings: {exc}") from exc
