"""Which tasks of an environment a spec selects: checks shared by every spec kind."""

from __future__ import annotations


def check_indices(value: list[int] | None) -> list[int] | None:
    """Validate an explicit list of task indices (None: no explicit selection)."""
    if value is None:
        return None
    if not value:
        raise ValueError("`indices` must not be empty (leave it out to use every task)")
    negative = [i for i in value if i < 0]
    if negative:
        raise ValueError(f"`indices` must be >= 0, got {negative[:5]}")
    return value
