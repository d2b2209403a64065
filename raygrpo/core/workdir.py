"""Config paths on every node of a cluster.

A run config's relative paths (task folders, environment and policy files) are made absolute on the driver, against
the config file's folder. Inside a `ray job submit` job that folder is in the job's working_dir, which Ray unpacks
on every node to a folder of that node's own (under its session directory, so it differs between nodes started with
different `--temp-dir`s). An actor therefore maps every path under the driver's working_dir to the same place under
its own working directory, which Ray makes its node's copy. Paths outside the working_dir (shared storage mounted
on every node, say `/mnt/shared`) are left as they are.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


def relocate(value: T, src: str | None, dst: str | None = None) -> T:
    """`value` with every string path under `src` moved under `dst` (default: this process's working directory).

    Strings, lists, tuples, dicts, pydantic models and dataclasses are walked; anything else is returned as it is. A
    string is a path under `src` when it is `src` itself or starts with `src` and a separator (`src:attr` import
    specs included). Nothing changes when `src` is None or equals `dst`.
    """
    dst = os.getcwd() if dst is None else dst
    if not src or os.path.normpath(src) == os.path.normpath(dst):
        return value
    return _walk(value, os.path.normpath(src), os.path.normpath(dst))


def _walk(value: Any, src: str, dst: str) -> Any:
    if isinstance(value, str):
        if value == src:
            return dst
        if value.startswith(src) and value[len(src)] in (os.sep, ":"):
            return dst + value[len(src):]
        return value
    if isinstance(value, BaseModel):
        updates = {name: _walk(getattr(value, name), src, dst) for name in type(value).model_fields}
        changed = {k: v for k, v in updates.items() if v is not getattr(value, k)}
        return value.model_copy(update=changed) if changed else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        updates = {f.name: _walk(getattr(value, f.name), src, dst) for f in dataclasses.fields(value) if f.init}
        changed = {k: v for k, v in updates.items() if v is not getattr(value, k)}
        return dataclasses.replace(value, **changed) if changed else value
    if isinstance(value, dict):
        out = {k: _walk(v, src, dst) for k, v in value.items()}
        return out if any(out[k] is not value[k] for k in value) else value
    if isinstance(value, (list, tuple)):
        items = [_walk(v, src, dst) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        return type(value)(items) if isinstance(value, list) else tuple(items)
    return value
