"""Elastic env pools on a local Ray: a burst grows the pool up to its maximum, idle actors drain, a lost actor's
rollouts are retried on the others and the pool is refilled.

Sessions are counted by the ORS server itself and the pool's size by Ray's own list of actors, not only by the
pools' bookkeeping.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
import ray

from raygrpo.driver.collect import collect
from raygrpo.config import load_config
from raygrpo.driver.launch import RolloutRuntime
from raygrpo.driver.attempts import make_groups
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.driver.resolve import resolve_run
from tests.e2e_support import NapEnvironment
from tests.ors_utils import ors_server, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

SUPPORT = str(Path(__file__).with_name("e2e_support.py"))


def _config(url: str, workers: dict, num_tasks: int = 32, script: str = "nap_one_and_a_half_seconds"):
    return load_config(data={
        "envs": {"nap": {"kind": "ors", "url": url, "num_tasks": num_tasks}},
        "policy": {"kind": "scripted", "script": f"{SUPPORT}:{script}"},
        "rollout": {"group_size": 1},
        "workers": {"max_concurrent_per_actor": 4, "actor_num_cpus": 0, **workers},
    })


def _ray_alive_actors(prefix: str) -> set[str]:
    """Named actors Ray holds (a dead actor's name is released), from the GCS."""
    return {name for name in ray.util.list_named_actors() if name.startswith(prefix)}


@pytest.mark.timeout(240)
def test_a_burst_grows_the_pool_and_idle_actors_drain():
    """An elastic pool with min 0 holds no actor until rollouts queue up; 32 rollouts at K=4 grow it to its max of
    4; once nothing runs for `idle_timeout_s` every actor is drained (Ray no longer lists it) and no session is
    left on the server."""
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        cfg = _config(server.url, {"min_env_actors": 0, "max_env_actors": 4, "idle_timeout_s": 1.0})
        with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env, actor_prefix="elastic-burst") as runtime:
            pools = runtime.pools
            assert pools.snapshot()["workers"]["actors"] == 0 and _ray_alive_actors("elastic-burst") == set()
            sizes: list[int] = []
            orchestrator = Orchestrator(pools=pools)
            trajs = list(orchestrator.run(make_groups(runtime.tasks, 1),
                                          on_poll=lambda o: sizes.append(pools.snapshot()["workers"]["actors"])))
            assert len(trajs) == 32 and all(t.status.value == "ok" for t in trajs)
            assert max(sizes) == 4 and pools.snapshot()["workers"]["started"] == 4
            assert len({t.worker for t in trajs}) == 4
            # Idle now: ticking the pools drains every actor after the idle timeout.
            assert wait_until(lambda: orchestrator.poll(timeout=0.2) == [] and
                              pools.snapshot()["workers"]["drained"] == 4, 30), pools.snapshot()
            snap = pools.snapshot()["workers"]
            assert snap["actors"] == 0 and 0 < snap["idle_actor_seconds"] < snap["actor_seconds"]
            assert 0 < snap["utilization"] < 1
            assert wait_until(lambda: _ray_alive_actors("elastic-burst") == set(), 20)
        assert runtime.leaked_envs == 0
        assert wait_until(lambda: server.live_sessions() == 0, 10), server.live_sessions()


@pytest.mark.timeout(240)
def test_rollout_run_records_the_pools_in_metrics_and_summary(tmp_path):
    """`raygrpo rollout` with an elastic pool: the metrics file has `pools` lines (the pool growing from 0), the
    summary the actors started; every rollout accounted for."""
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        cfg = _config(server.url, {"min_env_actors": 0, "max_env_actors": 3}, num_tasks=24)
        summary = collect(cfg, tmp_path / "out", progress=False)
        assert wait_until(lambda: server.live_sessions() == 0, 10)
    assert summary["completed"] == summary["requested"] == 24 and summary["status_counts"] == {"ok": 24}
    assert summary["leaked_envs"] == 0
    assert summary["pools"]["workers"]["started"] == 3 and summary["pools"]["workers"]["lost"] == 0
    lines = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(x["kind"] == "pools" for x in lines)
    assert lines[-1]["attempts_by_status"] == {"ok": 24}
    assert max(x["pools"]["workers"]["actors"] + x["pools"]["workers"]["starting"] for x in lines) == 3


@pytest.mark.timeout(240)
@pytest.mark.parametrize("tasks, group_size", [(32, 1), (8, 4)])
def test_a_killed_actor_costs_retries_and_is_replaced(tasks, group_size):
    """`kill -9` of one of two actors mid-batch: its rollouts come back as attempts lost to the actor and are
    retried on the other, a replacement starts, every rollout ends `ok` exactly once, and the only sessions left on
    the server are the killed actor's. With groups of 4 (K = 4) the actor's one call held a whole group."""
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        cfg = _config(server.url, {"num_env_actors": 2, "max_retries": 2})
        with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env, actor_prefix="elastic-kill") as runtime:
            pools = runtime.pools
            (victim_name, victim), _ = runtime.actors
            victim_pid = ray.get(victim.pid.remote())
            orchestrator = Orchestrator(pools=pools)
            finished: list = []
            stream = orchestrator.run(make_groups(runtime.tasks[:tasks], group_size))
            consumer = threading.Thread(target=lambda: finished.extend(stream))
            consumer.start()
            assert wait_until(lambda: NapEnvironment.napping >= 8, 30)
            os.kill(victim_pid, signal.SIGKILL)
            consumer.join(180)
            assert not consumer.is_alive()
            # The replacement may still be starting when the batch ends: the pool gets back to its size.
            assert wait_until(lambda: pools.tick() or pools.snapshot()["workers"]["actors"] == 2, 60)
            snap = pools.snapshot()["workers"]
            assert snap["lost"] == 1 and snap["started"] == 3, snap
            assert victim_name not in _ray_alive_actors("elastic-kill")
            assert len(_ray_alive_actors("elastic-kill")) == 2
        assert len(finished) == 32 and all(t.status.value == "ok" for t in finished)
        assert len({(t.group_id, t.sample) for t in finished}) == 32
        assert orchestrator.stats.lost_to_actors == 4 and orchestrator.stats.retried == 4
        assert sum(t.attempt == 1 for t in finished) == 4
        assert runtime.leaked_envs == 0
        # What is left on the server is the killed actor's four sessions, nothing else: the process that could close
        # them is gone, and an ORS server ends such sessions itself once they go unpinged (its reaper, 900 s).
        assert wait_until(lambda: server.live_sessions() == 4, 15), server.live_sessions()


@pytest.mark.timeout(420)
def test_async_training_survives_a_killed_env_pool_actor(tiny_model_dir, tmp_path):
    """`raygrpo train` (async) while one of its two env pool actors is `kill -9`ed after the first step: training
    finishes its steps, the lost attempts were retried, the learner's pool replaced the actor, and metrics.jsonl
    counts the retries and the loss."""
    from raygrpo.train.metrics import read_metrics
    from raygrpo.train.run import train

    NapEnvironment.reset_counters()
    out = tmp_path / "run"
    with ors_server(NapEnvironment) as server:
        cfg = load_config(data={
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 16}},
            "model": tiny_model_dir,
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:nap_one_and_a_half_seconds"},
            "sampling": {"max_tokens": 64},
            "rollout": {"group_size": 2},
            "workers": {"num_env_actors": 2, "max_concurrent_per_actor": 4, "max_retries": 2},
            "train": {"mode": "async", "max_staleness": 1},
            "trainer": {"per_device_train_batch_size": 4, "max_steps": 6, "save_steps": 100, "learning_rate": 1e-3},
        })
        killed: list[str] = []

        def kill_one_after_the_first_step() -> None:
            metrics = out / "metrics.jsonl"
            if not wait_until(lambda: metrics.exists() and any(r["kind"] == "train" for r in read_metrics(metrics)),
                              240, interval_s=0.5):
                return
            name = sorted(n for n in ray.util.list_named_actors() if n.startswith("raygrpo-train-envpool"))[0]
            os.kill(ray.get(ray.get_actor(name).pid.remote()), signal.SIGKILL)
            killed.append(name)

        killer = threading.Thread(target=kill_one_after_the_first_step)
        killer.start()
        summary = train(cfg, out, progress=False)
        killer.join(10)
    assert killed, "no env pool actor was killed"
    lines = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5, 6] and summary["steps"] == 6
    last = lines[-1]
    assert last["attempts_lost_to_actors_total"] >= 1
    assert last["rollouts_retried_total"] >= last["attempts_lost_to_actors_total"]
    assert summary["pools"]["workers"]["lost"] == 1 and summary["pools"]["workers"]["started"] == 3
    assert summary["rollouts_retried_total"] >= 1
    assert all(r["groups"] == 2 and r["rollouts"] == 4 for r in lines)
