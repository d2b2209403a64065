"""`EngineClient` (raygrpo.policy.engine_client) against a fake actor handle, no Ray: a hung engine ends the turn as
`PolicyError` at `policy.request_timeout_s`, and the wait for newer weights is not counted in that deadline."""

from __future__ import annotations

import asyncio

import pytest

from raygrpo.config.policy import PolicyConfig
from raygrpo.core.errors import PolicyError
from raygrpo.core.types import SamplingParams, Turn
from raygrpo.policy.engine_client import EngineClient
from raygrpo.policy.factory import build_policy_client

pytestmark = pytest.mark.timeout(30)


class _Method:
    def __init__(self, fn):
        self.remote = fn


class FakeEngine:
    """An engine actor's handle: `generate` takes `generate_s`, the weights of `version` arrive after `hold_s`."""

    def __init__(self, generate_s: float, hold_s: float = 0.0, version: int = 0):
        self.generate_s, self.hold_s, self.version = generate_s, hold_s, version
        self.generate = _Method(self._generate)
        self.wait_for_version = _Method(self._wait_for_version)

    async def _generate(self, prompt_ids, sampling):
        await asyncio.sleep(self.generate_s)
        return Turn(output_ids=[1], logprobs=[0.0], finish_reason="stop", policy_version=self.version)

    async def _wait_for_version(self, version):
        await asyncio.sleep(self.hold_s)
        self.version = max(self.version, version)
        return self.version


def test_the_factory_gives_engine_actors_the_request_deadline():
    cfg = PolicyConfig(kind="transformers", request_timeout_s=7)
    client = build_policy_client(cfg, tokenizer=None, engines=[FakeEngine(0.0)])
    assert isinstance(client, EngineClient) and client.timeout_s == 7


async def test_a_hung_engine_is_a_policy_error_at_the_request_deadline():
    client = EngineClient(FakeEngine(generate_s=60), timeout_s=0.3)
    with pytest.raises(PolicyError, match="request_timeout_s=0.3"):
        await asyncio.wait_for(client.generate([1, 2], SamplingParams(max_tokens=4)), 10)


async def test_the_wait_for_newer_weights_is_not_counted_in_the_deadline():
    client = EngineClient(FakeEngine(generate_s=0.05, hold_s=0.6), timeout_s=0.3)
    turn = await client.generate([1, 2], SamplingParams(max_tokens=4, min_version=2))
    assert turn.policy_version == 2 and client.policy_version == 2
