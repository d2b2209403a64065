"""End to end through Ray: `collect` (what `raygrpo rollout` runs) against real ORS servers.

Leaks are checked on the server side: the ORS server's own registry of live sessions, not raygrpo's bookkeeping.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from raygrpo.driver.collect import collect
from raygrpo.config import load_config
from raygrpo.core.errors import ResolveError
from tests.e2e_support import NUM_TASKS, FlakyEnvironment, NapEnvironment
from tests.ors_utils import closed_port, ors_server, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

SUPPORT = str(Path(__file__).with_name("e2e_support.py"))


def _run(tmp_path, config: str | None = None, overrides=(), data=None):
    cfg = load_config(config, list(overrides), data=data)
    summary = collect(cfg, tmp_path / "out", progress=False)
    lines = (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary
    return summary, [json.loads(line) for line in lines]


def _accounted(summary):
    assert summary["completed"] == summary["requested"]
    assert sum(summary["status_counts"].values()) == summary["requested"]
    assert summary["leaked_envs"] == 0
    assert all(v == 0 for v in summary["server_live_sessions"].values())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("script, reward, status", [("right", 1.0, "ok"), ("wrong", 0.0, "ok"),
                                                    ("silent", 0.0, "no_answer")])
def test_echo_example_rewards(tmp_path, script, reward, status):
    summary, trajs = _run(tmp_path, "examples/echo/rollout.yaml", [f"policy.script=policies.py:{script}"])
    _accounted(summary)
    assert summary["requested"] == len(trajs) == 8 * 4
    assert summary["reward_mean"] == reward and summary["scored"] == summary["requested"]
    assert all(t["reward"] == reward and t["schema_version"] == 6 for t in trajs)
    assert summary["status_counts"] == {status: 32}
    assert summary["max_concurrent_envs"] >= 2
    # Token bookkeeping as the learner will read it.
    for t in trajs:
        assert len(t["completion_ids"]) == len(t["env_mask"]) == len(t["logprobs"]) > 0


@pytest.mark.timeout(180)
def test_arith_example_multi_step(tmp_path):
    summary, trajs = _run(tmp_path, "examples/arith/rollout.yaml")
    _accounted(summary)
    assert summary["reward_mean"] == 1.0
    assert all(t["tool_calls"] >= 3 and 0 in t["env_mask"] for t in trajs)
    wrong, _ = _run(tmp_path / "wrong", "examples/arith/rollout.yaml", ["policy.script=policies.py:wrong"])
    assert wrong["reward_mean"] == 0.0


def _flaky_config(url: str, retries: int) -> dict:
    return {
        "envs": {"flaky": {"kind": "ors", "url": url}},
        "policy": {"kind": "scripted", "script": f"{SUPPORT}:call_answer"},
        "rollout": {"group_size": 2},
        "workers": {"num_env_actors": 2, "max_concurrent_per_actor": 8, "max_retries": retries},
    }


@pytest.mark.timeout(180)
def test_dead_sessions_are_retried_and_the_batch_completes(tmp_path):
    FlakyEnvironment.sessions_by_task.clear()
    with ors_server(FlakyEnvironment) as server:
        summary, trajs = _run(tmp_path, data=_flaky_config(server.url, retries=2))
        assert wait_until(lambda: server.live_sessions() == 0, 10)
    _accounted(summary)
    # The first session of each task died; its rollout was run again and scored.
    assert summary["retried_attempts"] == NUM_TASKS
    assert summary["reward_mean"] == 1.0 and summary["scored"] == NUM_TASKS * 2
    assert sorted(t["attempt"] for t in trajs).count(1) == NUM_TASKS


@pytest.mark.timeout(180)
def test_without_retries_a_dead_session_is_unscored_not_zero(tmp_path):
    FlakyEnvironment.sessions_by_task.clear()
    with ors_server(FlakyEnvironment) as server:
        summary, trajs = _run(tmp_path, data=_flaky_config(server.url, retries=0))
        assert wait_until(lambda: server.live_sessions() == 0, 10)
    assert summary["status_counts"]["env_error"] == NUM_TASKS
    failed = [t for t in trajs if t["status"] == "env_error"]
    assert len(failed) == NUM_TASKS and all(t["reward"] is None for t in failed)
    assert summary["reward_mean"] == 1.0  # over the scored ones only


@pytest.mark.timeout(180)
def test_a_failure_that_repeats_identically_is_not_retried_again(tmp_path):
    """A script that raises the same exception every time: each rollout runs twice (the first retry shows the
    failure is not a glitch), not 1 + max_retries times. Counted by the server: one session per attempt."""
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        summary, trajs = _run(tmp_path, data={
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 4}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:broken"},
            "rollout": {"group_size": 1},
            "workers": {"num_env_actors": 1, "max_retries": 2},
        })
        assert wait_until(lambda: server.live_sessions() == 0, 10)
    assert NapEnvironment.created == 8
    assert summary["status_counts"] == {"policy_error": 4} and summary["retried_attempts"] == 4
    assert sorted(t["attempt"] for t in trajs) == [1, 1, 1, 1]
    [cause] = summary["failure_causes"]
    assert cause["count"] == 4 and cause["status"] == "policy_error" and "no answer today" in cause["example"]


@pytest.mark.timeout(180)
def test_failed_run_leaves_no_session(tmp_path):
    """Every generation fails (the policy server answers every completion with HTTP 500): all rollouts end
    policy_error, and every session was closed."""
    from tests.fake_vllm import FakeVLLM, ServerThread

    policy = FakeVLLM([2], model="m")
    policy.fail_next = 10**6
    with ors_server("examples/echo/env.py:EchoEnvironment") as server, ServerThread(policy.app) as policy_server:
        data = {
            "envs": {"echo": {"kind": "ors", "url": server.url}},
            "policy": {"kind": "vllm", "url": policy_server.url, "served_model_name": "m", "request_timeout_s": 5},
            "rollout": {"group_size": 1},
            "workers": {"max_retries": 1},
        }
        summary, trajs = _run(tmp_path, data=data)
        assert wait_until(lambda: server.live_sessions() == 0, 10)
    assert summary["status_counts"] == {"policy_error": 8}
    assert summary["scored"] == 0 and summary["reward_mean"] is None
    assert summary["retried_attempts"] == 8
    assert summary["leaked_envs"] == 0


@pytest.mark.timeout(180)
@pytest.mark.parametrize("tasks, group_size", [(16, 1), (4, 4)])
def test_cancelled_batch_leaves_no_session(tmp_path, tasks, group_size):
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.orchestrator import Orchestrator
    from raygrpo.driver.pools import PoolSet
    from raygrpo.driver.resolve import resolve_run

    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        cfg = load_config(data={
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 16}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:nap_long"},
            "rollout": {"group_size": 1},
            "workers": {"num_env_actors": 2, "max_concurrent_per_actor": 8},
        })
        with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env) as runtime:
            stop = threading.Event()
            stream = Orchestrator(PoolSet.of_actors(runtime.actors, 8)).run(
                make_groups(runtime.tasks[:tasks], group_size), stop)
            finished: list = []
            consumer = threading.Thread(target=lambda: finished.extend(stream))
            consumer.start()
            busy = wait_until(lambda: NapEnvironment.napping == 16, 30)
            # Stopping the stream cancels the rollouts in flight; shutting the runtime down closes the rest.
            stop.set()
            consumer.join(30)
            assert busy and not consumer.is_alive() and finished == []
            assert server.live_sessions() <= 16
        assert runtime.leaked_envs == 0
        assert wait_until(lambda: server.live_sessions() == 0, 15), server.live_sessions()
        assert NapEnvironment.live == 0


@pytest.mark.timeout(180)
def test_one_actor_runs_64_sessions_at_once(tmp_path):
    """64 sessions on one env pool actor, each with one 1.5 s tool call on the server, all napping at once, finish
    within 6 s (one after another they would take 96 s). The nap is long enough that starting 64 sessions on a loaded
    2-core machine still overlaps them all (with 0.5 s naps the peak fell to ~50 in full-suite runs). The rest of the
    wall time is CPU: the server shares this process's GIL, and on 2 cores it measured 3.0-4.1 s idle, 4.8 s in CI."""
    NapEnvironment.reset_counters()
    with ors_server(NapEnvironment) as server:
        cfg = load_config(data={
            "envs": {"nap": {"kind": "ors", "url": server.url}},
            "policy": {"kind": "scripted", "script": f"{SUPPORT}:nap_one_and_a_half_seconds"},
            "rollout": {"group_size": 1},
            "workers": {"num_env_actors": 1, "max_concurrent_per_actor": 64},
        })
        summary = collect(cfg, tmp_path / "out", progress=False)
        assert wait_until(lambda: server.live_sessions() == 0, 10)
    _accounted(summary)
    assert summary["reward_mean"] == 1.0 and summary["requested"] == 64
    assert NapEnvironment.peak_napping == 64 and NapEnvironment.peak_live == 64
    assert summary["max_concurrent_envs"] == 64
    print(f"\n64 sessions on one actor (1.5 s nap each): {summary['wall_seconds']:.2f} s")
    assert summary["wall_seconds"] <= 6.0, summary["wall_seconds"]


@pytest.mark.timeout(120)
def test_unreachable_url_fails_fast_naming_url_and_field(tmp_path):
    port = closed_port()
    cfg = load_config(data={"envs": {"echo": {"kind": "ors", "url": f"http://127.0.0.1:{port}"}},
                            "policy": {"kind": "scripted", "script": f"{SUPPORT}:call_answer"}})
    start = time.monotonic()
    with pytest.raises(ResolveError) as info:
        collect(cfg, tmp_path / "out", progress=False)
    assert time.monotonic() - start < 30
    assert str(info.value).startswith(f"envs.echo.url: cannot reach the ORS server at http://127.0.0.1:{port}/")
    # Found while resolving the config, before anything ran: there are no outputs to write.
    assert not os.path.exists(tmp_path / "out")
