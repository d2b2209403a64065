"""Scripted policies for the Harbor example suite (`--set policy.kind=scripted --set policy.script=policies.py:wrong`).

The suite's own config runs the built-in oracle (`policy.kind: oracle`), which uploads `solution/` and runs
`solve.sh` as Harbor does; these go through the model's path instead (text, tool-call parsing, the `bash` tool).

Each function gets the `GenerationContext` of the turn and returns the assistant's text; tool calls go through the
same parsing path as a model's. They find the task's folder in `ctx.task.metadata["task_dir"]` (set by
`HarborSpec.list_tasks`).

- `right` pastes the text of the task's `solution/solve.sh` into the `bash` tool: reward 1.0 on these tasks, whose
  solutions need no other file of `solution/` (a solution that reads `/solution/...` needs the oracle).
- `wrong` only looks around (`ls`): the verifier runs and finds nothing done: reward 0.0.
- `silent` never calls a tool: the verifier still grades the untouched sandbox: reward 0.0.
"""

from __future__ import annotations

from pathlib import Path

from raygrpo.policy.base import GenerationContext
from raygrpo.agent.toolcalls import format_tool_call


def _called_a_tool(ctx: GenerationContext) -> bool:
    return any(m.get("role") == "tool" for m in ctx.messages)


def solution_script(ctx: GenerationContext) -> str:
    """The text of the task's `solution/solve.sh`."""
    task_dir = ctx.task.metadata.get("task_dir")
    if not task_dir:
        raise ValueError(f"task {ctx.task.env}/{ctx.task.index} has no task_dir in its metadata")
    return (Path(task_dir) / "solution" / "solve.sh").read_text()


def right(ctx: GenerationContext) -> str:
    """Run the reference solution as one bash command, then stop."""
    if _called_a_tool(ctx):
        return "Done."
    return format_tool_call("bash", {"command": solution_script(ctx)})


def wrong(ctx: GenerationContext) -> str:
    """List the working directory, then stop without solving anything."""
    if _called_a_tool(ctx):
        return "Done."
    return format_tool_call("bash", {"command": "ls -la"})


def silent(ctx: GenerationContext) -> str:
    """Answer in plain text without touching the sandbox."""
    return "I would solve this, but I will not run anything."
