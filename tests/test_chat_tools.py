"""raygrpo's tool template for chat templates without tools (SmolLM2's ChatML), checked with TRL's own checks."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(180)

#: SmolLM2-135M-Instruct's chat template, as transformers reads it from the GGUF file: no tools section.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>'"
    " + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SUBMIT = {"type": "function", "function": {"name": "submit", "description": "Submit the answer.", "parameters": {
    "type": "object", "properties": {"answer": {"type": "integer", "description": "The answer."}},
    "required": ["answer"]}}}


@pytest.fixture
def chatml_tok(tiny_model_dir):
    """The tiny tokenizer (ChatML markers are single tokens) with SmolLM2's template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = SMOLLM2_TEMPLATE
    return tok


def test_a_template_without_tools_gets_the_fallback(chatml_tok, tiny_model_dir):
    from transformers import AutoTokenizer

    from raygrpo.agent.chat import ChatRenderer
    from raygrpo.agent.chat_tools import TOOLS_CHATML_TEMPLATE, template_renders_tools

    assert not template_renders_tools(chatml_tok)
    assert template_renders_tools(AutoTokenizer.from_pretrained(tiny_model_dir))  # Qwen3: TRL training variant
    assert ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir)).chat_template != TOOLS_CHATML_TEMPLATE
    vocab_size = len(chatml_tok)
    renderer = ChatRenderer(chatml_tok)
    assert renderer.chat_template == TOOLS_CHATML_TEMPLATE
    assert len(chatml_tok) == vocab_size  # no token is added
    text = chatml_tok.decode(renderer.prompt_ids([{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "What is 2 + 3?"}], [SUBMIT]))
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou can call these tools")
    assert '"name": "submit"' in text and "<tools>" in text and "</tools>" in text
    assert text.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("<|im_start|>system") == 1
    # Tool results: one user turn, then the next generation prompt.
    suffix = chatml_tok.decode(renderer.tool_suffix_ids([{"role": "tool", "name": "submit", "content": "wrong"}]))
    assert suffix == "\n<|im_start|>user\n<tool_response>\nwrong\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_calls_the_template_writes_are_what_the_parser_reads(chatml_tok):
    from raygrpo.agent.chat_tools import TOOLS_CHATML_TEMPLATE
    from raygrpo.agent.toolcalls import format_tool_call, parse_tool_calls

    call = {"type": "function", "function": {"name": "submit", "arguments": {"answer": 5}}}
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    text = chatml_tok.apply_chat_template(msgs, tools=[SUBMIT], tokenize=False, chat_template=TOOLS_CHATML_TEMPLATE)
    turn = text.rsplit("<|im_start|>assistant\n", 1)[1]
    assert turn == format_tool_call("submit", {"answer": 5}) + "<|im_end|>\n"
    content, calls = parse_tool_calls(turn)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("submit", {"answer": 5})]


def test_trl_accepts_the_fallback_for_training(chatml_tok, tiny_model_dir, tmp_path):
    """TRL's checks: it renders tool calls, is prefix-preserving, needs no training patch; GRPOTrainer with tools
    keeps it as is."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import (
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        supports_tool_calling,
    )

    from raygrpo.agent.chat_tools import TOOLS_CHATML_TEMPLATE

    assert not supports_tool_calling(chatml_tok)  # SmolLM2's own template
    chatml_tok.chat_template = TOOLS_CHATML_TEMPLATE
    assert supports_tool_calling(chatml_tok)
    assert is_chat_template_prefix_preserving(chatml_tok)
    assert get_training_chat_template(chatml_tok) is None  # prefix-preserving, with generation markers

    def submit(answer: int) -> str:
        """Submit the answer.

        Args:
            answer: The answer.
        """
        return str(answer)

    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=False, num_generations=2,
                      per_device_train_batch_size=2, max_steps=1, report_to="none", max_completion_length=8)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], args=args,
                          processing_class=chatml_tok, tools=[submit],
                          train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "q"}]]}))
    assert trainer.chat_template is None  # TRL uses the template as it is


def test_fallback_needs_chatml_tokens(tiny_model_dir):
    from transformers import AutoTokenizer

    from raygrpo.agent.chat import ChatRenderer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    tok.get_vocab = lambda: {}  # a vocabulary without ChatML's markers
    with pytest.raises(ValueError, match="im_start"):
        ChatRenderer(tok)


def test_renderings_asked_again_come_from_the_cache_unchanged_and_the_cache_is_bounded(tiny_model_dir, monkeypatch):
    """A GRPO group renders its task's prompt G times: once through the template, then from the cache; what the
    caller does with the ids it got never reaches the cache, and the cache keeps at most its size."""
    from transformers import AutoTokenizer

    import raygrpo.agent.chat as chat
    from raygrpo.agent.chat import ChatRenderer

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))
    calls = []
    real = renderer.tokenizer.apply_chat_template
    monkeypatch.setattr(renderer.tokenizer, "apply_chat_template", lambda *a, **k: calls.append(1) or real(*a, **k))
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "Fix the bug."}]
    first = renderer.prompt_ids(messages, tools)
    first.append(-1)
    again = renderer.prompt_ids([dict(m) for m in messages], tools)
    assert len(calls) == 1 and again == first[:-1]
    assert renderer.prompt_ids([{"role": "user", "content": "Another task."}], tools) != again and len(calls) == 2
    tool = [{"role": "tool", "name": "bash", "content": "ok"}]
    assert renderer.tool_suffix_ids(tool) == renderer.tool_suffix_ids(tool) and len(calls) == 4

    monkeypatch.setattr(chat, "RENDER_CACHE_SIZE", 3)
    for i in range(10):
        renderer.prompt_ids([{"role": "user", "content": f"task {i}"}], None)
    assert len(renderer._rendered) == 3
