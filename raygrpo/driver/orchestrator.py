"""Dispatching rollouts over env pool actors, retrying infrastructure failures, streaming results as they finish.

The orchestrator lives on the driver (in training, in the learner). It keeps at most K rollouts in flight per actor
and gives each new rollout to the actor with the fewest in flight, so a slow sandbox on one actor does not hold the
others back. The actors come from the run's env pools (`raygrpo.driver.pools.PoolSet`), which it ticks as it dispatches:
they grow while rollouts queue up, drain idle actors, and replace lost ones (an actor or its node that died or was
cut off: its rollouts are retried on the others). Every
requested rollout ends as exactly one yielded trajectory: scored, or unscored with its status. A rollout that failed
for an infrastructure reason (env or policy error, a dead actor) is run again, within `max_retries`, by the rule of
`raygrpo.driver.attempts` (which also defines the requests: `RolloutRequest`, `make_groups`).

An actor that stops answering the pools' probes for `workers.unreachable_after_s` (its node cut off, its raylet
dead) is `unreachable`: its calls in flight are abandoned (its room released, their rollouts queued again at the
front, as retries) without waiting for Ray to declare it dead, which takes ~30 s by default. An abandoned call is
still watched: if the node comes back and delivers it, each rollout is scored once all the same, the first
trajectory that settles it wins and later copies are discarded and counted (`duplicates_discarded`;
`raygrpo.driver.copies`). Once every rollout of a call in flight (abandoned or not) has its final trajectory the call
is cancelled, so the actor closes those sandboxes; queued copies of it are dropped.

Rollouts of one group queued one after another go to an actor in one call (`EnvPool.run_many`) and come back
together once the last of them ends: one Ray call per group instead of one per rollout, which was most of raygrpo's
own CPU per rollout with remote sandboxes (benchmarks/README.md), and GRPO uses a group only once it is complete. A
call takes at most the actor's room; while the queue fits in the actors' room a group is shared between the actors
that have room, as dispatching rollout by rollout would, instead of filling one of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, TaskCancelledError

from raygrpo.core.types import RolloutCall, Status, TaskRef, Trajectory
from raygrpo.driver.attempts import RolloutRequest, next_attempt, should_retry, unscored_attempts
from raygrpo.driver.copies import RolloutCopies, RolloutId, Verdict
from raygrpo.driver.pools import PoolSet, PoolSlot, SlotState
from raygrpo.driver.pools.ray_metrics import PoolMetricsLog
from raygrpo.driver.warm_hints import WarmHints

logger = logging.getLogger(__name__)


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
    #: Rollouts in flight on an actor that went unreachable, run again elsewhere (also counted in `lost_to_actors`,
    #: and in `retried` when queued again).
    abandoned: int = 0
    #: Results discarded because their rollout already had its final trajectory (see `raygrpo.driver.copies`).
    duplicates_discarded: int = 0


class Orchestrator:
    """Streams trajectories of the requested rollouts from a run's env pool actors.

    Args:
        pools: The run's env pools (`RolloutRuntime.pools`, or `PoolSet.of_actors` for actors that already exist),
            possibly shared with other orchestrators.
        max_retries: Retries of one rollout after an infrastructure failure.
        on_failed_attempt: Called with the trajectory of each attempt that failed and will be retried.
    """

    def __init__(self, pools: PoolSet, max_retries: int = 2,
                 on_failed_attempt: Callable[[Trajectory], None] | None = None) -> None:
        self.pools = pools
        self.max_retries = max_retries
        self.on_failed_attempt = on_failed_attempt
        self.stats = DispatchStats()
        #: Which warm actors were told of which queued rollouts and foreseen tasks.
        self.hints = WarmHints(pools)
        #: Per call in flight: its actor and its rollouts.
        self._pending: dict[Any, tuple[PoolSlot, list[RolloutRequest]]] = {}
        #: Calls on actors that went unreachable: their rollouts were queued again; watched for late results.
        self._abandoned: dict[Any, tuple[PoolSlot, list[RolloutRequest]]] = {}
        #: Calls cancelled because every rollout of theirs was already settled.
        self._cancelled: set[Any] = set()
        #: Copies of each rollout out, and which have their final trajectory.
        self.copies = RolloutCopies()
        #: The finished rollouts of the calls the last `cancel` cut short (see `_salvage`).
        self.salvaged: list[Trajectory] = []
        self._queue: deque[RolloutRequest] = deque()
        self._queued: Counter[str] = Counter()

    @property
    def in_flight(self) -> int:
        """Rollouts running on the actors."""
        return sum(len(batch) for _, batch in self._pending.values())

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _submit(self, slot: PoolSlot, batch: list[RolloutRequest]) -> None:
        ref = slot.handle.run_many.remote([
            RolloutCall(r.task, r.group_id, r.attempt, r.sample, r.min_version, r.policy, r.seed_key) for r in batch
        ])
        slot.take(len(batch))
        self._pending[ref] = (slot, batch)
        self.stats.dispatched += len(batch)

    @property
    def outstanding(self) -> int:
        """Rollouts enqueued or in flight whose final trajectory has not been returned yet."""
        return self.copies.open

    def enqueue(self, requests: Iterable[RolloutRequest]) -> None:
        """Add rollouts to run; `poll` dispatches them as actors have room.

        Raises:
            ValueError: A rollout's environment is served by none of the pools.
        """
        requests = list(requests)
        for env in {r.task.env for r in requests}:
            if not self.pools.serves(env):
                raise ValueError(f"no env pool actor serves environment {env!r}")
        self.hints.claim(requests)  # rollouts of tasks an actor was told of ahead go to that actor when it has room
        for request in requests:
            self.copies.add(request.rid)
        self._queue.extend(requests)
        self._queued.update(r.task.env for r in requests)

    def foresee(self, tasks: Iterable[TaskRef]) -> None:
        """Tasks the caller will enqueue after what is queued now (sync training: the next step's groups, which the
        schedule knows): actors that keep a warm pool are told of them too, after the queued rollouts, so their
        sandboxes start while this batch runs; once enqueued, each goes to the actor told when it has room.
        Replaces what was foreseen and not told yet; told tasks not enqueued within `FORETOLD_TTL_S` are forgotten
        (see `raygrpo.driver.warm_hints`)."""
        with self.pools.lock:
            self.hints.foresee(tasks)
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
            self._abandon_unreachable()
            self.dispatch()
            wake = self.pools.wait_refs()
        calls = [*self._pending, *self._abandoned]
        if not calls:
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
        ready, _ = ray.wait(calls + wake, num_returns=1, timeout=timeout)
        if ready:  # collect everything else that is already done too
            ready, _ = ray.wait(calls, num_returns=len(calls), timeout=0)
        finals: list[Trajectory] = []
        done: list[tuple[RolloutRequest, Trajectory, bool]] = []
        for ref in ready:
            self._cancelled.discard(ref)
            abandoned = ref in self._abandoned
            slot, batch = self._abandoned.pop(ref) if abandoned else self._pending.pop(ref)
            if not abandoned:
                with self.pools.lock:
                    slot.release(len(batch))
            trajs, delivered = self._results(ref, slot, batch, abandoned)
            done.extend((request, traj, delivered) for request, traj in zip(batch, trajs))
        settled: set[RolloutId] = set()
        for request, traj, delivered in done:
            self.stats.by_status[traj.status.value] += 1
            self.pools.metrics.record_attempt(traj.status.value)
            may_retry = should_retry(request, traj, self.max_retries)
            verdict = self.copies.settle(request.rid, traj, may_retry=may_retry, delivered=delivered)
            if verdict is Verdict.DUPLICATE:
                logger.info("%s/%s: a later copy (attempt %d, %s, %s) discarded: the rollout was already settled",
                            request.group_id, request.sample, request.attempt, traj.worker, traj.status.value)
                continue
            if verdict is Verdict.SUPERSEDED:  # another copy of it is still out and settles it
                continue
            if verdict is Verdict.RETRY:
                self.stats.retried += 1
                self.stats.failed_attempts.append(traj)
                if self.on_failed_attempt is not None:
                    self.on_failed_attempt(traj)
                self._queue.appendleft(next_attempt(request, traj.error))
                self._queued[request.task.env] += 1
                continue
            finals.append(traj)
            if self.copies.copies(request.rid):
                settled.add(request.rid)
        self.stats.duplicates_discarded = self.copies.duplicates_discarded
        if settled:
            self._drop_settled_copies(settled)
        return finals

    def _abandon_unreachable(self) -> None:
        """Abandon the calls in flight on actors that went unreachable: release their room and queue their rollouts
        again at the front (within `max_retries`); the calls stay watched for late results (module docstring)."""
        for ref, (slot, batch) in list(self._pending.items()):
            if slot.state is not SlotState.UNREACHABLE:
                continue
            del self._pending[ref]
            slot.release(len(batch))
            self._abandoned[ref] = (slot, batch)
            self.stats.abandoned += len(batch)
            self.stats.lost_to_actors += len(batch)
            again = [r for r in batch if r.attempt < self.max_retries and not self.copies.is_final(r.rid)]
            for request in reversed(again):
                self.copies.add(request.rid)
                self._queue.appendleft(next_attempt(request, f"env pool actor {slot.name} unreachable"))
                self._queued[request.task.env] += 1
            self.stats.retried += len(again)
            logger.warning("%d of %d rollout(s) on unreachable env pool actor %s queued again (%d had no retry left "
                           "and wait for it, at most until it is killed: workers.unreachable_after_s + "
                           "rollout.rollout_timeout_s of silence)", len(again), len(batch), slot.name,
                           len(batch) - len(again))

    def _drop_settled_copies(self, settled: set[RolloutId]) -> None:
        """Rollouts in `settled` just got their final trajectory while other copies were out: drop their queued
        copies, and cancel every call in flight whose rollouts are all settled (the actor closes their sandboxes)."""
        kept: deque[RolloutRequest] = deque()
        for request in self._queue:
            if request.rid in settled:
                self.copies.drop(request.rid)
                self._queued[request.task.env] -= 1
            else:
                kept.append(request)
        self._queue = kept
        for ref, (slot, batch) in [*self._pending.items(), *self._abandoned.items()]:
            if ref not in self._cancelled and all(self.copies.is_final(r.rid) for r in batch):
                self._cancelled.add(ref)
                logger.info("cancelling a call of %d settled rollout(s) on %s", len(batch), slot.name)
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001 - already done, or its actor is gone
                    pass

    def dispatch(self) -> None:
        """Give queued rollouts to actors with room, and tell warm actors which come to them next, without waiting
        for results (what `poll` does before it waits)."""
        with self.pools.lock:
            self._dispatch()
            self._hint()

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
                self.hints.dispatched(request.hint, len(batch))
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
        """Tell warm actors which queued rollouts and foreseen tasks come to them next (`WarmHints.tell`)."""
        self.hints.tell(self._queue, sum(1 for n in self._queued.values() if n))

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

    def _results(self, ref: Any, slot: PoolSlot, batch: list[RolloutRequest],
                 abandoned: bool = False) -> tuple[list[Trajectory], bool]:
        """The trajectories of one call, one per rollout in `batch`, and whether the actor delivered them; unscored
        ones with the call's error if it failed (not delivered)."""
        try:
            return ray.get(ref), True
        except RayActorError as exc:
            # Died, OOM-killed, its node died or is cut off: forgotten and killed for good, so a partitioned actor
            # that comes back cannot deliver these rollouts too; the pool starts a replacement. An abandoned call's
            # rollouts were counted lost when it was abandoned.
            self.pools.lost(slot, exc)
            if not abandoned:
                self.stats.lost_to_actors += len(batch)
            status, error = Status.ENV_ERROR, f"env pool actor {slot.name} died"
        except TaskCancelledError:
            status, error = Status.CANCELLED, "cancelled"
        except Exception as exc:  # noqa: BLE001 - a task that raised: report, do not lose the rollout
            logger.warning("rollout on %s raised: %s", slot.name, exc)
            status, error = Status.ENV_ERROR, f"{type(exc).__name__}: {exc}"[:500]
        return unscored_attempts(batch, slot.name, status, error), False

    def log_pools(self, log: PoolMetricsLog, force: bool = False) -> None:
        """Write the pools' figures and this orchestrator's to `log` (at most once per its interval)."""
        log.write(self.pools.snapshot(), queued=self.queued, in_flight=self.in_flight,
                  by_status=dict(self.stats.by_status), force=force)

    def _salvage(self, timeout_s: float = 5.0) -> list[Trajectory]:
        """The rollouts that calls in flight have already finished, asked of their actors (for `timeout_s` at most)
        before the calls are cancelled: a group's rollouts go out in one call, cancelled whole."""
        wanted = {(r.group_id, r.sample, r.attempt): r.rid for _, batch in self._pending.values() for r in batch
                  if not self.copies.is_final(r.rid)}
        if not wanted:
            return []
        slots = {id(slot): slot for slot, _ in self._pending.values()}
        refs = [slot.handle.finished_in_flight.remote() for slot in slots.values()]
        try:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            found = [t for ref in ready for t in ray.get(ref)]
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001  (a second Ctrl-C: cancel at once)
            logger.warning("finished rollouts of the cancelled calls not collected: %r", exc)
            return []
        kept: dict[Any, Trajectory] = {}  # one per rollout: copies of it in two calls may both have finished
        for traj in found:
            rid = wanted.get((traj.group_id, traj.sample, traj.attempt))
            if rid is not None:
                kept.setdefault(rid, traj)
        return list(kept.values())

    def cancel(self) -> None:
        """Cancel every rollout still in flight and forget the queued ones; those of the cancelled calls that had
        finished are kept in `salvaged`."""
        self.salvaged = self._salvage()
        self._queue.clear()
        self._queued.clear()
        self.hints.forget_queued()
        for ref, (slot, batch) in [*self._pending.items(), *self._abandoned.items()]:
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001
                pass
            if ref in self._pending:
                with self.pools.lock:
                    slot.release(len(batch))
        self._pending.clear()
        self._abandoned.clear()
        self._cancelled.clear()
        self.copies.clear()
        self.pools.report(self, {})
