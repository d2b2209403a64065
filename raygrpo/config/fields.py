"""Which fields of a config the user set: a field the run will not read is refused only when the user gave it."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel


def given(model: BaseModel, names: Iterable[str]) -> list[str]:
    """The fields among `names` that the config sets to a value: present in the input (`model_fields_set`) and not
    null. A default is never reported, so a field with a default is refused only where a user wrote it; `null` reads
    as "unset", as it does for the optional fields."""
    return [name for name in names if name in model.model_fields_set and getattr(model, name) is not None]
