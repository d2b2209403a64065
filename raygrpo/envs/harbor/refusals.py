"""Harbor tasks that a run cannot load or run, each named with why (`Refusal`), and the error that lists them all.

A suite is judged task by task: one task dir that Harbor's loader refuses (an invalid `task.toml`, a missing
`tests/test.sh`) or that the suite's backend cannot run (a separate verifier environment or compose services on the
local backend) must not hide the others. `raygrpo check` turns
each refusal into a verdict of its own (`status: refused`); `raygrpo rollout` and `train` fail at load with
`TaskRefusals`, which lists every refused task at once, so that finding four broken tasks takes one load, not five.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Refusal:
    """One task dir of a suite that cannot be loaded or run.

    Args:
        index: The task dir's position in the sorted suite (what `indices` selects).
        task_dir: The task folder (absolute).
        task: The task's name (its `[task] name` when task.toml could be read, else the folder's name).
        cause: Why, without the folder (`missing tests/test.sh`, `compose services are not run by ...`).
    """

    index: int
    task_dir: str
    task: str
    cause: str

    def __str__(self) -> str:
        return f"task dir {self.task_dir}: {self.cause}"


class TaskDirError(ValueError):
    """A task dir that cannot be loaded or run: `task_dir` and `cause` kept apart, so that a refusal can name the
    folder once."""

    def __init__(self, task_dir: object, cause: str, task: str | None = None) -> None:
        super().__init__(f"task dir {task_dir}: {cause}")
        self.task_dir = str(task_dir)
        self.cause = cause
        self.task = task


class TaskRefusals(ValueError):
    """Some task dirs of a suite cannot be loaded or run; the message lists every one (see the module docstring).

    Args:
        refusals: Each refused task dir, in the suite's order.
    """

    def __init__(self, refusals: list[Refusal]) -> None:
        self.refusals = list(refusals)
        lines = "\n".join(f"  - {r}" for r in self.refusals)
        super().__init__(f"{len(self.refusals)} task(s) of the suite cannot be run:\n{lines}")
