"""ORS sessions as raygrpo environments: `ORSProvider` (one SDK client per event loop) and `ORSAdapter` (one session).

Built on the openreward SDK's async client. Every SDK call runs under a deadline given from outside, failures are
sorted into "tell the model" (`ToolResult(error=True)`: unknown tool, refused call, bad arguments) and "the session is
dead" (`EnvError`: tool crashed on the server, session gone, server unreachable, deadline passed: a tool call past
`tool_timeout_s` too, since it may still finish the episode on the server), and `close()` always leaves the SDK's
session context so the server deletes the session.

Keepalive: while a session is open the SDK pings it every 10 s. The ping requests run on the SDK's own process-wide
thread and loop (`openreward.api._session.ping.ping_thread`); the session's ping supervisor is a task on the loop that
opened the session. So an adapter only has to be used on one running loop (the env pool actor's); pings go on while
that loop waits on the policy or is busy.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from raygrpo.envs.base import EnvError, refuse_call
from raygrpo.envs.live import LiveAdapter, LiveAdapters
from raygrpo.envs.ors.client import api_key, make_client, sdk_environment
from raygrpo.envs.ors.tools import chat_messages, tool_output_text, tool_schemas
from raygrpo.core.errors import describe, first_line
from raygrpo.specs.ors import ORSSpec
from raygrpo.core.types import Observation, TaskRef, ToolResult

logger = logging.getLogger(__name__)


class ORSSessionError(EnvError):
    """The ORS session failed or died: it cannot go on, and the rollout's reward is None."""


class ORSTimeoutError(ORSSessionError):
    """An ORS request passed its deadline. The session is treated as dead (its state is unknown)."""


class _LoopClient:
    """The SDK client and environment handle of one event loop."""

    def __init__(self, client: Any, env: Any) -> None:
        self.client = client
        self.env = env


class ORSProvider:
    """Opens ORS sessions for one environment on one event loop (the env pool actor's).

    Holds one `AsyncOpenReward` client per event loop, made lazily inside the loop on first use (aiohttp binds to the
    loop that first uses it, so nothing loop-bound is made in `__init__` and nothing but the spec is pickled). Tracks
    its open adapters so `aclose()` can close every session still open (shutdown, cancellation). Its sessions'
    deadlines come from the spec (`start_timeout_s`, `tool_timeout_s`, `close_timeout_s`).

    Args:
        spec: The environment's spec (`url` or `catalog`; an `environment` spec must be served first).
        name: The environment's name in the run config, for error messages.
    """

    def __init__(self, spec: ORSSpec, *, name: str | None = None) -> None:
        if spec.environment is not None:
            raise ValueError(
                f"{spec.field_path(name, 'environment')}: serve {spec.environment!r} first, then build the provider "
                "from spec.served_at(url)"
            )
        # The SDK takes seconds to import: pay for it where the provider is built (an actor's start-up), not in the
        # first rollout.
        import openreward  # noqa: F401

        self.spec = spec
        self.name = name
        self._clients: dict[asyncio.AbstractEventLoop, _LoopClient] = {}
        self._live = LiveAdapters(self.label)
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        # Clients and adapters are loop-bound: a pickled provider carries only its configuration.
        return {"spec": self.spec, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"], name=state["name"])

    # ── EnvProvider ──────────────────────────────────────────────────────────────────────────────────────────────

    def adapter(self) -> ORSAdapter:
        """A new, unstarted adapter (one episode)."""
        if self._closed:
            raise EnvError(f"{self.label}: the ORS provider is closed")
        return ORSAdapter(self)

    async def aclose(self) -> None:
        """Close every session still open, then this loop's SDK client. Never raises; idempotent."""
        self._closed = True
        # Closes still running in the background (their rollouts were cancelled) must reach the server before the
        # client, and with it their connections, goes away.
        await self._live.close_all(self.spec.close_timeout_s, "ORS session(s)")
        loop = asyncio.get_running_loop()
        for other in [lp for lp in self._clients if lp is not loop]:
            if other.is_closed():
                self._clients.pop(other, None)
        state = self._clients.pop(loop, None)
        if state is not None:
            try:
                await asyncio.wait_for(state.client.environments.aclose(), self.spec.close_timeout_s)
            except Exception:  # noqa: BLE001 - closing must not raise
                logger.debug("%s: closing the SDK client failed", self.label, exc_info=True)

    # ── used by adapters ─────────────────────────────────────────────────────────────────────────────────────────

    @property
    def label(self) -> str:
        """How errors name this environment: `envs.<name>.<field> (<url or catalog>)`."""
        where = self.spec.url or self.spec.catalog
        return f"{self.spec.field_path(self.name)} ({where})"

    @property
    def open_sessions(self) -> int:
        """Adapters of this provider that started and are not closed yet."""
        return self._live.open_count()

    def environment(self) -> Any:
        """The SDK `AsyncEnvironment` for the running loop, made on first use. Must be called inside the loop."""
        loop = asyncio.get_running_loop()
        state = self._clients.get(loop)
        if state is None:
            for other in [lp for lp in self._clients if lp.is_closed()]:
                self._clients.pop(other, None)
            if self.spec.catalog is not None and not api_key(self.spec):
                raise ORSSessionError(
                    f"{self.spec.field_path(self.name, 'api_key_env')}: environment variable {self.spec.api_key_env} "
                    f"is not set in this process; the catalog environment {self.spec.catalog!r} needs it"
                )
            client = make_client(self.spec)
            state = _LoopClient(client, sdk_environment(self.spec, client))
            self._clients[loop] = state
            logger.debug("%s: SDK client created for loop %x", self.label, id(loop))
        return state.env

    def session_secrets(self) -> dict[str, Any] | None:
        """The per-session secrets, read from this process's environment variables now.

        Secret names the SDK knows (`OPENAI_API_KEY`, ...) go as plain values; other names go as `(value, [])`
        (the SDK refuses plain values for names it does not know; the domain list only matters to the platform's
        sandbox egress proxy).

        Raises:
            ORSSessionError: A variable is not set (the message names the variable, never a value).
        """
        if not self.spec.secrets:
            return None
        from openreward.api.sandboxes.secrets import WELL_KNOWN_SECRETS

        out: dict[str, Any] = {}
        for secret, var in self.spec.secrets.items():
            value = os.environ.get(var)
            if value is None:
                raise ORSSessionError(
                    f"{self.spec.field_path(self.name, 'secrets')}.{secret}: environment variable {var} is not set in "
                    "this process (set it, or pass it through Ray's runtime_env env_vars)"
                )
            out[secret] = value if secret in WELL_KNOWN_SECRETS else (value, [])
        return out

    def _register(self, adapter: ORSAdapter) -> None:
        if self._closed:
            raise EnvError(f"{self.label}: the ORS provider is closed")
        self._live.add(adapter)


class ORSAdapter(LiveAdapter):
    """One episode of one ORS task: an SDK session opened in `start` and deleted in `close`.

    The model sees the task's messages (`get_messages`, roles kept) and its tools as TRL's integration presents them
    (`raygrpo.envs.ors.tools`); an environment's `@terminal` tool is hidden and receives the model's final plain
    answer (`answer`). `score()` is the episode's reward by the spec's `reward_mode` (by default the reward of the
    call that finished the episode; None when it finished without one, or did not finish). A refused call (unknown
    tool, arguments that fail validation, calls after the episode finished) comes back as `ToolResult(error=True)`
    and the session lives on; a dead session raises `EnvError` (`ORSSessionError`), and so does a call that passes
    `tool_timeout_s` (`ORSTimeoutError`): the server may still be running it, and what it does there (finish the
    episode, with a reward) is out of sight, so the episode cannot be scored.

    Args:
        provider: The provider whose client (and event loop) this adapter uses; the deadlines come from its spec.
    """

    def __init__(self, provider: ORSProvider) -> None:
        super().__init__(provider._live)
        self.provider = provider
        self.spec = provider.spec
        self.task: TaskRef | None = None
        self.tools: list[dict[str, Any]] = []
        self.terminal_tool: Any = None
        self._session: Any = None
        self._rewards: list[float] = []
        self._final: float | None = None
        self._finished = False
        self._dead: str | None = None

    # ── state ─────────────────────────────────────────────────────────────────────────────────────────────────────

    @property
    def sid(self) -> str | None:
        """The server's session id (None before `start` got one)."""
        return getattr(self._session, "sid", None)

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def label(self) -> str:
        task = f" task {self.task.split}[{self.task.index}]" if self.task is not None else ""
        return f"{self.provider.label}{task}"

    # ── EnvAdapter ────────────────────────────────────────────────────────────────────────────────────────────────

    async def start(self, task: TaskRef) -> Observation:
        """Open a session on `task` (its split and index) and return the prompt and the tools the task offers.

        The tools are the session's own list (shared tools plus the task's `shared=False` tools) in OpenAI function
        format. The whole start is bounded by the spec's `start_timeout_s`. On failure the adapter must still be
        closed (`close` is safe after a failed start).

        Raises:
            ORSSessionError: The session could not be opened, or the deadline passed.
        """
        if self._started or self._closed:
            raise ORSSessionError(f"{self.label}: start() may be called once, on a new adapter")
        self._started = True
        self.task = task
        self.provider._register(self)
        try:
            env = self.provider.environment()
            secrets = self.provider.session_secrets()
            self._session = env.session(split=task.split, index=task.index, secrets=secrets)
        except EnvError:
            raise
        except Exception as exc:  # noqa: BLE001 - e.g. the SDK refusing the session arguments
            self._dead = describe(exc)
            raise ORSSessionError(f"{self.label}: cannot open a session: {self._dead}") from None
        timeout = self.spec.start_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await self._sdk(self._session.__aenter__(), "open the session")
                messages, specs, self.terminal_tool = await self._read_session()
        except TimeoutError:
            self._dead = f"the session did not start within start_timeout_s={timeout:g} s"
            raise ORSTimeoutError(f"{self.label}: {self._dead}") from None
        self.tools = tool_schemas(specs)
        logger.debug("%s: session %s open, tools %s", self.label, self.sid, self.tool_names)
        return Observation(messages=chat_messages(messages, self.spec.image_blocks), tools=[dict(t) for t in self.tools])

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one tool call under the spec's `tool_timeout_s`.

        Unknown tools and non-object arguments are refused here without a request; the server's refusals
        (`ToolCallError`: argument validation, episode already finished) come back as error results too.

        Raises:
            ORSSessionError: The session is dead: the tool raised on the server (`ToolFailed`), the session is gone
                (`SessionTerminatedError`, HTTP 404/410), or the connection failed.
            ORSTimeoutError: The call passed `tool_timeout_s`; the session is dead from then on.
        """
        if self._closed:
            raise ORSSessionError(f"{self.label}: call() after close()")
        if not self._started or self._session is None:
            raise ORSSessionError(f"{self.label}: call() before start()")
        if self._dead is not None:
            raise ORSSessionError(f"{self.label}: the session is dead ({self._dead})")
        refused = refuse_call(name, arguments, self.tool_names)
        if refused is not None:
            return refused
        return await self._step(self._session.call_tool(name, arguments), name)

    async def answer(self, text: str) -> ToolResult | None:
        """Route the model's final plain answer to the environment's `@terminal` tool, if it has one; its reward and
        `finished` are the episode's. None when the environment has no terminal tool (the answer just ends the
        episode).

        Raises:
            ORSSessionError: As `call` (`ORSTimeoutError`: the judge behind the terminal tool passed `tool_timeout_s`).
        """
        if self.terminal_tool is None or self._session is None or self._dead is not None:
            return None
        return await self._step(self._session.call_terminal_tool(text), self.terminal_tool.name)

    async def _step(self, call: Any, name: str) -> ToolResult:
        """Await one tool call under `tool_timeout_s` and record its reward.

        A call past its deadline ends the session: the server may go on with it (a judge grades, the episode
        finishes), so neither a result nor a reward of this session can be told apart from what it did unseen."""
        from openreward.api.errors import ToolCallError

        timeout = self.spec.tool_timeout_s
        try:
            async with asyncio.timeout(timeout):
                out = await self._sdk(call, f"call {name!r}", passthrough=(ToolCallError,))
        except ToolCallError as exc:
            return ToolResult(text=f"Error: {exc.detail}", error=True)
        except TimeoutError:
            self._dead = (f"tool {name!r} did not answer within tool_timeout_s={timeout:g} s; what it did on the server "
                          "is unknown, so the episode cannot be scored (raise tool_timeout_s for a slow tool)")
            raise ORSTimeoutError(f"{self.label}: {self._dead}") from None
        reward = None if out.reward is None else float(out.reward)
        if reward is not None:
            self._rewards.append(reward)
        if out.finished and not self._finished:
            self._finished, self._final = True, reward
        metadata = out.metadata if isinstance(out.metadata, dict) else None
        return ToolResult(text=tool_output_text(out.blocks, self.spec.image_blocks), reward=reward,
                          finished=bool(out.finished), metadata=metadata)

    async def score(self) -> float | None:
        """The episode's reward by `reward_mode`: `final`, the reward of the call that finished the episode (None if
        it gave none, or nothing finished it); `sum`, every reward given added up; `last`, the last one given (None
        when no call gave one)."""
        if self.spec.reward_mode == "final":
            return self._final
        if not self._rewards:
            return None
        return sum(self._rewards) if self.spec.reward_mode == "sum" else self._rewards[-1]

    def _holds_resources(self) -> bool:
        return self._session is not None

    async def _release(self) -> None:
        """Leave the session context so the server deletes the session (bounded by `close_timeout_s`)."""
        session = self._session
        try:
            await asyncio.wait_for(session.__aexit__(None, None, None), self.spec.close_timeout_s)
            logger.debug("%s: session %s closed", self.label, session.sid)
        except TimeoutError:
            logger.warning("%s: closing session %s took over %g s; the server reaps it when idle",
                           self.label, session.sid, self.spec.close_timeout_s)
        except Exception as exc:  # noqa: BLE001 - close never raises
            logger.warning("%s: closing session %s failed: %s", self.label, session.sid, describe(exc))

    async def _read_session(self) -> tuple[Any, Any, Any]:
        """The new session's prompt, tools and terminal tool, read at once: one round trip instead of three, which is
        most of a session's start on a busy server. The first failure cancels the other reads and is raised alone."""
        try:
            async with asyncio.TaskGroup() as group:
                reads = [group.create_task(self._sdk(self._session.get_messages(), "fetch the prompt")),
                         group.create_task(self._sdk(self._session.list_tools(), "list the tools")),
                         group.create_task(self._sdk(self._session.terminal_tool(), "find the terminal tool"))]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return tuple(read.result() for read in reads)  # type: ignore[return-value]

    async def _sdk(self, aw: Any, what: str, passthrough: tuple[type, ...] = ()) -> Any:
        """Await one SDK call; any failure marks the session dead and raises `ORSSessionError`. The caller's deadline
        (`asyncio.timeout`) cancels the call, and a cancellation passes through."""
        import aiohttp
        from openreward.api.errors import SessionTerminatedError, ToolFailed

        try:
            return await aw
        except (*passthrough, asyncio.CancelledError):
            raise
        except ToolFailed as exc:
            reason = f"{what} failed on the server: {first_line(exc.message)}"
        except SessionTerminatedError as exc:
            reason = f"the session was terminated ({first_line(exc.reason)})"
        except aiohttp.ClientResponseError as exc:
            if exc.status in (404, 410):
                reason = f"the session is gone on the server (HTTP {exc.status} on {what}: {first_line(exc.message)})"
            else:
                reason = f"HTTP {exc.status} on {what}: {first_line(exc.message)}"
        except Exception as exc:  # noqa: BLE001 - transport errors of every kind end the session
            reason = f"cannot {what}: {describe(exc)}"
        self._dead = reason
        raise ORSSessionError(f"{self.label}: {reason}")
