"""What every environment spec shares: strict fields, config-field names in messages, and the settings that moved."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

from raygrpo.specs.pool import PoolSpec

#: Fields an environment spec once had, and where that setting lives now (a config that sets one fails at load).
MOVED_FIELDS: dict[str, str] = {
    "weight": "is not an environment setting: set each environment's share of the training groups in "
              "train.mixture ({name: weight, ...})",
}


def refuse_moved_fields(data: Any, moved: dict[str, str]) -> Any:
    """`data` unchanged, unless it sets a field that moved: then a `ValueError` that says where each one went (for a
    `mode="before"` model validator, so a setting is never silently dropped)."""
    if isinstance(data, dict):
        found = [f"`{key}` {where}" for key, where in moved.items() if key in data]
        if found:
            raise ValueError("; ".join(found))
    return data


class EnvSpecBase(BaseModel):
    """Base class of environment specs: unknown fields are errors, and no input value is echoed in an error (a
    mistyped field may hold a secret). Every spec has `pool` (`PoolSpec`, *optional*): env pool actors of its own and
    where they run; without it the environment shares the run's default actors (`workers:`)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    pool: PoolSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_fields(cls, data: Any) -> Any:
        return refuse_moved_fields(data, MOVED_FIELDS)

    def field_path(self, name: str | None, field: str) -> str:
        """`envs.<name>.<field>` for error messages (just `field` without a name)."""
        return f"envs.{name}.{field}" if name else field


def base_dir_of(info: ValidationInfo) -> str | None:
    """The folder relative paths resolve against: `base_dir` in the validation context (the config file's folder)."""
    context = info.context if isinstance(info.context, dict) else {}
    base = context.get("base_dir")
    return os.fspath(base) if base else None
