"""Format warm-up for the sums example (`train: {warmup: {examples: warmup.py:format_examples}}`).

SmolLM2-135M-Instruct answers arithmetic in prose but never writes a `<tool_call>` from the system prompt alone
(0 of 38 sampled answers did, measured here). The warm-up shows it the call format on questions no task asks: two-digit
sums and differences that are in neither the train nor the test split (`tasks.questions()` takes 2,400 of the 16,200),
the `submit` tool as the server lists it, and an answer that first writes the sum out, as the model does in prose,
then calls `submit` with it. A short warm-up (12 steps of 4 in `save_warmed_model.py`) teaches the format; the arithmetic stays
the model's own.
"""

from __future__ import annotations

import copy
import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

from raygrpo.agent.toolcalls import format_tool_call


def _tasks():
    name = "raygrpo_examples_smol_sums_tasks"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("tasks.py"))
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def format_examples(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` conversations: a question no split holds, the submit tool, the sum written out and then submitted."""
    tasks = _tasks()
    taken = {(q["a"], q["op"], q["b"]) for split in tasks.questions().values() for q in split}
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        a, b, op = rng.randint(*tasks.OPERAND_RANGE), rng.randint(*tasks.OPERAND_RANGE), rng.choice("+-")
        if (a, op, b) in taken:
            continue
        answer = a + b if op == "+" else a - b
        out.append({
            "messages": [{"role": "user", "content": tasks.prompt_text(a, op, b)}],
            "tools": [copy.deepcopy(tasks.SUBMIT_TOOL)],
            "completion": f"{a} {op} {b} = {answer}\n" + format_tool_call("submit", {"answer": answer}),
        })
    return out
