"""Scripted policies for the echo environment (`policy: {kind: scripted, script: policies.py:right}`).

Each function gets the `GenerationContext` of the turn and returns the assistant's text. They read the target from
the task metadata (`include_metadata`, the default) or, failing that, from the prompt.
"""

from __future__ import annotations

import re
from typing import Any

from raygrpo.policy.base import GenerationContext
from raygrpo.agent.toolcalls import format_tool_call

_PROMPT_TARGET = re.compile(r"Echo '(.*)' to win")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _target(ctx: GenerationContext) -> str:
    target = ctx.task.metadata.get("target")
    if isinstance(target, str):
        return target
    for message in ctx.messages:
        if message.get("role") == "user":
            match = _PROMPT_TARGET.search(_text(message.get("content")))
            if match:
                return match.group(1)
    return ""


def _tool_results(ctx: GenerationContext) -> list[dict[str, Any]]:
    return [m for m in ctx.messages if m.get("role") == "tool"]


def right(ctx: GenerationContext) -> str:
    """Echo the target: reward 1.0."""
    if _tool_results(ctx):
        return "Done."
    return format_tool_call("echo", {"text": _target(ctx)})


def wrong(ctx: GenerationContext) -> str:
    """Echo something else: reward 0.0."""
    if _tool_results(ctx):
        return "Done."
    return format_tool_call("echo", {"text": "not " + _target(ctx)})


def silent(ctx: GenerationContext) -> str:
    """Never call the tool, answer in plain text: the episode ends `no_answer`, scored `rollout.unanswered_reward`
    (0.0 by default)."""
    return f"The target is {_target(ctx)}."
