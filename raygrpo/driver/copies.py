"""Each rollout is scored once, however many copies of it ran: the first result wins, later ones are discarded.

A rollout can have two copies at once: when its actor goes silent (`workers.unreachable_after_s`) the orchestrator
runs it again elsewhere without waiting for Ray to declare the actor dead, and the silent actor's node may come back
and deliver its result after all. `RolloutCopies` tracks, per rollout id (group id, sample), how many copies are
queued, in flight or abandoned on a silent actor, and whether its final trajectory was given out, and decides what
each copy's trajectory is (`settle`):

- the rollout already has its final trajectory: the copy is a **duplicate**, discarded (counted in
  `duplicates_discarded` unless it is a copy raygrpo cancelled or an error made up for a lost actor: those carry no
  result);
- it failed for the infrastructure (or was cancelled) while another copy is still out: **superseded**, dropped, the
  other copy settles the rollout;
- it failed for the infrastructure, no copy is left, and the caller may retry: **retry** (one more copy counted);
- otherwise it is the rollout's **final** trajectory.

Plain bookkeeping, no Ray: the orchestrator feeds it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum

from raygrpo.core.types import Status, Trajectory

RolloutId = tuple[str, int]


class Verdict(str, Enum):
    """What a copy's trajectory is (see the module docstring)."""

    FINAL = "final"
    RETRY = "retry"
    SUPERSEDED = "superseded"
    DUPLICATE = "duplicate"


@dataclass
class RolloutCopies:
    """Copies of each rollout not yet settled, and which rollouts have their final trajectory."""

    #: Results discarded because their rollout already had its final trajectory.
    duplicates_discarded: int = 0
    _copies: Counter = field(default_factory=Counter)
    _final: set = field(default_factory=set)
    _open: set = field(default_factory=set)

    def add(self, rid: RolloutId) -> None:
        """One more copy of `rid` is queued."""
        self._copies[rid] += 1
        if rid not in self._final:
            self._open.add(rid)

    def drop(self, rid: RolloutId) -> None:
        """A copy of `rid` will never run nor report (taken off the queue)."""
        self._take(rid)

    def is_final(self, rid: RolloutId) -> bool:
        return rid in self._final

    def copies(self, rid: RolloutId) -> int:
        """Copies of `rid` still out."""
        return self._copies[rid]

    @property
    def open(self) -> int:
        """Rollouts with a copy out and no final trajectory yet."""
        return len(self._open)

    def settle(self, rid: RolloutId, traj: Trajectory, *, may_retry: bool, delivered: bool = True) -> Verdict:
        """What the trajectory of one copy of `rid` is (module docstring).

        Args:
            rid: The rollout.
            traj: The copy's trajectory.
            may_retry: Whether the caller would retry this failure (retries left, not a repeat of the last one).
            delivered: False for a trajectory the caller made up (its actor was lost): never counted as a duplicate.
        """
        self._take(rid)
        if rid in self._final:
            if delivered and traj.status is not Status.CANCELLED:
                self.duplicates_discarded += 1
            self._prune(rid)
            return Verdict.DUPLICATE
        failed = traj.status.is_infra_failure or traj.status is Status.CANCELLED
        if failed and self._copies[rid] > 0:
            return Verdict.SUPERSEDED
        if traj.status.is_infra_failure and may_retry:
            self._copies[rid] += 1
            return Verdict.RETRY
        self._final.add(rid)
        self._open.discard(rid)
        self._prune(rid)
        return Verdict.FINAL

    def clear(self) -> None:
        """Forget every rollout (the caller cancelled everything)."""
        self._copies.clear()
        self._final.clear()
        self._open.clear()

    def _take(self, rid: RolloutId) -> None:
        if self._copies[rid] > 0:
            self._copies[rid] -= 1

    def _prune(self, rid: RolloutId) -> None:
        """A final rollout with no copy out can get no more trajectories: forget it (training runs for long)."""
        if self._copies[rid] <= 0:
            self._copies.pop(rid, None)
            self._final.discard(rid)
