"""Environment specs: the `envs:` entries of a run config (pure data, validated when the config loads).

`ORSSpec` (an OpenReward Standard environment) and `HarborSpec` (a Harbor task suite); `EnvSpec` is the union a run
config holds, told apart by `kind` (`ors` by default). `ProviderSpec` is a `providers:` entry: the limits of the
sandbox provider that Harbor suites name (`envs.<name>.provider`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Tag

from raygrpo.specs.harbor import HarborSpec
from raygrpo.specs.ors import ORSSpec
from raygrpo.specs.provider import ProviderSpec


def _env_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("kind", "ors")
    return getattr(value, "kind", None)


#: One environment of a run: an ORS environment (`kind: ors`, the default) or a Harbor task suite (`kind: harbor`).
EnvSpec = Annotated[
    Annotated[ORSSpec, Tag("ors")] | Annotated[HarborSpec, Tag("harbor")],
    Discriminator(_env_kind, custom_error_type="env_kind", custom_error_message="kind must be 'ors' or 'harbor'"),
]

__all__ = ["EnvSpec", "HarborSpec", "ORSSpec", "ProviderSpec"]
