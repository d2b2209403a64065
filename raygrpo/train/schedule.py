"""The training task schedule: which task each GRPO group runs, for one environment or a weighted mixture.

raygrpo owns the schedule, not TRL's sampler. In async mode the orchestrator must start groups before TRL asks
for them, so it cannot wait for TRL to pick the prompts; in sync mode the same schedule is used so both modes
train on the same task sequence. TRL's sampler only sets the shape of each batch (how many groups of G).

Environments are picked by smooth weighted round-robin (deterministic, and the shares of any window of groups are
within one group of the weights); within an environment, tasks run in a seeded random order, reshuffled each pass.
The state is one integer (groups scheduled so far): a schedule rebuilt with the same tasks, weights and seed and
advanced to that position continues exactly where the old one stopped.
"""

from __future__ import annotations

import random
from typing import Any

from raygrpo.core.types import TaskRef


class _EnvCycle:
    def __init__(self, tasks: list[TaskRef], seed: int) -> None:
        self.tasks = tasks
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def next(self) -> TaskRef:
        if not self.order:
            self.order = list(range(len(self.tasks)))
            self.rng.shuffle(self.order)
            self.order.reverse()  # pop() from the end yields the shuffled order front to back
        return self.tasks[self.order.pop()]


class TaskSchedule:
    """An endless, reproducible sequence of tasks, one per GRPO group.

    Args:
        tasks_by_env: Training tasks of each environment (environments with no tasks are an error).
        weights: Sampling weight per environment; None or missing names mean equal weights. Weight 0 leaves an
            environment out.
        seed: Seed of the per-environment task order.
    """

    def __init__(self, tasks_by_env: dict[str, list[TaskRef]], weights: dict[str, float] | None, seed: int) -> None:
        names = list(tasks_by_env)
        if not names:
            raise ValueError("the task schedule needs at least one environment")
        weights = {n: float((weights or {}).get(n, 1.0 if not weights else 0.0)) for n in names}
        self.weights = {n: w for n, w in weights.items() if w > 0}
        if not self.weights:
            raise ValueError("every environment has weight 0")
        empty = [n for n in self.weights if not tasks_by_env[n]]
        if empty:
            raise ValueError(f"environments {empty} have no training tasks")
        self._tasks_by_env = tasks_by_env
        self._seed = seed
        self._reset()

    def _reset(self) -> None:
        self._cycles = {
            n: _EnvCycle(self._tasks_by_env[n], self._seed * 1_000_003 + i) for i, n in enumerate(self.weights)
        }
        self._current = {n: 0.0 for n in self.weights}
        self.position = 0

    def _pick_env(self) -> str:
        total = sum(self.weights.values())
        for name, weight in self.weights.items():
            self._current[name] += weight
        name = max(self._current, key=lambda n: self._current[n])
        self._current[name] -= total
        return name

    def next(self) -> TaskRef:
        """The task of the next group."""
        task = self._cycles[self._pick_env()].next()
        self.position += 1
        return task

    def task_at(self, index: int) -> TaskRef:
        """The task of the group at `index` in the sequence (0 = the first), without moving this schedule."""
        replay = TaskSchedule(self._tasks_by_env, self.weights, self._seed)
        for _ in range(index):
            replay.next()
        return replay.next()

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (replays the schedule up to it)."""
        self._reset()
        for _ in range(int(state["position"])):
            self.next()
