"""The transformers engine: batching, sampling, log-probabilities, weight updates; then the same behind a Ray actor."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from raygrpo.policy.base import PolicyClient, PolicyError, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from raygrpo.policy.transformers_engine import TransformersEngine

    eng = TransformersEngine(tiny_model_dir, max_batch_size=16, batch_wait_s=0.02, seed=0, num_threads=1)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """The same model loaded separately, for plain forward passes."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


def _prompt(tok, text: str) -> list[int]:
    return tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True, return_dict=False
    )


def _reference_logprobs(model, prompt: list[int], completion: list[int], temperature: float,
                        top_p: float = 1.0) -> list[float]:
    """Log-probs of `completion` under softmax(logits / temperature), renormalised over the nucleus when top_p < 1
    (the smallest set of most likely tokens whose mass reaches top_p): the distribution a sampler draws from."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / (temperature or 1.0), dim=-1)
    out = []
    for row, token in zip(logp, completion):
        if temperature > 0 and top_p < 1.0:
            probs, order = row.exp().sort(descending=True)
            size = int(((probs.cumsum(0) - probs) < top_p).sum())
            nucleus = order[:size].tolist()
            assert token in nucleus, "sampled outside the nucleus"
            row = row - torch.logsumexp(row[order[:size]], dim=0)
        out.append(float(row[token]))
    return out


@pytest.mark.timeout(120)
async def test_concurrent_requests_share_batches(engine):
    tok = engine.tokenizer
    before = engine.stats()
    prompts = [_prompt(tok, f"question {i} " * (i + 1)) for i in range(8)]  # different lengths: left padding
    turns = await asyncio.gather(*[engine.generate(p, SamplingParams(max_tokens=8)) for p in prompts])
    after = engine.stats()
    batches = after["batches"] - before["batches"]
    assert 1 <= batches < 8, after
    assert after["requests"] - before["requests"] == 8
    assert all(1 <= len(t.output_ids) <= 8 and len(t.logprobs) == len(t.output_ids) for t in turns)


@pytest.mark.timeout(120)
async def test_max_batch_size_is_respected(tiny_model_dir):
    from raygrpo.policy.transformers_engine import TransformersEngine

    eng = TransformersEngine(tiny_model_dir, max_batch_size=3, batch_wait_s=0.02)
    try:
        await asyncio.gather(*[eng.generate([5, 6, 7], SamplingParams(max_tokens=4)) for _ in range(7)])
        stats = eng.stats()
        assert max(stats["batch_sizes"]) <= 3 and stats["requests"] == 7 and stats["batches"] >= 3
    finally:
        eng.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
async def test_logprobs_match_a_separate_forward_pass(engine, reference, temperature, top_p):
    tok = engine.tokenizer
    prompts = [_prompt(tok, "short"), _prompt(tok, "a much longer question " * 6), [7, 8, 9]]
    sampling = SamplingParams(max_tokens=24, temperature=temperature, top_p=top_p)
    turns = await asyncio.gather(*[engine.generate(p, sampling) for p in prompts])
    for prompt, turn in zip(prompts, turns):
        assert len(turn.logprobs) == len(turn.output_ids) > 0
        # The sampling log-probs are the nucleus's (the behaviour policy); `logprobs_of` is the learner's view, the
        # full softmax, which TRL computes.
        sampled = _reference_logprobs(reference, prompt, turn.output_ids, temperature, top_p)
        assert turn.logprobs == pytest.approx(sampled, abs=2e-4)
        expected = _reference_logprobs(reference, prompt, turn.output_ids, temperature)
        assert await engine.logprobs_of(prompt, turn.output_ids, temperature) == pytest.approx(expected, abs=2e-4)
        if top_p < 1 and temperature > 0:
            assert sum(turn.logprobs) > sum(expected) + 1e-3  # renormalised over fewer tokens
        if temperature == 0:  # greedy: each token is the argmax of the reference
            import torch

            with torch.no_grad():
                logits = reference(input_ids=torch.tensor([prompt + turn.output_ids])).logits[0]
            argmax = logits[len(prompt) - 1 : -1].argmax(-1).tolist()
            assert argmax == turn.output_ids


@pytest.mark.timeout(120)
async def test_max_tokens_is_honoured_per_request(engine):
    budgets = [1, 3, 10, 17]
    turns = await asyncio.gather(*[engine.generate([4, 5, 6], SamplingParams(max_tokens=n)) for n in budgets])
    for n, turn in zip(budgets, turns):
        assert len(turn.output_ids) <= n
        if turn.output_ids[-1] != engine.tokenizer.eos_token_id:
            assert len(turn.output_ids) == n and turn.finish_reason == "length"
    empty = await engine.generate([4, 5, 6], SamplingParams(max_tokens=0))
    assert empty.output_ids == [] and empty.finish_reason == "length"


@pytest.mark.timeout(120)
async def test_stops_at_eos(tiny_model_dir, tmp_path, engine):
    # A random model rarely says <|im_end|>; make the greedy first token an extra eos of a copy of the model.
    prompt = [10, 11, 12]
    first = (await engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0))).output_ids[0]
    copy = shutil.copytree(tiny_model_dir, tmp_path / "model")
    with open(copy / "generation_config.json") as f:
        gen = json.load(f)
    gen["eos_token_id"] = [engine.tokenizer.eos_token_id, first]
    (copy / "generation_config.json").write_text(json.dumps(gen))
    from raygrpo.policy.transformers_engine import TransformersEngine

    eng = TransformersEngine(str(copy))
    try:
        turn = await eng.generate(prompt, SamplingParams(max_tokens=20, temperature=0))
        assert turn.output_ids == [first] and turn.finish_reason == "stop"
    finally:
        eng.close()


@pytest.mark.timeout(120)
async def test_greedy_and_seeded_sampling_are_deterministic(engine):
    prompt = _prompt(engine.tokenizer, "determinism")
    greedy = SamplingParams(max_tokens=16, temperature=0)
    alone = await engine.generate(prompt, greedy)
    again = await engine.generate(prompt, greedy)
    crowd = await asyncio.gather(
        *[engine.generate(prompt if i == 2 else [3 + i] * (i + 2), greedy if i == 2 else SamplingParams(max_tokens=9))
          for i in range(5)]
    )
    assert alone.output_ids == again.output_ids == crowd[2].output_ids

    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=1234)
    a = await engine.generate(prompt, seeded)
    b = (await asyncio.gather(*[engine.generate(prompt, seeded if i == 1 else SamplingParams(max_tokens=5))
                                for i in range(4)]))[1]
    assert a.output_ids == b.output_ids
    # Unseeded samples of one prompt differ (GRPO needs diverse groups).
    group = await asyncio.gather(*[engine.generate(prompt, SamplingParams(max_tokens=16)) for _ in range(4)])
    assert len({tuple(t.output_ids) for t in group}) > 1


@pytest.mark.timeout(120)
async def test_set_weights_changes_version_and_outputs(tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from raygrpo.policy.tiny import build_tiny_model
    from raygrpo.policy.transformers_engine import TransformersEngine

    other_dir = build_tiny_model(str(tmp_path / "seed1"), seed=1)
    other = AutoModelForCausalLM.from_pretrained(other_dir).eval()
    eng = TransformersEngine(tiny_model_dir)
    try:
        prompt, completion = [5, 6, 7, 8], [9, 10, 11]
        old = await eng.logprobs_of(prompt, completion)
        assert eng.policy_version == 0
        state = {k: v.clone() for k, v in other.state_dict().items()}
        await eng.set_weights(state, version=5)
        assert eng.policy_version == 5
        new = await eng.logprobs_of(prompt, completion)
        assert new == pytest.approx(_reference_logprobs(other, prompt, completion, 1.0), abs=1e-5)
        assert new != pytest.approx(old, abs=1e-3)
        turn = await eng.generate(prompt, SamplingParams(max_tokens=3))
        assert turn.policy_version == 5
        with pytest.raises(ValueError, match="does not match"):
            await eng.set_weights({"nonsense": torch.zeros(1)}, version=6)
        assert eng.policy_version == 5
    finally:
        eng.close()


@pytest.mark.timeout(120)
async def test_cancelled_callers_do_not_break_the_engine(engine):
    task = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_tokens=64)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    turn = await engine.generate([1, 2, 3], SamplingParams(max_tokens=4))
    assert 1 <= len(turn.output_ids) <= 4


@pytest.mark.timeout(120)
async def test_throughput_figures(engine):
    """Not a timed assertion: records tokens/s for batch sizes 1 and 16 (printed with -s)."""
    import time

    prompt = _prompt(engine.tokenizer, "throughput")
    for n in (1, 16):
        start = time.perf_counter()
        turns = await asyncio.gather(*[engine.generate(prompt, SamplingParams(max_tokens=64)) for _ in range(n)])
        elapsed = time.perf_counter() - start
        tokens = sum(len(t.output_ids) for t in turns)
        print(f"\nengine batch {n}: {tokens} tokens in {elapsed:.3f}s = {tokens / elapsed:.0f} tokens/s")
    print("engine stats:", engine.stats())


# ---------------------------------------------------------------------------------------------- behind a Ray actor


@pytest.mark.ray
@pytest.mark.timeout(240)
async def test_engine_actor_and_client(ray_local, tiny_model_dir):
    import ray

    from raygrpo.actors.policy_engine import start_engines, stop_engines
    from raygrpo.config.policy import PolicyConfig
    from raygrpo.policy.engine_client import EngineClient
    from raygrpo.policy.factory import build_policy_client

    cfg = PolicyConfig(kind="transformers", num_engines=1, engine_num_cpus=0.5)
    handles = start_engines(cfg, tiny_model_dir)
    try:
        assert len(handles) == 1
        client = build_policy_client(cfg, tokenizer=None, engines=handles, worker_index=3)
        assert isinstance(client, EngineClient) and isinstance(client, PolicyClient)
        turns = await asyncio.gather(*[client.generate([5, 6, 7, i + 1], SamplingParams(max_tokens=6)) for i in range(6)])
        assert all(1 <= len(t.output_ids) <= 6 and len(t.logprobs) == len(t.output_ids) for t in turns)
        stats = await handles[0].stats.remote()
        assert stats["requests"] == 6 and stats["batches"] < 6, stats
        assert client.policy_version == 0

        # A weight update is seen in the versions of later turns.
        from transformers import AutoModelForCausalLM

        state = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
        assert await handles[0].set_weights.remote(state, 2) == 2
        turn = await client.generate([5, 6, 7], SamplingParams(max_tokens=2))
        assert turn.policy_version == 2 and client.policy_version == 2
        lps = await handles[0].logprobs_of.remote([5, 6, 7], turn.output_ids)
        assert lps == pytest.approx(turn.logprobs, abs=1e-4)

        # A bad request is the policy's failure, reported as PolicyError.
        with pytest.raises(PolicyError, match="prompt_ids is empty"):
            await client.generate([], SamplingParams(max_tokens=2))

        # A dead engine is a PolicyError too, raised promptly.
        ray.kill(handles[0], no_restart=True)
        with pytest.raises(PolicyError, match="policy engine"):
            await asyncio.wait_for(client.generate([1, 2], SamplingParams(max_tokens=2)), timeout=30)
    finally:
        stop_engines(handles)


@pytest.mark.timeout(120)
async def test_a_request_for_newer_weights_waits_for_them(tiny_model_dir):
    import torch

    from raygrpo.policy.transformers_engine import TransformersEngine

    eng = TransformersEngine(tiny_model_dir)
    try:
        pending = asyncio.ensure_future(eng.generate([5, 6, 7], SamplingParams(max_tokens=2, min_version=1)))
        await asyncio.sleep(0.3)
        assert not pending.done()  # held: the engine still has version 0
        now = await eng.generate([5, 6, 7], SamplingParams(max_tokens=2))
        assert now.policy_version == 0
        state = {k: v.clone() for k, v in eng.model.state_dict().items()}
        await eng.set_weights({k: v + 0.01 * torch.randn_like(v) for k, v in state.items()}, version=1)
        turn = await asyncio.wait_for(pending, 30)
        assert turn.policy_version == 1
    finally:
        eng.close()


@pytest.mark.ray
@pytest.mark.timeout(300)
async def test_engines_sample_by_the_runs_seed(ray_local, tiny_model_dir):
    """Two runs with different seeds sample different rollouts (unseeded requests); the same seed, the same ones."""
    import ray

    from raygrpo.actors.policy_engine import engine_seed, start_engines, stop_engines
    from raygrpo.config.policy import PolicyConfig

    cfg = PolicyConfig(kind="transformers", num_engines=1, engine_num_cpus=0.5)
    outputs = []
    for seed in (0, 7, 0):
        handles = start_engines(cfg, tiny_model_dir, seed=seed)
        try:
            turn = await handles[0].generate.remote([5, 6, 7], SamplingParams(max_tokens=16, temperature=1.0))
            outputs.append(turn.output_ids)
        finally:
            stop_engines(handles)
    assert outputs[0] == outputs[2] and outputs[0] != outputs[1]
    assert len({engine_seed(0, i) for i in range(4)} | {engine_seed(1, i) for i in range(4)}) == 8
