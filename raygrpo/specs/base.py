"""What every environment spec shares: strict fields, config-field names in messages, and the settings that moved."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

from raygrpo.specs.moved_fields import refuse_moved_fields
from raygrpo.specs.pool import PoolSpec

__all__ = ["MOVED_FIELDS", "EnvSpecBase", "base_dir_of", "refuse_moved_fields"]

#: Fields an environment spec once had, and where that setting lives now (a config that sets one fails at load).
MOVED_FIELDS: dict[str, str] = {
    "weight": "is not an environment setting: set each environment's share of the training groups in "
              "train.mixture ({name: weight, ...})",
    **{field: f"moved to providers.<provider>.{field}: a provider's limits are set once, in the top-level "
              "`providers:` section, for every suite that names it in envs.<name>.provider (by default the "
              "suite's backend: local, docker, e2b, ... or the import path)"
       for field in ("create_rate_per_s", "max_live", "rate_limit_backoff")},
    "rate_limit_key": "is now envs.<name>.provider: the entry of the top-level `providers:` section whose limits "
                      "apply (by default the suite's backend)",
}


class EnvSpecBase(BaseModel):
    """Base class of environment specs: unknown fields are errors, and no input value is echoed in an error (a
    mistyped field may hold a secret). Every spec has `pool` (`PoolSpec`, *optional*): env pool actors of its own and
    where they run; without it the environment shares the run's default actors (`workers:`). A provider's limits are
    no environment's field: they live in the run config's `providers:` section (`raygrpo.specs.provider`)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    pool: PoolSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_fields(cls, data: Any) -> Any:
        return refuse_moved_fields(data, MOVED_FIELDS)

    @property
    def provider_key(self) -> str | None:
        """The provider (`providers.<key>`) whose limits this environment's sandboxes count against; None for a kind
        that starts no sandboxes."""
        return None

    def field_path(self, name: str | None, field: str) -> str:
        """`envs.<name>.<field>` for error messages (just `field` without a name)."""
        return f"envs.{name}.{field}" if name else field


def base_dir_of(info: ValidationInfo) -> str | None:
    """The folder relative paths resolve against: `base_dir` in the validation context (the config file's folder)."""
    context = info.context if isinstance(info.context, dict) else {}
    base = context.get("base_dir")
    return os.fspath(base) if base else None
