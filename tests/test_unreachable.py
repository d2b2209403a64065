"""An env pool actor that goes silent costs seconds, and no rollout is scored twice -- without Ray.

`RolloutCopies` (the first trajectory of a rollout wins, later copies are discarded and counted) and `Reachability`
(silence measured from the last answered probe) are plain bookkeeping. The orchestrator and its pools run here with
`ray.wait/get/cancel/kill` replaced by a fake whose actors the test drives: one actor stops answering, its rollouts
run again on the other, and what it delivers after it comes back is discarded, counted, and its calls cancelled.
The same path on a real cluster with dropped packets: `tests/test_cluster_partition.py`.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray
from ray.exceptions import ActorDiedError, TaskCancelledError

from raygrpo.core.types import Status, TaskRef, Trajectory
from raygrpo.driver.copies import RolloutCopies, Verdict
from raygrpo.driver.attempts import make_groups
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.driver.pools import PoolSet, SlotState
from raygrpo.driver.pools.reachability import Reachability

pytestmark = pytest.mark.timeout(60)


def _traj(status: Status = Status.OK, worker: str = "a") -> Trajectory:
    return Trajectory(task=TaskRef("env", 0), status=status, reward=1.0 if status is Status.OK else None,
                      worker=worker)


# ---------------------------------------------------------------------------------------------- RolloutCopies


def _two_copies(*rids) -> RolloutCopies:
    """Bookkeeping where each of `rids` has two copies out (the first run and the one run again elsewhere)."""
    copies = RolloutCopies()
    for rid in rids:
        copies.add(rid)
        copies.add(rid)
    return copies


def test_the_first_result_wins_and_a_later_one_is_counted():
    rid = ("g", 0)
    copies = _two_copies(rid)
    assert copies.open == 1
    assert copies.settle(rid, _traj(worker="b"), may_retry=True) is Verdict.FINAL
    assert copies.open == 0 and copies.is_final(rid)
    assert copies.settle(rid, _traj(worker="a"), may_retry=True) is Verdict.DUPLICATE
    assert copies.duplicates_discarded == 1
    assert not copies.is_final(rid) and copies.copies(rid) == 0  # nothing more can come: forgotten


def test_cancelled_copies_and_lost_calls_are_not_counted_as_duplicates():
    copies = _two_copies(("g", 0), ("g", 1))
    for rid in (("g", 0), ("g", 1)):
        assert copies.settle(rid, _traj(), may_retry=False) is Verdict.FINAL
    assert copies.settle(("g", 0), _traj(Status.CANCELLED), may_retry=False) is Verdict.DUPLICATE
    assert copies.settle(("g", 1), _traj(Status.ENV_ERROR), may_retry=True, delivered=False) is Verdict.DUPLICATE
    assert copies.duplicates_discarded == 0


def test_a_failed_copy_is_superseded_while_another_is_out_and_retried_once_none_is():
    rid = ("g", 3)
    copies = _two_copies(rid)
    assert copies.settle(rid, _traj(Status.ENV_ERROR), may_retry=True, delivered=False) is Verdict.SUPERSEDED
    assert copies.settle(rid, _traj(Status.ENV_ERROR), may_retry=True) is Verdict.RETRY
    assert copies.copies(rid) == 1 and copies.open == 1
    assert copies.settle(rid, _traj(Status.ENV_ERROR), may_retry=False) is Verdict.FINAL  # unscored, settled
    assert copies.open == 0


def test_a_late_success_settles_a_rollout_whose_other_copy_then_fails():
    rid = ("g", 1)
    copies = _two_copies(rid)
    assert copies.settle(rid, _traj(worker="a"), may_retry=True) is Verdict.FINAL  # the silent actor's, first
    assert copies.settle(rid, _traj(Status.ENV_ERROR, worker="b"), may_retry=True) is Verdict.DUPLICATE
    assert copies.duplicates_discarded == 1


# ---------------------------------------------------------------------------------------------- Reachability


def test_silence_counts_from_the_last_answer_and_only_with_a_probe_out():
    reach = Reachability(last_answer=100.0)
    assert not reach.due(101.0, heartbeat_s=2.0) and reach.due(102.0, heartbeat_s=2.0)
    assert not reach.unreachable(200.0, unreachable_after_s=10.0)  # never asked: not silent
    reach.sent("probe-1", 102.0)
    assert not reach.due(105.0, heartbeat_s=2.0)  # one probe at a time
    assert not reach.unreachable(110.0, unreachable_after_s=10.0)
    assert reach.unreachable(110.5, unreachable_after_s=10.0) and reach.silent_for(110.5) == pytest.approx(10.5)
    reach.answered(111.0)
    assert not reach.unreachable(130.0, unreachable_after_s=10.0) and reach.due(113.0, heartbeat_s=2.0)


# ---------------------------------------------------------------------------------------------- orchestrator


class Ref:
    """A fake object ref: done once the test (or the fake actor) sets its value or error."""

    def __init__(self, what: str) -> None:
        self.what, self.done, self.value, self.error = what, False, None, None

    def set(self, value: Any = None, error: BaseException | None = None) -> None:
        if not self.done:
            self.done, self.value, self.error = True, value, error

    def __repr__(self) -> str:
        return f"Ref({self.what}, done={self.done})"


class FakeRay:
    """`ray.wait/get/cancel/kill` over `Ref`s."""

    def __init__(self) -> None:
        self.cancelled: list[Ref] = []
        self.killed: list[Any] = []

    def wait(self, refs, num_returns=1, timeout=None, **_):
        deadline = time.monotonic() + (timeout or 0)
        while True:
            done = [r for r in refs if r.done]
            if len(done) >= num_returns or time.monotonic() >= deadline:
                return done[:num_returns], [r for r in refs if r not in done[:num_returns]]
            time.sleep(0.005)

    def get(self, ref, timeout=None):
        if ref.error is not None:
            raise ref.error
        return ref.value

    def cancel(self, ref, **_):
        self.cancelled.append(ref)
        ref.set(error=TaskCancelledError())

    def kill(self, handle, **_):
        self.killed.append(handle)
        for ref, _calls in getattr(handle, "calls", []):  # as Ray does: the killed actor's calls fail
            ref.set(error=ActorDiedError())


class FakeActor:
    """An env pool actor whose calls the test answers; `reachable` False: its probes go unanswered."""

    class _Method:
        def __init__(self, fn) -> None:
            self.remote = fn

    def __init__(self, name: str, auto: bool) -> None:
        self.name, self.auto, self.reachable = name, auto, True
        self.calls: list[tuple[Ref, list]] = []
        self.probes: list[Ref] = []
        self.shutdowns = 0
        self.run_many = self._Method(self._run_many)
        self.ping = self._Method(self._ping)
        self.shutdown = self._Method(self._shutdown)

    def results(self, calls: list) -> list[Trajectory]:
        return [Trajectory(task=c.task, status=Status.OK, reward=1.0, group_id=c.group_id, sample=c.sample,
                           attempt=c.attempt, worker=self.name) for c in calls]

    def _run_many(self, calls):
        ref = Ref(f"{self.name}.run_many")
        self.calls.append((ref, calls))
        if self.auto:
            ref.set(self.results(calls))
        return ref

    def _ping(self):
        ref = Ref(f"{self.name}.ping")
        self.probes.append(ref)
        if self.reachable:
            ref.set(True)
        return ref

    def answer_probes(self) -> None:
        self.reachable = True
        for ref in self.probes:
            ref.set(True)

    def _shutdown(self):
        self.shutdowns += 1
        ref = Ref(f"{self.name}.shutdown")
        ref.set({"name": self.name, "live_envs": 0})
        return ref


@pytest.fixture
def fake_ray(monkeypatch):
    fake = FakeRay()
    for name in ("wait", "get", "cancel", "kill"):
        monkeypatch.setattr(ray, name, getattr(fake, name))
    return fake


def _pools(*actors: FakeActor, k: int = 2) -> PoolSet:
    pools = PoolSet.of_actors([(a.name, a) for a in actors], max_concurrent_per_actor=k)
    pools.pools[0].heartbeat_s, pools.pools[0].unreachable_after_s = 0.05, 0.4
    return pools


def _poll_until(orch: Orchestrator, done, timeout: float = 10.0) -> list[Trajectory]:
    finals: list[Trajectory] = []
    deadline = time.monotonic() + timeout
    while not done(finals):
        assert time.monotonic() < deadline, f"timed out with {len(finals)} final trajectories"
        finals += orch.poll(timeout=0.05)
    return finals


def test_a_silent_actors_rollouts_run_elsewhere_and_its_late_results_count_once(fake_ray):
    a, b = FakeActor("a", auto=False), FakeActor("b", auto=True)
    pools = _pools(a, b)
    orch = Orchestrator(pools, max_retries=2)
    orch.enqueue(make_groups([TaskRef("env", 0), TaskRef("env", 1)], group_size=2))
    a.reachable = False  # cut off from now: its probes go unanswered, its call does not come back
    first = _poll_until(orch, lambda f: len(f) >= 2)  # b's own two
    assert len(a.calls) == 1 and len(a.calls[0][1]) == 2
    b.auto = False  # b now holds the copies it gets, so a's late results can race them
    started = time.monotonic()
    assert _poll_until(orch, lambda f: len(b.calls) >= 2 or f, timeout=5) == []
    detected = time.monotonic() - started
    slot_a = next(s for s in pools.pools[0].slots if s.name == "a")
    assert slot_a.state is SlotState.UNREACHABLE and slot_a.in_flight == 0
    assert detected < 3.0  # 0.4 s of silence, at a poll's granularity, with room for a loaded machine
    copies_ref, copies_calls = b.calls[1]
    assert {(c.group_id, c.sample, c.attempt) for c in copies_calls} == \
           {(c.group_id, c.sample, c.attempt + 1) for c in a.calls[0][1]}
    assert orch.stats.abandoned == 2 and orch.stats.retried == 2 and orch.outstanding == 2
    # b's copies finish, and the healed actor delivers the same two rollouts in the same breath.
    copies_ref.set(b.results(copies_calls))
    a.calls[0][0].set(a.results(a.calls[0][1]))
    a.answer_probes()
    rest = _poll_until(orch, lambda f: len(f) >= 2)
    finals = first + rest
    assert sorted((t.group_id, t.sample) for t in finals) == sorted({(t.group_id, t.sample) for t in finals})
    assert len(finals) == 4 and {t.worker for t in rest} == {"b"}  # b's came first in the poll: they win
    assert orch.stats.duplicates_discarded == 2 and orch.outstanding == 0
    _poll_until(orch, lambda f: slot_a.state is SlotState.DEAD, timeout=5)  # it answered again: retired
    assert a.shutdowns == 1 and a not in [h for _, h in pools.actors]
    assert sum(s.in_flight for s in pools.pools[0].slots) == 0


def test_an_abandoned_call_is_cancelled_once_its_rollouts_are_settled(fake_ray):
    a, b = FakeActor("a", auto=False), FakeActor("b", auto=True)
    orch = Orchestrator(_pools(a, b), max_retries=2)
    orch.enqueue(make_groups([TaskRef("env", 0), TaskRef("env", 1)], group_size=2))
    a.reachable = False
    finals = _poll_until(orch, lambda f: len(f) >= 4)
    assert {t.worker for t in finals} == {"b"} and orch.outstanding == 0
    abandoned = a.calls[0][0]
    assert abandoned in fake_ray.cancelled  # its sandboxes are closed by the actor when it gets the cancel
    assert orch.stats.duplicates_discarded == 0  # a cancelled copy carries no result


def test_without_retries_left_an_abandoned_rollout_waits_for_its_actor(fake_ray):
    a, b = FakeActor("a", auto=False), FakeActor("b", auto=True)
    orch = Orchestrator(_pools(a, b), max_retries=0)
    orch.enqueue(make_groups([TaskRef("env", 0), TaskRef("env", 1)], group_size=2))
    a.reachable = False
    first = _poll_until(orch, lambda f: orch.stats.abandoned and len(f) >= 2, timeout=5)
    assert {t.worker for t in first} == {"b"} and len(b.calls) == 1  # nothing queued again: no retry left
    assert orch.outstanding == 2
    a.calls[0][0].set(a.results(a.calls[0][1]))  # delivered after all: scored once
    finals = _poll_until(orch, lambda f: len(f) >= 2)
    assert {t.worker for t in finals} == {"a"} and orch.stats.duplicates_discarded == 0
    assert orch.outstanding == 0


def test_an_actor_silent_past_the_rollout_deadline_is_killed_and_its_rollouts_settle_unscored(fake_ray):
    """A stopped actor (SIGSTOP) is never declared dead by Ray: without a bound, rollouts with no retry left waited
    for it forever and the run hung."""
    a, b = FakeActor("a", auto=False), FakeActor("b", auto=True)
    pools = _pools(a, b)
    pools.pools[0].rollout_timeout_s = 0.5
    orch = Orchestrator(pools, max_retries=0)
    orch.enqueue(make_groups([TaskRef("env", 0), TaskRef("env", 1)], group_size=2))
    a.reachable = False  # stopped: it never answers again
    finals = _poll_until(orch, lambda f: len(f) >= 4, timeout=10)
    assert a in fake_ray.killed and orch.outstanding == 0
    lost = [t for t in finals if t.worker == "a"]
    assert len(lost) == 2 and all(t.status is Status.ENV_ERROR and t.reward is None for t in lost)
    assert all("died" in t.error for t in lost)
