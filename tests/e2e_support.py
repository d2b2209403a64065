"""Environments and scripted policies for the end-to-end rollout tests.

The environments are real ORS environments served by a real server in the test process, so their class-level
counters are the server's own view. The scripts are loaded by file path inside the env pool actors.
"""

from __future__ import annotations

import itertools
import threading

from openreward.environments import Environment, JSONObject, TextBlock, ToolOutput, tool
from pydantic import BaseModel

from raygrpo.policy.base import GenerationContext
from raygrpo.agent.toolcalls import format_tool_call

NUM_TASKS = 4


class FlakyEnvironment(Environment):
    """The server deletes the first session of each task mid-episode (as its idle reaper would), so the next call
    finds the session gone; later sessions of the task answer with reward 1.0."""

    sessions_by_task: dict[int, int] = {}
    _lock = threading.Lock()

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        with type(self)._lock:
            n = int(task_spec["n"])
            type(self).sessions_by_task[n] = type(self).sessions_by_task.get(n, 0) + 1
            self.session_number = type(self).sessions_by_task[n]

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"n": i} for i in range(NUM_TASKS)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Call answer.")]

    @tool
    async def answer(self) -> ToolOutput:
        """Answer; the first session of a task is deleted by the server here."""
        if self.session_number == 1:
            from tests.ors_utils import delete_own_session

            await delete_own_session(self)
            return ToolOutput(blocks=[TextBlock(text="try again")])
        return ToolOutput(blocks=[TextBlock(text="right")], reward=1.0, finished=True)


class NapParams(BaseModel):
    seconds: float


class NapEnvironment(Environment):
    """`nap(seconds)` sleeps on the server, then ends the episode with reward 1.0. Records the peaks of sessions
    alive and of naps in progress, as the server sees them."""

    lock = threading.Lock()
    live = 0
    peak_live = 0
    napping = 0
    peak_napping = 0
    created = 0

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        cls = type(self)
        with cls.lock:
            cls.created += 1
            cls.live += 1
            cls.peak_live = max(cls.peak_live, cls.live)
        self._down = False

    def teardown(self) -> None:
        cls = type(self)
        with cls.lock:
            if not self._down:
                self._down = True
                cls.live -= 1

    @classmethod
    def reset_counters(cls) -> None:
        with cls.lock:
            cls.live = cls.peak_live = cls.napping = cls.peak_napping = cls.created = 0

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"n": i} for i in range(64)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Take a nap.")]

    @tool
    async def nap(self, params: NapParams) -> ToolOutput:
        """Sleep on the server, then finish with reward 1.0.

        Args:
            seconds: How long to sleep.
        """
        import asyncio

        cls = type(self)
        with cls.lock:
            cls.napping += 1
            cls.peak_napping = max(cls.peak_napping, cls.napping)
        try:
            await asyncio.sleep(params.seconds)
        finally:
            with cls.lock:
                cls.napping -= 1
        return ToolOutput(blocks=[TextBlock(text="rested")], reward=1.0, finished=True)


def _called(ctx: GenerationContext) -> bool:
    return any(m.get("role") == "tool" for m in ctx.messages)


def call_answer(ctx: GenerationContext) -> str:
    """Call `answer` until it says "right"."""
    done = any(m.get("role") == "tool" and m.get("content") == "right" for m in ctx.messages)
    return "Done." if done else format_tool_call("answer", {})


def nap_half_second(ctx: GenerationContext) -> str:
    return "Done." if _called(ctx) else format_tool_call("nap", {"seconds": 0.5})


def nap_one_and_a_half_seconds(ctx: GenerationContext) -> str:
    return "Done." if _called(ctx) else format_tool_call("nap", {"seconds": 1.5})


def nap_long(ctx: GenerationContext) -> str:
    return "Done." if _called(ctx) else format_tool_call("nap", {"seconds": 30})


_first_turns = itertools.count()


def nap_every_other(ctx: GenerationContext) -> str:
    """First turns alternate between a brief nap and a minute's: of a group of 2 sent together, one rollout finishes
    at once while the other is still running when a test interrupts."""
    if _called(ctx):
        return "Done."
    return format_tool_call("nap", {"seconds": 60 if next(_first_turns) % 2 else 0.1})


def nap_by_task(ctx: GenerationContext) -> str:
    """Tasks 0-3 nap briefly; the others nap for a minute (they are still running when a test interrupts)."""
    seconds = 0.1 if int(ctx.task.metadata.get("n", 0)) < 4 else 60
    return "Done." if _called(ctx) else format_tool_call("nap", {"seconds": seconds})


def broken(ctx: GenerationContext) -> str:
    """A policy script with a bug: it fails the same way on every call."""
    raise ValueError("no answer today")


def call_check(ctx: GenerationContext) -> str:
    return "Done." if _called(ctx) else format_tool_call("check", {})


def bash_sleep(ctx: GenerationContext) -> str:
    """Start a background sleep and a foreground one in the sandbox (a rollout that is still busy when stopped)."""
    return "Done." if _called(ctx) else format_tool_call("bash", {"command": "sleep 300 & sleep 300"})
