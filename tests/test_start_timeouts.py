"""Which timeout ended a sandbox's start: raygrpo's own deadline (`start_timeout_s`) is reported as that; a backend
client's own request timeout (a `TimeoutError` it raised long before the deadline) is reported as the backend's, not
as a start deadline the user would then raise for nothing (raygrpo's own deadline keeps its message:
`tests/test_lease_ledger.py`, a create whose answer never came). Against the fake provider."""

from __future__ import annotations

import pytest

from raygrpo.envs.harbor.provider import HarborProvider, HarborStartError
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.specs import HarborSpec
from raygrpo.testing.fake_provider.backend import FakeProviderEnvironment
from tests.harbor_utils import make_task
from tests.test_failed_stops import FAKE, provider  # noqa: F401 - the fake provider, a fixture


async def _start_error(tmp_path, url: str) -> str:
    make_task(tmp_path / "suite", "t")
    spec = HarborSpec(path=str(tmp_path / "suite"), import_path=FAKE, probe_verifier=False,
                      environment_kwargs={"url": url, "reward": 1.0}, start_timeout_s=30)
    suite = HarborProvider(spec, name="suite")
    adapter = suite.adapter()
    try:
        with pytest.raises(HarborStartError) as info:
            await adapter.start(list_harbor_tasks(spec, "suite")[0])
        return str(info.value)
    finally:
        await adapter.close()
        await suite.aclose()


async def test_a_backends_own_request_timeout_is_not_reported_as_the_start_deadline(tmp_path, provider, monkeypatch):
    async def start(self, force_build: bool) -> None:
        raise TimeoutError("the provider's API did not answer within the client's 10 s read timeout")

    monkeypatch.setattr(FakeProviderEnvironment, "start", start)
    message = await _start_error(tmp_path, provider.url)
    assert "start_timeout_s" not in message
    assert "the backend's own request timed out" in message and "10 s read timeout" in message

