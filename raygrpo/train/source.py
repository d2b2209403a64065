"""Where the learner's groups come from: generated on demand (sync) or streamed ahead by a producer thread (async).

Lives in the learner's process and drives the env pool actors through an `Orchestrator`.

- `sync`: `next_batch(n)` schedules n groups, runs them, and returns them once all are complete. They were all
  generated with the weights pushed just before (staleness 0); the learner waits for the slowest rollout.
- `async`: a producer thread keeps up to `n * (max_staleness + 1)` groups outstanding (running or finished but not
  yet consumed) while the learner trains, so the next batch is mostly ready when asked for. `next_batch` consumes
  complete groups in completion order and drops any whose staleness exceeds `max_staleness` (counted).

  Each new group is destined for a step d (the next step to consume plus its place in the queue, n groups a step)
  and may generate with weights no older than `d - max_staleness` (clamped to the last version pushed by then,
  given `weight_sync_every`). It is dispatched at once with that `min_version`: its environment starts now (a
  sandbox boots, a session opens) while the engine holds its first turn until those weights arrive. So a group
  can start a step earlier than its staleness budget would allow it to generate, which is where the learner stops
  waiting on slow environments; and the groups consumed stay within `max_staleness` unless a rollout runs so long
  that it is consumed after its destined step (then it is dropped).

In both modes a batch holds only complete groups, in the order they are consumed.

Dynamic sampling (DAPO's, `train.dynamic_sampling`; `max_extra_groups` not None): a group whose rewards are all equal
(`Group.zero_variance`) carries no GRPO signal, so it is dropped and counted (`zero_variance_total`, apart from the
stale drops) and another group takes its place, up to `max_extra_groups` replacements per step; past that the step
trains on what it has (the all-equal groups fill the batch, counted as `zero_variance_trained`). Sync mode runs the
replacements once it sees the step's groups, and waits for them. In async mode the producer dispatches them ahead:
it keeps `ceil(lookahead * f / (1 - f))` more groups outstanding (f: the fraction of all-equal groups so far, with a
step's worth of kept groups as a prior; at most `max_extra_groups` more), and reckons a queued group's step with the
`1 - f` of the groups ahead of it that will be kept.

A checkpoint saves the schedule's position and the places in it of the groups dispatched but not yet consumed or
dropped (`state_dict`): in async mode those are running or waiting when the step ends. A resumed source dispatches
them first (`load_state_dict`), so no task of the schedule is skipped or run twice across a resume.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from raygrpo.driver.attempts import make_groups
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.train.groups import Group, GroupAssembler
from raygrpo.train.schedule import TaskSchedule

logger = logging.getLogger(__name__)


@dataclass
class Batch:
    """The complete groups of one step and how getting them went.

    Args:
        groups: The groups, each with its G trajectories in sample order.
        wait_s: Seconds the learner waited for them.
        dropped: Groups dropped as too stale while gathering this batch.
        staleness: Staleness of each consumed group.
        zero_variance: Dynamic sampling: groups dropped (and replaced) because their rewards were all equal.
        zero_variance_trained: Dynamic sampling: all-equal groups in `groups`, kept once `max_extra_groups` was spent.
    """

    groups: list[Group]
    wait_s: float
    dropped: int = 0
    staleness: list[int] = field(default_factory=list)
    zero_variance: int = 0
    zero_variance_trained: int = 0


class RolloutSource:
    """Supplies complete GRPO groups to the learner.

    Args:
        orchestrator: Dispatches rollouts to the env pool actors (used by this source only).
        schedule: Picks the task of each new group.
        group_size: G, rollouts per group.
        mode: `"sync"` or `"async"`.
        max_staleness: Async mode: groups staler than this are dropped.
        groups_per_step: Groups one step consumes (sets the async look-ahead).
        weight_sync_every: Policy versions between weight pushes to the engines (the versions a rollout can wait for).
        max_extra_groups: Dynamic sampling: all-equal groups replaced per step at most; None turns it off.
    """

    def __init__(
        self,
        orchestrator: Orchestrator,
        schedule: TaskSchedule,
        group_size: int,
        mode: Literal["sync", "async"],
        max_staleness: int,
        groups_per_step: int,
        weight_sync_every: int = 1,
        max_extra_groups: int | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        self.schedule = schedule
        self.group_size = group_size
        self.mode = mode
        self.max_staleness = max_staleness
        self.groups_per_step = groups_per_step
        self.weight_sync_every = weight_sync_every
        self.lookahead = groups_per_step * (max_staleness + 1)
        self._version = 0  # the learner's version at the last next_batch
        # Where the queue's head goes: the batch consumed at version `_head_version`, which already holds
        # `_head_taken` groups (a batch in progress) or none (between batches). Both change under `_cond` only.
        self._head_version = 0
        self._head_taken = 0
        self.dropped_total = 0
        self.max_extra_groups = max_extra_groups
        self.zero_variance_total = 0
        # Groups judged by dynamic sampling so far (consumed or dropped as all-equal), and the all-equal ones.
        self._judged = 0
        self._judged_zero = 0
        self._assembler = GroupAssembler(group_size)
        self._ready: deque[Group] = deque()
        self._outstanding = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        #: Place in the schedule of each group dispatched and not yet consumed or dropped, by group id.
        self._pending: dict[str, int] = {}
        #: Places of a resumed run's pending groups, dispatched before the schedule moves on.
        self._replay: deque[int] = deque()
        if hasattr(orchestrator, "expect"):
            orchestrator.expect(self.expected_rollouts())

    def _new_group(self, min_version: int = 0) -> list:
        """The requests of the next scheduled group (a resumed run's pending groups first), its dispatch version and
        place in the schedule recorded."""
        with self._cond:
            if self._replay:
                place = self._replay.popleft()
                task = self.schedule.task_at(place)
            else:
                place = self.schedule.position
                task = self.schedule.next()
            requests = make_groups([task], self.group_size, min_version=min_version, first=place)
            self._pending[requests[0].group_id] = place
        self._assembler.dispatched(requests[0].group_id, self._version)
        return requests

    def state_dict(self) -> dict[str, Any]:
        """The schedule's position and the places of the groups not yet consumed or dropped, for a checkpoint."""
        with self._cond:
            pending = sorted([*self._pending.values(), *self._replay])
            return {**self.schedule.state_dict(), "pending": pending}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's `state_dict`: its pending groups are dispatched first."""
        self.schedule.load_state_dict(state)
        with self._cond:
            self._replay = deque(int(p) for p in state.get("pending", []))

    def _settled(self, group: Group) -> None:
        """A group was consumed or dropped: it no longer needs to run after a resume."""
        self._pending.pop(group.group_id, None)

    def _min_version(self, place: int) -> int:
        """The oldest weights a group at `place` in the queue (0 = consumed next) may generate with.

        The queue's first `groups_per_step - _head_taken` groups complete the batch consumed at `_head_version`, the
        next `groups_per_step` the one after, and so on: the group's step is the version it will be consumed at.
        """
        kept = math.floor(place * self._keep_fraction)  # the place itself when nothing is dropped
        step = self._head_version + (kept + self._head_taken) // self.groups_per_step
        pushed = step - step % self.weight_sync_every
        return max(0, min(step - self.max_staleness, pushed))

    # ------------------------------------------------------------------ dynamic sampling

    @property
    def _keep_fraction(self) -> float:
        """The fraction of groups dynamic sampling keeps, as seen so far (1.0 when it is off). Judged with a step's
        worth of kept groups as a prior, so that the first all-equal groups do not make it dispatch a deep queue
        that would go stale."""
        if self.max_extra_groups is None:
            return 1.0
        return 1.0 - self._judged_zero / (self._judged + self.groups_per_step)

    @property
    def _ahead(self) -> int:
        """Groups the async producer keeps outstanding beyond the look-ahead, so that the kept ones fill it."""
        if self.max_extra_groups is None:
            return 0
        keep = self._keep_fraction
        return min(self.max_extra_groups, math.ceil(self.lookahead * (1.0 - keep) / keep - 1e-9))

    def _judge(self, group: Group) -> bool:
        """Count a group dynamic sampling sees; whether its rewards are all equal."""
        self._judged += 1
        self._judged_zero += group.zero_variance
        return group.zero_variance

    # ------------------------------------------------------------------ sync

    def _sync_batch(self, n_groups: int) -> tuple[list[Group], int, int]:
        """The step's groups, then (dynamic sampling) replacements of the all-equal ones, waited for; returns
        `(groups, zero_variance, zero_variance_trained)`."""
        groups = self._run_groups(n_groups, foresee=True)
        if self.max_extra_groups is None:
            return groups, 0, 0
        kept: list[Group] = []
        flat: list[Group] = []
        budget = self.max_extra_groups
        while True:
            for group in groups:
                (flat if self._judge(group) else kept).append(group)
            more = min(n_groups - len(kept), budget)
            if more <= 0:
                break
            budget -= more
            groups = self._run_groups(more)
        trained = n_groups - len(kept)
        return kept + flat[:trained], len(flat) - trained, trained

    def _run_groups(self, n_groups: int, foresee: bool = False) -> list[Group]:
        """Schedule `n_groups` groups, run them and return them in schedule order once all are complete."""
        order = []
        requests = []
        for _ in range(n_groups):
            group_requests = self._new_group()
            order.append(group_requests[0].group_id)
            requests.extend(group_requests)
        if foresee and hasattr(self.orchestrator, "foresee"):
            # The next step's groups, read off a copy of the schedule: warm pools start their sandboxes while this
            # step runs and the learner trains on it.
            ahead = copy.deepcopy(self.schedule)
            self.orchestrator.foresee([t for _ in range(n_groups) for t in [ahead.next()] * self.group_size])
        done: dict[str, Group] = {}
        for traj in self.orchestrator.run(requests, stop=self._stop):
            group = self._assembler.add(traj)
            if group is not None:
                done[group.group_id] = group
                with self._cond:
                    self._settled(group)
        if len(done) < n_groups:
            raise RuntimeError("rollouts were stopped before the step's groups completed")
        return [done[g] for g in order]

    # ------------------------------------------------------------------ async

    def expected_rollouts(self) -> dict[str, int]:
        """Rollouts per environment the source keeps asking for: a step's groups in sync mode, the look-ahead in
        async mode, split by the schedule's weights. The pools are sized for at least these, so they do not drain
        between steps."""
        groups = self.lookahead if self.mode == "async" else self.groups_per_step
        total = sum(self.schedule.weights.values())
        return {env: math.ceil(groups * self.group_size * w / total) for env, w in self.schedule.weights.items()}

    def _produce(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    places = list(range(self._outstanding, self.lookahead + self._ahead))
                    self._outstanding += len(places)
                    versions = [self._min_version(place) for place in places]
                for version in versions:
                    self.orchestrator.enqueue(self._new_group(version))
                if not self.orchestrator.outstanding:
                    # Everything is finished and waiting for the learner: sleep until it consumes (or stops us).
                    with self._cond:
                        self._cond.wait(timeout=0.2)
                    continue
                for traj in self.orchestrator.poll(timeout=0.2):
                    group = self._assembler.add(traj)
                    if group is not None:
                        with self._cond:
                            self._ready.append(group)
                            self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the learner, which raises it
            logger.exception("the async rollout producer failed")
            with self._cond:
                self._error = exc
                self._cond.notify_all()
        finally:
            self.orchestrator.cancel()

    def _async_batch(self, n_groups: int, current_version: int) -> tuple[list[Group], int, list[int], int, int]:
        """`(groups, dropped, staleness, zero_variance, zero_variance_trained)` of the next batch."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="raygrpo-rollout-producer", daemon=True)
            self._thread.start()
        groups: list[Group] = []
        staleness: list[int] = []
        dropped = zero = trained_zero = 0
        budget = self.max_extra_groups or 0
        with self._cond:
            while len(groups) < n_groups:
                while not self._ready and self._error is None and not self._stop.is_set():
                    self._cond.wait(timeout=1.0)
                if self._error is not None:
                    raise RuntimeError(f"the rollout producer failed: {self._error}") from self._error
                if self._stop.is_set():
                    raise RuntimeError("the rollout source was closed")
                group = self._ready.popleft()
                self._outstanding -= 1
                self._settled(group)
                lag = group.staleness(current_version)
                flat = self.max_extra_groups is not None and lag <= self.max_staleness and self._judge(group)
                if lag > self.max_staleness:
                    dropped += 1
                elif flat and budget > 0:
                    budget -= 1
                    zero += 1
                else:
                    trained_zero += flat
                    groups.append(group)
                    staleness.append(lag)
                    self._head_taken += 1
                    if len(groups) == n_groups:  # the queue's head now belongs to the next batch
                        self._head_version, self._head_taken = current_version + 1, 0
                self._cond.notify_all()  # room for the producer
        return groups, dropped, staleness, zero, trained_zero

    # ------------------------------------------------------------------ public

    def next_batch(self, n_groups: int, current_version: int) -> Batch:
        """Block until `n_groups` complete groups are available and return them.

        Args:
            n_groups: Groups the step needs.
            current_version: The learner's policy version now (staleness is measured against it).
        """
        start = time.perf_counter()
        with self._cond:
            self._version = self._head_version = current_version
            self._head_taken = 0
        if self.mode == "sync":
            groups, zero, trained_zero = self._sync_batch(n_groups)
            dropped, staleness = 0, [g.staleness(current_version) for g in groups]
        else:
            groups, dropped, staleness, zero, trained_zero = self._async_batch(n_groups, current_version)
        self.dropped_total += dropped
        self.zero_variance_total += zero
        if trained_zero:
            logger.warning("dynamic sampling: max_extra_groups (%d) spent at version %d: the step trains on %d group(s) "
                           "whose rewards are all equal", self.max_extra_groups, current_version, trained_zero)
        return Batch(groups, time.perf_counter() - start, dropped, staleness, zero, trained_zero)

    def close(self) -> None:
        """Stop producing and cancel the rollouts in flight (their environments close as they unwind)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.orchestrator.cancel()
