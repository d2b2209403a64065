"""A rollout's attempts: the request of each (`RolloutRequest`), the groups they start as (`make_groups`), and the
rule of which failed attempt runs again, as what (`should_retry`, `next_attempt`, `unscored_attempts`).

A rollout that failed for an infrastructure reason (env or policy error, a dead actor) is run again, at most
`max_retries` times, unless its retry failed exactly as the attempt before it (same exception type and message, ids
such as a session's UUID aside: `raygrpo.core.outcome.without_ids`): a failure that repeats identically is not a
passing glitch, and retrying it again only costs time. Each retry is a new `RolloutRequest` of the same rollout
(`RolloutRequest.rid`), its attempt counted up and its last error kept.

Kept apart from the orchestrator (`raygrpo.driver.orchestrator`), which queues, dispatches and settles these requests,
so that what a request is and when it gets another attempt read in one place, and so that callers which only make
requests (`raygrpo.driver.check`, `raygrpo.driver.collect`, `raygrpo.train`) need not read the dispatching.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from raygrpo.core.outcome import without_ids
from raygrpo.core.types import Status, TaskRef, Trajectory
from raygrpo.driver.copies import RolloutId

logger = logging.getLogger(__name__)


@dataclass
class RolloutRequest:
    """One rollout to run: a task, the group it belongs to, its index in the group, which attempt this is, the
    lowest policy version it may generate with (`SamplingParams.min_version`), how its last attempt failed, a
    built-in acting policy (`"oracle"`, `"noop"`) to run it with instead of the run's (None: the run's), the actor
    told it comes next (its warm pool starts the sandbox ahead; None: none was), and the key its sampling seeds
    derive from (`seed_key`; empty: the group id).

    `group_id` is unique in a run and beyond (it ends in a random part), so that trajectories of two runs or of a
    group dispatched twice never merge; `seed_key` names the group by what the run makes the same every time (its
    task and its place among the groups dispatched), so that with `sampling.seed` set two runs of one config sample
    alike. The worker adds the sample and the attempt (a retry samples anew) and the turn.
    """

    task: TaskRef
    group_id: str
    sample: int = 0
    attempt: int = 0
    min_version: int = 0
    last_error: str | None = None
    policy: str | None = None
    hint: str | None = None
    seed_key: str = ""

    @property
    def rid(self) -> RolloutId:
        """The rollout's id, the same for every attempt and copy of it."""
        return self.group_id, self.sample


def make_groups(
    tasks: Iterable[TaskRef], group_size: int, min_version: int = 0, first: int = 0
) -> list[RolloutRequest]:
    """Repeat each task `group_size` times as one group (adjacent, so the group finishes together).

    The i-th group's `seed_key` is its task and its place `first + i` (a training run passes the group's place in
    its schedule), never the random part of its `group_id`: the same run makes the same keys, hence the same
    per-request seeds, every time.
    """
    requests = []
    for place, task in enumerate(tasks, start=first):
        key = f"{task.env}:{task.split}:{task.index}"
        group_id = f"{key}:{uuid.uuid4().hex[:8]}"
        requests.extend(
            RolloutRequest(task, group_id, sample, min_version=min_version, seed_key=f"{key}#{place}")
            for sample in range(group_size)
        )
    return requests


def should_retry(request: RolloutRequest, traj: Trajectory, max_retries: int) -> bool:
    """Whether to run a failed attempt again: an infrastructure failure, retries left, and not the same failure as
    the attempt before it (the same message but for its ids: each attempt has a session or sandbox of its own)."""
    if not traj.status.is_infra_failure or request.attempt >= max_retries:
        return False
    if request.last_error is not None and without_ids(traj.error or "") == without_ids(request.last_error):
        logger.info("%s/%s failed again as before (%s); not retried", request.task.env, request.task.index,
                    traj.error)
        return False
    return True


def next_attempt(request: RolloutRequest, error: str | None) -> RolloutRequest:
    """The request of the rollout's next attempt after one that failed with `error`: told to no actor (the actor
    told of it may be the one that failed it)."""
    return dataclasses.replace(request, attempt=request.attempt + 1, last_error=error, hint=None)


def unscored_attempts(batch: list[RolloutRequest], worker: str, status: Status, error: str) -> list[Trajectory]:
    """The unscored trajectories of the attempts of a call that delivered none (its actor died, it was cancelled,
    it raised), one per request of `batch`."""
    return [Trajectory(task=r.task, status=status, error=error, group_id=r.group_id, sample=r.sample,
                       attempt=r.attempt, worker=worker) for r in batch]
