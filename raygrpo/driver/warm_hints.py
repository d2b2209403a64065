"""Telling env pool actors that keep a warm pool which rollouts come to them next, so their sandboxes start ahead.

The orchestrator owns one `WarmHints` and calls it at four points: `claim` when rollouts are enqueued (a rollout of
a task an actor was told of ahead goes to that actor), `tell` after each dispatch (queued rollouts, then foreseen
tasks, are told to warm actors with room to be told), `dispatched` when a told rollout leaves the queue, and
`forget_queued` when the queue is dropped. `foresee` records tasks the caller will enqueue later (sync training: the
next step's groups). Each actor is told at most `PoolSlot.tell_limit` rollouts not dispatched yet, each rollout to
the actor with the least in flight and told, a group's rollouts told to one actor next to each other (so that they
go to it in one call). Telling is a hint only: a told rollout goes to the actor told when it has room, else to
another, where its sandbox starts cold.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from raygrpo.core.types import TaskRef
from raygrpo.driver.pools import PoolSet, PoolSlot

#: Seconds a task told to an actor ahead (`WarmHints.foresee`) is held for it before it is forgotten.
FORETOLD_TTL_S = 600.0


class Hinted(Protocol):
    """A queued rollout as the hints see it (`RolloutRequest`): its task, its group, and the actor told it comes
    (None: none was)."""

    task: TaskRef
    group_id: str
    hint: str | None


@dataclass
class _Foretold:
    """A foreseen task told to an actor, waiting to be enqueued: its key, the actor's name, when (monotonic)."""

    key: tuple[str, str, int]
    slot: str
    at: float


def _task_key(task: TaskRef) -> tuple[str, str, int]:
    return (task.env, task.split, task.index)


def _contiguous(slots: list[PoolSlot | None]) -> list[PoolSlot | None]:
    """`slots` (what least-busy telling chose for each rollout of a group, in order) reordered so that each actor's
    come one after another, in the order of their first choice, and the rollouts no actor could be told of come
    last: as many rollouts told to each actor as before, but adjacent in the queue, so that dispatch sends them in
    one call."""
    first: dict[str | None, int] = {}
    for i, slot in enumerate(slots):
        first.setdefault(None if slot is None else slot.name, i)
    return sorted(slots, key=lambda s: len(slots) if s is None else first[s.name])


class WarmHints:
    """Which warm actors were told of which queued rollouts and foreseen tasks (see the module docstring).

    Calls are not locked here: the orchestrator makes them under its pools' lock.

    Args:
        pools: The run's env pools: which actors keep a warm pool, and their room to be told.
        ttl_s: Seconds a task told ahead is held for its actor before it is forgotten.
        clock: Monotonic seconds (a test may pass its own).
    """

    def __init__(self, pools: PoolSet, ttl_s: float = FORETOLD_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pools = pools
        self.ttl_s = ttl_s
        self.clock = clock
        #: Per actor name: queued rollouts it was told come to it next and that were not dispatched yet.
        self._told: Counter[str] = Counter()
        #: Tasks the caller will enqueue later, not told to an actor yet; and those told, not enqueued yet.
        self._foreseen: deque[TaskRef] = deque()
        self._foretold: list[_Foretold] = []

    def told(self, actor: str) -> int:
        """Queued rollouts told to `actor` that were not dispatched yet."""
        return self._told[actor]

    def foretold(self, actor: str) -> int:
        """Foreseen tasks told to `actor` whose rollouts were not enqueued yet."""
        return sum(1 for f in self._foretold if f.slot == actor)

    @property
    def foreseen(self) -> list[TaskRef]:
        """Foreseen tasks not told to any actor yet (waiting for one with room to be told)."""
        return list(self._foreseen)

    def assign(self, request: Hinted, actor: str) -> None:
        """Mark the queued `request` as told to `actor`: dispatch gives it to that actor when it has room."""
        request.hint = actor
        self._told[actor] += 1

    def dispatched(self, actor: str, n: int) -> None:
        """`n` rollouts told to `actor` left the queue (dispatched)."""
        self._told[actor] -= n

    def forget_queued(self) -> None:
        """The queue was dropped: its told rollouts come to no actor. Foreseen tasks stay (they are about what the
        caller enqueues next)."""
        self._told.clear()

    def claim(self, requests: Iterable[Hinted]) -> None:
        """Rollouts about to be enqueued: each of a task told to an actor ahead (`foresee`) is assigned to that
        actor."""
        if not self._foretold:
            return
        for request in requests:
            if request.hint is None:
                key = _task_key(request.task)
                match = next((f for f in self._foretold if f.key == key), None)
                if match is not None:
                    self._foretold.remove(match)
                    self.assign(request, match.slot)

    def foresee(self, tasks: Iterable[TaskRef]) -> None:
        """Tasks the caller will enqueue after what is queued now; the next `tell` tells warm actors of them, after
        the queued rollouts. Replaces what was foreseen and not told yet."""
        self._foreseen = deque(tasks)

    def tell(self, queue: Sequence[Hinted], queued_envs: int) -> None:
        """Tell warm actors which rollouts come to them next: those of `queue` not told yet, in queue order, then the
        foreseen tasks, while actors have room to be told (`prewarm` calls, one per actor). Told tasks not enqueued
        within `ttl_s` are forgotten first.

        Args:
            queue: The queued rollouts, in dispatch order (their `hint` is set as they are told).
            queued_envs: How many environments have queued rollouts (telling stops once none of them has an actor
                with room to be told).
        """
        if not (queue or self._foreseen) or not self.pools.keeps_warm():
            return
        now = self.clock()
        if self._foretold and self._foretold[0].at < now - self.ttl_s:
            self._foretold = [f for f in self._foretold if f.at >= now - self.ttl_s]
        told_n = Counter(self._told)
        told_n.update(f.slot for f in self._foretold)
        room: dict[str, list[PoolSlot]] = {}
        told: dict[str, tuple[PoolSlot, list[TaskRef]]] = {}

        def slot_for(env: str) -> PoolSlot | None:
            slots = room.get(env)
            if slots is None:
                slots = room[env] = [s for s in self.pools.warm_slots(env) if told_n[s.name] < s.tell_limit]
            if not slots:
                return None
            slot = min(slots, key=lambda s: told_n[s.name] + s.in_flight)
            told_n[slot.name] += 1
            if told_n[slot.name] >= slot.tell_limit:
                slots.remove(slot)
            return slot

        def tell_run(run: list[Hinted]) -> None:
            for request, slot in zip(run, _contiguous([slot_for(r.task.env) for r in run])):
                if slot is not None:
                    self.assign(request, slot.name)
                    told.setdefault(slot.name, (slot, []))[1].append(request.task)

        run: list[Hinted] = []
        for request in queue:
            if run and (request.hint is not None or request.group_id != run[0].group_id
                        or request.task.env != run[0].task.env):
                tell_run(run)
                run = []
                if len(room) >= queued_envs and not any(room.values()):
                    break  # no actor has room to be told more
            if request.hint is None:
                run.append(request)
        tell_run(run)
        untold: deque[TaskRef] = deque()
        tasks = list(self._foreseen)
        i = 0
        while i < len(tasks):
            j = i + 1
            while j < len(tasks) and _task_key(tasks[j]) == _task_key(tasks[i]):
                j += 1
            for task, slot in zip(tasks[i:j], _contiguous([slot_for(t.env) for t in tasks[i:j]])):
                if slot is None:
                    untold.append(task)
                    continue
                self._foretold.append(_Foretold(_task_key(task), slot.name, now))
                told.setdefault(slot.name, (slot, []))[1].append(task)
            i = j
        self._foreseen = untold
        for slot, tasks in told.values():
            slot.handle.prewarm.remote(tasks)
