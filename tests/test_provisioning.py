"""Provisioning control: the create schedule, the gate's concurrency bound and cancellation, the governor actor.

Everything but the last test runs without Ray, against the in-process `CreateSchedule`; the last one kills the
named governor actor mid-run (once restarted by Ray, once for good) and checks that starts go on within the rate.
The multi-node acceptance run is in `test_rate_limit_cluster.py`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid

import pytest

from raygrpo.governor import Governor
from raygrpo.governor import CreateSchedule, Reservation, local_governor, max_per_window
from raygrpo.governor.gate import ProvisioningError, ProvisioningGate, gate_for, gate_stats, reset_gates


@pytest.fixture(autouse=True)
def _fresh_gates():
    reset_gates()
    yield
    reset_gates()


async def _run_starters(gates: list[ProvisioningGate], per_gate: int, seconds: float, body_s: float = 0.02):
    """Each gate gets `per_gate` loops of `async with gate.start_slot(): record`; returns the sorted create times."""
    creates: list[float] = []
    end = time.time() + seconds

    async def starter(gate: ProvisioningGate) -> None:
        while time.time() < end:
            async with gate.start_slot():
                creates.append(time.time())
                await asyncio.sleep(body_s * random.uniform(0.5, 1.5))

    await asyncio.wait_for(asyncio.gather(*(starter(g) for g in gates for _ in range(per_gate))), seconds + 10)
    return sorted(creates)


def _gates(n: int, rate: float, schedule: CreateSchedule, concurrent: int = 3) -> list[ProvisioningGate]:
    return [ProvisioningGate(concurrent, rate, "p", governor=schedule) for _ in range(n)]


@pytest.mark.timeout(30)
async def test_schedule_reaches_the_rate_and_never_exceeds_it():
    rate = 20.0
    schedule = CreateSchedule("p", rate)
    gates = _gates(4, rate, schedule)
    creates = await _run_starters(gates, per_gate=3, seconds=3.0)
    assert max_per_window(creates) <= rate
    assert len(creates) >= 50
    # A wake later than the margin (another process took the CPU) gives its slot up: count those as offered.
    late = sum(g.stats()["late_wakes"] for g in gates)
    assert late <= 5 and (len(creates) - 1 + late) / (creates[-1] - creates[0]) >= 0.9 * rate
    # spread: every gate got its share
    assert all(g.stats()["granted"] >= 8 for g in gates)


@pytest.mark.timeout(30)
async def test_late_wakes_give_their_slot_up_and_the_rate_still_holds():
    """A loop blocked now and then (as on a loaded machine) wakes starts late; none may push a window over."""
    rate = 20.0
    schedule = CreateSchedule("p", rate)
    gates = _gates(4, rate, schedule)
    stop = asyncio.Event()

    async def hog() -> None:
        while not stop.is_set():
            time.sleep(random.uniform(0.0, 0.09))  # blocks the loop, as a busy process would
            await asyncio.sleep(random.uniform(0.0, 0.05))

    hogging = asyncio.create_task(hog())
    try:
        creates = await _run_starters(gates, per_gate=3, seconds=3.0)
    finally:
        stop.set()
        await hogging
    assert max_per_window(creates) <= rate
    assert sum(g.stats()["late_wakes"] for g in gates) > 0
    assert len(creates) >= 0.5 * 3.0 * rate


@pytest.mark.timeout(20)
async def test_concurrency_limit_holds():
    gate = ProvisioningGate(max_concurrent_starts=3)
    inside = peak = 0

    async def start() -> None:
        nonlocal inside, peak
        async with gate.start_slot():
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.03)
            inside -= 1

    tasks = [asyncio.create_task(start()) for _ in range(12)]
    await asyncio.sleep(0.01)
    stats = gate.stats()
    assert stats["starting"] == 3 and stats["waiting"] == 9
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert peak == 3
    stats = gate.stats()
    assert (stats["granted"], stats["waiting"], stats["starting"]) == (12, 0, 0)
    assert stats["mean_wait_s"] > 0 and len(gate.grant_times()) == 12


@pytest.mark.timeout(20)
async def test_released_slot_goes_to_the_next_request():
    schedule = CreateSchedule("p", 10.0, max_lead_s=100.0)
    got = [await schedule.reserve(f"r{i}") for i in range(5)]
    gaps = [b.at - a.at for a, b in zip(got, got[1:])]
    assert all(abs(g - schedule.interval_s) < 1e-6 for g in gaps)
    assert schedule.release("r2") and not schedule.release("r2")
    again = await schedule.reserve("r5")
    assert again.at == got[2].at  # no hole left behind
    assert (await schedule.reserve("r6")).at == pytest.approx(got[4].at + schedule.interval_s)
    assert (await schedule.reserve("r5")).at == again.at  # asking again answers the same slot
    assert schedule.stats()["reused"] == 1


@pytest.mark.timeout(20)
async def test_a_missed_slot_queues_again_first_and_the_spacing_holds():
    schedule = CreateSchedule("p", 2.0, max_lead_s=0.0, max_hold_s=0.02, min_lead_s=0.0)
    near = await schedule.reserve("near")
    assert near.ready
    queued = {f"q{i}": await schedule.reserve(f"q{i}") for i in range(4)}
    assert not any(res.ready for res in queued.values())
    # "near"'s caller woke too late: its new request goes before the four queued ones, which each move one slot on.
    again = await schedule.reserve("again", first=True)
    assert again.at == pytest.approx(queued["q0"].at)
    moved = {rid: (await schedule.reserve(rid)).at for rid in queued}
    assert [moved[f"q{i}"] for i in range(4)] == pytest.approx([queued[f"q{i}"].at for i in range(1, 4)]
                                                                + [queued["q3"].at + schedule.interval_s])
    slots = sorted([near.at, again.at, *moved.values()])
    assert min(b - a for a, b in zip(slots, slots[1:])) >= schedule.interval_s - 1e-9
    assert schedule.stats()["queued"] == 5


@pytest.mark.timeout(20)
async def test_answers_are_held_until_the_slot_is_near():
    schedule = CreateSchedule("p", 10.0, max_lead_s=0.2, max_hold_s=0.1, min_lead_s=0.0)
    pending = 0

    async def ask(rid: str) -> tuple[Reservation, float]:
        nonlocal pending
        while not (res := await schedule.reserve(rid)).ready:
            pending += 1
        return res, time.time()

    answers = await asyncio.wait_for(asyncio.gather(*(ask(f"r{i}") for i in range(8))), 10)
    assert pending > 0
    assert all(res.at - answered <= 0.2 + 0.02 for res, answered in answers)
    slots = sorted(res.at for res, _ in answers)
    assert slots[-1] - slots[0] == pytest.approx(7 * schedule.interval_s)


@pytest.mark.timeout(20)
async def test_recovering_schedule_leaves_a_pause():
    fresh = CreateSchedule("p", 5.0)
    recovering = CreateSchedule("p", 5.0, max_lead_s=1.0, margin_s=0.05, recovering=True)
    assert fresh.stats()["next_slot_in_s"] < 0.01
    assert recovering.stats()["next_slot_in_s"] >= 2.0
    with pytest.raises(ValueError):
        CreateSchedule("p", 5.0, margin_s=0.0)


@pytest.mark.timeout(20)
async def test_abandoned_request_is_released():
    schedule = CreateSchedule("p", 2.0, max_lead_s=0.05, max_hold_s=0.05, min_lead_s=0.0, abandon_after_s=0.1)
    first = await schedule.reserve("now")
    assert first.ready
    assert not (await schedule.reserve("gone")).ready  # its caller never asks again
    await asyncio.sleep(0.7)
    await schedule.reserve("later")
    assert schedule.stats()["abandoned"] == 1


@pytest.mark.timeout(20)
async def test_cancelled_start_releases_its_slot():
    schedule = CreateSchedule("p", 5.0)
    gate = ProvisioningGate(None, 5.0, "p", governor=schedule)

    async def start() -> float:
        async with gate.start_slot():
            return time.time()

    tasks = [asyncio.create_task(start()) for _ in range(4)]
    await asyncio.sleep(0.05)
    tasks[2].cancel()
    late = asyncio.create_task(start())
    times = await asyncio.wait_for(asyncio.gather(tasks[0], tasks[1], tasks[3], late), 10)
    with pytest.raises(asyncio.CancelledError):
        await tasks[2]
    stats = gate.stats()
    assert (stats["cancelled"], stats["waiting"], stats["starting"], stats["granted"]) == (1, 0, 0, 4)
    assert schedule.stats()["released"] == 1 and schedule.stats()["reused"] == 1
    assert max(times) - min(times) < 3.5 * schedule.interval_s  # the late start took the cancelled one's slot


@pytest.mark.timeout(20)
async def test_wait_beyond_max_wait_fails_and_frees_the_slot():
    schedule = CreateSchedule("p", 1.0, max_hold_s=0.1)
    gate = ProvisioningGate(None, 1.0, "p", governor=schedule, max_wait_s=0.3)

    async def start() -> None:
        async with gate.start_slot():
            pass

    results = await asyncio.wait_for(asyncio.gather(*(start() for _ in range(4)), return_exceptions=True), 10)
    errors = [r for r in results if isinstance(r, ProvisioningError)]
    assert len(errors) >= 2 and "max_wait_s" in str(errors[0])
    # It names what a config sets: the provider's rate and the starts queued.
    assert "providers.p.create_rate_per_s" in str(errors[0]) and "max_concurrent_starts" in str(errors[0])
    stats = gate.stats()  # the longest wait is its own figure, not the bound's name
    assert "max_wait_s" not in stats and stats["longest_wait_s"] > 0
    assert schedule.stats()["queued"] == 0 and stats["waiting"] == 0


@pytest.mark.timeout(20)
async def test_late_answer_queues_again():
    class LateOnce:
        def __init__(self) -> None:
            self.calls = 0
            self.first: list[bool] = []

        async def reserve(self, request_id: str, first: bool = False) -> Reservation:
            self.calls += 1
            self.first.append(first)
            now = time.time()
            at = now - 1.0 if self.calls == 1 else now + 0.01
            return Reservation(request_id, at, at + 0.04, True, 5.0)

        def release(self, request_id: str) -> None:
            pass

    fake = LateOnce()
    gate = ProvisioningGate(1, 5.0, "p", governor=fake)
    async with gate.start_slot():
        pass
    assert fake.calls == 2 and gate.stats()["late_wakes"] == 1
    assert fake.first == [False, True]  # the second request goes before the queue
    stats = gate.stats()  # the first answer came a second after its slot: late before the wait for it began
    assert stats["late_on_arrival"] == 1 and stats["late_max_s"] >= 1.0


@pytest.mark.timeout(20)
async def test_gate_for_shares_one_gate_per_key(caplog):
    a = gate_for("e2b", 4, None)
    assert gate_for("e2b", 4, None) is a
    assert [g["key"] for g in gate_stats()] == ["e2b"]  # what an env pool actor reports in its stats
    assert gate_for("docker", 4, None) is not a
    with caplog.at_level(logging.WARNING, logger="raygrpo.governor.gate"):
        assert gate_for("e2b", 8, None) is a
    assert "already set" in caplog.text
    with pytest.raises(ValueError):
        ProvisioningGate(2, 5.0, None)
    with pytest.raises(ValueError, match="governor"):
        ProvisioningGate(2, 5.0, "p")  # a rate needs a governor to reserve from
    limited = gate_for("local-rate", 2, 5.0)  # no factory given: this process's own governor of the key
    assert isinstance(limited._governor, Governor) and limited._governor is local_governor("local-rate", 5.0)


@pytest.mark.ray
@pytest.mark.timeout(90)
async def test_ray_governor_death_is_survived(ray_local):
    """Kill the named governor once with a Ray restart and once for good; starts go on and never exceed the rate."""
    import ray

    from raygrpo.governor.actor import NAMESPACE, RayGovernorClient, ensure_governor, governor_name

    key, rate = f"test-{uuid.uuid4().hex[:8]}", 10.0
    assert ensure_governor(key, rate)["rate_per_s"] == rate
    gate = gate_for(key, 2, rate, governors=RayGovernorClient)
    creates: list[float] = []
    end = time.time() + 10.0

    async def starter() -> None:
        while time.time() < end:
            async with gate.start_slot():
                creates.append(time.time())

    running = asyncio.gather(*(starter() for _ in range(3)))
    kills = []
    for no_restart in (False, True):
        await asyncio.sleep(1.0)
        kills.append(time.time())
        ray.kill(ray.get_actor(governor_name(key), namespace=NAMESPACE), no_restart=no_restart)
        await asyncio.sleep(2.5)
    await asyncio.wait_for(running, 60)
    assert isinstance(gate._governor, RayGovernorClient)
    assert max_per_window(creates) <= rate
    assert any(t > kills[1] + 1.0 for t in creates), "no create after the governor was killed for good"
    assert ray.get(ray.get_actor(governor_name(key), namespace=NAMESPACE).ping.remote(), timeout=30)["granted"] > 0


@pytest.mark.ray
@pytest.mark.timeout(90)
async def test_the_named_governor_serves_a_rollouts_start_before_a_warm_one_and_asks_the_warm_holder_to_give_way(
        ray_local):
    """Two gates (two actors) on the named governor of a key with `max_live: 1`: one holds the ticket for a warm
    sandbox and queues a second warm start; the other's rollout start, queued later, is told to go first, and the
    first gate, asking, is told to stop its warm sandbox."""
    from raygrpo.governor.actor import RayGovernorClient, ensure_governor

    key = f"test-{uuid.uuid4().hex[:8]}"
    ensure_governor(key, None, max_live=1)
    pool, other = (ProvisioningGate(key=key, max_live=1, governor=RayGovernorClient(key, None, max_live=1))
                   for _ in range(2))
    held = await pool.acquire_live(warm=True)
    assert not await pool.ask_evict()  # nobody waits
    queued_warm = asyncio.create_task(pool.acquire_live(warm=True))
    await asyncio.sleep(0.3)
    own = asyncio.create_task(other.acquire_live())
    await asyncio.sleep(1.0)
    try:
        assert await pool.ask_evict()
        pool.release_live(held)
        ticket = await asyncio.wait_for(own, 10)
        assert ticket is not None and not queued_warm.done()
        other.release_live(ticket)
        pool.release_live(await asyncio.wait_for(queued_warm, 10))
    finally:
        for task in (queued_warm, own, pool._renewer, other._renewer):
            if task is not None:
                task.cancel()
