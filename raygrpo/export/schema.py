"""The Arrow schema of a trajectory line, and the codec between a line and an Arrow row, both ways.

Every field of a line (`raygrpo.core.types.Trajectory.to_dict`, schema_version 6) is a column of its own. Nested records
are Arrow structs and lists of structs (`task`, `messages` and their `tool_calls`, `timings`, `steps`, `verifier`);
token ids and masks are lists of ints, log-probabilities lists of float64 (the exact values the JSON line holds).

Where a value is free-form, it is a column of JSON text, decoded back by `decode_row`: `task.metadata`,
`steps[].metadata`, `verifier.rewards` and a tool call's `arguments` (each shaped by the environment that wrote it;
Arrow needs one type per column, so a JSON string is the faithful choice there).

Every struct also has an `_extra` column, JSON text of whatever did not fit its typed columns, null when nothing did:
a key this schema does not name (e.g. a message's `reasoning_content`), a value of another type than its column (a
message whose `content` is a list of parts), a key that is present with the value null where the typed column's null
already means "absent" (`name`, `tool_calls`), and, under the reserved key `__absent__`, the keys a record lacks that
lines always carry (an older writer's line). So `decode_row(encode_line(line)) == line` for every line, and the typed
columns are what analyses use.

A column's null means None for keys a line always has (`reward`, `error`, `env_span`, `verifier`, ...) and "no such
key" for keys only some records have (`messages[].name`, `messages[].tool_calls`, `timings.governor_wait`, ...).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

#: The struct column holding what did not fit a record's typed columns (JSON text).
EXTRA = "_extra"
#: The key of `EXTRA` listing keys that lines always carry but this record lacked.
ABSENT = "__absent__"
#: The trajectory `schema_version` this schema was written for (`raygrpo.core.types.TRAJECTORY_SCHEMA_VERSION`).
SCHEMA_VERSION = 6


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class Codec(ABC):
    """How one value travels between a JSON line and an Arrow column.

    Args:
        arrow: The Arrow type of the column.
    """

    def __init__(self, arrow: pa.DataType) -> None:
        self.arrow = arrow

    @abstractmethod
    def accepts(self, value: Any) -> bool:
        """True when `value` (never None) has the column's shape; otherwise its record keeps it in `_extra`."""

    def encode(self, value: Any) -> Any:
        """`value` (accepted, never None) as the Python value pyarrow converts into the column."""
        return value

    def decode(self, value: Any) -> Any:
        """A non-null value read back from the column, as the JSON line had it."""
        return value


class Scalar(Codec):
    """A string, integer, float or boolean column.

    Args:
        arrow: The Arrow type.
        check: Whether a Python value fits the type.
    """

    def __init__(self, arrow: pa.DataType, check: Callable[[Any], bool]) -> None:
        super().__init__(arrow)
        self._check = check

    def accepts(self, value: Any) -> bool:
        return self._check(value)

    def decode(self, value: Any) -> Any:
        if pa.types.is_integer(self.arrow) and isinstance(value, float) and value.is_integer():
            return int(value)  # pandas reads an integer column with nulls as floats
        return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, float) or _is_int(value)


STRING = Scalar(pa.string(), lambda v: isinstance(v, str))
INT64 = Scalar(pa.int64(), lambda v: _is_int(v) and -(2**63) <= v < 2**63)
#: Floats; an int (a JSON `1`) fits too and reads back as the equal float `1.0`.
FLOAT64 = Scalar(pa.float64(), _is_number)
BOOL = Scalar(pa.bool_(), lambda v: isinstance(v, bool))


class Json(Codec):
    """Free-form JSON, as a string column (decoded with `json.loads`)."""

    def __init__(self) -> None:
        super().__init__(pa.string())

    def accepts(self, value: Any) -> bool:
        return True

    def encode(self, value: Any) -> str:
        return _dumps(value)

    def decode(self, value: Any) -> Any:
        return json.loads(value)


class ListOf(Codec):
    """A list column.

    Args:
        item: The codec of the items.
        check_items: Check each item's shape (a list with an item of another shape then goes to `_extra` whole).
            Off for token ids, masks and log-probabilities: thousands of numbers per line, where a wrong one fails
            the export instead, naming its line and field. pyarrow checks what it converts (a string, a token id
            past int32), but truncates a float into an integer column (2.5 to 2) without a word, so the items of an
            integer list are checked here: every item must be an integer, or a float of integral value (2.0, which
            pyarrow stores as 2, equal to it in Python).
        arrow_item: The Arrow type of the items, where it is narrower than the codec's (int32 token ids).
    """

    def __init__(self, item: Codec, check_items: bool = True, arrow_item: pa.DataType | None = None) -> None:
        super().__init__(pa.list_(arrow_item or item.arrow))
        self.item = item
        self.check_items = check_items
        self._plain = isinstance(item, Scalar)
        self._integers = not check_items and pa.types.is_integer(arrow_item or item.arrow)

    def accepts(self, value: Any) -> bool:
        if not isinstance(value, list):
            return False
        return not self.check_items or all(v is not None and self.item.accepts(v) for v in value)

    def encode(self, value: list[Any]) -> list[Any]:
        if self._integers and value and set(map(type, value)) != {int}:  # the common case: one pass in C
            for index, v in enumerate(value):
                if not (type(v) is int or (type(v) is float and v.is_integer())):
                    raise ValueError(f"item {index} is {json.dumps(v)}, not an integer")
        return value if self._plain else [self.item.encode(v) for v in value]

    def decode(self, value: list[Any]) -> list[Any]:
        return value if self._plain else [self.item.decode(v) for v in value]


@dataclass(frozen=True)
class Key:
    """One key of a record.

    Args:
        name: The key.
        codec: How its value is stored.
        always: Lines always carry this key (its column's null is None); otherwise a null means the record lacks it.
    """

    name: str
    codec: Codec
    always: bool = True


@dataclass
class Record(Codec):
    """A JSON object as an Arrow struct: a column per key named here, plus `_extra` (unless `strict`).

    Args:
        keys: The keys with columns of their own, in column order.
        strict: No `_extra` column: a value that does not fit raises instead (the token columns of the top level
            are checked by pyarrow anyway).
    """

    keys: list[Key]
    strict: bool = False
    arrow: pa.DataType = field(init=False)

    def __post_init__(self) -> None:
        self.arrow = pa.struct(self.fields())
        self._by_name = {k.name: k for k in self.keys}

    def fields(self) -> list[pa.Field]:
        out = [pa.field(k.name, k.codec.arrow) for k in self.keys]
        return out if self.strict else [*out, pa.field(EXTRA, pa.string())]

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def encode(self, value: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key in self.keys:
            if key.name not in value:
                if key.always:
                    extra.setdefault(ABSENT, []).append(key.name)
                continue
            item = value[key.name]
            if item is None:
                if not key.always:
                    extra[key.name] = None  # the typed null would read back as "no such key"
            elif key.codec.accepts(item):
                try:
                    row[key.name] = key.codec.encode(item)
                except ValueError as exc:
                    raise ValueError(f"{key.name}: {exc}") from None
            else:
                extra[key.name] = item
        for name, item in value.items():
            if name not in self._by_name:
                extra[name] = item
        if extra:
            if self.strict:
                raise ValueError(f"unexpected fields or values: {_dumps(extra)[:300]}")
            row[EXTRA] = _dumps(extra)
        return row

    def decode(self, value: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in self.keys:
            item = value.get(key.name)
            if item is not None:
                out[key.name] = key.codec.decode(item)
            elif key.always:
                out[key.name] = None
        if not self.strict and value.get(EXTRA) is not None:
            extra = json.loads(value[EXTRA])
            for name in extra.pop(ABSENT, []):
                out.pop(name, None)
            out.update(extra)
        return out


TOOL_CALL = Record([
    Key("type", STRING),
    Key("function", Record([Key("name", STRING), Key("arguments", Json())])),
])
MESSAGE = Record([
    Key("role", STRING),
    Key("content", STRING),
    Key("name", STRING, always=False),
    Key("tool_calls", ListOf(TOOL_CALL), always=False),
])
TASK = Record([
    Key("env", STRING), Key("index", INT64), Key("split", STRING), Key("prompt", STRING), Key("metadata", Json()),
])
#: The phases `Trajectory.timings` names; another key goes to `timings._extra`.
TIMING_KEYS = ("provision", "generate", "tools", "verify", "total", "governor_wait", "backoff", "warm_wait", "start")
TIMINGS = Record([Key(name, FLOAT64, always=False) for name in TIMING_KEYS])
STEP = Record([Key("tool", STRING), Key("reward", FLOAT64), Key("finished", BOOL), Key("metadata", Json())])
VERIFIER = Record([
    Key("exit_code", INT64),
    Key("output_tail", STRING),
    Key("rewards", Json()),
    Key("logs_dir", STRING, always=False),
    Key("logs_omitted", ListOf(STRING), always=False),
    Key("tooling_missing", ListOf(STRING), always=False),
])


def trajectory_codec(training: bool) -> Record:
    """The codec of a whole line: `trajectories.jsonl`'s, or with `training` `rollouts.jsonl`'s (its `step` first).

    The top level keeps `_extra` too (a key a newer writer added, a key an older one lacked), so any line survives.
    """
    keys = [
        Key("schema_version", INT64),
        Key("task", TASK),
        Key("prompt_ids", ListOf(INT64, check_items=False, arrow_item=pa.int32())),
        Key("completion_ids", ListOf(INT64, check_items=False, arrow_item=pa.int32())),
        Key("logprobs", ListOf(FLOAT64, check_items=False)),
        Key("env_mask", ListOf(INT64, check_items=False, arrow_item=pa.int8())),
        Key("messages", ListOf(MESSAGE)),
        Key("reward", FLOAT64),
        Key("status", STRING),
        Key("error", STRING),
        Key("turns", INT64),
        Key("tool_calls", INT64),
        Key("timings", TIMINGS),
        Key("policy_versions", ListOf(INT64)),
        Key("attempt", INT64),
        Key("group_id", STRING),
        Key("sample", INT64),
        Key("worker", STRING),
        Key("node", STRING),
        Key("env_span", ListOf(FLOAT64)),
        Key("steps", ListOf(STEP)),
        Key("verifier", VERIFIER),
        Key("sandbox", STRING),
        Key("step_rewards", ListOf(FLOAT64)),
    ]
    if training:
        keys.insert(0, Key("step", INT64))
    return Record(keys)


def arrow_schema(training: bool, metadata: dict[str, str] | None = None) -> pa.Schema:
    """The Arrow schema of an exported run (`training`: a training run's `rollouts.jsonl`, with `step`)."""
    schema = pa.schema(trajectory_codec(training).fields())
    return schema.with_metadata(metadata) if metadata else schema


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    """An exported row (from `pyarrow`'s `to_pylist()`, a `datasets` row, or pandas' `df.iloc[i].to_dict()` /
    `df.to_dict("records")`) as the JSON line it came from.

    A pandas row is made plain first (`plain_row`): its lists are numpy arrays and its nulls NaN. Which codec
    applies follows from the row: a training run's rows have `step`.
    """
    return trajectory_codec("step" in row).decode(plain_row(row))


def plain_row(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with pandas' values as pyarrow gives them: numpy arrays as lists, numpy scalars as Python numbers, and
    NaN (pandas' null of a string, float or nullable column, and of a float list's item) or `pd.NA` as None.

    A row of plain Python values (pyarrow, `datasets`) is returned as it is: there NaN is a value (a NaN
    log-probability), not a null. Whether the row is pandas' is told by a numpy value at its top level (its token
    lists always are).
    """
    if not any(type(value).__module__ == "numpy" for value in row.values()):
        return row
    return {name: _plain(value) for name, value in row.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if type(value).__module__ == "numpy":
        if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:  # an array: a list column
            if value.dtype.kind == "O":
                return [_plain(v) for v in value]
            items = value.tolist()
            return [None if v != v else v for v in items] if value.dtype.kind == "f" else items
        value = value.item()  # a numpy scalar
    if isinstance(value, float) and value != value:
        return None
    if type(value).__name__ == "NAType":  # pd.NA, of a nullable column
        return None
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
