"""raygrpo's own tool-calling chat template, for models whose chat template has no tools section.

Some instruct models ship a chat template that ignores `tools=` and `tool_calls` (SmolLM2's ChatML template renders
only `role` and `content`). For them raygrpo renders with `TOOLS_CHATML_TEMPLATE` instead: ChatML as the model knows
it, with

* the tool schemas written into the system prompt as plain text: one JSON object per line between `<tools>` and
  `</tools>`, after the task's own system message (if any), followed by how to call a tool;
* an assistant turn's tool calls written as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, the format
  `raygrpo.agent.toolcalls.parse_tool_calls` parses (Qwen2.5's and Hermes' format);
* tool results as one user turn holding a `<tool_response>\\n...\\n</tool_response>` block per result.

Every marker is plain text the tokenizer splits into ordinary tokens: no special token is added (a new token's
embedding would be untrained). The template is prefix-preserving (an assistant turn renders the same whatever follows
it) and marks assistant turns with `{% generation %}`, so TRL's `is_chat_template_prefix_preserving` and
`supports_tool_calling` accept it and `get_training_chat_template` has nothing to patch (`tests/test_chat_tools.py`
checks all three). This format is raygrpo's own: the prompt-parity promise with TRL covers the templates TRL ships,
not this one.
"""

from __future__ import annotations

from typing import Any

#: ChatML with tools in the system prompt and tool calls as `<tool_call>` text (see the module docstring).
TOOLS_CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- 'You can call these tools (JSON schemas, one per line):\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nTo call a tool, reply with a JSON object of its name and arguments between "
    "<tool_call> and </tool_call>, for example:\\n<tool_call>\\n{\"name\": \"' + tools[0].function.name + "
    "'\", \"arguments\": {}}\\n</tool_call>\\nEach result comes back in <tool_response></tool_response>.<|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{{- message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set f = call.function if call.function is defined else call %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' }}"
    "{{- f.arguments if f.arguments is string else (f.arguments | tojson) }}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: Tokens the template relies on: they must already be single tokens of the model's vocabulary.
CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")

_NAME = "tool_name_7f3c"
_ARG = "tool_arg_2b9e"
_RESULT = "tool_result_5d1a"


def template_renders_tools(tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether the tokenizer's own chat template shows tools: their schemas in the prompt, an assistant turn's tool
    calls and the tool results (the same sentinel test as TRL's `supports_tool_calling`, plus the schemas, without
    importing TRL), rendered with the run's `template_kwargs` (`rollout.chat_template_kwargs`)."""
    kwargs = dict(template_kwargs or {})
    if tokenizer.chat_template is None:
        return False
    schema = {"type": "function", "function": {"name": _NAME, "description": "d",
                                                "parameters": {"type": "object", "properties": {}}}}
    call = {"type": "function", "function": {"name": _NAME, "arguments": {_ARG: 1}}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": _NAME, "content": _RESULT}]
    try:
        prompt = tokenizer.apply_chat_template(messages[:1], tools=[schema], tokenize=False, **kwargs)
        convo = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception:  # noqa: BLE001 - a template that rejects the tool roles does not render tools
        return False
    return _NAME in prompt and all(s in convo for s in (_NAME, _ARG, _RESULT))


def tools_fallback_template(tokenizer: Any) -> str:
    """`TOOLS_CHATML_TEMPLATE`, after checking that the tokenizer has ChatML's turn markers as single tokens."""
    vocab = tokenizer.get_vocab()
    missing = [t for t in CHATML_TOKENS if t not in vocab]
    if missing:
        raise ValueError(
            f"the tokenizer's chat template does not render tools, and raygrpo's fallback (ChatML with tools in the "
            f"system prompt) needs {missing} in its vocabulary; give the tokenizer a chat template with tools"
        )
    return TOOLS_CHATML_TEMPLATE
