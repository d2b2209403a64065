"""Progress of a long run on the console: a rich bar on a terminal, plain lines where output is a log."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Literal

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
    """A count of `unit`s done out of `total` with a line of details: a rich bar (`"bar"`), plain lines on stderr
    (`"log"`), or nothing (`"off"`).

    In `"log"` mode a line is printed at most every `log_every_s` and whenever `update(..., log_now=True)` asks; an
    update that comes sooner is held, not dropped: a timer prints the latest held count once `log_every_s` has passed
    since the last line, and leaving the `with` prints it at once, so the log never shows a stale count for longer
    than `log_every_s` and always ends with the final one.

    Args:
        unit: What is counted (`"rollouts"`, `"steps"`).
        total: How many there are, if known.
        mode: The display (see `progress_mode`).
        log_every_s: Least time between two plain lines.
        clock: Seconds, monotonic (tests give a fake one).
    """

    def __init__(self, unit: str, total: int | None, mode: Mode, log_every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.unit, self.total, self.mode, self.log_every_s = unit, total, mode, log_every_s
        self._clock = clock
        self._started = clock()
        self._logged = float("-inf")
        self._bar: Any = None
        self._lock = threading.Lock()
        #: The latest (completed, info) not yet printed, in `"log"` mode.
        self._held: tuple[int, str] | None = None
        self._timer: threading.Timer | None = None

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
            with self._lock:
                now = self._clock()
                if log_now or now - self._logged >= self.log_every_s or completed == self.total:
                    self._print(completed, info, now)
                    return
                self._held = (completed, info)
                if self._timer is None:
                    self._timer = threading.Timer(self._logged + self.log_every_s - now, self._flush)
                    self._timer.daemon = True
                    self._timer.start()

    def _print(self, completed: int, info: str, now: float) -> None:
        """Print one line (the lock held) and forget what was held."""
        self._logged, self._held = now, None
        of = f"/{self.total}" if self.total is not None else ""
        print(f"{self.unit} {completed}{of}  {info}  {now - self._started:.1f} s", file=sys.stderr, flush=True)

    def _flush(self) -> None:
        """Print the held count, if any (the timer's work, and the last thing `__exit__` does)."""
        with self._lock:
            self._timer = None
            if self._held is not None:
                self._print(*self._held, self._clock())

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
        timer = self._timer
        if timer is not None:
            timer.cancel()
        self._flush()
