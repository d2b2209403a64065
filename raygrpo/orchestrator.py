"""Dispatching rollouts over env pool actors, retrying infrastructure failures, streaming results as they finish.

The orchestrator lives on the driver. It keeps at most K rollouts in flight per actor and gives each new rollout
to the actor with the fewest in flight, so a slow sandbox on one actor does not hold the others back. Every
requested rollout ends as exactly one yielded trajectory: scored, or unscored with its status. A rollout that failed
for an infrastructure reason (env or policy error, a dead actor) is run again, at most `max_retries` times, unless
its retry failed exactly as the attempt before it (same exception type and message): a failure that repeats
identically is not a passing glitch, and retrying it again only costs time.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, TaskCancelledError

from raygrpo.types import Status, TaskRef, Trajectory

logger = logging.getLogger(__name__)


@dataclass
class RolloutRequest:
    """One rollout to run: a task, the group it belongs to, its index in the group, which attempt this is, the
    lowest policy version it may generate with (`SamplingParams.min_version`), how its last attempt failed, and a
    built-in acting policy (`"oracle"`, `"noop"`) to run it with instead of the run's (None: the run's)."""

    task: TaskRef
    group_id: str
    sample: int = 0
    attempt: int = 0
    min_version: int = 0
    last_error: str | None = None
    policy: str | None = None


@dataclass(frozen=True)
class Route:
    """What one env pool actor takes: the environments it serves (None: every one) and how many rollouts at once
    (None: the orchestrator's `max_in_flight_per_actor`)."""

    envs: frozenset[str] | None = None
    capacity: int | None = None


@dataclass
class _Slot:
    handle: Any
    name: str
    capacity: int
    envs: frozenset[str] | None = None
    in_flight: int = 0
    alive: bool = True

    def takes(self, env: str) -> bool:
        return self.alive and self.in_flight < self.capacity and (self.envs is None or env in self.envs)


@dataclass
class DispatchStats:
    """Counts kept while dispatching."""

    dispatched: int = 0
    retried: int = 0
    failed_attempts: list[Trajectory] = field(default_factory=list)


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
        actors: Env pool actor handles (`EnvPoolActor`), with their names.
        max_in_flight_per_actor: Rollouts in flight per actor (K); more wait on the driver.
        max_retries: Retries of one rollout after an infrastructure failure.
        on_failed_attempt: Called with the trajectory of each attempt that failed and will be retried.
        routes: Per actor name, the environments it serves and its capacity (`RolloutRuntime.routes`); actors not
            listed serve every environment, `max_in_flight_per_actor` at a time.
    """

    def __init__(
        self,
        actors: list[tuple[str, Any]],
        max_in_flight_per_actor: int,
        max_retries: int = 2,
        on_failed_attempt: Callable[[Trajectory], None] | None = None,
        routes: dict[str, Route] | None = None,
    ) -> None:
        if not actors:
            raise ValueError("the orchestrator needs at least one env pool actor")
        routes = routes or {}
        self.slots = [
            _Slot(handle=h, name=n, envs=routes.get(n, Route()).envs,
                  capacity=routes.get(n, Route()).capacity or max_in_flight_per_actor)
            for n, h in actors
        ]
        self.max_retries = max_retries
        self.on_failed_attempt = on_failed_attempt
        self.stats = DispatchStats()
        self._pending: dict[Any, tuple[_Slot, RolloutRequest]] = {}
        self._queue: deque[RolloutRequest] = deque()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def _free_slot(self, env: str) -> _Slot | None:
        live = [s for s in self.slots if s.takes(env)]
        return min(live, key=lambda s: s.in_flight) if live else None

    def _submit(self, slot: _Slot, request: RolloutRequest) -> None:
        ref = slot.handle.run.remote(
            request.task, request.group_id, request.attempt, request.sample, request.min_version, request.policy
        )
        slot.in_flight += 1
        self._pending[ref] = (slot, request)
        self.stats.dispatched += 1

    @property
    def outstanding(self) -> int:
        """Rollouts enqueued or in flight whose final trajectory has not been returned yet."""
        return len(self._queue) + len(self._pending)

    def enqueue(self, requests: Iterable[RolloutRequest]) -> None:
        """Add rollouts to run; `poll` dispatches them as actors have room.

        Raises:
            ValueError: A rollout's environment is served by none of the actors.
        """
        requests = list(requests)
        for env in {r.task.env for r in requests}:
            if not any(s.envs is None or env in s.envs for s in self.slots):
                raise ValueError(f"no env pool actor serves environment {env!r}")
        self._queue.extend(requests)

    def poll(self, timeout: float = 1.0) -> list[Trajectory]:
        """Dispatch what fits, wait up to `timeout` seconds for results, and return the final trajectories that came
        back (possibly none). Failed attempts with retries left go back to the front of the queue instead."""
        self._dispatch()
        if not self._pending:
            if self._queue:
                envs = sorted({r.task.env for r in self._queue})
                raise RuntimeError(f"every env pool actor serving {', '.join(envs)} has died; cannot run the "
                                   f"remaining {len(self._queue)} rollout(s)")
            return []
        ready, _ = ray.wait(list(self._pending), num_returns=1, timeout=timeout)
        if ready:  # collect everything else that is already done too
            ready, _ = ray.wait(list(self._pending), num_returns=len(self._pending), timeout=0)
        finals: list[Trajectory] = []
        for ref in ready:
            slot, request = self._pending.pop(ref)
            slot.in_flight -= 1
            traj = self._result(ref, slot, request)
            if self._retry(request, traj):
                self.stats.retried += 1
                self.stats.failed_attempts.append(traj)
                if self.on_failed_attempt is not None:
                    self.on_failed_attempt(traj)
                self._queue.appendleft(dataclasses.replace(request, attempt=request.attempt + 1, last_error=traj.error))
                continue
            finals.append(traj)
        return finals

    def _dispatch(self) -> None:
        """Give queued rollouts, in order, to the least busy actor serving their environment; a rollout whose
        actors are all full waits without holding back those of other environments."""
        held: deque[RolloutRequest] = deque()
        full: set[str] = set()
        while self._queue and any(s.alive and s.in_flight < s.capacity for s in self.slots):
            request = self._queue.popleft()
            env = request.task.env
            slot = None if env in full else self._free_slot(env)
            if slot is None:
                full.add(env)
                held.append(request)
                continue
            self._submit(slot, request)
        self._queue.extendleft(reversed(held))

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

    def run(self, requests: Iterable[RolloutRequest], stop: threading.Event | None = None) -> Iterator[Trajectory]:
        """Yield one final trajectory per request, in completion order.

        Closing the generator early, setting `stop` (checked at least once a second, from any thread), or an
        exception such as KeyboardInterrupt while it waits cancels the rollouts still in flight; each closes its
        environment as it unwinds.
        """
        self.enqueue(requests)
        try:
            while self.outstanding and not (stop is not None and stop.is_set()):
                yield from self.poll(timeout=1.0)
        finally:
            self.cancel()

    def _result(self, ref: Any, slot: _Slot, request: RolloutRequest) -> Trajectory:
        try:
            return ray.get(ref)
        except RayActorError as exc:
            slot.alive = False
            logger.warning("env pool actor %s died: %s", slot.name, exc)
            status, error = Status.ENV_ERROR, f"env pool actor {slot.name} died"
        except TaskCancelledError:
            status, error = Status.CANCELLED, "cancelled"
        except Exception as exc:  # noqa: BLE001 - a task that raised: report, do not lose the rollout
            logger.warning("rollout on %s raised: %s", slot.name, exc)
            status, error = Status.ENV_ERROR, f"{type(exc).__name__}: {exc}"[:500]
        return Trajectory(
            task=request.task, status=status, error=error, group_id=request.group_id,
            sample=request.sample, attempt=request.attempt, worker=slot.name,
        )

    def cancel(self) -> None:
        """Cancel every rollout still in flight and forget the queued ones."""
        self._queue.clear()
        for ref in list(self._pending):
            try:
                ray.cancel(ref)
            except Exception:  # noqa: BLE001
                pass
        self._pending.clear()
        for slot in self.slots:
            slot.in_flight = 0
