"""The tiny offline model: it loads, its chat template is TRL's Qwen3 one, and its tokenizer round-trips any text."""

from __future__ import annotations

import json
import os
import threading

import pytest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "echo",
            "description": "Echo the text back.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        },
    }
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.timeout(120)
def test_loads_with_auto_classes(tiny_model_dir, tok):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    assert 100_000 <= n_params <= 1_000_000
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert 300 <= len(tok) <= 2048
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and model.config.eos_token_id == tok.eos_token_id
    assert tok.pad_token is not None and tok.pad_token_id != tok.eos_token_id
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tok.encode("hello world")])).logits
    assert logits.shape[-1] == len(tok) and torch.isfinite(logits).all()


@pytest.mark.timeout(60)
def test_chat_template_is_trls_qwen3_and_supports_tools(tok):
    from trl.chat_template_utils import qwen3_chat_template, supports_tool_calling

    assert tok.chat_template == qwen3_chat_template
    assert supports_tool_calling(tok)
    # (Not prefix-preserving, exactly like Qwen3's own template: TRL swaps in a training template for that.)
    # add_response_schema's result survives save/load.
    assert getattr(tok, "response_template", None) or getattr(tok, "response_schema", None)


@pytest.mark.timeout(60)
def test_format_tokens_are_single_ids(tok):
    for text in ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                 "<think>", "</think>", tok.pad_token]:
        ids = tok.encode(text, add_special_tokens=False)
        assert len(ids) == 1, (text, ids)
    # Tool-call markers are not "special": a decode that drops special tokens keeps them (as Qwen3's tokenizer does).
    ids = tok.encode("<tool_call>\n{}\n</tool_call><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"
    assert tok.encode("hi", add_special_tokens=True) == tok.encode("hi", add_special_tokens=False)  # no BOS added


@pytest.mark.timeout(60)
def test_template_renders_tools_tool_calls_and_tool_messages(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Echo héllo"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "echo", "arguments": {"text": "héllo"}}}],
        },
        {"role": "tool", "name": "echo", "content": "héllo"},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOLS[0], ensure_ascii=False) in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "echo", "arguments": {"text": "héllo"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\nhéllo\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok.apply_chat_template(messages, tools=TOOLS, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert tok.decode(ids) == text


@pytest.mark.timeout(60)
def test_trl_parses_a_tool_call_from_tokens(tok):
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "echo x"}], tools=TOOLS, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    completion = tok.encode(
        '<tool_call>\n{"name": "echo", "arguments": {"text": "x"}}\n</tool_call><|im_end|>', add_special_tokens=False
    )
    parsed = tok.parse_response(completion, prefix=prompt)
    assert parsed["tool_calls"][0]["function"] == {"name": "echo", "arguments": {"text": "x"}}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "text",
    [
        "",
        "plain words",
        '{"name": "echo", "arguments": {"text": "a\\nb", "n": [1, 2.5, null, true]}}',
        "  leading and trailing spaces  \n\n\ttabs\r\nCRLF",
        "naïve café — “quotes” … 日本語 🙂👍🏽 \u200b zero-width",
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la | grep '.py'\"}}\n</tool_call>",
        "e\u0301 (decomposed) vs \u00e9 (composed)",
        "\x00\x01 control \x7f bytes",
    ],
)
def test_byte_level_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text


@pytest.mark.timeout(120)
def test_build_is_deterministic(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    from raygrpo.policy.tiny import build_tiny_model

    other = build_tiny_model(str(tmp_path / "again"), seed=0)
    with open(os.path.join(tiny_model_dir, "tokenizer.json")) as a, open(os.path.join(other, "tokenizer.json")) as b:
        assert json.load(a) == json.load(b)
    w0 = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    w1 = load_file(os.path.join(other, "model.safetensors"))
    assert w0.keys() == w1.keys() and all((w0[k] == w1[k]).all() for k in w0)
    seeded = build_tiny_model(str(tmp_path / "seed1"), seed=1)
    w2 = load_file(os.path.join(seeded, "model.safetensors"))
    assert any(not (w0[k] == w2[k]).all() for k in w0)


@pytest.mark.timeout(180)
def test_ensure_tiny_model_races_and_caches(tmp_path, monkeypatch):
    import time

    from raygrpo.policy import tiny

    builds = []
    real_build = tiny.build_tiny_model

    def counting_build(out_dir, seed=0):
        builds.append(out_dir)
        return real_build(out_dir, seed)

    monkeypatch.setattr(tiny, "build_tiny_model", counting_build)
    cache = str(tmp_path / "cache")
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(tiny.ensure_tiny_model(cache, seed=3))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert len(results) == 2 and results[0] == results[1]
    path = results[0]
    assert os.path.basename(path) == "tiny-qwen3-v2-seed3"
    assert sorted(os.listdir(os.path.dirname(path))) == ["tiny-qwen3-v2-seed3"]  # the losers' temp dirs are gone
    assert os.path.isfile(os.path.join(path, "config.json"))
    n = len(builds)
    start = time.monotonic()
    assert tiny.ensure_tiny_model(cache, seed=3) == path
    assert len(builds) == n and time.monotonic() - start < 1.0  # cached: no rebuild

    monkeypatch.setenv("RAYGRPO_CACHE", cache)
    assert tiny.resolve_model_path("tiny").startswith(cache)


@pytest.mark.timeout(30)
def test_resolve_model_path(tmp_path):
    from raygrpo.policy.tiny import resolve_model_path

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    missing = str(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        resolve_model_path(missing)


@pytest.mark.timeout(30)
def test_a_folder_that_is_not_a_model_is_refused_naming_what_it_lacks_and_where_the_model_is(tmp_path):
    """A run folder given for its `model/`, a hub cache folder for its `snapshots/<rev>/`, a folder without a
    tokenizer: refused when resolved (before Ray starts), not by every engine actor dying in its `__init__`."""
    from raygrpo.policy.tiny import resolve_model_path

    run = tmp_path / "runs" / "echo-train"
    (run / "model").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    for name in ("config.json", "tokenizer_config.json"):
        (run / "model" / name).write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"has no config\.json and no tokenizer.*"
                                                f"{run / 'model'}.*give that path"):
        resolve_model_path(str(run))
    assert resolve_model_path(str(run / "model")) == str(run / "model")

    hub = tmp_path / "hub" / "models--Qwen--Qwen3-0.6B"
    (hub / "snapshots" / "abc123").mkdir(parents=True)
    (hub / "snapshots" / "abc123" / "config.json").write_text("{}")
    (hub / "refs").mkdir()
    with pytest.raises(FileNotFoundError, match=f"no config\\.json.*{hub / 'snapshots' / 'abc123'}"):
        resolve_model_path(str(hub))

    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    (weights_only / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer \(tokenizer\.json, tokenizer_config\.json") as info:
        resolve_model_path(str(weights_only))
    assert "give that path" not in str(info.value)
    (weights_only / "vocab.json").write_text("{}")  # a slow BPE tokenizer's files are enough for AutoTokenizer
    assert resolve_model_path(str(weights_only)) == str(weights_only)
