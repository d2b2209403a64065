"""Helpers for ORS tests: servers on free loopback ports, environments that misbehave on purpose, a tiny episode loop.

The environments here are real `openreward.environments.Environment` subclasses served by a real server; their
class-level counters are updated on the server side (the server runs in a thread of the test process).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from openreward.environments import (
    Environment,
    ImageBlock,
    JSONObject,
    ListToolsOutput,
    Message,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolOutput,
    ToolResultBlock,
    ToolSpec,
    terminal,
    tool,
)
from pydantic import BaseModel, Field

from raygrpo.envs.ors.server import RunningORSServer, serve_environments
from raygrpo.policy.base import GenerationContext
from raygrpo.agent.toolcalls import ToolCallProblem, parse_tool_calls
from raygrpo.core.types import TaskRef, ToolResult

#: The repository root; the example environments by absolute file path (as a loaded config holds them).
REPO = Path(__file__).resolve().parent.parent
ECHO = f"{REPO}/examples/echo/env.py:EchoEnvironment"
ARITH = f"{REPO}/examples/arith/env.py:ArithEnvironment"

#: Servers started by `ors_server`, so `KillableEnvironment` can find its own session in their registries.
_SERVERS: list[RunningORSServer] = []


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ors_server(environments: Any, **kwargs: Any) -> Iterator[RunningORSServer]:
    """Serve `environments` on a free 127.0.0.1 port for the duration of the block; always stopped afterwards."""
    running = serve_environments(environments, host="127.0.0.1", port=0, **kwargs)
    _SERVERS.append(running)
    try:
        yield running
    finally:
        running.stop()
        _SERVERS.remove(running)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    """Poll `predicate` until it is true or `timeout_s` passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


async def delete_own_session(env: Environment) -> None:
    """Delete `env`'s session from the test server that holds it, the way the server's idle reaper does."""
    from openreward.environments.server import _delete_session

    for running in _SERVERS:
        srv = running.server
        for sid, live in list(srv._active_envs.items()):
            if live is env:
                await _delete_session(sid, srv._active_envs, srv._active_toolsets, srv._last_ping,
                                      srv._setup_tasks, srv._ready, srv._setup_errors)
                return
    raise RuntimeError(f"{type(env).__name__}: own session not found in any test server")


# ── environments ─────────────────────────────────────────────────────────────────────────────────────────────────


class _Counter:
    """A thread-safe gauge with a high-water mark."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0
        self.peak = 0

    def add(self, delta: int) -> None:
        with self._lock:
            self.value += delta
            self.peak = max(self.peak, self.value)

    def reset(self) -> None:
        with self._lock:
            self.value = 0
            self.peak = 0


class SleepParams(BaseModel):
    seconds: float
    until_napping: int = 0


class SleepEnvironment(Environment):
    """`nap(seconds, until_napping=0)` sleeps on the server, then finishes the episode with reward 1.0.

    With `until_napping`, a nap ends early once that many naps are under way at once (a barrier bounded by
    `seconds`), so a test of concurrency does not depend on how fast a loaded machine starts the sessions.

    Class attributes `live` (sessions constructed and not torn down) and `napping` (calls inside `nap`) record their
    peaks on the server side.
    """

    live = _Counter()
    napping = _Counter()

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        type(self).live.add(1)
        self._torn_down = False

    def teardown(self) -> None:
        if not self._torn_down:
            self._torn_down = True
            type(self).live.add(-1)

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"n": i} for i in range(4)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Take a nap.")]

    @tool
    async def nap(self, params: SleepParams) -> ToolOutput:
        """Sleep `seconds` on the server, then end the episode with reward 1.0."""
        napping = type(self).napping
        napping.add(1)
        try:
            deadline = asyncio.get_running_loop().time() + params.seconds
            while asyncio.get_running_loop().time() < deadline:
                if params.until_napping and napping.peak >= params.until_napping:
                    break
                await asyncio.sleep(min(0.05, max(0.0, deadline - asyncio.get_running_loop().time())))
        finally:
            type(self).napping.add(-1)
        return ToolOutput(blocks=[TextBlock(text=f"slept {params.seconds}")], reward=1.0, finished=True)


class KillableEnvironment(Environment):
    """A session that dies mid-episode: `vanish` deletes it from the server's registry, `explode` raises."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"n": 0}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Do not vanish.")]

    @tool
    async def poke(self) -> ToolOutput:
        """A harmless call that scores 0.5."""
        return ToolOutput(blocks=[TextBlock(text="ouch")], reward=0.5)

    @tool
    async def vanish(self) -> ToolOutput:
        """Delete this session on the server (the way the idle reaper would); later calls find it gone."""
        await delete_own_session(self)
        return ToolOutput(blocks=[TextBlock(text="gone")])

    @tool
    async def explode(self) -> ToolOutput:
        """Raise inside the tool: the server reports a tool failure and the SDK treats the session as dead."""
        raise RuntimeError("boom")


class SecretEnvironment(Environment):
    """Records the secrets each session receives (server side) in `received`; never shows them."""

    received: list[dict[str, str]] = []

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        type(self).received.append(dict(secrets))

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"n": 0}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Check the secret.")]

    @tool
    async def check(self) -> ToolOutput:
        """Say whether a secret named probe_token arrived (never its value); reward 1.0 when it did."""
        ok = bool(type(self).received) and "probe_token" in type(self).received[-1]
        return ToolOutput(blocks=[TextBlock(text="present" if ok else "absent")], reward=1.0 if ok else 0.0,
                          finished=True)


class EmptySplitEnvironment(Environment):
    """Split `train` has no tasks (a dataset that failed to load, say); split `dev` has one."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "dev"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"n": 0}] if split == "dev" else []

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Nothing to do.")]

    @tool
    async def done(self) -> ToolOutput:
        """End the episode."""
        return ToolOutput(blocks=[TextBlock(text="done")], reward=1.0, finished=True)


class FinalAnswer(BaseModel):
    answer: str


class SlowJudgeEnvironment(Environment):
    """Answers graded by a judge that takes `judge_s` seconds (task 0: 1.5 s): the model's plain answer through the
    `@terminal` tool `grade`, or a call to `submit`. Either finishes the episode, 1.0 for "Paris"."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"judge_s": 1.5}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="What is the capital of France?")]

    async def _judge(self, answer: str) -> ToolOutput:
        await asyncio.sleep(float(self.task_spec["judge_s"]))
        reward = float("paris" in answer.lower())
        return ToolOutput(blocks=[TextBlock(text="graded")], reward=reward, finished=True)

    @terminal
    @tool
    async def grade(self, params: FinalAnswer) -> ToolOutput:
        """Grade the final answer."""
        return await self._judge(params.answer)

    @tool
    async def submit(self, params: FinalAnswer) -> ToolOutput:
        """Submit the answer."""
        return await self._judge(params.answer)


#: A 1x1 PNG.
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="


class Measure(BaseModel):
    value: int


class RichConversationEnvironment(Environment):
    """A conversation-shaped prompt (`get_messages` only) with every kind of block: text, an image, an assistant's
    reasoning and tool call, and a user turn holding that call's result (an error, then a success). Its tool
    `screenshot` gives only an image."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"n": 3}]

    def get_messages(self) -> list[Message]:
        return [
            Message(role="system", blocks=[TextBlock(text="You measure things.")]),
            Message(role="user", blocks=[TextBlock(text="Look at this:"), ImageBlock(data=PIXEL, mimeType="image/png"),
                                         TextBlock(text="How long is it?")]),
            Message(role="assistant", blocks=[ReasoningBlock(text="I should measure it."),
                                              ToolCallBlock(id="c1", name="measure", input={"value": 1})]),
            Message(role="user", blocks=[ToolResultBlock(tool_call_id="c1", blocks=[TextBlock(text="1 is wrong")],
                                                         is_error=True),
                                         ToolResultBlock(tool_call_id="c1", blocks=[TextBlock(text="noted")]),
                                         TextBlock(text="Try again.")]),
        ]

    @tool
    async def measure(self, params: Measure) -> ToolOutput:
        """Report a length."""
        right = params.value == self.task_spec["n"]
        return ToolOutput(blocks=[TextBlock(text="right" if right else "wrong")], reward=float(right), finished=True)

    @tool
    async def screenshot(self) -> ToolOutput:
        """Take a screenshot."""
        return ToolOutput(blocks=[ImageBlock(data=PIXEL, mimeType="image/png")])


class Move(BaseModel):
    source: str = Field(alias="from", description="Where the piece is.")
    to: str = Field(description="Where it goes.")


class QuirkyToolsEnvironment(Environment):
    """Tools named as Python does not allow, as other languages' servers (and pydantic aliases) write them: a
    parameter named `from` (`move`), a task tool named `submit-answer`."""

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        setattr(self, "submit-answer", self.submit_answer)  # the SDK finds a tool by getattr(env, name)

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"answer": "42"}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Move from a to b, then submit 42.")]

    def list_task_tools(self) -> ListToolsOutput:
        return ListToolsOutput(tools=[ToolSpec(name="submit-answer", description="Submit the answer.",
                                               input_schema=FinalAnswer.model_json_schema())])

    @tool
    async def move(self, params: Move) -> ToolOutput:
        """Move a piece."""
        return ToolOutput(blocks=[TextBlock(text=f"moved {params.source} to {params.to}")])

    @tool(shared=False)
    async def submit_answer(self, params: FinalAnswer) -> ToolOutput:
        """Submit the answer (listed as `submit-answer`)."""
        right = params.answer.strip() == self.task_spec["answer"]
        return ToolOutput(blocks=[TextBlock(text="right" if right else "wrong")], reward=float(right), finished=True)


# ── a minimal episode loop (the real agent loop lives in raygrpo.agent.rollout) ────────────────────────────────────────


async def run_episode(
    adapter: Any,
    task: TaskRef,
    policy: Callable[[GenerationContext], str],
    *,
    max_turns: int = 10,
    pause: Callable[[int], Any] | None = None,
) -> tuple[float | None, list[dict[str, Any]], list[ToolResult]]:
    """Drive one episode with a scripted policy: start, then text → tool calls → results until the episode finishes,
    the policy stops calling tools, or `max_turns`. `pause(turn)` (async) runs after each turn's tool calls.
    Returns `(score, messages, tool results)`. The caller closes the adapter.
    """
    observation = await adapter.start(task)
    messages: list[dict[str, Any]] = list(observation.messages)
    results: list[ToolResult] = []
    for turn in range(max_turns):
        text = policy(GenerationContext(task=task, messages=list(messages), turn=turn))
        content, calls = parse_tool_calls(text)
        good = [c for c in calls if not isinstance(c, ToolCallProblem)]
        messages.append({
            "role": "assistant",
            "content": content,
            "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                           for c in good],
        })
        if not calls:
            break
        finished = False
        for call in calls:
            if isinstance(call, ToolCallProblem):
                messages.append({"role": "tool", "name": "", "content": call.message})
                continue
            result = await adapter.call(call.name, call.arguments)
            results.append(result)
            messages.append({"role": "tool", "name": call.name, "content": result.text})
            finished = finished or result.finished
        if finished:
            break
        if pause is not None:
            await pause(turn)
    return await adapter.score(), messages, results
