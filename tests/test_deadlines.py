"""One owner per deadline: waiting for a create slot is not start time, and a start slower than its own deadline
still fails.

Harbor sandboxes on the null backend with an injected start latency, through the real agent loop and provider (no
Ray): the provider's gate holds the cluster-wide create rate (here this process's governor), the adapter owns the start
deadline from the moment the gate lets a start in.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from raygrpo.agent.chat import ChatRenderer
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.governor.gate import reset_gates
from raygrpo.agent.rollout import run_rollout
from raygrpo.testing.null import NULL_IMPORT_PATH
from raygrpo.specs.harbor import HarborSpec
from raygrpo.specs.provider import ProviderSpec
from raygrpo.core.types import SamplingParams, Status
from tests.harbor_utils import make_task

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _fresh_gates():
    reset_gates()
    yield
    reset_gates()


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def _spec(tmp_path, **fields) -> HarborSpec:
    make_task(tmp_path / "suite", "t")
    return HarborSpec(path=str(tmp_path / "suite"), import_path=NULL_IMPORT_PATH,
                      environment_kwargs={"reward": 1.0}, **fields)


async def _batch(spec: HarborSpec, renderer: ChatRenderer, n: int, limits: ProviderSpec | None = None) -> list:
    provider = HarborProvider(spec, name="null", limits=limits)
    [task] = list_harbor_tasks(spec, "null")
    policy = ScriptedPolicy(renderer.tokenizer, lambda ctx: "Done.")
    try:
        return await asyncio.gather(*(
            run_rollout(task, provider.adapter(), policy, renderer, SamplingParams(max_tokens=64), RolloutConfig())
            for _ in range(n)
        ))
    finally:
        await provider.aclose()


async def test_queueing_for_a_create_slot_never_fails_a_start(tmp_path, renderer):
    """12 starts at 4 creates/s: the last waits ~3 s for its slot, three times the 1 s start deadline; each start
    itself takes 0.3 s. None fails."""
    spec = _spec(tmp_path, start_timeout_s=1.0, faults={"start_latency_s": 0.3})
    began = time.monotonic()
    trajs = await _batch(spec, renderer, 12, ProviderSpec(create_rate_per_s=4.0))
    wall = time.monotonic() - began
    assert [t.status for t in trajs] == [Status.OK] * 12, [t.error for t in trajs]
    assert all(t.reward == 1.0 for t in trajs)
    assert wall >= 2.5, wall  # the rate really made them queue (11 intervals of 1.05/4 s)
    assert max(t.timings["provision"] for t in trajs) > spec.start_timeout_s


async def test_a_start_slower_than_its_deadline_fails_as_env_error(tmp_path, renderer):
    spec = _spec(tmp_path, start_timeout_s=0.5, faults={"start_latency_s": 1.5})
    trajs = await _batch(spec, renderer, 2, ProviderSpec(create_rate_per_s=4.0))
    assert [t.status for t in trajs] == [Status.ENV_ERROR] * 2
    assert all(t.reward is None and "did not start within start_timeout_s=0.5" in t.error for t in trajs)


async def test_concurrency_queueing_is_not_start_time_either(tmp_path, renderer):
    """One start at a time per actor, 0.4 s each: the fourth waits 1.2 s for its slot with a 0.8 s deadline."""
    spec = _spec(tmp_path, max_concurrent_starts=1, start_timeout_s=0.8, faults={"start_latency_s": 0.4})
    trajs = await _batch(spec, renderer, 4)
    assert [t.status for t in trajs] == [Status.OK] * 4, [t.error for t in trajs]
