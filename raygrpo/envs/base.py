"""The environment protocol every adapter implements, and the errors adapters raise.

An adapter drives one episode of one task. It is plain asyncio, created and used on one event loop (the env pool
actor's), and must always be closed, even when `start` failed.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from raygrpo.types import Observation, TaskRef, ToolResult


class EnvError(RuntimeError):
    """An infrastructure failure of the environment: the episode cannot go on, and its reward is None.

    Raised when a session or sandbox fails to start, dies mid-episode, or cannot be reached. The orchestrator may
    retry the rollout.
    """


class RewardMissingError(RuntimeError):
    """The episode ran to its end but produced no reward (e.g. a verifier that wrote no reward file).

    The rollout is kept unscored with status `no_reward` and is not retried: the model may have caused it.
    """


@runtime_checkable
class EnvAdapter(Protocol):
    """One episode of one environment.

    `start` opens it and returns the opening messages and the tool schemas; `call` runs one tool call (a refused call
    comes back as a `ToolResult` with `error=True`; a dead environment raises `EnvError`); `score` returns the outcome
    reward (None when nothing was scored; `RewardMissingError` when scoring ran but found no reward; `EnvError` when
    the scorer itself broke); `close` releases everything and never raises.
    """

    async def start(self, task: TaskRef) -> Observation: ...

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult: ...

    async def score(self) -> float | None: ...

    async def close(self) -> None: ...


@runtime_checkable
class EnvProvider(Protocol):
    """Makes adapters for one environment on one event loop.

    Built inside the env pool actor (clients bind to the loop that first uses them), shared by all of that actor's
    rollouts of the environment, and closed when the actor shuts down.
    """

    def adapter(self) -> EnvAdapter: ...

    async def aclose(self) -> None: ...
