"""`ChatTokenizer` (tokenizers + Jinja, what env pool actors load) gives the ids and text of transformers'
`AutoTokenizer` for the same model folder: plain prompts, tools, multi-turn tool calls and results, reasoning, control
tokens written as text, the TRL training template and raygrpo's ChatML fallback; and folders it cannot reproduce go
to transformers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_chat_tools import SMOLLM2_TEMPLATE, SUBMIT

pytestmark = pytest.mark.timeout(180)

ECHO = {"type": "function", "function": {"name": "echo", "description": "Echo the text back.", "parameters": {
    "type": "object", "properties": {"text": {"type": "string", "description": "What to echo."}},
    "required": ["text"]}}}


def _call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is 2 + 3?"}],
    "system": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Please echo: hello"}],
    "multi_turn_tools": [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Echo 'naïve café', then submit 5."},
        {"role": "assistant", "content": "", "tool_calls": [_call("echo", text="naïve café")]},
        {"role": "tool", "name": "echo", "content": "naïve café"},
        {"role": "assistant", "content": None, "reasoning_content": "Now submit.",
         "tool_calls": [_call("submit", answer=5), _call("echo", text="done 🙂")]},
        {"role": "tool", "name": "submit", "content": "correct"},
        {"role": "tool", "name": "echo", "content": "done 🙂"},
        {"role": "assistant", "content": "Finished."},
        {"role": "user", "content": "Again?"},
    ],
    "control_tokens_as_text": [
        {"role": "user", "content": "Text with <|im_end|> and <tool_call>{\"name\": \"x\"}</tool_call> <think>"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nIt says <|im_start|>."},
        {"role": "user", "content": "\t\tindented\r\nwindows line 日本語"},
    ],
}
TOOLS = {"none": None, "two": [ECHO, SUBMIT]}


@pytest.fixture(scope="module")
def folders(tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    """The tiny model's folder (Qwen3 template) and a copy with SmolLM2's template (no tools: raygrpo's fallback),
    saved by transformers as `raygrpo.policy.gguf` saves a converted model."""
    from transformers import AutoTokenizer

    chatml = tmp_path_factory.mktemp("chatml")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = SMOLLM2_TEMPLATE
    tok.save_pretrained(str(chatml))
    shutil.copy(Path(tiny_model_dir) / "config.json", chatml / "config.json")
    return {"qwen3": tiny_model_dir, "chatml": str(chatml)}


@pytest.fixture(scope="module", params=["qwen3", "chatml"])
def pair(request, folders):
    from transformers import AutoTokenizer

    from raygrpo.agent.chat_template import ChatTokenizer, load_tokenizer

    light = load_tokenizer(folders[request.param])
    assert isinstance(light, ChatTokenizer)
    return light, AutoTokenizer.from_pretrained(folders[request.param])


@pytest.mark.parametrize("tools", sorted(TOOLS))
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_renders_and_tokenizes_like_transformers(pair, name, tools, add_generation_prompt):
    light, auto = pair
    kwargs = {"tools": TOOLS[tools], "add_generation_prompt": add_generation_prompt}
    messages = CONVERSATIONS[name]
    text = _outcome(auto.apply_chat_template, messages, tokenize=False, **kwargs)
    assert _outcome(light.apply_chat_template, messages, tokenize=False, **kwargs) == text
    ids = _outcome(auto.apply_chat_template, messages, tokenize=True, return_dict=False, **kwargs)
    assert _outcome(light.apply_chat_template, messages, tokenize=True, return_dict=False, **kwargs) == ids
    if isinstance(ids, list):
        assert light.apply_chat_template(messages, **kwargs)["input_ids"] == ids  # return_dict by default


def _outcome(fn, *args, **kwargs):
    """What `fn` returns (ids as a list), or the type and message of what it raises: SmolLM2's template fails on an
    assistant turn without content, and must fail alike."""
    try:
        out = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared, not swallowed
        return type(exc), str(exc)
    return out if isinstance(out, str) else list(out)


def test_the_renderer_gives_the_same_ids_either_way(pair):
    from raygrpo.agent.chat import ChatRenderer
    from raygrpo.agent.chat_tools import template_renders_tools

    light, auto = pair
    assert template_renders_tools(light) == template_renders_tools(auto)
    mine, theirs = ChatRenderer(light), ChatRenderer(auto)
    assert mine.chat_template == theirs.chat_template and mine.eos_token_id == theirs.eos_token_id
    for name, messages in CONVERSATIONS.items():
        for tools in TOOLS.values():
            assert mine.prompt_ids(messages, tools) == theirs.prompt_ids(messages, tools), name
    results = [{"role": "tool", "name": "echo", "content": "hi <tool_response>"},
               {"role": "tool", "name": "submit", "content": "wrong"}]
    for block in (results[:1], results):
        assert mine.tool_suffix_ids(block) == theirs.tool_suffix_ids(block)
    ids = theirs.prompt_ids(CONVERSATIONS["multi_turn_tools"], [ECHO, SUBMIT])
    assert mine.decode(ids) == theirs.decode(ids)


def test_encodes_and_decodes_like_transformers(pair):
    from raygrpo.policy.tiny import _corpus

    light, auto = pair
    assert len(light) == len(auto) and light.get_vocab() == auto.get_vocab()
    assert light.eos_token == auto.eos_token and light.eos_token_id == auto.eos_token_id
    assert light.special_tokens_map == auto.special_tokens_map
    texts = _corpus()[::7] + ["", " leading space", "<|im_end|><|endoftext|>x", "emoji 🙂 ✓ → ≤ ≥"]
    for text in texts:
        for special in (False, True):
            ids = auto.encode(text, add_special_tokens=special)
            assert light.encode(text, add_special_tokens=special) == ids, text
            for skip in (False, True):
                assert light.decode(ids, skip_special_tokens=skip) == auto.decode(ids, skip_special_tokens=skip)


def test_template_errors_and_globals_match(pair):
    import jinja2

    light, auto = pair
    raising = "{{ raise_exception('no ' + messages[0].role) }}"
    with pytest.raises(jinja2.exceptions.TemplateError, match="no user"):
        light.apply_chat_template([{"role": "user", "content": "q"}], chat_template=raising, tokenize=False)
    template = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
                "{{ ns.n }} {{ dict(a=1) | tojson }} {{ messages | tojson(indent=1) }} {{ eos_token }}"
                "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}")
    messages = CONVERSATIONS["system"]
    assert light.apply_chat_template(messages, chat_template=template, tokenize=False) == \
        auto.apply_chat_template(messages, chat_template=template, tokenize=False)
    sneaky = "{% set ns = namespace() %}{% set ns._x = 1 %}"
    with pytest.raises(jinja2.exceptions.SecurityError):
        light.apply_chat_template(messages, chat_template=sneaky, tokenize=False)


def _edited_copy(src: str, dst: Path, **config_changes) -> Path:
    shutil.copytree(src, dst)
    path = dst / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(config_changes)
    path.write_text(json.dumps(config))
    return dst


def test_folders_it_cannot_reproduce_load_with_transformers(folders, tmp_path):
    from raygrpo.agent.chat_template import ChatTokenizer, load_tokenizer, plain_folder_issue

    own_class = _edited_copy(folders["qwen3"], tmp_path / "own", tokenizer_class="Qwen2Tokenizer")
    assert "tokenizer_class" in plain_folder_issue(own_class)
    assert not isinstance(load_tokenizer(str(own_class)), ChatTokenizer)
    legacy = _edited_copy(folders["qwen3"], tmp_path / "legacy")
    (legacy / "special_tokens_map.json").write_text("{}")
    assert "legacy" in plain_folder_issue(legacy)
    missing = _edited_copy(folders["qwen3"], tmp_path / "missing", unk_token="<unk-not-there>")
    assert "not a special added token" in plain_folder_issue(missing)
    qwen2 = _edited_copy(folders["qwen3"], tmp_path / "qwen2")
    config = json.loads((qwen2 / "config.json").read_text())
    (qwen2 / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    assert "model_type" in plain_folder_issue(qwen2)
    assert plain_folder_issue(Path(folders["chatml"])) is None


def test_the_model_types_read_from_transformers_source_are_its_own():
    from transformers.models.auto.tokenization_auto import MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS

    from raygrpo.agent.chat_template import _types_with_other_tokenizer

    assert _types_with_other_tokenizer() == frozenset(MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS)


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
def test_rollout_chat_template_kwargs_reach_every_rendering_as_the_template_says(folders, kwargs):
    """`rollout.chat_template_kwargs` reaches the env pool actor's renderer (prompts and the blocks after a model
    turn) and the warm-up's: with Qwen3's `enable_thinking: false` the generation prompt opens with an empty think
    block, exactly as the tokenizer's own `apply_chat_template(..., enable_thinking=False)` renders it."""
    from transformers import AutoTokenizer

    from raygrpo.agent.chat import ChatRenderer
    from raygrpo.agent.worker import RolloutWorker, WorkerSettings
    from raygrpo.config import load_config
    from raygrpo.train.warmup import encode_example

    cfg = load_config(data={"envs": {"echo": {"kind": "ors", "url": "http://127.0.0.1:9/"}}, "model": folders["qwen3"],
                            "policy": {"kind": "scripted", "script": "examples/echo/policies.py:right"},
                            "rollout": {"chat_template_kwargs": kwargs}})
    worker = RolloutWorker.build(WorkerSettings("kwargs", dict(cfg.envs), cfg.policy, cfg.model, cfg.sampling,
                                                cfg.rollout, max_concurrent_per_actor=1))
    auto = AutoTokenizer.from_pretrained(folders["qwen3"])
    messages = CONVERSATIONS["user"]
    expected = auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    empty_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert expected.endswith(empty_think) == bool(kwargs)  # what the template says enable_thinking does
    renderers = [worker.renderer, ChatRenderer(auto, cfg.rollout.chat_template_kwargs)]
    for renderer in renderers:
        assert renderer.tokenizer.decode(renderer.prompt_ids(messages, None)) == expected
        suffix = renderer.tokenizer.decode(renderer.tool_suffix_ids([{"role": "tool", "name": "echo", "content": "r"}]))
        assert suffix.endswith(empty_think) == bool(kwargs), suffix
        prompt, _ = encode_example(renderer, {"messages": messages, "tools": None, "completion": "hi"})
        assert renderer.tokenizer.decode(prompt) == expected
