"""Scripted policies for the training tests, loaded by file path inside the env pool actors.

`mixed` plays the echo environment right, wrong or not at all (at random: rewards 1.0, 0.0 and None in one batch)
and the arith environment right (several tool calls per episode, so its completions hold tool-result tokens).
"""

from __future__ import annotations

import random
from pathlib import Path

from raygrpo.core.imports import load_object
from raygrpo.policy.base import GenerationContext

_EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
_ECHO = {name: load_object(f"{_EXAMPLES / 'echo' / 'policies.py'}:{name}") for name in ("right", "wrong", "silent")}
_ARITH_RIGHT = load_object(f"{_EXAMPLES / 'arith' / 'policies.py'}:right")


def mixed(ctx: GenerationContext) -> str | None:
    if ctx.task.env.startswith("arith"):
        return _ARITH_RIGHT(ctx)
    # The first echo call ends the episode, so the first turn's choice decides the reward.
    return _ECHO[random.choice(["right", "right", "wrong", "silent"])](ctx)


def nap_task0(ctx: GenerationContext) -> str:
    """For `tests/e2e_support.py:NapEnvironment`: task 0 naps 3 s on the server, every other task not at all."""
    from raygrpo.agent.toolcalls import format_tool_call

    if any(m.get("role") == "tool" for m in ctx.messages):
        return "Done."
    return format_tool_call("nap", {"seconds": 3.0 if ctx.task.index == 0 else 0.0})


def half_flat(ctx: GenerationContext) -> str | None:
    """Echo: even tasks are always answered right (their groups' rewards are all 1.0: no signal for GRPO), odd ones
    right or wrong at random (their groups mostly mixed)."""
    choice = "right" if ctx.task.index % 2 == 0 else random.choice(["right", "wrong"])
    return _ECHO[choice](ctx)
