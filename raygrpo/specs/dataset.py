"""Task lists as TRL-style `datasets.Dataset`s, for every kind of environment spec."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raygrpo.types import TaskRef

if TYPE_CHECKING:
    import datasets


def tasks_to_dataset(tasks: list[TaskRef], include_metadata: bool = True) -> datasets.Dataset:
    """Turn `TaskRef`s into a TRL-style dataset.

    Columns: `prompt` (a chat list holding one empty user message: the environment supplies the real prompt),
    `task_index`, `env` (the environment's config name) and, with `include_metadata`, one column per metadata key
    (keys clashing with those columns are left out). Non-scalar metadata that Arrow cannot type consistently is
    stored as JSON text.
    """
    import json

    from datasets import Dataset

    rows: dict[str, list[Any]] = {
        "prompt": [[{"role": "user", "content": ""}] for _ in tasks],
        "task_index": [t.index for t in tasks],
        "env": [t.env for t in tasks],
    }
    if include_metadata:
        keys = sorted({k for t in tasks for k in t.metadata} - rows.keys())
        for key in keys:
            rows[key] = [t.metadata.get(key) for t in tasks]
    try:
        return Dataset.from_dict(rows)
    except Exception:  # noqa: BLE001 - Arrow could not unify a column's types: fall back to JSON text for those
        pass
    for key in list(rows):
        if key in ("prompt", "task_index", "env"):
            continue
        try:
            Dataset.from_dict({key: rows[key]})
        except Exception:  # noqa: BLE001
            rows[key] = [None if v is None else json.dumps(v, sort_keys=True, default=str) for v in rows[key]]
    return Dataset.from_dict(rows)
