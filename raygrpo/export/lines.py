"""Reading a run's trajectories: which file, and its JSON lines one at a time.

A rollout run writes `trajectories.jsonl`, a training run `rollouts.jsonl` (each line with the `step` that consumed
it). Both are appended a line at a time as trajectories finish, so a run killed while writing leaves its last line
cut off: that line, and only that one (the last, with no newline after it), is left out with a warning and the
complete lines are exported. Any other line that is not a JSON object is an error naming its line. The lines are
read by `raygrpo.core.jsonl.JsonLines`, as a resumed training run reads them, so both agree on a cut-off line.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raygrpo.core.jsonl import JsonLines, JsonLinesError
from raygrpo.core.types import TRAJECTORY_SCHEMA_VERSION as SCHEMA_VERSION

logger = logging.getLogger(__name__)

#: A rollout run's trajectories (`raygrpo rollout`, `raygrpo check --out`).
ROLLOUT_FILE = "trajectories.jsonl"
#: A training run's consumed trajectories (`raygrpo train` with `train.save_rollouts`), each with its `step`.
TRAINING_FILE = "rollouts.jsonl"


class ExportError(Exception):
    """The input cannot be exported: the message is one line for the user (the CLI exits 2)."""


@dataclass(frozen=True)
class Source:
    """The JSON lines file to export.

    Args:
        path: The file.
        training: A training run's `rollouts.jsonl`: its lines carry the step that consumed them.
    """

    path: Path
    training: bool

    @property
    def size(self) -> int:
        return self.path.stat().st_size


@dataclass
class ReadStats:
    """What reading a file found.

    Args:
        lines: Trajectories read (complete lines).
        bytes_read: Bytes of the file read so far (progress).
        truncated_line: The number of the cut-off last line that was left out, if there was one.
        older_schema: The oldest `schema_version` met that is older than this raygrpo's (its lines lack fields;
            the export keeps them as they are).
    """

    lines: int = 0
    bytes_read: int = 0
    truncated_line: int | None = None
    older_schema: int | None = None

    def truncation_note(self, source: Source) -> str | None:
        """One line on a cut-off last line, or None."""
        if self.truncated_line is None:
            return None
        return (f"{source.path.name}: line {self.truncated_line}, the last, is cut off (a run killed while writing "
                f"it?); exported the {self.lines} complete line(s) before it")


@dataclass(frozen=True)
class Line:
    """One trajectory line.

    Args:
        number: Its line number in the file (1-based).
        record: The parsed JSON object.
        size: Its length in bytes.
    """

    number: int
    record: dict[str, Any]
    size: int


def find_source(path: str | os.PathLike[str]) -> Source:
    """The trajectories file of a run folder, or the JSON lines file `path` names.

    Raises:
        ExportError: No such folder or file, a folder without either file, or a folder with both.
    """
    path = Path(path)
    if path.is_file():
        training = path.name == TRAINING_FILE or (path.name != ROLLOUT_FILE and _first_has_step(path))
        return Source(path, training)
    if not path.exists():
        raise ExportError(f"{path}: no such run folder or file")
    if not path.is_dir():
        raise ExportError(f"{path}: not a run folder or a JSON lines file")
    found = [name for name in (ROLLOUT_FILE, TRAINING_FILE) if (path / name).is_file()]
    if not found:
        raise ExportError(f"{path} has no trajectories: neither {ROLLOUT_FILE} (a rollout run) nor {TRAINING_FILE} "
                          "(a training run with train.save_rollouts) is there")
    if len(found) > 1:
        raise ExportError(f"{path} has both {ROLLOUT_FILE} and {TRAINING_FILE}: pass the one to export as the path")
    return Source(path / found[0], found[0] == TRAINING_FILE)


def _first_has_step(path: Path) -> bool:
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    first = json.loads(raw)
                except ValueError:
                    return False
                return isinstance(first, dict) and "step" in first
    return False


def read_lines(source: Source, stats: ReadStats | None = None) -> Iterator[Line]:
    """The trajectories of `source`, one at a time (memory: one line).

    Args:
        source: The file.
        stats: Filled in as lines are read (counts, bytes, a cut-off last line).

    Raises:
        ExportError: A line other than a cut-off last one is not a JSON object, or a line is of a newer
            `schema_version` than this raygrpo knows; or the file holds no complete trajectory.
    """
    stats = stats if stats is not None else ReadStats()
    name = source.path.name
    lines = JsonLines(source.path)
    try:
        for line in lines:
            stats.bytes_read = lines.bytes_read
            record, number = line.value, line.number
            if not isinstance(record, dict):
                raise ExportError(f"{name}: line {number} is not a JSON object")
            version = record.get("schema_version")
            if not isinstance(version, int) or isinstance(version, bool):
                raise ExportError(f"{name}: line {number} has no schema_version: not a raygrpo trajectory")
            if version > SCHEMA_VERSION:
                raise ExportError(f"{name}: line {number} has schema_version {version}, newer than this raygrpo "
                                  f"writes ({SCHEMA_VERSION}): upgrade raygrpo")
            if version < SCHEMA_VERSION and (stats.older_schema is None or version < stats.older_schema):
                stats.older_schema = version
                logger.info("%s: line %d has schema_version %d (this raygrpo writes %d); its fields are kept as "
                               "they are", name, number, version, SCHEMA_VERSION)
            stats.lines += 1
            yield Line(number, record, len(line.raw))
    except JsonLinesError as exc:
        raise ExportError(str(exc)) from None
    stats.bytes_read = lines.bytes_read
    if lines.cut_off_line is not None:
        stats.truncated_line = lines.cut_off_line
        logger.info("%s", stats.truncation_note(source))
    if stats.lines == 0:
        raise ExportError(f"{source.path}: no complete trajectory to export"
                          + (" (its only line is cut off)" if stats.truncated_line is not None else ""))
