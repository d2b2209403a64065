"""Harnesses: the tool surface a Harbor task's sandbox shows the model.

A Harbor task says what to do (`instruction.md`) and how it is graded (`tests/`); it does not say which tools the
model gets. That is the harness: a set of tool schemas in OpenAI function format and an async `call` that runs one
tool call against the task's sandbox (a Harbor `BaseEnvironment`). `bash` is built in; others are loaded by import
path (`"pkg.module:Class"`) or file path (`"path/to/file.py:Class"`), as TRL's `HarborSpec(agent=...)` accepts.

A harness instance serves one episode (it may keep per-episode state) and runs on the env pool actor's event loop.
What it must do with failures:

- a refused call (unknown tool, bad arguments) or a command that timed out: a `ToolResult(error=True)` whose text
  tells the model; the episode goes on;
- a sandbox that is gone (exec raising anything but a timeout): raise `EnvError`; the rollout ends unscored.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from raygrpo.envs.base import EnvError
from raygrpo.core.errors import describe
from raygrpo.core.imports import ImportSpecError, load_object
from raygrpo.core.types import ToolResult

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment

logger = logging.getLogger(__name__)

#: Extra seconds granted on top of a command's own timeout before raygrpo stops waiting for the backend.
EXEC_GRACE_S = 5.0


class SandboxDeadError(EnvError):
    """The sandbox did not answer an exec (it died, or the backend lost it): the episode cannot go on."""


@runtime_checkable
class Harness(Protocol):
    """What the Harbor adapter needs from a harness.

    `tools` are OpenAI function schemas (`{"type": "function", "function": {"name", "description", "parameters"}}`);
    `call` runs one call of one of them in `env` (the adapter refuses unknown tools and non-object arguments before
    `call` sees them). Harness classes are built as
    `cls(exec_timeout_s=..., max_output_chars=...)`, once per episode (subclass `BaseHarness` to get that).
    A harness may also define `async setup(env)`, run once after the sandbox started and before the first turn.
    """

    tools: list[dict[str, Any]]

    async def call(self, env: BaseEnvironment, name: str, arguments: dict[str, Any]) -> ToolResult: ...


class BaseHarness(abc.ABC):
    """Base class of harnesses: holds the limits every harness gets and the shared exec helper.

    Args:
        exec_timeout_s: Deadline of one command in the sandbox; past it the model gets an error message.
        max_output_chars: Tool outputs longer than this are cut (head and tail kept, with a note).
    """

    #: Tool schemas in OpenAI function format.
    tools: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, *, exec_timeout_s: float = 30.0, max_output_chars: int = 8000) -> None:
        self.exec_timeout_s = exec_timeout_s
        self.max_output_chars = max_output_chars

    @abc.abstractmethod
    async def call(self, env: BaseEnvironment, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run the tool `name` with `arguments` in `env`; refused calls come back as error results."""

    async def run_command(self, env: BaseEnvironment, command: str, *, cwd: str | None = None) -> ToolResult:
        """Run `command` in the sandbox under `exec_timeout_s` and describe the outcome for the model.

        The text is stdout, then stderr, then `[exit code N]`, cut to `max_output_chars`. A timeout is an error
        result (the episode goes on). Backends report their own timeouts differently (Docker raises RuntimeError
        "Command timed out", others raise TimeoutError or return late), so an exec that fails at or after its
        deadline counts as a timeout; raygrpo also stops waiting `EXEC_GRACE_S` after the deadline in case a backend
        ignores it. Any other exec failure means the sandbox is gone: `SandboxDeadError`.
        """
        timeout = self.exec_timeout_s
        began = time.monotonic()
        try:
            result = await asyncio.wait_for(
                env.exec(command, cwd=cwd, timeout_sec=max(1, math.ceil(timeout))), timeout + EXEC_GRACE_S
            )
        except (TimeoutError, asyncio.TimeoutError):
            return self._timed_out(command)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - sorted below: a late failure is the backend's timeout
            if time.monotonic() - began >= timeout - 0.05 or "timed out" in str(exc).lower():
                partial = (getattr(exc, "stdout", None) or "") + (getattr(exc, "stderr", None) or "")
                return self._timed_out(command, partial if isinstance(partial, str) else "")
            raise SandboxDeadError(f"the sandbox failed to run a command: {describe(exc)}") from exc
        body = (result.stdout or "") + (result.stderr or "")
        tail = f"[exit code {result.return_code}]"
        body = clip_output(body, self.max_output_chars - len(tail) - 1)
        if body and not body.endswith("\n"):
            body += "\n"
        return ToolResult(text=body + tail)

    def _timed_out(self, command: str, partial: str = "") -> ToolResult:
        shown = command if len(command) <= 200 else command[:200] + "..."
        text = f"Error: the command did not finish within {self.exec_timeout_s:g} s and was stopped: {shown}"
        if partial:
            text += "\nOutput before it was stopped:\n" + clip_output(partial, self.max_output_chars - len(text) - 30)
        return ToolResult(text=text, error=True)


class BashHarness(BaseHarness):
    """One `bash` tool: run a shell command in the sandbox, get stdout + stderr + exit code.

    Each call is a fresh shell in the task's working directory (no state carries over but files). This is the
    harness Harbor's own terminal agents and TRL's `HarborBashEnv` use.
    """

    tools: ClassVar[list[dict[str, Any]]] = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": (
                    "Run a shell command in the task's sandbox and return its stdout, stderr and exit code. Each "
                    "call starts a new shell in the task's working directory; files persist between calls."
                ),
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string", "description": "The shell command to run."}},
                    "required": ["command"],
                },
            },
        }
    ]

    async def call(self, env: BaseEnvironment, name: str, arguments: dict[str, Any]) -> ToolResult:
        command = arguments.get("command")
        extra = sorted(set(arguments) - {"command"})
        if not isinstance(command, str) or not command.strip():
            return ToolResult(text="Error: bash takes one argument, `command`: a non-empty string.", error=True)
        if extra:
            return ToolResult(text=f"Error: bash takes only `command`; unexpected: {', '.join(extra)}.", error=True)
        return await self.run_command(env, command)


#: Built-in harnesses by name.
HARNESSES: dict[str, type] = {"bash": BashHarness}


def clip_output(text: str, limit: int) -> str:
    """Cut `text` to about `limit` characters, keeping its head and tail (errors usually come last)."""
    limit = max(limit, 40)
    if len(text) <= limit:
        return text
    note = f"\n[... {{}} of {len(text)} characters omitted ...]\n"
    room = max(0, limit - len(note.format(len(text))))
    head = room // 2
    tail = room - head
    omitted = len(text) - head - tail
    return text[:head] + note.format(omitted) + (text[-tail:] if tail else "")


def load_harness(spec: str, base_dir: str | None = None) -> type:
    """The harness class a selector names: a built-in name, `"pkg.module:Class"` or `"path/file.py:Class"`.

    Raises:
        ValueError: The selector does not load, or names something that is not a harness class (the message names
            the selector and what is missing).
    """
    if spec in HARNESSES:
        return HARNESSES[spec]
    if ":" not in spec:
        raise ValueError(
            f"unknown harness {spec!r}: use a built-in name ({', '.join(sorted(HARNESSES))}), an import path "
            "'pkg.module:Class' or a file path 'path/to/file.py:Class'"
        )
    try:
        cls = load_object(spec, base_dir=base_dir)
    except ImportSpecError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(cls, type):
        raise ValueError(f"harness {spec!r} must name a class, got {type(cls).__name__}")
    tools = getattr(cls, "tools", None)
    if not callable(getattr(cls, "call", None)) or not isinstance(tools, list):
        raise ValueError(
            f"harness {spec!r} ({cls.__qualname__}) must have a `tools` list of OpenAI function schemas and an "
            "async `call(env, name, arguments)` method (subclass raygrpo.envs.harbor.harness.BaseHarness)"
        )
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"harness {spec!r}: every entry of `tools` must be "
                             "{'type': 'function', 'function': {'name': ..., 'parameters': ...}}")
    return cls
