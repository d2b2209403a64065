"""Warm pools end to end through Ray on the local sandbox backend: `raygrpo rollout` and async `raygrpo train` runs
get warm hits from sandboxes started for the tasks their queue and schedule say come next, and a cancelled batch or
a killed env pool actor leaves none of its warm sandboxes behind (checked through the OS, as in test_e2e_harbor)."""

from __future__ import annotations

import json
import os
import signal
import statistics
import threading
import time
from pathlib import Path

import pytest
import ray

from raygrpo.driver.collect import collect
from raygrpo.config import load_config
from raygrpo.sandbox.os_probe import process_env_marks
from tests.ors_utils import wait_until
from tests.test_e2e_harbor import HARBOR, SUPPORT, no_os_leaks, os_leaks, sandbox_base  # noqa: F401 - fixture

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

ROOT = Path(__file__).resolve().parent.parent
WARM = ["envs.local.warm_pool={size: 2, ttl_s: 60}", "envs.local.faults={start_latency_s: 1.0}",
        "workers.num_env_actors=1", "workers.max_concurrent_per_actor=2"]


@pytest.mark.timeout(240)
def test_a_rollout_run_with_a_warm_pool_gets_warm_hits_and_leaves_nothing(tmp_path, sandbox_base):
    summary = collect(load_config(HARBOR, WARM), tmp_path / "out", progress=False)
    assert summary["completed"] == summary["requested"] == 18 and summary["status_counts"] == {"ok": 18}
    assert summary["reward_mean"] == 1.0
    sandboxes = summary["sandboxes"]
    assert sum(sandboxes.values()) == 18 and sandboxes.get("warm", 0) >= 8, sandboxes
    # A warm hit's start began before its rollout came: it waits less than a cold rollout's start takes.
    trajs = [json.loads(line) for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    warm = [t["timings"]["warm_wait"] for t in trajs if t["sandbox"] == "warm"]
    cold = [t["timings"]["start"] for t in trajs if t["sandbox"] == "cold"]
    assert statistics.mean(warm) < statistics.mean(cold) and min(cold) >= 1.0, (warm, cold)
    assert summary["leaked_envs"] == 0
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)


def _busy_runtime(overrides):
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.resolve import resolve_run

    cfg = load_config(HARBOR, ["policy.kind=scripted", f"policy.script={SUPPORT}:bash_sleep",
                               "envs.local.exec_timeout_s=600", "envs.local.warm_pool={size: 3, ttl_s: 120}",
                               "workers.num_env_actors=1", "workers.max_concurrent_per_actor=2", *overrides])
    return RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env)


def _sandbox_ids(base: Path) -> set[str]:
    return {sid for root, sid in process_env_marks().values() if root and root.startswith(str(base))}


@pytest.mark.timeout(240)
def test_a_cancelled_batch_stops_the_warm_sandboxes_too(sandbox_base):
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.orchestrator import Orchestrator

    with _busy_runtime([]) as runtime:
        stop = threading.Event()
        stream = Orchestrator(pools=runtime.pools).run(make_groups(runtime.tasks, 2), stop)
        finished: list = []
        consumer = threading.Thread(target=lambda: finished.extend(stream))
        consumer.start()
        # Two rollouts sleep in their sandboxes; three more sandboxes are warm for the rollouts queued behind them.
        busy = wait_until(lambda: len(_sandbox_ids(sandbox_base)) >= 5, 60)
        stop.set()
        consumer.join(30)
        assert busy, _sandbox_ids(sandbox_base)
        assert not consumer.is_alive() and finished == []
    assert runtime.leaked_envs == 0
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)


@pytest.mark.timeout(240)
def test_the_warm_sandboxes_of_a_killed_actor_are_reaped(sandbox_base):
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.orchestrator import Orchestrator

    with _busy_runtime(["rollout.rollout_timeout_s=90", "workers.max_retries=0"]) as runtime:
        ((_, victim),) = runtime.actors
        victim_pid = ray.get(victim.pid.remote())
        stop = threading.Event()
        stream = Orchestrator(pools=runtime.pools, max_retries=0).run(make_groups(runtime.tasks[:2], 2), stop)
        finished: list = []
        consumer = threading.Thread(target=lambda: finished.extend(stream))
        consumer.start()
        assert wait_until(lambda: len(_sandbox_ids(sandbox_base)) >= 4, 60), _sandbox_ids(sandbox_base)
        os.kill(victim_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # Its rollouts' sandboxes and its warm ones: every process gone within 30 s (the node's reaper).
        assert wait_until(lambda: not _sandbox_ids(sandbox_base), 30), _sandbox_ids(sandbox_base)
        assert time.monotonic() - killed_at < 30
        stop.set()
        consumer.join(60)
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)


@pytest.mark.timeout(300)
def test_an_async_train_run_with_a_warm_pool_records_warm_hits(tiny_model_dir, tmp_path, sandbox_base):
    from raygrpo.train.metrics import read_metrics
    from raygrpo.train.run import train

    cfg = load_config(HARBOR, [
        *WARM, f"model={tiny_model_dir}", "policy.kind=scripted", "policy.script=policies.py:right",
        "train.mode=async", "train.max_staleness=1", "rollout.group_size=2",
        "trainer={per_device_train_batch_size: 4, max_steps: 3, save_steps: 100, learning_rate: 0.001}",
    ])
    out = tmp_path / "run"
    summary = train(cfg, out, progress=False)
    lines = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in lines] == [1, 2, 3]
    assert all(sum(r["sandboxes"].values()) == r["rollouts"] for r in lines)
    assert sum(r["warm_hits"] for r in lines) > 0, [r["sandboxes"] for r in lines]
    assert summary["leaked_envs"] == 0
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)


@pytest.mark.timeout(300)
def test_a_sync_train_run_warms_the_next_steps_sandboxes_from_the_schedule(tiny_model_dir, tmp_path, sandbox_base):
    """A step's 4 rollouts all fit the actor at once (K = 4): nothing ever queues, so only the schedule's next step,
    foreseen while this one runs, can have started their sandboxes."""
    from raygrpo.train.metrics import read_metrics
    from raygrpo.train.run import train

    cfg = load_config(HARBOR, [
        "envs.local.warm_pool={size: 4, ttl_s: 120}", "envs.local.faults={start_latency_s: 1.0}",
        "workers.num_env_actors=1", "workers.max_concurrent_per_actor=4",
        f"model={tiny_model_dir}", "policy.kind=scripted", "policy.script=policies.py:right",
        "train.mode=sync", "rollout.group_size=2",
        "trainer={per_device_train_batch_size: 4, max_steps: 3, save_steps: 100, learning_rate: 0.001}",
    ])
    out = tmp_path / "run"
    summary = train(cfg, out, progress=False)
    lines = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in lines] == [1, 2, 3] and all(r["rollouts"] == 4 for r in lines)
    assert lines[0]["warm_hits"] == 0  # nothing was foreseen before the first step
    assert lines[1]["warm_hits"] + lines[2]["warm_hits"] >= 4, [r["sandboxes"] for r in lines]
    assert summary["leaked_envs"] == 0
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)
