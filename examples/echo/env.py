"""Echo: the smallest useful ORS environment (the one in TRL's OpenReward guide, with more tasks).

Each task has a `target` string; the model wins by calling `echo(text=<target>)`. Any echo ends the episode:
reward 1.0 when the text matches, 0.0 otherwise. Not calling `echo` at all gives no reward from the environment:
raygrpo ends such a rollout `no_answer`, scored `rollout.unanswered_reward` (0.0 by default).

Serve it:  python examples/echo/env.py --port 8000        (binds 127.0.0.1)
Use it:    envs: {echo: {kind: ors, environment: examples/echo/env.py:EchoEnvironment}}
       or  envs: {echo: {kind: ors, url: http://127.0.0.1:8000}}
"""

from __future__ import annotations

from openreward.environments import Environment, JSONObject, TextBlock, ToolOutput, tool
from pydantic import BaseModel

#: The train split's targets (words the tiny test tokenizer knows).
TRAIN_TARGETS = ["hello", "world", "hello world", "yes", "done", "the answer", "ok", "think step"]
#: A small held-out split.
TEST_TARGETS = ["echo", "repeat this"]


class EchoTaskSpec(BaseModel):
    target: str


class EchoParams(BaseModel):
    text: str


class EchoEnvironment(Environment):
    """Echo the task's target string to win.

    Args:
        task_spec: `{"target": str}`.
        secrets: Per-session secrets (unused).
    """

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        self.config = EchoTaskSpec.model_validate(task_spec)

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        targets = TRAIN_TARGETS if split == "train" else TEST_TARGETS
        return [{"target": t} for t in targets]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(type="text", text=f"Echo '{self.config.target}' to win. Call the echo tool with it.")]

    @tool
    async def echo(self, params: EchoParams) -> ToolOutput:
        """Submit a string. Reward 1.0 if it matches the target, else 0.0; either way the episode ends.

        Args:
            text: The string to echo back.
        """
        correct = params.text == self.config.target
        return ToolOutput(
            blocks=[TextBlock(type="text", text="match" if correct else "no match")],
            reward=1.0 if correct else 0.0,
            finished=True,
        )


if __name__ == "__main__":
    from raygrpo.envs.ors.server import main

    main(EchoEnvironment)
