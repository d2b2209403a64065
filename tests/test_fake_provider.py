"""The fake sandbox provider: its limits, lifetimes and log, and the Harbor backend that talks to it.

The service runs in its own process on 127.0.0.1 (`FakeProviderProcess`); figures are read back from its call log
(`audit`), the provider's view, as the governor and ledger tests will judge raygrpo by it.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from raygrpo.testing.fake_provider.audit import audit
from raygrpo.testing.fake_provider.backend import RUN_LABEL, FakeProviderEnvironment, ProviderRateLimited, SandboxGone
from raygrpo.testing.fake_provider.service import FakeProviderProcess
from raygrpo.testing.fake_provider.state import Limits

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def provider(tmp_path):
    with FakeProviderProcess(tmp_path / "calls.jsonl", Limits(create_rate_per_s=5, max_live=8)) as running:
        yield running


async def _create_many(url: str, n: int, lifetime_s: float | None = None) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        return await asyncio.gather(*(client.post("/sandboxes", json={"lifetime_s": lifetime_s, "labels": {}})
                                      for _ in range(n)))


def test_a_burst_beyond_the_create_rate_is_answered_429(provider):
    responses = asyncio.run(_create_many(provider.url, 12))
    accepted = [r for r in responses if r.status_code == 201]
    refused = [r for r in responses if r.status_code == 429]
    assert len(accepted) == 5 and len(refused) == 7
    assert all(0 <= float(r.headers["Retry-After"]) <= 1.0 and "too many requests" in r.json()["error"]
               for r in refused)
    figures = audit(provider.log_path)
    assert figures.creates == 5 and figures.rejected_rate == 7 and figures.max_creates_per_s == 5
    assert figures.live == figures.max_live == 5


def test_the_live_cap_holds_until_a_sandbox_goes(provider):
    ids = [r.json()["id"] for r in asyncio.run(_create_many(provider.url, 5))]
    time.sleep(1.05)  # past the rate window
    ids += [r.json()["id"] for r in asyncio.run(_create_many(provider.url, 3))]
    time.sleep(1.05)
    [full] = asyncio.run(_create_many(provider.url, 1))
    assert full.status_code == 429 and "live" in full.json()["error"]
    assert httpx.delete(f"{provider.url}/sandboxes/{ids[0]}").status_code == 204
    assert httpx.delete(f"{provider.url}/sandboxes/{ids[0]}").status_code == 404
    [again] = asyncio.run(_create_many(provider.url, 1))
    assert again.status_code == 201
    figures = audit(provider.log_path)
    assert figures.max_live == 8 and figures.rejected_live == 1 and figures.deletes == 1 and figures.live == 8


def test_a_sandbox_dies_when_its_lifetime_ends(provider):
    [created] = asyncio.run(_create_many(provider.url, 1, lifetime_s=0.5))
    sandbox = created.json()["id"]
    time.sleep(0.8)
    assert provider.live() == []
    exec_after = httpx.post(f"{provider.url}/sandboxes/{sandbox}/exec", json={"command": "true"})
    assert exec_after.status_code == 404
    figures = audit(provider.log_path)
    assert figures.expired == 1 and figures.live == 0


def test_a_held_create_already_bills(provider):
    """While the provider holds a create's answer back, the sandbox already exists (the client may never learn
    its id: what the lease ledger is for)."""
    provider.set_limits(hold_creates=True)

    async def held() -> httpx.Response:
        async with httpx.AsyncClient(base_url=provider.url, timeout=10) as client:
            task = asyncio.create_task(client.post("/sandboxes", json={"labels": {"k": "v"}}))
            await asyncio.sleep(0.5)
            assert not task.done()
            assert [s["labels"] for s in provider.live("k=v")] == [{"k": "v"}]
            await asyncio.to_thread(provider.set_limits, hold_creates=False)
            return await task

    assert asyncio.run(held()).status_code == 201


def _environment(tmp_path, url: str, **kwargs) -> FakeProviderEnvironment:
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    return FakeProviderEnvironment(tmp_path, "t", "s", TrialPaths(tmp_path / "trial"), EnvironmentConfig(), url=url,
                                   **kwargs)


def test_the_backend_creates_execs_and_deletes_through_the_provider(tmp_path, provider, monkeypatch):
    monkeypatch.setenv("RAYGRPO_RUN_ID", "run-abc")

    async def lifecycle() -> None:
        env = _environment(tmp_path, provider.url, lifetime_s=30)
        await env.start(force_build=False)
        assert [s["id"] for s in provider.live(f"{RUN_LABEL}=run-abc")] == [env.sandbox_id]
        assert (await env.exec("echo hi")).return_code == 0
        sandbox = env.sandbox_id
        await env.stop(delete=True)
        assert provider.live() == [] and env.sandbox_id is None
        env.sandbox_id = sandbox
        with pytest.raises(SandboxGone):
            await env.exec("echo hi")

    asyncio.run(lifecycle())
    figures = audit(provider.log_path)
    assert figures.creates == 1 and figures.deletes == 1 and figures.live == 0


def test_the_backend_reports_429_with_its_retry_after(tmp_path, provider):
    provider.set_limits(create_rate_per_s=1)

    async def two() -> None:
        first = _environment(tmp_path, provider.url)
        second = _environment(tmp_path, provider.url)
        await first.start(force_build=False)
        with pytest.raises(ProviderRateLimited) as refused:
            await second.start(force_build=False)
        assert refused.value.retry_after_s is not None and 0 < refused.value.retry_after_s <= 1.0
        await first.stop()
        await second.stop()

    asyncio.run(two())
    assert audit(provider.log_path).live == 0
