"""A group's rollouts go to an env pool actor in one call (`Orchestrator._batch`, `EnvPool.run_many`).

The dispatch tests run without Ray, on actor handles that record the orchestrator's calls; the last one runs a
call of several rollouts, one of which raises, on a real env pool actor against an ORS server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raygrpo.driver.attempts import RolloutRequest, make_groups
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.driver.pools import PoolSet
from raygrpo.core.types import TaskRef
from tests.dispatch_recorder import RecordingActor

pytestmark = pytest.mark.timeout(30)

SUPPORT = str(Path(__file__).with_name("e2e_support.py"))


def orchestrator(k: int, actors: int = 2) -> tuple[Orchestrator, list[RecordingActor]]:
    handles = [RecordingActor() for _ in range(actors)]
    pools = PoolSet.of_actors([(f"a{i}", h) for i, h in enumerate(handles)], max_concurrent_per_actor=k)
    return Orchestrator(pools=pools), handles


def dispatch(o: Orchestrator) -> None:
    o.dispatch()


def groups(n: int, size: int) -> list[RolloutRequest]:
    return make_groups([TaskRef(env="e", index=i) for i in range(n)], size)


def test_a_queue_that_fills_the_actors_goes_one_call_per_group():
    o, (a, b) = orchestrator(k=8)
    o.enqueue(groups(4, 4))  # 16 rollouts, 16 places
    dispatch(o)
    for actor in (a, b):
        batches = actor.batches()
        assert len(batches) == 2 and all(len(calls) == 4 for calls in batches)
        for calls in batches:  # one group per call, its samples in order
            assert len({c.group_id for c in calls}) == 1 and [c.sample for c in calls] == [0, 1, 2, 3]
    assert o.in_flight == 16 and o.queued == 0 and o.stats.dispatched == 16
    assert [s.in_flight for s in o.pools.pools[0].slots] == [8, 8]


def test_a_group_smaller_than_the_actors_room_is_shared_between_them():
    o, (a, b) = orchestrator(k=8)
    o.enqueue(groups(1, 8))  # 8 rollouts, 16 places: rollout by rollout they would go 4 and 4
    dispatch(o)
    assert [len(calls) for calls in a.batches()] == [4] and [len(calls) for calls in b.batches()] == [4]
    assert sorted(c.sample for c in a.batches()[0] + b.batches()[0]) == list(range(8))


def test_a_call_takes_no_more_than_the_actors_room():
    o, (a,) = orchestrator(k=3, actors=1)
    o.enqueue(groups(1, 8))
    dispatch(o)
    assert [len(calls) for calls in a.batches()] == [3] and o.queued == 5 and o.in_flight == 3
    o.pools.pools[0].slots[0].release(3)
    dispatch(o)
    assert [len(calls) for calls in a.batches()] == [3, 3] and o.queued == 2


def test_rollouts_of_different_groups_or_told_to_different_actors_are_not_sent_together():
    o, (a, b) = orchestrator(k=8)
    singles = groups(6, 1)
    o.enqueue(singles)
    dispatch(o)
    assert all(len(calls) == 1 for calls in a.batches() + b.batches()) and len(a.batches() + b.batches()) == 6

    o, (a, b) = orchestrator(k=8)
    group = groups(1, 4)
    for request, hint in zip(group, ["a1", "a1", "a0", "a0"]):
        o.hints.assign(request, hint)
    assert o.hints.told("a0") == o.hints.told("a1") == 2
    o.enqueue(group)
    dispatch(o)
    assert [[c.sample for c in calls] for calls in a.batches()] == [[2, 3]]
    assert [[c.sample for c in calls] for calls in b.batches()] == [[0, 1]]
    assert o.hints.told("a0") == o.hints.told("a1") == 0


@pytest.mark.ray
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ray_local")
def test_one_call_runs_its_rollouts_at_once_and_one_that_raises_does_not_take_the_others_with_it():
    import ray

    from raygrpo.config import load_config
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.resolve import resolve_run
    from raygrpo.core.types import RolloutCall, Status
    from tests.e2e_support import NapEnvironment
    from tests.ors_utils import ors_server, wait_until

    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        cfg = load_config(data={
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 4}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:nap_half_second"},
            "workers": {"num_env_actors": 1, "max_concurrent_per_actor": 8},
        })
        with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env) as runtime:
            (_, actor), = runtime.actors
            task = runtime.tasks[0]
            calls = [RolloutCall(task, "g", sample=0), RolloutCall(TaskRef(env="nope", index=0), "g", sample=1),
                     RolloutCall(task, "g", sample=2)]
            trajs = ray.get(actor.run_many.remote(calls), timeout=60)
        assert wait_until(lambda: server.live_sessions() == 0, 15)
    assert [t.sample for t in trajs] == [0, 1, 2]
    assert [t.status for t in trajs] == [Status.OK, Status.ENV_ERROR, Status.OK]
    assert [t.reward for t in trajs] == [1.0, None, 1.0]
    assert "KeyError" in trajs[1].error and "nope" in trajs[1].error and trajs[1].task.env == "nope"
    assert NapEnvironment.peak_napping == 2  # the two good ones napped at the same time
    assert runtime.leaked_envs == 0
