"""Turning conversations into token ids with the tokenizer's own chat template.

The agent loop works on token ids (what the learner trains on) and keeps decoded messages beside them (what people
read). `ChatRenderer` is the only place that knows how a chat template lays out a prompt and a block of tool results.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from raygrpo.agent.chat_tools import template_renders_tools, tools_fallback_template
from raygrpo.core.types import ToolCall

#: Renderings kept by each `ChatRenderer` (oldest dropped first).
RENDER_CACHE_SIZE = 1024


def training_template(tokenizer: Any) -> str | None:
    """TRL's prefix-preserving training variant of the tokenizer's chat template.

    TRL ships `X.jinja` with `X_training.jinja` beside it and maps one to the other by exact text. Reading the files
    directly avoids importing `trl` (seconds per process) in env pool actors; TRL's own lookup is the fallback.
    """
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    spec = importlib.util.find_spec("trl")
    if spec is not None and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations))) / "chat_templates"
        for path in sorted(folder.glob("*.jinja")):
            training = path.with_name(f"{path.stem}_training.jinja")
            if training.is_file() and path.read_text(encoding="utf-8") == template:
                return training.read_text(encoding="utf-8")
    from trl.chat_template_utils import get_training_chat_template

    return get_training_chat_template(tokenizer)


class ChatRenderer:
    """Renders prompts and tool-result blocks through a Hugging Face tokenizer's chat template.

    Tool results are rendered the way TRL's GRPOTrainer does it: the suffix is the difference between a short dummy
    conversation that ends on an assistant turn and the same conversation followed by the tool messages and the next
    generation prompt, so the ids appended after a model turn are exactly what the template would produce. That only
    works with a prefix-preserving template; like GRPOTrainer, the renderer swaps a template that is not (Qwen3's
    drops `<think>` blocks of earlier turns) for TRL's training variant of it, for prompts and tool results alike.
    A template that does not render tools at all (SmolLM2's ChatML) is replaced by raygrpo's own tool-calling ChatML
    template (`raygrpo.agent.chat_tools`): schemas in the system prompt, calls as `<tool_call>` text, no new tokens.

    Args:
        tokenizer: A tokenizer with a chat template (one without tools gets raygrpo's fallback): a `transformers`
            tokenizer, or the `ChatTokenizer` env pool actors load without transformers (`raygrpo.agent.chat_template`).
        template_kwargs: Extra keyword arguments of every rendering, the checks of the template included
            (`rollout.chat_template_kwargs`, e.g. `{"enable_thinking": False}`), as `apply_chat_template` takes them.
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token; the agent loop needs one to end a turn")
        self.eos_token_id: int = tokenizer.eos_token_id
        self.chat_template: str | None = None
        self._rendered: dict[str, tuple[int, ...]] = {}
        if not template_renders_tools(tokenizer, self.template_kwargs):
            self.chat_template = tools_fallback_template(tokenizer)  # raygrpo's own format (see raygrpo.agent.chat_tools)
        elif not self._prefix_preserving():
            self.chat_template = training_template(tokenizer)

    def _prefix_preserving(self) -> bool:
        call = {"type": "function", "function": {"name": "f", "arguments": {}}}
        first = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
        longer = first + [{"role": "tool", "name": "f", "content": "r"}]
        short = self.tokenizer.apply_chat_template(first, tokenize=False, **self.template_kwargs)
        full = self.tokenizer.apply_chat_template(longer, tokenize=False, add_generation_prompt=True,
                                                  **self.template_kwargs)
        eos = self.tokenizer.eos_token
        return full.startswith(short[: short.rfind(eos) + len(eos)] if eos in short else short)

    def _template(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        """The template's ids for `messages`; the same rendering asked again (a GRPO group's G copies of a task's
        prompt, the fixed prefix of every tool block) is answered from a bounded cache: rendering the template and
        tokenizing it is the costliest CPU of an agent turn."""
        kwargs = {**self.template_kwargs, **kwargs}
        key = json.dumps([messages, kwargs], sort_keys=True, default=str)
        ids = self._rendered.get(key)
        if ids is None:
            if self.chat_template is not None:
                kwargs["chat_template"] = self.chat_template
            out = self.tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
            if isinstance(out, dict) or hasattr(out, "input_ids"):
                out = out["input_ids"]
            ids = tuple(out)
            while len(self._rendered) >= RENDER_CACHE_SIZE:
                self._rendered.pop(next(iter(self._rendered)))
            self._rendered[key] = ids
        return list(ids)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The templated prompt, tools included, ending with the generation prompt."""
        return self._template(messages, tools=tools or None, add_generation_prompt=True)

    def tool_suffix_ids(self, tool_messages: list[dict[str, Any]]) -> list[int]:
        """Ids that follow a finished assistant turn: the tool results, then the next generation prompt."""
        dummy_call = {"type": "function", "function": {"name": tool_messages[0].get("name", "tool"), "arguments": {}}}
        prefix_msgs = [
            {"role": "user", "content": "dummy"},
            {"role": "assistant", "content": "", "tool_calls": [dummy_call]},
        ]
        return self._suffix_ids(prefix_msgs, tool_messages, "tool results")

    def user_suffix_ids(self, user_messages: list[dict[str, Any]]) -> list[int]:
        """Ids that follow a finished assistant turn that called no tool: new user messages (the next step of a
        multi-step episode), then the next generation prompt."""
        prefix_msgs = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "dummy"}]
        return self._suffix_ids(prefix_msgs, user_messages, "a user turn")

    def _suffix_ids(self, prefix_msgs: list[dict[str, Any]], new_msgs: list[dict[str, Any]], what: str) -> list[int]:
        """The ids `new_msgs` (and the next generation prompt) add after the assistant turn ending `prefix_msgs`."""
        prefix = self._template(prefix_msgs, add_generation_prompt=False)
        full = self._template(prefix_msgs + new_msgs, add_generation_prompt=True)
        eos_positions = [i for i, tok in enumerate(prefix) if tok == self.eos_token_id]
        if eos_positions:
            prefix = prefix[: eos_positions[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError(f"the chat template does not extend an assistant turn with {what} as a prefix")
        return full[len(prefix) :]

    def decode(self, ids: list[int]) -> str:
        """Model output as text, tool-call markers kept, the end-of-turn token dropped."""
        if ids and ids[-1] == self.eos_token_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def assistant_message(content: str, calls: list[ToolCall]) -> dict[str, Any]:
    """An assistant message in the chat-template format, with its parsed tool calls."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return message
