"""Telling warm actors what comes next (`raygrpo.driver.warm_hints.WarmHints`, `Orchestrator.foresee`), without Ray:
which actor is told of which queued rollout or foreseen task, at most its tell limit at a time, dispatch preferring
the actor told, and told tasks forgotten after their time. Actor handles are recorders of the calls made on them."""

from __future__ import annotations

import pytest

from raygrpo.driver.attempts import RolloutRequest
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.driver.pools import PoolSet
from raygrpo.driver.warm_hints import WarmHints
from raygrpo.core.types import TaskRef
from tests.dispatch_recorder import RecordingActor

pytestmark = pytest.mark.timeout(30)


def warm_pools(k: int = 1, warm_depth: int = 2) -> tuple[PoolSet, RecordingActor, RecordingActor]:
    a, b = RecordingActor(), RecordingActor()
    pools = PoolSet.of_actors([("a", a), ("b", b)], max_concurrent_per_actor=k)
    pool = pools.pools[0]
    pool.warm_envs, pool.warm_depth = frozenset({"h"}), warm_depth
    for slot in pool.slots:
        slot.warm_envs, slot.warm_depth = pool.warm_envs, warm_depth
    return pools, a, b


def orchestrator(k: int = 1, warm_depth: int = 2) -> tuple[Orchestrator, RecordingActor, RecordingActor]:
    pools, a, b = warm_pools(k, warm_depth)
    return Orchestrator(pools=pools), a, b


def requests(*indices: int) -> list[RolloutRequest]:
    return [RolloutRequest(TaskRef(env="h", index=i), group_id=f"g{i}") for i in indices]


def hint_and_dispatch(o: Orchestrator) -> None:
    o.dispatch()


def test_queued_rollouts_are_told_to_the_warm_actors_up_to_their_limit_and_go_there():
    o, a, b = orchestrator(k=1, warm_depth=2)
    o.enqueue(requests(0, 1, 2, 3, 4, 5, 6, 7))
    hint_and_dispatch(o)
    assert sorted(a.ran() + b.ran()) == [0, 1]  # K = 1 each
    # The queue's next rollouts, two per actor (its warm depth); the rest not yet.
    assert sorted(a.told() + b.told()) == [2, 3, 4, 5] and len(a.told()) == len(b.told()) == 2
    told = {i: "a" for i in a.told()} | {i: "b" for i in b.told()}
    for slot in o.pools.pools[0].slots:
        slot.release()
    hint_and_dispatch(o)
    assert {a.ran()[-1]: "a", b.ran()[-1]: "b"} == {i: told[i] for i in (2, 3)}  # each went where it was told
    assert sorted(a.told() + b.told()) == [2, 3, 4, 5, 6, 7]  # and each actor was told of one more


def test_a_rollout_goes_to_the_actor_told_even_when_another_is_less_busy():
    o, a, b = orchestrator(k=2, warm_depth=2)
    slot_a, slot_b = o.pools.pools[0].slots
    slot_b.take()  # b has one in flight, a none: a is the least busy
    (request,) = requests(0)
    o.hints.assign(request, "b")
    assert request.hint == "b" and o.hints.told("b") == 1
    o.enqueue([request])
    hint_and_dispatch(o)
    assert b.ran() == [0] and a.ran() == [] and o.hints.told("b") == 0


def test_no_warm_actor_means_nothing_is_told():
    a = RecordingActor()
    o = Orchestrator(pools=PoolSet.of_actors([("a", a)], max_concurrent_per_actor=1))
    o.enqueue(requests(0, 1, 2))
    hint_and_dispatch(o)
    assert a.told() == [] and a.ran() == [0]


def test_foreseen_tasks_are_told_after_the_queue_and_their_rollouts_go_to_the_actor_told():
    o, a, b = orchestrator(k=1, warm_depth=3)
    o.foresee([TaskRef(env="h", index=i) for i in (10, 11, 12)])
    assert sorted(a.told() + b.told()) == [10, 11, 12]
    told_to = {i: ("a" if i in a.told() else "b") for i in (10, 11, 12)}
    later = requests(10, 11, 12)
    o.enqueue(later)
    assert {r.task.index: r.hint for r in later} == told_to
    o.cancel()  # a batch ends: what it was told is forgotten, the foreseen tasks already matched are not told twice
    o.foresee([TaskRef(env="h", index=20)])
    assert 20 in a.told() + b.told() and sorted(a.told() + b.told()).count(10) == 1


def test_foreseen_tasks_wait_for_room_to_be_told():
    o, a, b = orchestrator(k=1, warm_depth=1)
    o.enqueue(requests(0, 1, 2, 3))
    hint_and_dispatch(o)  # 0 and 1 run; 2 and 3 are told (one per actor): no room for foreseen tasks
    o.foresee([TaskRef(env="h", index=9)])
    assert 9 not in a.told() + b.told()
    for slot in o.pools.pools[0].slots:
        slot.release()
    hint_and_dispatch(o)  # 2 and 3 go to the actors told; each has room to be told again
    assert 9 in a.told() + b.told()


def group(index: int, size: int) -> list[RolloutRequest]:
    return [RolloutRequest(TaskRef(env="h", index=index), group_id=f"g{index}", sample=s) for s in range(size)]


def test_a_groups_rollouts_told_to_an_actor_go_to_it_in_one_call():
    o, a, b = orchestrator(k=2, warm_depth=2)
    rollouts = group(5, 8)
    o.enqueue(rollouts)
    hint_and_dispatch(o)  # 4 run cold, two per actor; the next 4 are told, two per actor
    assert [len(c) for c in a.batches()] == [2] and [len(c) for c in b.batches()] == [2]
    assert a.told() == [5, 5] and b.told() == [5, 5]
    assert o.queued == 4 and sorted(c.sample for c in a.batches()[0] + b.batches()[0]) == [0, 1, 2, 3]
    hints = [r.hint for r in rollouts[4:]]  # the queue, in order
    assert sorted(hints) == ["a", "a", "b", "b"] and hints[0] == hints[1]  # each actor's next to each other
    for slot in o.pools.pools[0].slots:
        slot.release(2)
    hint_and_dispatch(o)
    assert [len(c) for c in a.batches()] == [2, 2] and [len(c) for c in b.batches()] == [2, 2]
    assert sorted(c.sample for c in a.batches()[1] + b.batches()[1]) == [4, 5, 6, 7]


def test_a_foreseen_groups_tasks_are_told_to_an_actor_next_to_each_other():
    o, a, b = orchestrator(k=2, warm_depth=2)
    o.foresee([TaskRef(env="h", index=7)] * 4 + [TaskRef(env="h", index=8)])
    assert a.told() == b.told() == [7, 7]  # two each (their tell limit), as one by one; 8 waits for room
    later = group(7, 4)
    o.enqueue(later)
    hints = [r.hint for r in later]
    assert sorted(hints) == ["a", "a", "b", "b"] and hints[0] == hints[1] and hints[2] == hints[3]


# ── WarmHints on its own ─────────────────────────────────────────────────────────────────────────────────────────

class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_task_told_ahead_is_claimed_by_its_rollout_once_and_counts_as_told_until_dispatched():
    pools, a, b = warm_pools(k=1, warm_depth=2)
    hints = WarmHints(pools)
    hints.foresee([TaskRef(env="h", index=3)])
    hints.tell([], queued_envs=0)
    (actor,) = [name for name, handle in (("a", a), ("b", b)) if handle.told() == [3]]
    assert hints.foretold(actor) == 1 and hints.foreseen == []
    first, second = requests(3, 3)
    hints.claim([first, second])  # one task told ahead: one rollout goes to that actor, the other to any
    assert (first.hint, second.hint) == (actor, None)
    assert hints.foretold(actor) == 0 and hints.told(actor) == 1
    hints.dispatched(actor, 1)
    assert hints.told(actor) == 0


def test_tasks_told_ahead_are_forgotten_after_their_time_and_their_room_is_told_again():
    pools, a, b = warm_pools(k=1, warm_depth=1)
    clock = Clock()
    hints = WarmHints(pools, ttl_s=10.0, clock=clock)
    hints.foresee([TaskRef(env="h", index=i) for i in (1, 2, 3)])
    hints.tell([], queued_envs=0)  # one per actor (tell limit 1); the third waits for room
    assert sorted(a.told() + b.told()) == [1, 2] and [t.index for t in hints.foreseen] == [3]
    clock.now = 5.0
    hints.tell([], queued_envs=0)  # still held for the actors told
    assert sorted(a.told() + b.told()) == [1, 2]
    clock.now = 11.0
    hints.tell([], queued_envs=0)  # forgotten: their actors have room to be told again
    assert sorted(a.told() + b.told()) == [1, 2, 3] and hints.foreseen == []
    (late,) = requests(1)
    hints.claim([late])
    assert late.hint is None  # task 1 was forgotten: its rollout goes to whichever actor has room


def test_forgetting_the_queue_keeps_what_was_told_ahead():
    pools, a, b = warm_pools(k=1, warm_depth=2)
    hints = WarmHints(pools)
    queued = requests(0, 1)
    hints.foresee([TaskRef(env="h", index=9)])
    hints.tell(queued, queued_envs=1)
    assert all(r.hint is not None for r in queued) and 9 in a.told() + b.told()
    hints.forget_queued()
    assert hints.told("a") == hints.told("b") == 0
    assert hints.foretold("a") + hints.foretold("b") == 1


def test_nothing_is_told_when_no_actor_keeps_a_warm_pool():
    a = RecordingActor()
    hints = WarmHints(PoolSet.of_actors([("a", a)], max_concurrent_per_actor=1))
    queued = requests(0, 1)
    hints.foresee([TaskRef(env="h", index=9)])
    hints.tell(queued, queued_envs=1)
    assert a.told() == [] and all(r.hint is None for r in queued) and [t.index for t in hints.foreseen] == [9]
