"""Scripted policies for the multi-step counter tasks of `tests/harbor_steps_utils.py`, through the model's path
(text, tool-call parsing, the `bash` tool).

- `progress`: at the start of each step (the last message is the step's user turn) appends the step's line to
  `/app/progress.txt` with the `bash` tool, then answers: every step passes.
- `stalls`: does step 1 right and then only looks around (`ls`): step 2 onwards fails.
"""

from __future__ import annotations

from raygrpo.agent.toolcalls import format_tool_call
from raygrpo.policy.base import GenerationContext


def _step(ctx: GenerationContext) -> int:
    """Which step the conversation is in: the number of user turns so far."""
    return sum(1 for m in ctx.messages if m.get("role") == "user")


def progress(ctx: GenerationContext) -> str:
    if ctx.messages[-1].get("role") != "user":
        return "Done."
    return format_tool_call("bash", {"command": f"echo 'step {_step(ctx)}' >> /app/progress.txt"})


def stalls(ctx: GenerationContext) -> str:
    if ctx.messages[-1].get("role") != "user":
        return "Done."
    if _step(ctx) == 1:
        return format_tool_call("bash", {"command": "echo 'step 1' >> /app/progress.txt"})
    return format_tool_call("bash", {"command": "ls"})
