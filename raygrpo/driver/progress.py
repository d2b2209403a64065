"""Progress of a long run on the console: a rich bar on a terminal, plain lines where output is a log."""

from __future__ import annotations

import sys
import time
from typing import Any, Literal

Mode = Literal["bar", "log", "off"]


def progress_mode(progress: bool | str) -> Mode:
    """The display for a `progress` argument: True or `"bar"` for a live bar, `"log"` for plain lines (`ray job
    logs`, CI), False or `"off"` for none."""
    if progress is True:
        return "bar"
    if not progress:
        return "off"
    if progress not in ("bar", "log", "off"):
        raise ValueError(f"progress must be 'bar', 'log' or 'off', got {progress!r}")
    return progress  # type: ignore[return-value]


class Progress:
    """A count of `unit`s done out of `total` with a line of details: a rich bar (`"bar"`), a line on stderr at most
    every `log_every_s` and whenever `update(..., log_now=True)` asks (`"log"`), or nothing (`"off"`).

    Args:
        unit: What is counted (`"rollouts"`, `"steps"`).
        total: How many there are, if known.
        mode: The display (see `progress_mode`).
        log_every_s: Least time between two plain lines.
    """

    def __init__(self, unit: str, total: int | None, mode: Mode, log_every_s: float = 5.0) -> None:
        self.unit, self.total, self.mode, self.log_every_s = unit, total, mode, log_every_s
        self._started = time.monotonic()
        self._logged = float("-inf")
        self._bar: Any = None

    def __enter__(self) -> Progress:
        if self.mode == "bar":
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn(self.unit), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                     TextColumn("{task.fields[info]}"))
            self._bar.start()
            self._task = self._bar.add_task(self.unit, total=self.total, info="")
        return self

    def update(self, completed: int, info: str = "", *, total: int | None = None, log_now: bool = False) -> None:
        """Show `completed` (of `total`, which may change) with `info`."""
        if total is not None:
            self.total = total
        if self._bar is not None:
            self._bar.update(self._task, completed=completed, total=self.total, info=info)
        elif self.mode == "log":
            now = time.monotonic()
            if log_now or now - self._logged >= self.log_every_s or completed == self.total:
                self._logged = now
                of = f"/{self.total}" if self.total is not None else ""
                print(f"{self.unit} {completed}{of}  {info}  {now - self._started:.1f} s", file=sys.stderr, flush=True)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
