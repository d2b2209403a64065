"""Warm pools and hedged starts of Harbor sandboxes (`raygrpo.envs.harbor.warm`, `raygrpo.envs.harbor.starts`) on the
local sandbox backend, driven by the real agent loop: a warm sandbox is adopted and never by two rollouts, one that
fails its check is replaced, one past its TTL is stopped, a cancelled rollout leaves the pool's start to the pool, a
hedged start's loser is stopped after its rollout ended. Leaks are counted through the OS (`/proc`: sandbox
processes and mounts, and the sandbox registry's directories), not through raygrpo's bookkeeping."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.policy.base import SamplingParams
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.agent.rollout import run_rollout
from raygrpo.sandbox.local import LocalSandboxEnvironment
from raygrpo.sandbox.os_probe import sandbox_processes
from raygrpo.core.types import Status
from raygrpo.specs.provider import ProviderSpec
from tests.harbor_utils import bash_script, make_task
from tests.test_harbor_adapter import nothing_left, renderer, root, spec_for  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)

CONFIG = RolloutConfig(max_turns=3, max_total_tokens=4096, max_tool_output_chars=8000)


class DelayedStart(LocalSandboxEnvironment):
    """The local backend whose starts wait first: the n-th start of the process waits `DELAYS[n]` seconds (0 past
    the list), before anything of the sandbox exists."""

    DELAYS: list[float] = []
    calls = 0

    async def start(self, force_build: bool) -> None:
        n, DelayedStart.calls = DelayedStart.calls, DelayedStart.calls + 1
        delay = DelayedStart.DELAYS[n] if n < len(DelayedStart.DELAYS) else 0.0
        await asyncio.sleep(delay)
        await super().start(force_build)


@pytest.fixture
def delays():
    DelayedStart.calls = 0
    DelayedStart.DELAYS = []
    yield DelayedStart.DELAYS
    DelayedStart.DELAYS = []


def suite(tmp_path, root, **fields):
    make_task(tmp_path / "suite", "t", test_sh='echo 1 > /logs/verifier/reward.txt')
    return spec_for(tmp_path / "suite", root, import_path=f"{__name__}:DelayedStart", **fields)


async def rollout(provider, renderer, ref):
    return await run_rollout(ref, provider.adapter(), ScriptedPolicy(renderer.tokenizer, bash_script("echo hi")),
                             renderer, SamplingParams(max_tokens=256), CONFIG)


async def until(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


# ── warm pool ──────────────────────────────────────────────────────────────────────────────────────────────────


async def test_a_warm_sandbox_is_adopted_by_one_rollout_only(renderer, root, tmp_path, delays):
    provider = HarborProvider(suite(tmp_path, root, warm_pool={"size": 1, "ttl_s": 60}), name="suite")
    ref = list_harbor_tasks(provider.spec, "suite")[0]
    try:
        provider.expect([ref])
        await until(lambda: provider.warm.stats()["ready"] == 1)
        assert len(sandbox_processes(root)) > 0  # started ahead, through the OS
        delays.extend([0.0] * DelayedStart.calls + [1.0] * 4)  # later starts (cold ones) take a second
        began = time.monotonic()
        first, second = await asyncio.gather(rollout(provider, renderer, ref), rollout(provider, renderer, ref))
        trajs = [first, second]
        assert all(t.status is Status.OK and t.reward == 1.0 for t in trajs), [t.error for t in trajs]
        assert sorted(t.sandbox for t in trajs) == ["cold", "warm"]
        warm = next(t for t in trajs if t.sandbox == "warm")
        cold = next(t for t in trajs if t.sandbox == "cold")
        assert "start" not in warm.timings and warm.timings["warm_wait"] < 0.5
        assert cold.timings["start"] >= 1.0
        assert time.monotonic() - began >= 1.0
        stats = provider.warm.stats()
        assert (stats["hits"], stats["misses"], stats["ready"], stats["starting"]) == (1, 1, 0, 0)
    finally:
        await provider.aclose()
    await nothing_left(root)


async def test_a_warm_sandbox_failing_its_check_is_stopped_and_replaced(renderer, root, tmp_path, delays):
    provider = HarborProvider(suite(tmp_path, root, warm_pool={"size": 2, "ttl_s": 60}), name="suite")
    ref = list_harbor_tasks(provider.spec, "suite")[0]
    try:
        provider.expect([ref, ref])
        await until(lambda: provider.warm.stats()["ready"] == 2)
        broken = provider.warm._ready[provider.task_dir_of(ref)][0]
        os.kill(broken.env.init_pid, signal.SIGKILL)  # dies while it waits
        # A SIGKILL lands when the kernel next schedules the init: under load, a check made before that still passes
        # (as a sandbox dying between its check and its first exec would), which is not what this test is about.
        await until(lambda: not broken.env.is_running())
        traj = await rollout(provider, renderer, ref)
        assert traj.status is Status.OK and traj.reward == 1.0 and traj.sandbox == "warm", traj.error
        assert provider.warm.stats()["unhealthy"] == 1 and provider.warm.stats()["hits"] == 1
        assert broken.closed
    finally:
        await provider.aclose()
    await nothing_left(root)


async def test_warm_sandboxes_past_their_ttl_are_stopped(root, tmp_path, delays):
    provider = HarborProvider(suite(tmp_path, root, warm_pool={"size": 2, "ttl_s": 0.8}), name="suite")
    ref = list_harbor_tasks(provider.spec, "suite")[0]
    try:
        provider.expect([ref, ref])
        await until(lambda: provider.warm.stats()["ready"] == 2)
        await until(lambda: provider.warm.stats()["expired"] == 2, timeout_s=10)
        await nothing_left(root)  # the provider is still open: the TTL stopped them
        assert provider.warm.stats()["expected"] == 0  # the tasks that did not come are forgotten too
        assert provider.live_sandboxes == 0
    finally:
        await provider.aclose()


async def test_a_rollout_waiting_for_a_live_ticket_held_by_an_idle_warm_sandbox_gets_it(renderer, root, tmp_path,
                                                                                        delays):
    """Under `max_live: 1` the warm sandbox of a task that does not come holds the only ticket until its TTL (60 s);
    a rollout of another task waiting for a ticket has the pool stop it instead, and the pool starts no other
    warm sandbox into the freed ticket meanwhile."""
    make_task(tmp_path / "suite", "u", test_sh='echo 1 > /logs/verifier/reward.txt')
    provider = HarborProvider(suite(tmp_path, root, warm_pool={"size": 1, "ttl_s": 60}), name="suite",
                              limits=ProviderSpec(max_live=1))
    told, other = list_harbor_tasks(provider.spec, "suite")
    try:
        provider.expect([told])
        await until(lambda: provider.warm.stats()["ready"] == 1)
        began = time.monotonic()
        traj = await asyncio.wait_for(rollout(provider, renderer, other), 20)
        assert traj.status is Status.OK and traj.reward == 1.0, traj.error
        assert traj.sandbox == "cold"
        assert time.monotonic() - began < 10  # not the TTL
        stats = provider.warm.stats()
        assert stats["evicted"] == 1 and stats["expired"] == 0
        # Once the rollout's sandbox is stopped, the pool starts the told task's sandbox again.
        await until(lambda: provider.warm.stats()["ready"] == 1)
        assert provider.warm.stats()["started"] == 2
    finally:
        await provider.aclose()
    await nothing_left(root)


async def test_a_warm_start_queued_for_a_live_ticket_gives_up_for_a_rollouts_own_start(renderer, root, tmp_path,
                                                                                       delays):
    """`max_live: 1`, a pool of 2 for the same task: one warm sandbox holds the ticket, the second warm start waits
    for it. A rollout of another task: the queued warm start gives up (it would take the freed ticket first), the
    ready one is stopped, and only that one."""
    make_task(tmp_path / "suite", "u", test_sh='echo 1 > /logs/verifier/reward.txt')
    provider = HarborProvider(suite(tmp_path, root, warm_pool={"size": 2, "ttl_s": 60}), name="suite",
                              limits=ProviderSpec(max_live=1))
    told, other = list_harbor_tasks(provider.spec, "suite")
    try:
        provider.expect([told, told])
        await until(lambda: provider.warm.stats()["ready"] == 1 and provider.warm.stats()["starting"] == 1)
        traj = await asyncio.wait_for(rollout(provider, renderer, other), 20)
        assert traj.status is Status.OK and traj.reward == 1.0, traj.error
        stats = provider.warm.stats()
        assert (stats["yielded"], stats["evicted"], stats["failed"]) == (1, 1, 0), stats
    finally:
        await provider.aclose()
    await nothing_left(root)


async def test_a_rollout_of_another_suite_waiting_for_the_live_ticket_of_a_warm_sandbox_gets_it(renderer, root,
                                                                                              tmp_path, delays):
    """Two suites on one provider key (one governor, `max_live: 1`): suite A's warm pool holds the only ticket for a
    task that does not come; a rollout of suite B, which has no pool and so no part in A's own give-way, waits for a
    ticket. The governor tells A's pool to stop its sandbox (not its TTL of 60 s)."""
    make_task(tmp_path / "b", "b", test_sh='echo 1 > /logs/verifier/reward.txt')
    one = ProviderSpec(max_live=1)  # the provider's one `providers:` entry, for both suites
    pooled = HarborProvider(suite(tmp_path, root, warm_pool={"size": 1, "ttl_s": 60}), name="a", limits=one)
    other = HarborProvider(spec_for(tmp_path / "b", root, import_path=f"{__name__}:DelayedStart"), name="b",
                           limits=one)
    assert pooled.spec.provider_key == other.spec.provider_key
    try:
        pooled.expect(list_harbor_tasks(pooled.spec, "a"))
        await until(lambda: pooled.warm.stats()["ready"] == 1)
        began = time.monotonic()
        traj = await asyncio.wait_for(rollout(other, renderer, list_harbor_tasks(other.spec, "b")[0]), 20)
        assert traj.status is Status.OK and traj.reward == 1.0, traj.error
        assert time.monotonic() - began < 10  # not the TTL
        assert pooled.warm.stats()["evicted"] == 1
        assert pooled.gate.stats()["max_live"] == 1
    finally:
        await asyncio.gather(pooled.aclose(), other.aclose())
    await nothing_left(root)


async def test_a_rollout_cancelled_while_it_waits_for_a_warm_start_leaves_it_to_the_pool(renderer, root, tmp_path,
                                                                                      delays):
    delays.extend([1.5])
    provider = HarborProvider(suite(tmp_path, root, warm_pool={"size": 1, "ttl_s": 60}), name="suite")
    ref = list_harbor_tasks(provider.spec, "suite")[0]
    try:
        provider.expect([ref])
        await until(lambda: provider.warm.stats()["starting"] == 1)
        waiting = asyncio.create_task(rollout(provider, renderer, ref))
        await asyncio.sleep(0.3)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await until(lambda: provider.warm.stats()["ready"] == 1)  # the pool's start went on
        traj = await rollout(provider, renderer, ref)
        assert traj.sandbox == "warm" and traj.status is Status.OK
    finally:
        await provider.aclose()
    await nothing_left(root)


async def test_closing_the_provider_stops_warm_sandboxes_and_warm_starts_in_flight(root, tmp_path, delays):
    delays.extend([0.0, 0.0, 3.0])
    provider = HarborProvider(suite(tmp_path, root, warm_pool={"size": 3, "ttl_s": 60}), name="suite")
    ref = list_harbor_tasks(provider.spec, "suite")[0]
    provider.expect([ref, ref, ref])
    await until(lambda: provider.warm.stats()["ready"] == 2 and provider.warm.stats()["starting"] == 1)
    assert provider.live_sandboxes == 3
    await provider.aclose()
    assert provider.live_sandboxes == 0
    await nothing_left(root, timeout_s=2)


async def test_auto_size_follows_littles_law(root, tmp_path, delays):
    provider = HarborProvider(suite(tmp_path, root, warm_pool={"size": "auto", "max_size": 8}), name="suite")
    try:
        pool = provider.warm
        assert pool.size == 1  # nothing measured and nothing told yet
        pool.starts._seconds.extend([2.0] * 5)  # starts take 2 s
        now = time.monotonic()
        pool._arrivals.extend(now - 10 + i * 0.5 for i in range(20))  # 2 rollouts/s over 10 s
        assert pool.size == 5  # 2/s x 2 s, plus one
        pool.starts._seconds.extend([30.0] * 200)
        assert pool.size == 8  # capped at max_size
    finally:
        await provider.aclose()


# ── hedged starts ──────────────────────────────────────────────────────────────────────────────────────────────


async def test_a_slow_start_is_hedged_and_its_loser_stopped_after_the_rollout_ended(renderer, root, tmp_path,
                                                                                     delays):
    delays.extend([4.0])  # the first start hangs for 4 s before its sandbox exists; the hedge's is immediate
    spec = suite(tmp_path, root, hedge={"floor_s": 0.3, "cap_s": 0.3, "min_samples": 1})
    provider = HarborProvider(spec, name="suite")
    ref = list_harbor_tasks(spec, "suite")[0]
    try:
        began = time.monotonic()
        traj = await rollout(provider, renderer, ref)
        assert traj.status is Status.OK and traj.sandbox == "hedged", traj.error
        assert time.monotonic() - began < 3.5
        assert provider.starts.stats()["hedged"] == 1 and provider.starts.stats()["hedge_wins"] == 1
        assert provider.live_sandboxes == 1  # the loser, still starting after its rollout ended
        await until(lambda: provider.live_sandboxes == 0, timeout_s=15)  # came up, then was stopped
        await nothing_left(root)
    finally:
        await provider.aclose()
    await nothing_left(root)


async def test_a_start_under_the_threshold_is_not_hedged(renderer, root, tmp_path, delays):
    delays.extend([0.2])
    provider = HarborProvider(suite(tmp_path, root, hedge={"floor_s": 2.0, "cap_s": 5.0}), name="suite")
    ref = list_harbor_tasks(provider.spec, "suite")[0]
    try:
        traj = await rollout(provider, renderer, ref)
        assert traj.status is Status.OK and traj.sandbox == "cold"
        assert provider.starts.stats()["hedged"] == 0 and DelayedStart.calls == 1
    finally:
        await provider.aclose()
    await nothing_left(root)


async def test_a_rollout_cancelled_during_a_hedged_start_leaves_nothing(renderer, root, tmp_path, delays):
    delays.extend([3.0, 3.0])
    provider = HarborProvider(suite(tmp_path, root, hedge={"floor_s": 0.2, "cap_s": 0.2, "min_samples": 1}),
                              name="suite")
    ref = list_harbor_tasks(provider.spec, "suite")[0]
    try:
        running = asyncio.create_task(rollout(provider, renderer, ref))
        await until(lambda: provider.starts.stats()["hedged"] == 1)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert provider.live_sandboxes == 0
    finally:
        await provider.aclose()
    await nothing_left(root)


def test_hedge_threshold_is_a_percentile_within_floor_and_cap(root, tmp_path):
    provider = HarborProvider(suite(tmp_path, root, hedge={"percentile": 0.9, "floor_s": 1.0, "cap_s": 20.0,
                                                             "min_samples": 5}), name="suite")
    starts = provider.starts
    assert starts.threshold_s() == 20.0  # too few measured: the cap
    starts._seconds.extend([0.1] * 10)
    assert starts.threshold_s() == 1.0  # the floor
    starts._seconds.extend([float(i) for i in range(1, 11)] * 10)
    assert 8.0 <= starts.threshold_s() <= 10.0
    starts._seconds.extend([100.0] * 200)
    assert starts.threshold_s() == 20.0  # the cap
