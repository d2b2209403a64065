"""Sums: arithmetic word problems answered through a tool, generated locally, with a large held-out split.

Each task asks for `a + b` or `a - b` (operands 2 to 99, seeded; train and test never share a question). The model
must answer by calling `submit(answer)`: reward 1.0 when the integer is right, 0.0 when it is wrong, and the episode
ends. Answering in plain text without the tool scores `rollout.unanswered_reward` (0.0). Sized so that
SmolLM2-135M-Instruct gets some right before any training (see examples/smol_sums/README.md for the measurement):
learning to call the tool and to add more carefully both carry over to the 400 held-out test questions.

Serve it:  python examples/smol_sums/env.py --port 8002        (binds 127.0.0.1)
Use it:    envs: {sums: {kind: ors, environment: examples/smol_sums/env.py:SumsEnvironment, split: test}}
"""

from __future__ import annotations

import random

from openreward.environments import Environment, JSONObject, TextBlock, ToolOutput, tool
from pydantic import BaseModel

#: Tasks per split; test is held out (no question of it is in train).
SPLIT_SIZES = {"train": 2000, "test": 400}
OPERAND_RANGE = (2, 99)


def _questions() -> dict[str, list[JSONObject]]:
    rng = random.Random(20261201)
    seen: set[tuple[int, str, int]] = set()
    out: dict[str, list[JSONObject]] = {name: [] for name in SPLIT_SIZES}
    for split, size in SPLIT_SIZES.items():
        while len(out[split]) < size:
            a, b = rng.randint(*OPERAND_RANGE), rng.randint(*OPERAND_RANGE)
            op = rng.choice("+-")
            if (a, op, b) in seen:
                continue
            seen.add((a, op, b))
            out[split].append({"a": a, "op": op, "b": b, "answer": a + b if op == "+" else a - b})
    return out


_TASKS = _questions()


class SumsTaskSpec(BaseModel):
    a: int
    op: str
    b: int
    answer: int


class SubmitParams(BaseModel):
    answer: int


class SumsEnvironment(Environment):
    """Answer `a + b` or `a - b` by calling `submit`; reward 1.0 when right.

    Args:
        task_spec: `{"a": int, "op": "+" | "-", "b": int, "answer": int}`.
        secrets: Per-session secrets (unused).
    """

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        self.config = SumsTaskSpec.model_validate(task_spec)

    @classmethod
    def list_splits(cls) -> list[str]:
        return list(SPLIT_SIZES)

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return list(_TASKS[split])

    def get_prompt(self) -> list[TextBlock]:
        c = self.config
        return [TextBlock(type="text", text=f"What is {c.a} {c.op} {c.b}? Answer with the submit tool.")]

    @tool
    async def submit(self, params: SubmitParams) -> ToolOutput:
        """Submit the final integer answer. Ends the episode: reward 1.0 if correct, else 0.0.

        Args:
            answer: The integer result.
        """
        correct = params.answer == self.config.answer
        return ToolOutput(
            blocks=[TextBlock(type="text", text="correct" if correct else "wrong")],
            reward=1.0 if correct else 0.0,
            finished=True,
        )


if __name__ == "__main__":
    from raygrpo.envs.ors_server import main

    main(SumsEnvironment)
