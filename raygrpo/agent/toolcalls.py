"""Tool calls in model text: the Qwen/Hermes `<tool_call>{json}</tool_call>` format.

Parsing never raises: every problem with a call (malformed JSON, missing name, arguments that are not an object)
becomes a `ToolCallProblem` that the agent loop shows to the model as an error message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from raygrpo.core.types import ToolCall

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.DOTALL)


@dataclass
class ToolCallProblem:
    """A tool call the model tried to make but that cannot be run; `message` is what the model is told."""

    message: str
    raw: str


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a Qwen3-style model emits for one tool call."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall | ToolCallProblem]]:
    """Split model text into its plain content and the tool calls it makes, in order.

    Returns the text before the first `<tool_call>` (stripped) and one entry per `<tool_call>` block: a `ToolCall`
    when the block holds a JSON object with a string `name` and an object `arguments` (a JSON string holding an
    object is accepted too), else a `ToolCallProblem`. An unclosed last block is parsed up to the end of the text.
    """
    start = text.find(TOOL_CALL_OPEN)
    content = (text if start < 0 else text[:start]).strip()
    calls: list[ToolCall | ToolCallProblem] = []
    for match in _BLOCK.finditer(text):
        calls.append(_parse_one(match.group(1).strip()))
    return content, calls


def _parse_one(raw: str) -> ToolCall | ToolCallProblem:
    try:
        payload = json.loads(raw)
    except json.JSONDecodeError as exc:
        return ToolCallProblem(f"Error: the tool call is not valid JSON ({exc.msg} at position {exc.pos}).", raw)
    if not isinstance(payload, dict):
        return ToolCallProblem('Error: a tool call must be a JSON object {"name": ..., "arguments": {...}}.', raw)
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallProblem('Error: the tool call has no "name" string.', raw)
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return ToolCallProblem(f'Error: the "arguments" of tool {name!r} are not a JSON object.', raw)
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ToolCallProblem(f'Error: the "arguments" of tool {name!r} must be a JSON object.', raw)
    return ToolCall(name=name, arguments=arguments)
