"""LoRA on the learner (`train.peft`): the merged weights engines get, a partial push reaching a real transformers
engine, the store that keeps a whole push under the partial ones, and the config's checks."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from raygrpo.actors.weight_store import WeightStore
from raygrpo.config import ConfigError, load_config
from raygrpo.core.types import SamplingParams
from raygrpo.train.lora import lora_config, merged_state_dict

pytestmark = pytest.mark.timeout(120)

BASE = {"envs": {"e": {"kind": "ors", "url": "http://127.0.0.1:1"}}}


def _peft_model(model_dir: str, seed: int = 0):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = load_config(data={**BASE, "train": {"peft": {"r": 4}}})
    peft_model = get_peft_model(model, lora_config(cfg.train.peft))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a trained adapter: B starts at zero, which would merge to nothing
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return peft_model


def test_merged_weights_are_peft_own_merge_and_leave_the_model_unmerged(tiny_model_dir):
    model = _peft_model(tiny_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_state_dict(model)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    assert all(torch.allclose(merged[k], reference[k], atol=1e-6) for k in reference)
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    changed = {k for k in reference if not torch.equal(reference[k], original[k])}
    adapted = merged_state_dict(model, adapted_only=True)
    assert set(adapted) == changed and "model.embed_tokens.weight" not in adapted
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # nothing merged in place


def test_a_partial_lora_push_changes_a_real_engines_output_to_the_merged_models(tiny_model_dir):
    from raygrpo.policy.transformers_engine import TransformersEngine

    model = _peft_model(tiny_model_dir)
    merged = copy.deepcopy(model).merge_and_unload()
    prompt = list(range(5, 25))
    greedy = SamplingParams(max_tokens=12, temperature=0.0)

    async def run():
        engine = TransformersEngine(tiny_model_dir, max_batch_size=2)
        try:
            before = await engine.generate(prompt, greedy)
            await engine.set_weights(merged_state_dict(model, adapted_only=True), version=3, partial=True)
            after = await engine.generate(prompt, greedy)
            with pytest.raises(ValueError, match="unexpected"):
                await engine.set_weights({"model.nonsense.weight": torch.zeros(1)}, version=4, partial=True)
            return before, after, engine.policy_version
        finally:
            engine.close()

    before, after, version = asyncio.run(run())
    with torch.no_grad():
        expected = merged.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):]
    assert after.output_ids != before.output_ids and version == 3
    assert after.output_ids == expected.tolist()[: len(after.output_ids)]
    assert after.policy_version == 3


def test_the_store_keeps_the_whole_push_under_the_latest_partial_one():
    store = WeightStore()
    store.put(["whole-1"], 1)
    store.put(["part-2"], 2, partial=True)
    store.put(["part-3"], 3, partial=True)
    assert store.latest() == (["whole-1", "part-3"], 3)
    store.put(["whole-4"], 4)
    assert store.latest() == (["whole-4"], 4)
    store.put(["late-part"], 2, partial=True)  # an older version never replaces a newer one
    assert store.latest() == (["whole-4"], 4)


def test_the_peft_config_defaults_and_refusals():
    peft = load_config(data={**BASE, "train": {"peft": {"r": 8}}}).train.peft
    assert (peft.r, peft.lora_alpha, peft.dropout, peft.target_modules) == (8, 16.0, 0.0, "all-linear")
    built = lora_config(peft)
    assert (built.r, built.lora_alpha, built.task_type) == (8, 16.0, "CAUSAL_LM")
    with pytest.raises(ConfigError, match="train.peft.dropout .* trainer.disable_dropout"):
        load_config(data={**BASE, "train": {"peft": {"dropout": 0.1}}})
    kept = load_config(data={**BASE, "train": {"peft": {"dropout": 0.1}}, "trainer": {"disable_dropout": False}})
    assert kept.train.peft.dropout == 0.1
    with pytest.raises(ConfigError, match="train.peft.target_modules"):
        load_config(data={**BASE, "train": {"peft": {"target_modules": []}}})
    with pytest.raises(ConfigError, match="train.peft.rank"):
        load_config(data={**BASE, "train": {"peft": {"rank": 8}}})
