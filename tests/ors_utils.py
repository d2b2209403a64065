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

from openreward.environments import Environment, JSONObject, TextBlock, ToolOutput, tool
from pydantic import BaseModel

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
