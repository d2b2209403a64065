"""Harbor suites end to end through Ray on the local sandbox backend, with leaks checked through the OS.

After each run the machine is searched for what the run's sandboxes left: processes carrying a sandbox mark in
their environment (`/proc/<pid>/environ`) and mounts of sandbox directories in any mount namespace
(`/proc/<pid>/mountinfo`) — not raygrpo's own bookkeeping.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import ray

from raygrpo.driver.collect import collect
from raygrpo.config import load_config
from raygrpo.sandbox.os_probe import process_env_marks, sandbox_mounts
from tests.ors_utils import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

HARBOR = "examples/harbor_local/rollout.yaml"
SUPPORT = str(Path(__file__).with_name("e2e_support.py"))


@pytest.fixture
def sandbox_base(tmp_path, monkeypatch) -> Path:
    """Sandboxes of the test's runs go under their own base folder (each run adds its own sub-folder)."""
    base = tmp_path / "sandboxes"
    monkeypatch.setenv("RAYGRPO_SANDBOX_ROOT", str(base))
    return base


def os_leaks(base: Path) -> tuple[list[int], list[str]]:
    """Sandbox processes and sandbox mounts under `base` still present on this machine."""
    prefix = str(base)
    pids = [pid for pid, (root, _) in process_env_marks().items() if root and root.startswith(prefix)]
    return pids, sandbox_mounts(base)


def no_os_leaks(base: Path, timeout_s: float = 10.0) -> bool:
    return wait_until(lambda: os_leaks(base) == ([], []), timeout_s)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("overrides, reward", [
    ([], 1.0),  # the example's own policy: the oracle runs each task's solution/solve.sh
    (["policy.kind=scripted", "policy.script=policies.py:wrong"], 0.0),  # a model's path: a tool call, nothing solved
], ids=["oracle", "scripted-wrong"])
def test_harbor_example_scores_and_leaves_nothing(tmp_path, sandbox_base, overrides, reward):
    cfg = load_config(HARBOR, overrides)
    summary = collect(cfg, tmp_path / "out", progress=False)
    assert summary["completed"] == summary["requested"] == 9 * 2
    assert summary["status_counts"] == {"ok": 18}
    assert summary["reward_mean"] == reward and summary["scored"] == 18
    workers = cfg.workers
    assert summary["max_concurrent_envs"] == min(18, workers.num_env_actors * workers.max_concurrent_per_actor)
    assert summary["leaked_envs"] == 0 and summary["leaked_envs_by_node"] == {}
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)
    assert list(sandbox_base.iterdir()) == []  # the run's folder went at its end


@pytest.mark.timeout(240)
def test_injected_start_failures_are_accounted_for_and_leak_nothing(tmp_path, sandbox_base):
    """About 20% of starts fail (half before anything exists, half after the sandbox is up)."""
    cfg = load_config(HARBOR, [
        "envs.local.faults={start_failure_rate: 0.1, post_start_failure_rate: 0.1, seed: 7}",
        "rollout.group_size=4", "workers.max_retries=3",
    ])
    summary = collect(cfg, tmp_path / "out", progress=False)
    assert summary["completed"] == summary["requested"] == 36
    assert sum(summary["status_counts"].values()) == 36
    assert summary["retried_attempts"] > 0
    # Infrastructure failures that ran out of retries stay unscored, never 0.0.
    assert summary["scored"] == summary["status_counts"].get("ok", 0)
    assert summary["reward_mean"] == 1.0
    assert summary["leaked_envs"] == 0
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)


@pytest.mark.timeout(240)
def test_failed_run_leaves_nothing(tmp_path, sandbox_base):
    """Every sandbox dies right after it starts: the run ends with every rollout unscored, and nothing is left."""
    cfg = load_config(HARBOR, ["envs.local.faults={post_start_failure_rate: 1.0}", "workers.max_retries=1"])
    summary = collect(cfg, tmp_path / "out", progress=False)
    assert summary["status_counts"] == {"env_error": 18}
    assert summary["scored"] == 0 and summary["reward_mean"] is None
    assert summary["leaked_envs"] == 0
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)


def _busy_runtime(cfg_overrides):
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.resolve import resolve_run

    cfg = load_config(HARBOR, ["policy.kind=scripted", f"policy.script={SUPPORT}:bash_sleep",
                               "envs.local.exec_timeout_s=600", *cfg_overrides])
    return RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env)


@pytest.mark.timeout(240)
def test_cancelled_batch_kills_every_sandbox_process(sandbox_base):
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.orchestrator import Orchestrator
    from raygrpo.driver.pools import PoolSet

    with _busy_runtime([]) as runtime:
        stop = threading.Event()
        stream = Orchestrator(PoolSet.of_actors(runtime.actors, 8)).run(make_groups(runtime.tasks, 2), stop)
        finished: list = []
        consumer = threading.Thread(target=lambda: finished.extend(stream))
        consumer.start()
        # Nothing finishes (every rollout sleeps): wait until 16 sandboxes run their sleeps, then cancel the batch.
        busy = wait_until(lambda: len(os_leaks(sandbox_base)[0]) >= 16, 60)
        stop.set()
        consumer.join(30)
        assert busy, os_leaks(sandbox_base)
        assert not consumer.is_alive() and finished == []
    assert runtime.leaked_envs == 0
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)


@pytest.mark.timeout(240)
def test_sigkill_of_an_env_pool_actor_is_reaped(sandbox_base):
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.orchestrator import Orchestrator
    from raygrpo.driver.pools import PoolSet

    with _busy_runtime(["rollout.rollout_timeout_s=90"]) as runtime:
        (victim_name, victim), _ = runtime.actors
        victim_pid = ray.get(victim.pid.remote())
        stop = threading.Event()
        orchestrator = Orchestrator(PoolSet.of_actors(runtime.actors, 8), max_retries=0)
        stream = orchestrator.run(make_groups(runtime.tasks, 2), stop)
        finished: list = []
        consumer = threading.Thread(target=lambda: finished.extend(stream))
        consumer.start()
        run_root = Path(runtime.sandbox_root)

        def busy_victim_sandboxes() -> set[str]:
            """The victim's sandboxes that have processes running (its starts may lag the other actor's)."""
            if not run_root.is_dir():
                return set()
            ids = {d.name for d in run_root.iterdir() if _owner_pid(d) == victim_pid}
            return {sid for _, sid in process_env_marks().values() if sid in ids}

        assert wait_until(lambda: len(busy_victim_sandboxes()) >= 4, 60), os_leaks(sandbox_base)
        victim_ids = {d.name for d in run_root.iterdir() if _owner_pid(d) == victim_pid}
        victim_procs = lambda: [p for p, (_, sid) in process_env_marks().items() if sid in victim_ids]  # noqa: E731
        assert victim_ids and victim_procs()
        os.kill(victim_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # The victim's rollouts come back as env_error (the actor died) ...
        assert wait_until(lambda: len(finished) >= 8, 30), finished
        assert all(t.status.value == "env_error" and victim_name in (t.error or "") for t in finished)
        # ... and within 30 s its sandboxes' processes are gone and the reaper has removed their folders.
        assert wait_until(lambda: not victim_procs(), 30), victim_procs()
        victim_dirs = lambda: [d.name for d in run_root.iterdir() if d.name in victim_ids]  # noqa: E731
        assert wait_until(lambda: not victim_dirs(), 30 - (time.monotonic() - killed_at)), victim_dirs()
        stop.set()
        consumer.join(30)
    assert no_os_leaks(sandbox_base), os_leaks(sandbox_base)


def _owner_pid(sandbox_dir: Path) -> int | None:
    import json

    try:
        return json.loads((sandbox_dir / "owner.json").read_text()).get("pid")
    except (OSError, ValueError):
        return None
