"""Scripted policies for the arith environment (`policy: {kind: scripted, script: policies.py:right}`).

`right` plays the episode the intended way, one tool call per turn: read every operand with `get_operand`, compute
with `calculator` using the values the tool returned, then `submit` the calculator's result. `wrong` does the same
but submits one more than the result (reward 0.0). `silent` answers in plain text and never submits
(`no_answer`, scored `rollout.unanswered_reward`: 0.0 by default).
The expression and operand names come from the task metadata or, failing that, from the prompt.
"""

from __future__ import annotations

import re
from typing import Any

from raygrpo.policy.base import GenerationContext
from raygrpo.agent.toolcalls import format_tool_call

_PROMPT = re.compile(r"Compute (.+?)\. The operands \(([^)]*)\)")
_OPERAND = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*(-?\d+)\s*$")
_INTEGER = re.compile(r"^\s*(-?\d+)\s*$")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _task(ctx: GenerationContext) -> tuple[str, list[str]]:
    """(expression, operand names) of the task."""
    meta = ctx.task.metadata
    if isinstance(meta.get("expression"), str) and isinstance(meta.get("operands"), dict):
        return meta["expression"], sorted(meta["operands"])
    for message in ctx.messages:
        if message.get("role") == "user":
            match = _PROMPT.search(_text(message.get("content")))
            if match:
                return match.group(1), [n.strip() for n in match.group(2).split(",") if n.strip()]
    return "", []


def _results(ctx: GenerationContext, tool: str) -> list[str]:
    return [_text(m.get("content")) for m in ctx.messages if m.get("role") == "tool" and m.get("name") == tool]


def _substitute(expression: str, values: dict[str, int]) -> str:
    return re.sub(r"[A-Za-z_]\w*", lambda m: str(values.get(m.group(0), m.group(0))), expression)


def _play(ctx: GenerationContext, offset: int) -> str:
    if _results(ctx, "submit"):
        return "Done."
    expression, names = _task(ctx)
    values: dict[str, int] = {}
    for text in _results(ctx, "get_operand"):
        match = _OPERAND.match(text)
        if match:
            values[match.group(1)] = int(match.group(2))
    missing = [n for n in names if n not in values]
    if missing:
        return format_tool_call("get_operand", {"name": missing[0]})
    computed = [int(m.group(1)) for t in _results(ctx, "calculator") if (m := _INTEGER.match(t))]
    if not computed:
        return format_tool_call("calculator", {"expression": _substitute(expression, values)})
    return format_tool_call("submit", {"answer": computed[-1] + offset})


def right(ctx: GenerationContext) -> str:
    """Look up, compute, submit the right answer: reward 1.0."""
    return _play(ctx, 0)


def wrong(ctx: GenerationContext) -> str:
    """Look up, compute, submit the answer plus one: reward 0.0."""
    return _play(ctx, 1)


def silent(ctx: GenerationContext) -> str:
    """Answer in plain text without submitting: the episode ends `no_answer`, scored `rollout.unanswered_reward`
    (0.0 by default)."""
    expression, _ = _task(ctx)
    return f"I think {expression or 'it'} is 42."
