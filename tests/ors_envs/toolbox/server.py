"""An ORS server written only against the openreward SDK, as `orwd init` lays one out (`python server.py PORT`).

Three environments, served by the SDK's own `Server` in a process of their own:

- `toolboxenvironment`: twelve tools of many parameter shapes (integers, floats with defaults, strings, booleans,
  arrays, an enum, an object, none), an intermediate reward (`bonus`, +0.1), a rewarded finishing tool (`submit`), an
  early finishing tool without a reward (`quit`), large unicode output (`poem`), an image block (`picture`), a
  task-specific tool on task 2 only (`peek`), and custom splits (`train`, `holdout`);
- `terminalenvironment`: a `@terminal` tool (`grade`) that scores the model's final plain answer;
- `conversationenvironment`: a prompt with several roles, from `get_messages` only.
"""

from __future__ import annotations

import sys
from typing import Literal

from openreward.environments import (
    Environment,
    ImageBlock,
    JSONObject,
    ListToolsOutput,
    Message,
    Server,
    TextBlock,
    ToolOutput,
    ToolSpec,
    terminal,
    tool,
)
from pydantic import BaseModel, Field

TASKS = {
    "train": [{"id": i, "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)],
    "holdout": [{"id": 10 + i, "question": f"What is {10 + i} + {10 + i}?", "answer": str(2 * (10 + i))}
                for i in range(2)],
}
# A 1x1 transparent PNG.
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="


class AddParams(BaseModel):
    a: int
    b: int


class ScaleParams(BaseModel):
    x: float = Field(description="The number to scale.")
    factor: float = 2.0


class ShoutParams(BaseModel):
    text: str
    times: int = 1


class FlagParams(BaseModel):
    enabled: bool


class TotalParams(BaseModel):
    values: list[float]


class LookupParams(BaseModel):
    key: Literal["a", "b", "c"]


class SettingsParams(BaseModel):
    settings: dict[str, str]


class SubmitParams(BaseModel):
    answer: str


class ToolboxEnvironment(Environment):
    """Questions answered with `submit`, and every kind of tool beside it."""

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        self.task = dict(task_spec)

    @classmethod
    def list_splits(cls) -> list[str]:
        return list(TASKS)

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return TASKS[split]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.task["question"]), TextBlock(text="Answer with submit.")]

    def list_task_tools(self) -> ListToolsOutput:
        if self.task["id"] != 2:
            return ListToolsOutput(tools=[])
        return ListToolsOutput(tools=[ToolSpec(name="peek", description="Show this task's answer.", input_schema=None)])

    @tool
    async def add(self, params: AddParams) -> ToolOutput:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return ToolOutput(blocks=[TextBlock(text=str(params.a + params.b))])

    @tool
    async def scale(self, params: ScaleParams) -> ToolOutput:
        """Multiply a number by a factor."""
        return ToolOutput(blocks=[TextBlock(text=str(params.x * params.factor))])

    @tool
    async def shout(self, params: ShoutParams) -> ToolOutput:
        """Repeat a text in capitals."""
        return ToolOutput(blocks=[TextBlock(text=" ".join([params.text.upper()] * params.times))])

    @tool
    async def flag(self, params: FlagParams) -> ToolOutput:
        """Turn a flag on or off."""
        return ToolOutput(blocks=[TextBlock(text="on" if params.enabled else "off")])

    @tool
    async def total(self, params: TotalParams) -> ToolOutput:
        """Sum a list of numbers."""
        return ToolOutput(blocks=[TextBlock(text=str(sum(params.values)))])

    @tool
    async def lookup(self, params: LookupParams) -> ToolOutput:
        """Look a key up."""
        return ToolOutput(blocks=[TextBlock(text={"a": "1", "b": "2", "c": "3"}[params.key])])

    @tool
    async def configure(self, params: SettingsParams) -> ToolOutput:
        """Apply settings."""
        return ToolOutput(blocks=[TextBlock(text=f"{len(params.settings)} settings")])

    @tool
    async def bonus(self) -> ToolOutput:
        """Claim a small bonus (the episode goes on)."""
        return ToolOutput(blocks=[TextBlock(text="bonus claimed")], reward=0.1, metadata={"bonus": 1})

    @tool
    async def submit(self, params: SubmitParams) -> ToolOutput:
        """Submit the answer. Ends the episode: 1.0 if right, else 0.0."""
        right = params.answer.strip() == self.task["answer"]
        return ToolOutput(blocks=[TextBlock(text="right" if right else "wrong")], reward=1.0 if right else 0.0,
                          finished=True, metadata={"expected": self.task["answer"]})

    @tool
    async def quit(self) -> ToolOutput:
        """Give up: the episode ends without a reward."""
        return ToolOutput(blocks=[TextBlock(text="bye")], finished=True)

    @tool
    async def poem(self) -> ToolOutput:
        """A long poem."""
        return ToolOutput(blocks=[TextBlock(text="Ünïcödé wörld 🌍 — 日本語の詩。\n" * 2000)])

    @tool
    async def picture(self) -> ToolOutput:
        """A picture and its caption."""
        return ToolOutput(blocks=[ImageBlock(data=PIXEL, mimeType="image/png"), TextBlock(text="a pixel")])

    @tool(shared=False)
    async def peek(self) -> ToolOutput:
        """Show this task's answer."""
        return ToolOutput(blocks=[TextBlock(text=self.task["answer"])])


class GradeParams(BaseModel):
    answer: str


class TerminalEnvironment(Environment):
    """Questions answered in plain text: the `@terminal` tool grades the model's final message."""

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        self.task = dict(task_spec)

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return TASKS["train"]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.task["question"] + " Reply with the number only.")]

    @tool
    async def hint(self) -> ToolOutput:
        """A hint."""
        return ToolOutput(blocks=[TextBlock(text="Add the number to itself.")])

    @terminal
    @tool
    async def grade(self, params: GradeParams) -> ToolOutput:
        """Grade the final answer."""
        right = params.answer.strip() == self.task["answer"]
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=1.0 if right else 0.0, finished=True)


class ConversationEnvironment(Environment):
    """A dialogue to continue: its prompt has several roles (`get_messages` only)."""

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        self.task = dict(task_spec)

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return TASKS["train"]

    def get_messages(self) -> list[Message]:
        return [
            Message(role="system", blocks=[TextBlock(text="You are a calculator.")]),
            Message(role="user", blocks=[TextBlock(text="What is 1 + 1?")]),
            Message(role="assistant", blocks=[TextBlock(text="2")]),
            Message(role="user", blocks=[TextBlock(text=self.task["question"])]),
        ]

    @tool
    async def submit(self, params: SubmitParams) -> ToolOutput:
        """Submit the answer."""
        right = params.answer.strip() == self.task["answer"]
        return ToolOutput(blocks=[TextBlock(text="done")], reward=1.0 if right else 0.0, finished=True)


if __name__ == "__main__":
    Server([ToolboxEnvironment, TerminalEnvironment, ConversationEnvironment]).run(host="127.0.0.1",
                                                                                  port=int(sys.argv[1]))
