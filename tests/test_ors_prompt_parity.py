"""The prompt raygrpo templates for an ORS task is, token for token, the one TRL's OpenReward integration templates.

The TRL side is TRL's own code path: `OpenRewardSpec(...).environment_factory` plugged into a `GRPOTrainer` (the tiny
model, TRL's shipped chat template), the environment reset on the task as GRPOTrainer resets it, and the prompt
tokenized by the trainer's own `_tokenize_prompts`. The raygrpo side is the ORS adapter's observation rendered by the
agent loop's `ChatRenderer`. Both against the same servers: the SDK-only toolbox (twelve tools of many parameter
shapes, custom splits) and the examples.
"""

from __future__ import annotations

import asyncio

import pytest

from raygrpo.agent.chat import ChatRenderer
from raygrpo.envs.ors.adapter import ORSProvider
from raygrpo.specs.ors import ORSSpec
from raygrpo.core.types import TaskRef
from tests.ors_utils import ARITH, ECHO, ors_server
from tests.test_ors_semantics import toolbox  # noqa: F401 - the SDK-only server fixture

pytestmark = pytest.mark.timeout(240)


def _trl_prompt_ids(url: str, tokenizer, model_dir: str, out, index: int, split: str) -> list[int]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.experimental.openreward import OpenRewardSpec

    spec = OpenRewardSpec(url, split=split, indices=[index])
    trainer = GRPOTrainer(
        model=model_dir, processing_class=tokenizer, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=GRPOConfig(output_dir=str(out), use_cpu=True, per_device_train_batch_size=2, num_generations=2,
                        max_steps=1, report_to="none"),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]]}),
        environment_factory=spec.environment_factory,
    )
    environment = trainer._environment_pool[None][0]
    try:
        observation = environment.reset(task_index=index)  # what GRPOTrainer does for each rollout
    finally:
        environment._close()
    prompt = [{"role": "user", "content": "" + observation}]
    trainer._batch_environments = [None]
    prompt_ids, _, _ = trainer._tokenize_prompts([prompt])
    return list(prompt_ids[0])


def _raygrpo_prompt_ids(url: str, renderer: ChatRenderer, index: int, split: str) -> list[int]:
    async def main():
        provider = ORSProvider(ORSSpec(url=url, split=split), name="p")
        adapter = provider.adapter()
        try:
            obs = await adapter.start(TaskRef(env="p", index=index, split=split))
        finally:
            await adapter.close()
            await provider.aclose()
        return renderer.prompt_ids(obs.messages, obs.tools)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("index, split", [(0, "train"), (3, "train"), (1, "holdout")])
def test_the_toolbox_prompt_is_trls(toolbox, tokenizer, tiny_model_dir, tmp_path, monkeypatch, index, split):  # noqa: F811
    monkeypatch.setenv("OPENREWARD_SESSION_URL", toolbox)  # TRL's client reaches a self-hosted server this way
    theirs = _trl_prompt_ids(toolbox, tokenizer, tiny_model_dir, tmp_path, index, split)
    ours = _raygrpo_prompt_ids(toolbox, ChatRenderer(tokenizer), index, split)
    assert tokenizer.decode(ours) == tokenizer.decode(theirs)
    assert ours == theirs
    text = tokenizer.decode(ours)
    tools = ["add", "bonus", "configure", "flag", "lookup", "picture", "poem", "quit", "scale", "shout", "submit",
             "total"]
    assert all(f'"name": "{name}"' in text for name in tools)
    assert '"description": "The first integer."' in text  # the parameters are described, from the Args: block


@pytest.mark.parametrize("environment, index", [(ECHO, 2), (ARITH, 0)], ids=["echo", "arith"])
def test_the_examples_prompts_are_trls(tokenizer, tiny_model_dir, tmp_path, monkeypatch, environment, index):
    with ors_server([environment]) as server:
        monkeypatch.setenv("OPENREWARD_SESSION_URL", server.url)
        theirs = _trl_prompt_ids(server.url, tokenizer, tiny_model_dir, tmp_path, index, "train")
        ours = _raygrpo_prompt_ids(server.url, ChatRenderer(tokenizer), index, "train")
    assert tokenizer.decode(ours) == tokenizer.decode(theirs)
    assert ours == theirs
