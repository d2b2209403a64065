"""The sums task family, as plain data (no ORS dependency): `env.py` serves it, `scripts/gpu_check.py` runs it in
process.

Each task asks for `a + b` or `a - b` with two-digit operands (10 to 99, seeded); the train and test splits never
share a question. The model answers by calling `submit(answer)`.
"""

from __future__ import annotations

import random
import re
from typing import Any

#: Tasks per split; test is held out (none of its questions is in train).
SPLIT_SIZES = {"train": 2000, "test": 400}
OPERAND_RANGE = (10, 99)
SEED = 20261201

#: The `submit` tool as the ORS server lists it (raygrpo.envs.ors.tools renders it this way).
SUBMIT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Submit the final integer answer. Ends the episode: reward 1.0 if correct, else 0.0.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "integer", "description": "The integer result."}},
            "required": ["answer"],
        },
        "return": {"type": "string"},
    },
}


def questions() -> dict[str, list[dict[str, Any]]]:
    """Every split's tasks, `{"a", "op", "b", "answer"}` each; deterministic."""
    rng = random.Random(SEED)
    seen: set[tuple[int, str, int]] = set()
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in SPLIT_SIZES}
    for split, size in SPLIT_SIZES.items():
        while len(out[split]) < size:
            a, b = rng.randint(*OPERAND_RANGE), rng.randint(*OPERAND_RANGE)
            op = rng.choice("+-")
            if (a, op, b) in seen:
                continue
            seen.add((a, op, b))
            out[split].append({"a": a, "op": op, "b": b, "answer": a + b if op == "+" else a - b})
    return out


def prompt_text(a: int, op: str, b: int) -> str:
    """The user message of one task."""
    return f"What is {a} {op} {b}? Answer with the submit tool."


def reward(task: dict[str, Any], answer: Any) -> float:
    """1.0 when `answer` is the task's integer answer, else 0.0."""
    return 1.0 if type(answer) is int and answer == task["answer"] else 0.0


def graded_reward(task: dict[str, Any], answer: Any) -> float:
    """A dense reward: 1.0 for the right integer, falling linearly to 0.0 at 100 away (0.0 for a non-integer)."""
    if type(answer) is not int:
        return 0.0
    return max(0.0, 1.0 - abs(answer - task["answer"]) / 100)


def text_answer(text: str) -> int | None:
    """The last integer of a plain-text answer (None when there is none)."""
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None
