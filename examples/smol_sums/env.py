"""Sums: arithmetic word problems answered through a tool, generated locally, with a large held-out split.

Each task asks for `a + b` or `a - b` (operands 10 to 99, seeded; train and test never share a question:
`tasks.py`). The model
must answer by calling `submit(answer)`: reward 1.0 when the integer is right, 0.0 when it is wrong, and the episode
ends. Answering in plain text without the tool scores `rollout.unanswered_reward` (0.0). Sized so that
SmolLM2-135M-Instruct, once warmed up on the format, gets some right (docs/models.md measures it: 0.156 of 32):
learning to call the tool and to add more carefully both carry over to the 400 held-out test questions.

Serve it:  python examples/smol_sums/env.py --port 8002        (binds 127.0.0.1)
Use it:    envs: {sums: {kind: ors, environment: examples/smol_sums/env.py:SumsEnvironment, split: test}}
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from openreward.environments import Environment, JSONObject, TextBlock, ToolOutput, tool
from pydantic import BaseModel



def _sibling(name: str):
    """Load `<name>.py` beside this file under a unique module name (the env file is loaded by path)."""
    module_name = f"raygrpo_examples_smol_sums_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, Path(__file__).with_name(f"{name}.py"))
        sys.modules[module_name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[module_name]


_tasks = _sibling("tasks")
SPLIT_SIZES, prompt_text, questions, reward = _tasks.SPLIT_SIZES, _tasks.prompt_text, _tasks.questions, _tasks.reward

_TASKS = questions()


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
        return [TextBlock(type="text", text=prompt_text(c.a, c.op, c.b))]

    @tool
    async def submit(self, params: SubmitParams) -> ToolOutput:
        """Submit the final integer answer. Ends the episode: reward 1.0 if correct, else 0.0.

        Args:
            answer: The integer result.
        """
        value = reward(self.config.model_dump(), params.answer)
        return ToolOutput(
            blocks=[TextBlock(type="text", text="correct" if value else "wrong")],
            reward=value,
            finished=True,
        )


if __name__ == "__main__":
    from raygrpo.envs.ors.server import main

    main(SumsEnvironment)
