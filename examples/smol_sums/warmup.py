"""Format warm-up for the sums example (`train: {warmup: {examples: warmup.py:format_examples}}`).

SmolLM2-135M-Instruct answers arithmetic in prose but never writes a `<tool_call>` from the system prompt alone
(0 of 38 sampled answers did, measured here). The warm-up shows it the call format on questions the tasks never ask:
one-digit operands (the tasks' are 10 to 99), the `submit` tool as the server lists it, and the right answer as one
`submit` call. It teaches the format, not the tasks: two-digit sums stay the model's own work.
"""

from __future__ import annotations

import copy
import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

from raygrpo.toolcalls import format_tool_call


def _tasks():
    name = "raygrpo_examples_smol_sums_tasks"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("tasks.py"))
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def format_examples(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` conversations: a one-digit question, the submit tool, and the right answer as a submit call."""
    tasks = _tasks()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, op = rng.randint(0, 9), rng.randint(0, 9), rng.choice("+-")
        out.append({
            "messages": [{"role": "user", "content": tasks.prompt_text(a, op, b)}],
            "tools": [copy.deepcopy(tasks.SUBMIT_TOOL)],
            "completion": format_tool_call("submit", {"answer": a + b if op == "+" else a - b}),
        })
    return out
