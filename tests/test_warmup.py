"""The supervised format warm-up: its echo data matches the real echo server and leaks no train task, it teaches a
fresh tiny model the tool-call format without teaching it the answers, and its config errors name the field."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter

import pytest
from pydantic import ValidationError

from raygrpo.config.train import WarmupConfig
from raygrpo.envs.ors.adapter import ORSProvider
from raygrpo.core.errors import ResolveError
from raygrpo.core.imports import load_object
from raygrpo.train.warmup import encode_example, load_examples, run_warmup
from tests.ors_utils import ECHO, ors_server, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = f"{REPO}/examples/echo/warmup.py:format_examples"


def _echo(name: str):
    return load_object(f"examples/echo/warmup.py:{name}", base_dir=REPO)


def _env(name: str):
    return load_object(f"examples/echo/env.py:{name}", base_dir=REPO)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.timeout(90)
async def test_warmup_prompts_match_the_echo_server(tokenizer):
    """The warm-up's tools and prompts are what the echo env's ORS server gives the agent loop, to the token."""
    from raygrpo.agent.chat import ChatRenderer
    from raygrpo.specs.ors import ORSSpec
    from raygrpo.core.types import TaskRef

    renderer = ChatRenderer(tokenizer)
    echo_tool, prompt_text = _echo("ECHO_TOOL"), _echo("prompt_text")
    examples = _echo("format_examples")(n=4, seed=0)
    with ors_server([ECHO]) as server:
        provider = ORSProvider(ORSSpec(url=server.url), name="echo")
        try:
            for index, target in enumerate(_env("TRAIN_TARGETS")[:2]):
                adapter = provider.adapter()
                try:
                    obs = await adapter.start(TaskRef(env="echo", index=index))
                finally:
                    await adapter.close()
                # Key order matters too: the chat template writes the schema with tojson.
                assert json.dumps(obs.tools) == json.dumps([echo_tool])
                assert obs.messages == [{"role": "user", "content": prompt_text(target)}]
                for ex in examples:
                    assert json.dumps(ex["tools"]) == json.dumps(obs.tools)
                mine, _ = encode_example(renderer, {"messages": [{"role": "user", "content": prompt_text(target)}],
                                                    "tools": examples[0]["tools"], "completion": "x"})
                assert mine == renderer.prompt_ids(obs.messages, obs.tools)
        finally:
            await provider.aclose()
        assert wait_until(lambda: server.live_sessions() == 0, 10)


@pytest.mark.timeout(60)
def test_echo_examples_are_disjoint_and_answers_random(tokenizer):
    from raygrpo.agent.chat import ChatRenderer
    from raygrpo.agent.toolcalls import parse_tool_calls

    train, test = _env("TRAIN_TARGETS"), _env("TEST_TARGETS")
    answers = _echo("ANSWERS")
    assert sorted(answers) == sorted(train)  # the guesses are the train answer set, nothing else
    examples = _echo("format_examples")(n=2000, seed=0)
    assert examples == _echo("format_examples")(n=2000, seed=0)  # deterministic
    train_words = {w for t in train for w in t.split()}
    renderer = ChatRenderer(tokenizer)
    said = Counter()
    for ex in examples[:400]:
        target = ex["target"]
        assert target not in train and target not in test and not set(target.split()) & train_words
        assert ex["messages"][0]["content"] == f"Echo '{target}' to win. Call the echo tool with it."
        prompt, completion = encode_example(renderer, ex)
        assert completion[-1] == renderer.eos_token_id and completion.count(renderer.eos_token_id) == 1
        _, calls = parse_tool_calls(renderer.decode(completion))
        assert len(calls) == 1 and calls[0].name == "echo"
        assert calls[0].arguments["text"] != target
        said[calls[0].arguments["text"]] += 1
    assert set(said) == set(answers) and max(said.values()) < 2 * min(said.values())  # roughly uniform
    assert len({ex["target"] for ex in examples}) > 500  # too many prompts to memorise an answer per prompt


async def _sample(model_dir: str, renderer, prompts: list[tuple[str, list[int]]], per_prompt: int):
    from raygrpo.policy.base import SamplingParams
    from raygrpo.policy.transformers_engine import TransformersEngine

    engine = TransformersEngine(model_dir, seed=0, max_batch_size=64)
    try:
        sampling = SamplingParams(max_tokens=64, temperature=1.0, top_p=1.0)
        jobs = [(t, engine.generate(p, sampling)) for t, p in prompts for _ in range(per_prompt)]
        turns = await asyncio.gather(*(job for _, job in jobs))
    finally:
        engine.close()
    return [(t, renderer.decode(turn.output_ids), turn.finish_reason) for (t, _), turn in zip(jobs, turns)]


def _echo_calls(samples) -> tuple[float, float, Counter]:
    """Share of samples that are exactly one echo call with a string `text`, share that hit the target, answers."""
    from raygrpo.agent.toolcalls import parse_tool_calls
    from raygrpo.core.types import ToolCall

    good = hits = 0
    said: Counter = Counter()
    for target, text, finish in samples:
        _, calls = parse_tool_calls(text)
        if (finish == "stop" and len(calls) == 1 and isinstance(calls[0], ToolCall) and calls[0].name == "echo"
                and isinstance(calls[0].arguments.get("text"), str)):
            good += 1
            said[calls[0].arguments["text"]] += 1
            hits += calls[0].arguments["text"] == target
    return good / len(samples), hits / len(samples), said


@pytest.mark.timeout(120)
def test_warmup_teaches_the_format_not_the_answers(tiny_model_dir, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from raygrpo.agent.chat import ChatRenderer

    renderer = ChatRenderer(tokenizer)
    echo_tool, prompt_text = _echo("ECHO_TOOL"), _echo("prompt_text")
    prompts = [(t, renderer.prompt_ids([{"role": "user", "content": prompt_text(t)}], [echo_tool]))
               for t in _env("TRAIN_TARGETS")]

    before, _, _ = _echo_calls(asyncio.run(_sample(tiny_model_dir, renderer, prompts, 2)))
    assert before == 0.0  # a random model never calls the tool: whatever follows is the warm-up's doing

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    result = run_warmup(model, tokenizer, WarmupConfig(examples=EXAMPLES))
    assert result["steps"] == 500 and result["examples"] == 2000
    assert result["final_loss"] < 0.2 and result["seconds"] > 0
    out = tmp_path / "warm"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

    samples = asyncio.run(_sample(str(out), renderer, prompts, 8))
    fmt, hit, said = _echo_calls(samples)
    assert fmt >= 0.8, f"only {fmt:.0%} well-formed echo calls: {[s[1] for s in samples[:4]]}"
    assert 0.0 < hit <= 0.5, f"hit rate {hit:.2f}, answers {said}"
    assert len(said) >= 4, f"answers collapsed: {said}"  # random guesses, not one memorised string


@pytest.mark.timeout(60)
def test_config_errors_name_the_field(tmp_path, tiny_model_dir, tokenizer):
    with pytest.raises(ValidationError, match="examples"):
        WarmupConfig()
    with pytest.raises(ValidationError, match="examples"):
        WarmupConfig(examples="no_colon_here")
    with pytest.raises(ValidationError, match="steps"):
        WarmupConfig(examples=EXAMPLES, steps=0)
    with pytest.raises(ValidationError, match="learning_rate"):
        WarmupConfig(examples=EXAMPLES, learning_rate=-1.0)
    with pytest.raises(ValidationError, match="epochs"):
        WarmupConfig(examples=EXAMPLES, epochs=3)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ResolveError, match=r"^train\.warmup\.examples: .*nope\.py"):
        run_warmup(model, tokenizer, WarmupConfig(examples=f"{tmp_path}/nope.py:f"))
    # A relative path resolves against the config file's folder when the config loads.
    relative = WarmupConfig.model_validate({"examples": "bad.py:f"}, context={"base_dir": str(tmp_path)})
    assert relative.examples == f"{tmp_path}/bad.py:f"
    (tmp_path / "bad.py").write_text(
        "def f(n, seed):\n"
        "    ok = {'messages': [{'role': 'user', 'content': 'hi'}], 'tools': [], 'completion': 'x'}\n"
        "    return [ok, {'messages': ok['messages'], 'tools': []}]\n"
        "def empty(n, seed):\n    return []\n"
    )
    with pytest.raises(ValueError, match=r"warmup\.examples: example 1 has no completion"):
        load_examples(relative)
    with pytest.raises(ValueError, match=r"warmup\.examples: .*non-empty list"):
        load_examples(WarmupConfig(examples=f"{tmp_path}/bad.py:empty"))
    assert len(load_examples(WarmupConfig(examples=EXAMPLES, num_examples=5))) == 5


@pytest.mark.timeout(120)
def test_the_learners_warmup_prompts_are_templated_like_rollout_prompts(tmp_path, tiny_model_dir, tokenizer,
                                                                         monkeypatch):
    """The run's `rollout.system_prompt` opens every warm-up prompt, as it opens every rollout's."""
    from transformers import AutoModelForCausalLM

    import raygrpo.train.warmup as warmup_module
    from raygrpo.agent.chat import ChatRenderer
    from raygrpo.config import load_config
    from raygrpo.train.learner import Learner

    cfg = load_config(data={
        "envs": {"echo": {"url": "http://127.0.0.1:1"}},
        "rollout": {"system_prompt": "You are terse."},
        "train": {"warmup": {"examples": EXAMPLES, "num_examples": 4, "steps": 1, "batch_size": 2}},
    })
    seen = []
    real = warmup_module.encode_example

    def spy(renderer, ex, system_prompt=None):
        prompt, completion = real(renderer, ex, system_prompt)
        seen.append((ex, prompt))
        return prompt, completion

    monkeypatch.setattr(warmup_module, "encode_example", spy)
    learner = Learner(cfg, str(tmp_path), spawners=[], engines=[], tasks_by_env={}, eval_tasks=[])
    learner.tokenizer = tokenizer
    learner._warm_up(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    renderer = ChatRenderer(tokenizer)
    assert len(seen) == 4
    for ex, prompt in seen:
        # What the agent loop renders: the system prompt, then the environment's opening messages, with its tools.
        assert prompt == renderer.prompt_ids([{"role": "system", "content": "You are terse."}, *ex["messages"]],
                                             ex["tools"])
