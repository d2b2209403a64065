"""Dispatching rollouts over env pool actors, retrying infrastructure failures, streaming results as they finish.

The orchestrator lives on the driver (in training, in the learner). It keeps at most K rollouts in flight per actor
and gives each new rollout to the actor with the fewest in flight, so a slow sandbox on one actor does not hold the
others back. The actors come from the run's env pools (`raygrpo.driver.pools.PoolSet`), which it ticks as it dispatches:
they grow while rollouts queue up, drain idle actors, and replace lost ones (an actor or its node that died or was
cut off: its rollouts are retried on the others). Every
requested rollout ends as exactly one yielded trajectory: scored, or unscored with its status. A rollout that failed
for an infrastructure reason (env or policy error, a dead actor) is run again, at most `max_retries` times, unless
its retry failed exactly as the attempt before it (same exception type and message): a failure that repeats
identically is not a passing glitch, and retrying it again only costs time.

Rollouts of one group queued one after another go to an actor in one call (`EnvPool.run_many`) and come back
together once the last of them ends: one Ray call per group instead of one per rollout, which was most of raygrpo's
own CPU per rollout with remote sandboxes (benchmarks/README.md), and GRPO uses a group only once it is complete. A
call takes at most the actor's room; while the queue fits in the actors' room a group is shared between the actors
that have room, as dispatching rollout by rollout would, instead of filling one of them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, TaskCancelledError

from raygrpo.driver.pools import PoolSet, PoolSlot
from raygrpo.driver.pools.metrics import PoolMetricsLog
from raygrpo.core.types import RolloutCall, Status, TaskRef, Trajectory

logger = logging.getLogger(__name__)


@dataclass
class RolloutRequest:
    """One rollout to run: a task, the group it belongs to, its index in the group, which attempt this is, the
    lowest policy version it may generate with (`SamplingParams.min_version`), how its last attempt failed, a
    built-in acting policy (`"oracle"`, `"noop"`) to run it with instead of the run's (None: the run's), and the
    actor told it comes next (its warm pool starts the sandbox ahead; None: none was)."""

    task: TaskRef
    group_id: str
    sample: int = 0
    attempt: int = 0
    min_version: int = 0
    last_error: str | None = None
    policy: str | None = None
    hint: str | None = None


@dataclass(frozen=True)
class Route:
    """What one env pool actor takes: the environments it serves (None: every one) and how many rollouts at once
    (None: the orchestrator's `max_in_flight_per_actor`)."""

    envs: frozenset[str] | None = None
    capacity: int | None = None


@dataclass
class DispatchStats:
    """Counts kept while dispatching."""

    dispatched: int = 0
    retried: int = 0
    failed_attempts: list[Trajectory] = field(default_factory=list)
    #: Every attempt that ended, by status (retried ones included).
    by_status: Counter = field(default_factory=Counter)
    #: Attempts that ended because their actor (or its node) was lost.
    lost_to_actors: int = 0


#: Seconds a task told to an actor ahead (`Orchestrator.foresee`) is held for it before it is forgotten.
FORETOLD_TTL_S = 600.0


@dataclass
class _Foretold:
    """A foreseen task told to an actor, waiting to be enqueued: its key, the actor's name, when (monotonic)."""

    key: tuple[str, str, int]
    slot: str
    at: float


def _contiguous(slots: list[PoolSlot | None]) -> list[PoolSlot | None]:
    """`slots` (what least-busy telling chose for each rollout of a group, in order) reordered so that each actor's
    come one after another, in the order of their first choice, and the rollouts no actor could be told of come last:
    as many rollouts told to each actor as before, but adjacent in the queue, so that `_batch` sends them in one call."""
    first: dict[str | None, int] = {}
    for i, slot in enumerate(slots):
        first.setdefault(None if slot is None else slot.name, i)
    return sorted(slots, key=lambda s: len(slots) if s is None else first[s.name])


def _task_key(task: TaskRef) -> tuple[str, str, int]:
    return (task.env, task.split, task.index)


def make_groups(tasks: Iterable[TaskRef], group_size: int, min_version: int = 0) -> list[RolloutRequest]:
    """Repeat each task `group_size` times as one group (adjacent, so the group finishes together)."""
    requests = []
    for task in tasks:
        group_id = f"{task.env}:{task.split}:{task.index}:{uuid.uuid4().hex[:8]}"
        requests.extend(
            RolloutRequest(task, group_id, sample, min_version=min_version) for sample in range(group_size)
        )
    return requests


class Orchestrator:
    """Streams trajectories of the requested rollouts from a set of env pool actors.

    Args:
        actors: Env pool actor handles (`EnvPoolActor`), with their names: a fixed pool. Not with `pools`.
        max_in_flight_per_actor: Rollouts in flight per actor (K) for `actors`; more wait on the driver.
        max_retries: Retries of one rollout after an infrastructure failure.
        on_failed_attempt: Called with the trajectory of each attempt that failed and will be retried.
        routes: For `actors`: per actor name, the environments it serves and its capacity; actors not listed serve
            every environment, `max_in_flight_per_actor` at a time.
        pools: The run's env pools (`RolloutRuntime.pools`), possibly shared with other orchestrators.
    """

    def __init__(
        self,
        actors: list[tuple[str, Any]] | None = None,
        max_in_flight_per_actor: int = 64,
        max_retries: int = 2,
        on_failed_attempt: Callable[[Trajectory], None] | None = None,
        routes: dict[str, Route] | None = None,
        *,
        pools: PoolSet | None = None,
    ) -> None:
        if pools is None:
            if not actors:
                raise ValueError("the orchestrator needs at least one env pool actor")
            pools = PoolSet.of_actors(actors, max_in_flight_per_actor, routes)
        elif actors:
            raise ValueError("give the orchestrator actors or pools, not both")
        self.pools = pools
        self.max_retries = max_retries
        self.on_failed_attempt = on_failed_attempt
        self.stats = DispatchStats()
        #: Per call in flight: its actor and its rollouts.
        self._pending: dict[Any, tuple[PoolSlot, list[RolloutRequest]]] = {}
        self._queue: deque[RolloutRequest] = deque()
        self._queued: Counter[str] = Counter()
        #: Per actor name: queued rollouts it was told come to it next and that were not dispatched yet.
        self._told: Counter[str] = Counter()
        #: Tasks the caller will enqueue later (`foresee`), not told to an actor yet; and those told, not enqueued yet.
        self._foreseen: deque[TaskRef] = deque()
        self._foretold: list[_Foretold] = []

    @property
    def in_flight(self) -> int:
        """Rollouts running on the actors."""
        return sum(len(batch) for _, batch in self._pending.values())

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _submit(self, slot: PoolSlot, batch: list[RolloutRequest]) -> None:
        ref = slot.handle.run_many.remote([
            RolloutCall(r.task, r.group_id, r.attempt, r.sample, r.min_version, r.policy) for r in batch
        ])
        slot.take(len(batch))
        self._pending[ref] = (slot, batch)
        self.stats.dispatched += len(batch)

    @property
    def outstanding(self) -> int:
        """Rollouts enqueued or in flight whose final trajectory has not been returned yet."""
        return len(self._queue) + self.in_flight

    def enqueue(self, requests: Iterable[RolloutRequest]) -> None:
        """Add rollouts to run; `poll` dispatches them as actors have room.

        Raises:
            ValueError: A rollout's environment is served by none of the pools.
        """
        requests = list(requests)
        for env in {r.task.env for r in requests}:
            if not self.pools.serves(env):
                raise ValueError(f"no env pool actor serves environment {env!r}")
        if self._foretold:  # rollouts of tasks an actor was told of ahead go to that actor when it has room
            for request in requests:
                if request.hint is None:
                    key = _task_key(request.task)
                    match = next((f for f in self._foretold if f.key == key), None)
                    if match is not None:
                        self._foretold.remove(match)
                        request.hint = match.slot
                        self._told[match.slot] += 1
        self._queue.extend(requests)
        self._queued.update(r.task.env for r in requests)

    def foresee(self, tasks: Iterable[TaskRef]) -> None:
        """Tasks the caller will enqueue after what is queued now (sync training: the next step's groups, which the
        schedule knows): actors that keep a warm pool are told of them too, after the queued rollouts, so their
        sandboxes start while this batch runs; once enqueued, each goes to the actor told when it has room.
        Replaces what was foreseen and not told yet; told tasks not enqueued within `FORETOLD_TTL_S` are forgotten."""
        with self.pools.lock:
            self._foreseen = deque(tasks)
            self._hint()

    def expect(self, per_env: dict[str, int]) -> None:
        """Tell the pools how many rollouts per environment the caller will keep asking for (async training's
        look-ahead), so they are not drained between the caller's bursts."""
        self.pools.expect(per_env)

    def _tick(self) -> None:
        self.pools.report(self, {env: n for env, n in self._queued.items() if n})
        self.pools.tick()

    def poll(self, timeout: float = 1.0) -> list[Trajectory]:
        """Dispatch what fits, wait up to `timeout` seconds for results, and return the final trajectories that came
        back (possibly none). Failed attempts with retries left go back to the front of the queue instead."""
        with self.pools.lock:
            self._tick()
            self._dispatch()
            self._hint()
            wake = self.pools.wait_refs()
        if not self._pending:
            if self._queue:
                stuck = sorted(env for env, n in self._queued.items() if n and not self.pools.can_run(env))
                if stuck:
                    raise RuntimeError(f"every env pool actor serving {', '.join(stuck)} has died; cannot run the "
                                       f"remaining {len(self._queue)} rollout(s)")
                if wake:  # waiting for actors to start
                    ray.wait(wake, num_returns=1, timeout=timeout)
                else:
                    time.sleep(min(timeout, 0.1))
            return []
        ready, _ = ray.wait(list(self._pending) + wake, num_returns=1, timeout=timeout)
        if ready:  # collect everything else that is already done too
            ready, _ = ray.wait(list(self._pending), num_returns=len(self._pending), timeout=0)
        finals: list[Trajectory] = []
        done: list[tuple[RolloutRequest, Trajectory]] = []
        for ref in ready:
            slot, batch = self._pending.pop(ref)
            with self.pools.lock:
                slot.release(len(batch))
            done.extend(zip(batch, self._results(ref, slot, batch)))
        for request, traj in done:
            self.stats.by_status[traj.status.value] += 1
            self.pools.metrics.record_attempt(traj.status.value)
            if self._retry(request, traj):
                self.stats.retried += 1
                self.stats.failed_attempts.append(traj)
                if self.on_failed_attempt is not None:
                    self.on_failed_attempt(traj)
                self._queue.appendleft(dataclasses.replace(request, attempt=request.attempt + 1, last_error=traj.error,
                                                           hint=None))
                self._queued[request.task.env] += 1
                continue
            finals.append(traj)
        return finals

    def _dispatch(self) -> None:
        """Give queued rollouts, in order, to the least busy actor serving their environment; a rollout whose
        actors are all full waits without holding back those of other environments."""
        held: deque[RolloutRequest] = deque()
        full: set[str] = set()
        while self._queue and self.pools.has_room():
            request = self._queue.popleft()
            env = request.task.env
            slot = None if env in full else self.pools.free_slot(env, prefer=request.hint)
            if slot is None:
                full.add(env)
                held.append(request)
                if full >= {e for e, n in self._queued.items() if n}:  # every queued environment is full
                    break
                continue
            batch = self._batch(request, slot)
            self._queued[env] -= len(batch)
            if request.hint is not None:
                self._told[request.hint] -= len(batch)
            self._submit(slot, batch)
        self._queue.extendleft(reversed(held))

    def _batch(self, request: RolloutRequest, slot: PoolSlot) -> list[RolloutRequest]:
        """`request` and the queued rollouts right behind it of its group told to the same actor (if any), as many as
        `slot` takes in one call: up to its room, and while the queue of their environment fits in the room of its
        actors (they will not all fill), the share of them that rollout-by-rollout dispatch would give it."""
        room = slot.room
        run = 1
        for other in self._queue:
            if run >= room or other.group_id != request.group_id or other.hint != request.hint:
                break
            run += 1
        if run == 1:
            return [request]
        env = request.task.env
        if request.hint is None and self._queued[env] < self.pools.room(env):
            run = max(1, self.pools.share(env, slot, run))
        return [request, *(self._queue.popleft() for _ in range(run - 1))]

    def _hint(self) -> None:
        """Tell actors that keep a warm pool which rollouts come to them next: the queued ones in queue order, then the
        foreseen tasks, at most `PoolSlot.tell_limit` per actor not dispatched yet, each to the actor with the least
        in flight and told, the rollouts of a group told to one actor next to each other (so that they go to it in
        one call). It starts their sandboxes ahead, and `_dispatch` gives the rollout to it when it has room (else to
        another, where it starts cold)."""
        if not (self._queue or self._foreseen) or not self.pools.keeps_warm():
            return
        now = time.monotonic()
        if self._foretold and self._foretold[0].at < now - FORETOLD_TTL_S:
            self._foretold = [f for f in self._foretold if f.at >= now - FORETOLD_TTL_S]
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

        def tell(run: list[RolloutRequest]) -> None:
            for request, slot in zip(run, _contiguous([slot_for(r.task.env) for r in run])):
                if slot is not None:
                    request.hint = slot.name
                    self._told[slot.name] += 1
                    told.setdefault(slot.name, (slot, []))[1].append(request.task)

        queued_envs = sum(1 for n in self._queued.values() if n)
        run: list[RolloutRequest] = []
        for request in self._queue:
            if run and (request.hint is not None or request.group_id != run[0].group_id
                        or request.task.env != run[0].task.env):
                tell(run)
                run = []
                if len(room) >= queued_envs and not any(room.values()):
                    break  # no actor has room to be told more
            if request.hint is None:
                run.append(request)
        tell(run)
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

    def _retry(self, request: RolloutRequest, traj: Trajectory) -> bool:
        """Whether to run a failed attempt again: an infrastructure failure, retries left, and not the same failure
        as the attempt before it."""
        if not traj.status.is_infra_failure or request.attempt >= self.max_retries:
            return False
        if request.last_error is not None and traj.error == request.last_error:
            logger.info("%s/%s failed again as before (%s); not retried", request.task.env, request.task.index,
                        traj.error)
            return False
        return True

    def run(self, requests: Iterable[RolloutRequest], stop: threading.Event | None = None,
            on_poll: Callable[[Orchestrator], None] | None = None) -> Iterator[Trajectory]:
        """Yield one final trajectory per request, in completion order.

        Closing the generator early, setting `stop` (checked at least once a second, from any thread), or an
        exception such as KeyboardInterrupt while it waits cancels the rollouts still in flight; each closes its
        environment as it unwinds. `on_poll` is called after every poll (at least once a second), e.g. to log the
        pools' sizes.
        """
        self.enqueue(requests)
        try:
            while self.outstanding and not (stop is not None and stop.is_set()):
                yield from self.poll(timeout=1.0)
                if on_poll is not None:
                    on_poll(self)
        finally:
            self.cancel()

    def _results(self, ref: Any, slot: PoolSlot, batch: list[RolloutRequest]) -> list[Trajectory]:
        """The trajectories of one call, one per rollout in `batch`; unscored ones with the call's error if it failed."""
        try:
            return ray.get(ref)
        except RayActorError as exc:
            # Died, OOM-killed, its node died or is cut off: forgotten and killed for good, so a partitioned actor
            # that comes back cannot deliver these rollouts too; the pool starts a replacement.
            self.pools.lost(slot, exc)
            self.stats.lost_to_actors += len(batch)
            status, error = Status.ENV_ERROR, f"env pool actor {slot.name} died"
        except TaskCancelledError:
            status, error = Status.CANCELLED, "cancelled"
        except Exception as exc:  # noqa: BLE001 - a task that raised: report, do not lose the rollout
            logger.warning("rollout on %s raised: %s", slot.name, exc)
            status, error = Status.ENV_ERROR, f"{type(exc).__name__}: {exc}"[:500]
        return [Trajectory(task=r.task, status=status, error=error, group_id=r.group_id, sample=r.sample,
                           attempt=r.attempt, worker=slot.name) for r in batch]

    def log_pools(self, log: PoolMetricsLog, force: bool = False) -> None:
        """Write the pools' figures and this orchestrator's to `log` (at most once per its interval)."""
        log.write(self.pools.snapshot(), queued=self.queued, in_flight=self.in_flight,
                  by_status=dict(self.stats.by_status), force=force)

    def cancel(self) -> None:
        """Cancel every rollout still in flight and forget the queued ones."""
        self._queue.clear()
        self._queued.clear()
        self._told.clear()  # what was foreseen stays: it is about what the caller enqueues next
        for ref, (slot, batch) in list(self._pending.items()):
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001
                pass
            with self.pools.lock:
                slot.release(len(batch))
        self._pending.clear()
        self.pools.report(self, {})
