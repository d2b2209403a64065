"""The scripted policy: its text goes through the run's tokenizer and comes back out of the tool-call parser intact."""

from __future__ import annotations

import pytest

from raygrpo.policy.base import GenerationContext, PolicyClient, PolicyError, SamplingParams
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.agent.toolcalls import format_tool_call, parse_tool_calls
from raygrpo.core.types import TaskRef, ToolCall


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _ctx(turn: int = 0, **metadata) -> GenerationContext:
    return GenerationContext(task=TaskRef(env="arith", index=4, metadata=metadata), messages=[], turn=turn)


def answer_script(ctx: GenerationContext) -> str | None:
    if ctx.turn == 0:
        return "Let me compute. " + format_tool_call("submit", {"answer": ctx.task.metadata["a"] + ctx.task.metadata["b"]})
    return None


@pytest.mark.timeout(60)
async def test_emits_the_texts_tokens_then_eos(tok):
    policy = ScriptedPolicy(tok, answer_script, policy_version=3)
    assert isinstance(policy, PolicyClient)
    turn = await policy.generate([1, 2, 3], SamplingParams(max_tokens=256), _ctx(a=2, b=40))
    text = "Let me compute. " + format_tool_call("submit", {"answer": 42})
    assert turn.output_ids == tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    assert turn.logprobs == [0.0] * len(turn.output_ids)
    assert turn.finish_reason == "stop" and turn.policy_version == 3
    # Through the same decode + parser a model's output takes.
    decoded = tok.decode(turn.output_ids[:-1], skip_special_tokens=False)
    assert decoded == text
    content, calls = parse_tool_calls(decoded)
    assert content == "Let me compute."
    assert calls == [ToolCall(name="submit", arguments={"answer": 42})]
    # TRL's parser agrees.
    parsed = tok.parse_response(turn.output_ids, prefix="")
    assert parsed["tool_calls"][0]["function"] == {"name": "submit", "arguments": {"answer": 42}}


@pytest.mark.timeout(60)
async def test_none_means_just_eos(tok):
    policy = ScriptedPolicy(tok, answer_script)
    turn = await policy.generate([1], SamplingParams(), _ctx(turn=1, a=1, b=1))
    assert turn.output_ids == [tok.eos_token_id] and turn.logprobs == [0.0] and turn.finish_reason == "stop"


@pytest.mark.timeout(60)
async def test_max_tokens_truncates(tok):
    policy = ScriptedPolicy(tok, lambda ctx: "a fairly long answer that will not fit in five tokens")
    turn = await policy.generate([1], SamplingParams(max_tokens=5), _ctx())
    full = tok.encode("a fairly long answer that will not fit in five tokens", add_special_tokens=False)
    assert turn.output_ids == full[:5] and turn.finish_reason == "length" and len(turn.logprobs) == 5
    # Exactly fitting (text + eos == max_tokens) is a normal stop.
    turn = await policy.generate([1], SamplingParams(max_tokens=len(full) + 1), _ctx())
    assert turn.finish_reason == "stop" and turn.output_ids[-1] == tok.eos_token_id


@pytest.mark.timeout(60)
async def test_text_already_ending_with_eos_is_not_doubled(tok):
    policy = ScriptedPolicy(tok, lambda ctx: "done<|im_end|>")
    turn = await policy.generate([1], SamplingParams(), _ctx())
    assert turn.output_ids == tok.encode("done", add_special_tokens=False) + [tok.eos_token_id]


@pytest.mark.timeout(60)
async def test_async_script_and_unicode(tok):
    async def script(ctx):
        return format_tool_call("echo", {"text": "héllo 🙂\n{\"nested\": [1]}"})

    turn = await ScriptedPolicy(tok, script).generate([1], SamplingParams(), _ctx())
    _, calls = parse_tool_calls(tok.decode(turn.output_ids[:-1]))
    assert calls == [ToolCall(name="echo", arguments={"text": "héllo 🙂\n{\"nested\": [1]}"})]


@pytest.mark.timeout(60)
async def test_a_failing_script_is_a_policy_error(tok):
    def broken(ctx):
        raise KeyError("missing")

    with pytest.raises(PolicyError, match="broken raised KeyError"):
        await ScriptedPolicy(tok, broken).generate([1], SamplingParams(), _ctx())
    with pytest.raises(PolicyError, match="expected str"):
        await ScriptedPolicy(tok, lambda ctx: 42).generate([1], SamplingParams(), _ctx())


@pytest.mark.timeout(60)
async def test_factory_loads_a_script_by_file_path(tok, tmp_path, monkeypatch):
    from raygrpo.config.policy import PolicyConfig
    from raygrpo.core.errors import ResolveError
    from raygrpo.policy.factory import build_policy_client, script_function

    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "say.py").write_text("def hello(ctx):\n    return f'hello {ctx.turn}'\nNOT_A_FN = 3\n")
    # A relative file path resolves against the config file's folder when the config loads.
    cfg = PolicyConfig.model_validate({"kind": "scripted", "script": "scripts/say.py:hello"},
                                      context={"base_dir": str(tmp_path)})
    assert cfg.script == f"{tmp_path}/scripts/say.py:hello"
    policy = build_policy_client(cfg, tok)
    turn = await policy.generate([1], SamplingParams(), _ctx(turn=2))
    assert tok.decode(turn.output_ids) == "hello 2<|im_end|>"

    # A dotted module path, imported from sys.path.
    (tmp_path / "my_scripts_mod.py").write_text("def shout(ctx):\n    return 'HI'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    policy = build_policy_client(PolicyConfig(kind="scripted", script="my_scripts_mod:shout"), tok)
    assert isinstance(policy, ScriptedPolicy) and policy.script.__name__ == "shout"

    # What does not load fails naming the field (the driver's resolve step calls this before Ray starts).
    with pytest.raises(ResolveError, match=r"^policy.script: cannot load .*has no attribute 'nope'"):
        script_function(PolicyConfig(kind="scripted", script=f"{tmp_path}/scripts/say.py:nope"))
    with pytest.raises(ResolveError, match=r"^policy.script: .* is a int, not a function"):
        script_function(PolicyConfig(kind="scripted", script=f"{tmp_path}/scripts/say.py:NOT_A_FN"))


@pytest.mark.timeout(30)
def test_policy_config_validation():
    from pydantic import ValidationError

    from raygrpo.config.policy import PolicyConfig, SamplingConfig
    from raygrpo.policy.base import request_seed

    with pytest.raises(ValidationError, match="policy.script is required"):
        PolicyConfig(kind="scripted")
    assert PolicyConfig(kind="vllm").engine_actors  # neither url nor serve: vLLM engine actors
    with pytest.raises(ValidationError, match="give policy.url or policy.serve, not both"):
        PolicyConfig(kind="vllm", url="http://127.0.0.1:8000", serve={})
    with pytest.raises(ValidationError, match="extra"):
        PolicyConfig(kind="transformers", bogus=1)
    assert PolicyConfig(kind="transformers").num_engines == 1
    params = SamplingConfig(max_tokens=12, temperature=0.5, top_p=0.9, seed=7).to_params()
    assert (params.max_tokens, params.temperature, params.top_p, params.seed) == (12, 0.5, 0.9, 7)
    assert request_seed(None, "t", 0) is None
    assert request_seed(7, "t", 0) == request_seed(7, "t", 0) != request_seed(7, "t", 1)
    assert 0 <= request_seed(7, "t", 0) < 2**63
