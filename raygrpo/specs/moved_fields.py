"""Settings that moved: a config that sets one fails at load saying where it went, rather than being dropped."""

from __future__ import annotations

from typing import Any


def refuse_moved_fields(data: Any, moved: dict[str, str]) -> Any:
    """`data` unchanged, unless it sets a field that moved: then a `ValueError` that says where each one went (for a
    `mode="before"` model validator, so a setting is never silently dropped).

    Args:
        data: The raw input of the model being validated.
        moved: Old field name -> where that setting lives now, as the rest of the sentence "`<field>` ...".
    """
    if isinstance(data, dict):
        found = [f"`{key}` {where}" for key, where in moved.items() if key in data]
        if found:
            raise ValueError("; ".join(found))
    return data
