"""JSON lines files that a run appends to, read back and rewritten safely.

A run appends its records (`trajectories.jsonl`, `rollouts.jsonl`, `metrics.jsonl`) a line at a time and flushes
each, so a run killed while writing leaves at most its last line cut off: that line, and only that one (the last,
with no newline after it), is what a reader leaves out; any other line that is not JSON is an error naming the file
and the line. Every reader of these files (a resumed training run, `raygrpo export`, a fresh run replacing the file)
goes through `JsonLines`, so they agree on what a cut-off line is.

A file rewritten in place (a resumed run keeping the lines up to its checkpoint) is written to a temporary file next
to it and renamed over it (`rewrite_lines`): a crash during the rewrite leaves the old file or the new one, never
half of either.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class JsonLinesError(ValueError):
    """A line other than a cut-off last one is not JSON; the message names the file and the line."""


@dataclass(frozen=True)
class JsonLine:
    """One complete line.

    Args:
        number: Its line number in the file (1-based).
        value: The parsed JSON value.
        raw: The line's bytes, newline included.
    """

    number: int
    value: Any
    raw: bytes


class JsonLines:
    """The complete lines of a JSON lines file, one at a time (memory: one line); blank lines are skipped.

    After iterating, `cut_off_line` is the number of a cut-off last line that was left out (None if there was none)
    and `bytes_read` the bytes read (progress).

    Args:
        path: The file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.cut_off_line: int | None = None
        self.bytes_read = 0

    def __iter__(self) -> Iterator[JsonLine]:
        with self.path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                self.bytes_read += len(raw)
                if not raw.strip():
                    continue
                try:
                    value = json.loads(raw)
                except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
                    if not raw.endswith(b"\n"):  # only the last line can lack its newline: it was cut off
                        self.cut_off_line = number
                        return
                    raise JsonLinesError(f"{self.path.name}: line {number} is not valid JSON ({exc})") from None
                yield JsonLine(number, value, raw)

    def cut_off_note(self, kept: int, action: str = "kept") -> str | None:
        """One line on a cut-off last line (None when there was none): `<file>: line N, the last, is cut off (...);
        <action> the <kept> complete line(s) before it`."""
        if self.cut_off_line is None:
            return None
        return (f"{self.path.name}: line {self.cut_off_line}, the last, is cut off (a run killed while writing "
                f"it?); {action} the {kept} complete line(s) before it")


def rewrite_lines(path: str | os.PathLike[str], lines: Iterable[bytes]) -> None:
    """Replace `path` with `lines` (each a line's bytes; a missing newline is added) through a temporary file in
    the same folder and `os.replace`: a crash during the rewrite leaves the old file whole. The file keeps its
    permissions."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for line in lines:
                f.write(line if line.endswith(b"\n") else line + b"\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        except FileNotFoundError:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def count_lines(path: str | os.PathLike[str]) -> int:
    """How many non-blank lines `path` holds (0 when it does not exist), a cut-off last one included; not parsed."""
    try:
        with Path(path).open("rb") as f:
            return sum(1 for raw in f if raw.strip())
    except FileNotFoundError:
        return 0
