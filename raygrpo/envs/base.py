"""The environment protocol every adapter implements, and the check every tool call goes through first.

An adapter drives one episode of one task. It is plain asyncio, created and used on one event loop (the env pool
actor's), and must always be closed, even when `start` failed. A provider makes the adapters of one environment on
one loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from raygrpo.core.errors import EnvError, RewardMissingError, TaskError
from raygrpo.core.types import Observation, TaskRef, ToolResult

__all__ = ["EnvAdapter", "EnvError", "EnvProvider", "ModelTimedCalls", "RewardMissingError", "SolutionRunner",
           "SteppedAdapter", "TaskError", "refuse_call"]


@runtime_checkable
class EnvAdapter(Protocol):
    """One episode of one environment.

    `start` opens it and returns the opening messages and the tool schemas; `call` runs one tool call (a refused call
    comes back as a `ToolResult` with `error=True`; a dead environment raises `EnvError`); `answer` (optional) takes
    the model's final plain answer, for environments that score it (an ORS `@terminal` tool), and returns None where
    the answer only ends the episode; `score` returns the outcome
    reward (None when nothing was scored; `RewardMissingError` when scoring ran but found no reward; `EnvError` when
    the scorer itself broke); a task that is broken (an image that does not build) raises `TaskError`; `close` releases everything and never raises. The adapter owns the deadlines of its own
    operations (start, each call, scoring, close), each set on the environment's spec.
    """

    async def start(self, task: TaskRef) -> Observation: ...

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult: ...

    async def answer(self, text: str) -> ToolResult | None: ...

    async def score(self) -> float | None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SolutionRunner(Protocol):
    """An adapter whose tasks ship a reference solution it can run in the episode's environment (Harbor's
    `solution/solve.sh`): what the oracle policy calls instead of writing turns.

    `run_solution` runs it once, after `start` and before `score`, and returns a `ToolResult` (finished) whose
    metadata holds `exit_code` and `output_tail`; a non-zero exit code is a result, not an error (the verifier
    judges). It raises `TaskError` when the task has no solution to run, `TimeoutError` when the solution runs past
    its deadline, and `EnvError` when the environment failed to run it.
    """

    async def run_solution(self) -> ToolResult: ...


@runtime_checkable
class SteppedAdapter(Protocol):
    """An adapter whose episode may hold several steps in one environment (a Harbor multi-step task): each step
    opens with a new user turn and is scored on its own; the episode's reward comes from its steps' rewards.

    `multi_step` says whether this episode has steps (read after `start`); `score` then scores the current step;
    `next_step` (after `score`) returns the next step's opening messages, or None when the episode is over (its last
    step was scored, or a step's reward ended it early), and raises `EnvError` or `TaskError` when the environment
    cannot be prepared for the step; `episode_reward` is the episode's reward once it is over.
    """

    multi_step: bool

    async def next_step(self) -> Observation | None: ...

    def episode_reward(self) -> float | None: ...


@runtime_checkable
class AgentDeadline(Protocol):
    """An adapter whose task bounds the model's turns itself (Harbor's `[agent] timeout_sec`).

    `agent_timeout_s` is read after `start` and after each `next_step`: seconds the model's turns of the current
    step may take before they are stopped and the step is verified, or None for no bound of its own
    (`raygrpo.agent.limits.agent_phase`).
    """

    @property
    def agent_timeout_s(self) -> float | None: ...


@runtime_checkable
class ModelTimedCalls(Protocol):
    """An adapter whose tool calls run the model's own commands under a deadline of the adapter's, past which the
    model is told and the episode goes on (Harbor's `exec_timeout_s`).

    `model_call_s`: seconds a call may take by the model's doing (that deadline, with the adapter's grace). When
    `rollout.rollout_timeout_s` ends the episode during a call, the time is the model's up to there, the
    environment's past it (`raygrpo.agent.limits.past_deadline`).
    """

    @property
    def model_call_s(self) -> float: ...


@runtime_checkable
class EnvProvider(Protocol):
    """Makes adapters for one environment on one event loop.

    Built inside the env pool actor (clients bind to the loop that first uses them), shared by all of that actor's
    rollouts of the environment, and closed when the actor shuts down.
    """

    def adapter(self) -> EnvAdapter: ...

    async def aclose(self) -> None: ...


def refuse_call(name: str, arguments: Any, available: Iterable[str]) -> ToolResult | None:
    """The error result for a call that must not reach the environment, or None when it may run.

    Refused: a tool that is not in `available`, and arguments that are not a JSON object with string keys. The text
    tells the model what it can call instead.
    """
    names = sorted(n for n in available if n)
    if name not in names:
        return ToolResult(text=f"Error: unknown tool {name!r}. Available tools: {', '.join(names) or 'none'}.",
                          error=True)
    if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
        return ToolResult(text=f"Error: the arguments of {name!r} must be a JSON object with string keys.",
                          error=True)
    return None
