"""Fault and latency injection around real backends (the local sandbox and the null backend)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from harbor.environments.base import BaseEnvironment
from harbor.verifier.verifier import Verifier
from pydantic import ValidationError

from raygrpo.envs.harbor.faults import (
    FaultConfig,
    FaultInjectingEnvironment,
    InjectedExecTimeout,
    InjectedPostStartFailure,
    InjectedSandboxDeath,
    InjectedStartFailure,
    LogNormalLatency,
    wrap_environment,
)
from raygrpo.testing.null import live_null_environments
from raygrpo.sandbox.owners import live_sandboxes
from tests.sandbox_utils import NULL, assert_no_leaks, make_env, make_task, pid_namespace, pids_in_namespace


@pytest.fixture
def sroot(tmp_path: Path) -> Path:
    root = tmp_path / "sandboxes"
    yield root
    assert_no_leaks(root)


def null_env(tmp_path: Path, **kwargs) -> BaseEnvironment:
    task = tmp_path / "null-task"
    if not task.exists():
        make_task(tmp_path, "null-task")
    return make_env(task, tmp_path / "trials", tmp_path / "unused", import_path=NULL, kwargs=kwargs)[0]


def test_config_schema():
    assert FaultConfig(start_latency_s=1.5).start_latency_s == 1.5
    cfg = FaultConfig.model_validate(
        {"start_latency_s": {"dist": "lognormal", "median": 0.5, "sigma": 0.8, "max_s": 3}, "seed": 1}
    )
    assert isinstance(cfg.start_latency_s, LogNormalLatency)
    FaultConfig.model_validate({"exec_latency_s": {"dist": "uniform", "low": 0.1, "high": 0.2}})
    FaultConfig.model_validate({"start_latency_s": {"dist": "fixed", "value": 1.0}})
    with pytest.raises(ValidationError):
        FaultConfig.model_validate({"start_failure_rat": 0.1})  # extra=forbid catches typos
    with pytest.raises(ValidationError):
        FaultConfig.model_validate({"start_latency_s": {"dist": "uniform", "low": 2, "high": 1}})
    with pytest.raises(ValidationError):
        FaultConfig.model_validate({"start_latency_s": {"dist": "pareto", "alpha": 1}})
    with pytest.raises(ValidationError):
        FaultConfig(death_rate=1.5)


@pytest.mark.timeout(30)
async def test_wrap_is_transparent(tmp_path: Path):
    env = null_env(tmp_path)
    assert wrap_environment(env, None) is env
    assert wrap_environment(env, FaultConfig()) is env
    wrapped = wrap_environment(env, {"start_latency_s": 0.01})
    assert isinstance(wrapped, FaultInjectingEnvironment) and isinstance(wrapped, BaseEnvironment)
    assert wrapped.type() == "raygrpo-null" and wrapped.session_id == env.session_id
    assert wrapped.os == env.os and wrapped.capabilities == env.capabilities
    with wrapped.with_default_user("agent"):
        assert env.default_user == "agent"  # attribute writes reach the inner environment
    await wrapped.start(force_build=False)
    assert live_null_environments() >= 1
    assert (await wrapped.exec("true")).return_code == 0
    await wrapped.stop(delete=True)
    await wrapped.stop(delete=True)


@pytest.mark.timeout(30)
async def test_start_latency(tmp_path: Path):
    env = wrap_environment(null_env(tmp_path), FaultConfig(start_latency_s=0.3))
    t0 = time.perf_counter()
    await env.start(force_build=False)
    assert 0.29 < time.perf_counter() - t0 < 2.0
    await env.stop(delete=True)
    # Distributions: samples differ from sandbox to sandbox and stay within bounds; they overlap (awaited on the
    # loop, not slept on a thread), so 10 starts of 0.2-0.3 s take about 0.3 s, not 2.5 s.
    cfg = FaultConfig(start_latency_s={"dist": "uniform", "low": 0.2, "high": 0.3}, seed=3)
    samples = {cfg.start_latency_s.sample(FaultInjectingEnvironment(null_env(tmp_path), cfg, key=f"k{i}")._rng)
               for i in range(10)}
    assert len(samples) == 10 and all(0.2 <= x <= 0.3 for x in samples)
    envs = [FaultInjectingEnvironment(null_env(tmp_path), cfg, key=f"k{i}") for i in range(10)]
    t0 = time.perf_counter()
    await asyncio.gather(*(e.start(force_build=False) for e in envs))
    assert 0.2 <= time.perf_counter() - t0 < 1.5
    await asyncio.gather(*(e.stop(delete=True) for e in envs))


@pytest.mark.timeout(60)
async def test_start_failure_before_creation(tmp_path: Path, sroot: Path):
    before = live_null_environments()
    null = wrap_environment(null_env(tmp_path), FaultConfig(start_failure_rate=1.0))
    with pytest.raises(InjectedStartFailure, match="nothing was created"):
        await null.start(force_build=False)
    assert live_null_environments() == before
    local, _, _ = make_env(make_task(tmp_path, "t"), tmp_path / "trials", sroot)
    wrapped = wrap_environment(local, FaultConfig(start_failure_rate=1.0, start_latency_s=0.05))
    with pytest.raises(InjectedStartFailure):
        await wrapped.start(force_build=False)
    assert not sroot.exists() or list(sroot.iterdir()) == []
    await wrapped.stop(delete=True)  # a caller's `finally: stop()` is harmless


@pytest.mark.timeout(60)
async def test_post_start_failure_stops_the_inner_sandbox(tmp_path: Path, sroot: Path):
    local, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    wrapped = wrap_environment(local, FaultConfig(post_start_failure_rate=1.0))
    seen_ns = []
    real_start = local.start

    async def start_and_note(force_build: bool) -> None:
        await real_start(force_build)
        await local.exec("sleep 1000 &")
        seen_ns.append(pid_namespace(local.init_pid))

    local.start = start_and_note  # observe the sandbox that really came up (not a mock: it runs the real start)
    with pytest.raises(InjectedPostStartFailure, match="it was stopped") as info:
        await wrapped.start(force_build=False)
    assert isinstance(info.value, InjectedStartFailure)
    assert seen_ns and pids_in_namespace(seen_ns[0]) == []  # the sandbox and its background process are gone
    assert live_sandboxes(sroot) == []
    await wrapped.stop(delete=True)


@pytest.mark.timeout(60)
async def test_exec_hang_is_cut_at_its_timeout(tmp_path: Path, sroot: Path):
    local, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    env = wrap_environment(local, FaultConfig(exec_hang_rate=1.0))
    await env.start(force_build=False)
    try:
        t0 = time.perf_counter()
        with pytest.raises(InjectedExecTimeout, match="Command timed out after 1 seconds"):
            await env.exec("echo never", timeout_sec=1)
        assert 0.95 < time.perf_counter() - t0 < 3.0
        # Without a timeout of its own, a hung exec hangs until the caller's deadline.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(env.exec("echo never"), timeout=0.3)
    finally:
        await env.stop(delete=True)


@pytest.mark.timeout(60)
async def test_death_mid_episode(tmp_path: Path, sroot: Path):
    local, _, _ = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    # death_rate 0.5 with a fixed seed/key: some execs succeed, then the sandbox dies for good.
    env = FaultInjectingEnvironment(local, FaultConfig(death_rate=0.5, seed=7), key="episode-1")
    await env.start(force_build=False)
    ns = pid_namespace(local.init_pid)
    ok = 0
    try:
        with pytest.raises(InjectedSandboxDeath):
            for _ in range(100):
                assert (await env.exec("echo alive")).stdout == "alive\n"
                ok += 1
        for op in (env.exec("true"), env.upload_file(__file__, "/app/x"), env.download_file("/app/x", tmp_path / "x")):
            with pytest.raises(InjectedSandboxDeath, match="is dead"):
                await op
    finally:
        await env.stop(delete=True)
    assert pids_in_namespace(ns) == []  # stop() still stopped the real sandbox
    # The same seed and key replay the same episode.
    again = FaultInjectingEnvironment(null_env(tmp_path), FaultConfig(death_rate=0.5, seed=7), key="episode-1")
    await again.start(force_build=False)
    ok2 = 0
    try:
        while True:
            await again.exec("echo alive")
            ok2 += 1
    except InjectedSandboxDeath:
        pass
    await again.stop(delete=True)
    assert ok2 == ok


@pytest.mark.timeout(60)
async def test_seeded_rates(tmp_path: Path):
    cfg = FaultConfig(start_failure_rate=0.1, post_start_failure_rate=0.1, seed=11)
    async def outcomes(seed_cfg: FaultConfig) -> list[str]:
        out = []
        for i in range(400):
            env = FaultInjectingEnvironment(null_env(tmp_path), seed_cfg, key=f"task{i}")
            try:
                await env.start(force_build=False)
                out.append("ok")
            except InjectedPostStartFailure:
                out.append("post")
            except InjectedStartFailure:
                out.append("pre")
            finally:
                await env.stop(delete=True)
        return out

    before = live_null_environments()
    first = await outcomes(cfg)
    assert live_null_environments() == before  # every started inner env was stopped
    assert 20 <= first.count("pre") <= 60 and 15 <= first.count("post") <= 60, (first.count("pre"), first.count("post"))
    assert await outcomes(cfg) == first  # same seed, same keys: same faults
    assert await outcomes(cfg.model_copy(update={"seed": 12})) != first


@pytest.mark.timeout(60)
async def test_wrapped_local_sandbox_works_with_harbors_verifier(tmp_path: Path, sroot: Path):
    local, task, paths = make_env(make_task(tmp_path), tmp_path / "trials", sroot)
    env = wrap_environment(local, FaultConfig(start_latency_s=0.05, exec_latency_s=0.01))
    await env.start(force_build=False)
    try:
        await env.exec("echo 42 > /app/answer.txt")
        result = await Verifier(task=task, trial_paths=paths, environment=env).verify()
        assert result.rewards == {"reward": 1.0}
    finally:
        await env.stop(delete=True)


@pytest.mark.timeout(60)
async def test_null_backend_with_reward_through_the_verifier(tmp_path: Path):
    env, task, paths = make_env(make_task(tmp_path), tmp_path / "trials", tmp_path / "x", import_path=NULL,
                                kwargs={"reward": 0.5})
    await env.start(force_build=False)
    result = await Verifier(task=task, trial_paths=paths, environment=env).verify()
    await env.stop(delete=True)
    assert result.rewards == {"reward": 0.5}


@pytest.mark.timeout(60)
async def test_verifier_latency_delays_the_test_script_only(tmp_path: Path):
    """`verifier_latency_s` is added to the exec that runs the task's test script, not to the verifier's other execs
    (removing old rewards, chmod) nor to the agent's."""
    import time

    inner, task, paths = make_env(make_task(tmp_path), tmp_path / "trials", tmp_path / "x", import_path=NULL,
                                  kwargs={"reward": 1.0})
    env = wrap_environment(inner, FaultConfig(exec_latency_s=0.01, verifier_latency_s=0.3))
    timed: list[tuple[str, float]] = []
    exec_ = env.exec

    async def timed_exec(command, *args, **kwargs):
        began = time.perf_counter()
        try:
            return await exec_(command, *args, **kwargs)
        finally:
            timed.append((command, time.perf_counter() - began))

    object.__setattr__(env, "exec", timed_exec)
    await env.start(force_build=False)
    try:
        await env.exec("echo 42 > /app/answer.txt")
        result = await Verifier(task=task, trial_paths=paths, environment=env).verify()
    finally:
        await env.stop(delete=True)
    assert result.rewards == {"reward": 1.0}
    slow = [c for c, s in timed if s >= 0.3]
    assert len(slow) == 1 and "test-stdout.txt" in slow[0], timed
    assert all(s < 0.2 for c, s in timed if c not in slow), timed
