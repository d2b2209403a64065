"""A sandbox whose stop failed may still be alive at the provider: its stop is retried, and while it may be alive
it keeps its live ticket, so `providers.<p>.max_live` holds; what is still leased after the run counts as leaked.
Against the fake provider, with its backend's DELETE made to fail."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from raygrpo.envs.harbor import sandbox as sandbox_module
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.governor.gate import reset_gates
from raygrpo.leases.ledger import LEASE_DIR_ENV, LeaseLedger
from raygrpo.specs import HarborSpec, ProviderSpec
from raygrpo.testing.fake_provider.backend import FakeProviderEnvironment
from raygrpo.testing.fake_provider.service import FakeProviderProcess
from raygrpo.testing.fake_provider.state import Limits
from tests.harbor_utils import make_task

FAKE = "raygrpo.testing.fake_provider.backend:FakeProviderEnvironment"


@pytest.fixture
def provider(tmp_path, monkeypatch):
    monkeypatch.setenv(LEASE_DIR_ENV, str(tmp_path / "leases"))
    reset_gates()
    with FakeProviderProcess(tmp_path / "calls.jsonl", Limits()) as running:
        yield running
    reset_gates()


@pytest.fixture
def failing_deletes(monkeypatch):
    """The backend's stop raises while `left[0]` > 0 (each failure counts it down; -1: fail until told)."""
    left = [0]
    real_stop = FakeProviderEnvironment.stop

    async def stop(self, delete: bool = True) -> None:
        if left[0] != 0:
            left[0] -= 1 if left[0] > 0 else 0
            raise RuntimeError("503 from the provider's delete API")
        await real_stop(self, delete)

    monkeypatch.setattr(FakeProviderEnvironment, "stop", stop)
    return left


def _spec(tmp_path, url: str) -> HarborSpec:
    make_task(tmp_path / "suite", "t")
    return HarborSpec(path=str(tmp_path / "suite"), import_path=FAKE, provider="fake", probe_verifier=False,
                      environment_kwargs={"url": url, "reward": 1.0}, stop_timeout_s=10)


async def test_a_stop_that_failed_twice_is_retried_and_leaves_nothing(tmp_path, provider, failing_deletes):
    spec = _spec(tmp_path, provider.url)
    suite = HarborProvider(spec, name="suite")
    adapter = suite.adapter()
    try:
        await adapter.start(list_harbor_tasks(spec, "suite")[0])
        assert len(provider.live()) == 1
        failing_deletes[0] = 2
        await adapter.close()
        assert failing_deletes[0] == 0 and provider.live() == [] and LeaseLedger().leases() == []
    finally:
        await suite.aclose()


async def test_a_sandbox_whose_stop_failed_keeps_its_live_ticket_until_it_is_gone(tmp_path, provider, failing_deletes,
                                                                                   monkeypatch):
    monkeypatch.setattr(sandbox_module, "RESTOP_INITIAL_S", 0.2, raising=False)
    monkeypatch.setattr(sandbox_module, "RESTOP_MAX_S", 0.2, raising=False)
    spec = _spec(tmp_path, provider.url)
    suite = HarborProvider(spec, name="suite", limits=ProviderSpec(max_live=1))
    task = list_harbor_tasks(spec, "suite")[0]
    first, second = suite.adapter(), suite.adapter()
    try:
        await first.start(task)
        failing_deletes[0] = -1  # the provider's delete API is down
        await first.close()
        assert len(provider.live()) == 1 and len(LeaseLedger().leases()) == 1
        waiting = asyncio.ensure_future(second.start(task))
        await asyncio.sleep(1.5)  # several background tries, all refused: the cap of 1 is still taken
        assert not waiting.done() and len(provider.live()) == 1
        failing_deletes[0] = 0  # the delete API is back: the next try stops it, and only then the next start goes
        await asyncio.wait_for(waiting, 20)
        (alive,) = provider.live()
        assert alive["id"] == second.sandbox.env.sandbox_id
        assert [lease.sandbox_id for lease in LeaseLedger().leases()] == [alive["id"]]
    finally:
        failing_deletes[0] = 0
        await second.close()
        await first.close()
        await suite.aclose()
    assert provider.live() == [] and LeaseLedger().leases() == []


async def test_the_ticket_of_a_sandbox_that_cannot_be_stopped_goes_back_when_its_lifetime_is_over(
        tmp_path, provider, failing_deletes, monkeypatch, caplog):
    monkeypatch.setattr(sandbox_module, "RESTOP_INITIAL_S", 0.2, raising=False)
    spec = _spec(tmp_path, provider.url)
    suite = HarborProvider(spec, name="suite", limits=ProviderSpec(max_live=1))
    task = list_harbor_tasks(spec, "suite")[0]
    first, second = suite.adapter(), suite.adapter()
    try:
        await first.start(task)
        (lease,) = LeaseLedger().leases()
        soon = time.time() + 1.0
        first.sandbox._lease = dataclasses.replace(lease, expires=soon)  # as if its lifetime ends now
        failing_deletes[0] = -1
        await first.close()
        await asyncio.wait_for(second.start(task), 20)  # not a deadlock: the ticket came back at the expiry
        assert time.time() >= soon and "its lifetime at the provider is over" in caplog.text
    finally:
        failing_deletes[0] = 0
        await second.close()
        await suite.aclose()


def test_leases_the_end_of_run_reap_kept_count_as_leaked(tmp_path, monkeypatch):
    """A sandbox whose stop failed, and whose provider the reap cannot reach either, is still billing: the run
    reports it in `leaked_envs` (before, `leaked_envs: 0`); one whose lifetime there is over is not counted."""
    from raygrpo.config import load_config
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.sandbox.owners import ROOT_ENV
    from tests.test_lease_ledger import leases_of_a_dead_owner, lease_spec
    from tests.test_providers import two_suites_on_e2b

    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "sandboxes"))
    runtime = RolloutRuntime(load_config(data=two_suites_on_e2b()), {"swe": None, "sql": None})
    runtime.lease_dir = str(tmp_path / "leases")
    down = "http://127.0.0.1:9"  # nothing answers: the reap keeps these leases
    leases_of_a_dead_owner(tmp_path / "leases", lease_spec("kept-1", url=down, run=runtime.run_id),
                           lease_spec("kept-2", url=down, run=runtime.run_id),
                           lease_spec("over", url=down, run=runtime.run_id, expires=time.time() - 1),
                           lease_spec("other-run", url=down, run="run-other"))
    runtime._reap_own_leases()
    assert runtime.leaked_leases == 2 and runtime.leaked_envs == 2
