"""The limits of an episode that are not the model's doing, for the agent loop (`raygrpo.agent.rollout`).

A prompt that leaves the model no token under `rollout.max_total_tokens` is the task's or the config's problem
(`check_prompt_fits`: `task_error`, not retried); an environment's own agent deadline (`agent_timeout_s` on the
adapter: Harbor's task `[agent] timeout_sec`) stops the model's turns and the episode is scored, as Harbor's trial
does (`agent_phase`); and when `rollout.rollout_timeout_s` ends an episode, `past_deadline` says whose the time was
(`Phases` follows which call is in flight, and since when).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import contextmanager
from typing import Any, Iterator

from raygrpo.config.rollout import RolloutConfig
from raygrpo.core.errors import TaskError
from raygrpo.core.types import Status, TaskRef, Trajectory
from raygrpo.envs.base import AgentDeadline, EnvAdapter, ModelTimedCalls

logger = logging.getLogger(__name__)


#: The share of `rollout.rollout_timeout_s` one call in flight must have taken, when that deadline ends the episode,
#: for the time to be its side's rather than the model's turns' (docs/statuses.md).
STUCK_SHARE = 0.5


class Phases:
    """Accumulates seconds per phase of a rollout, remembers the phase it entered last, and how long the call of a
    phase that was cut off (a deadline cancelling it) had been running (`cut_s`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"provision": 0.0, "generate": 0.0, "tools": 0.0, "verify": 0.0}
        self.current: str | None = None
        self.cut_s = 0.0

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        start, self.current, self.cut_s = time.perf_counter(), phase, 0.0
        try:
            yield
        except BaseException:  # cancelled by a deadline (or failed): how long it had run
            self.cut_s = time.perf_counter() - start
            raise
        finally:
            self.seconds[phase] += time.perf_counter() - start


def past_deadline(phases: Phases, adapter: EnvAdapter, config: RolloutConfig,
                  acting: bool) -> tuple[Status, float | None, str]:
    """The status, reward and error of an episode that `rollout.rollout_timeout_s` ended.

    `timeout` when the scorer was running or no model acted; `env_error` (`policy_error`) when one tool call
    (generation) still in flight had taken `STUCK_SHARE` of the deadline or more: a call that never returned ate the
    budget, not the model's turns, and the same hang past the call's own deadline (an ORS `tool_timeout_s`, the
    policy's `request_timeout_s`) is infrastructure too. A tool call that runs the model's own command under a
    deadline of the adapter's (`ModelTimedCalls`: Harbor's `exec_timeout_s`) is the model's time up to that
    deadline. Otherwise the model's turns used the time: `truncated`, as a turn limit is.
    """
    limit = config.rollout_timeout_s
    error = f"rollout exceeded rollout_timeout_s={limit:g}"
    if phases.current == "verify" or acting:  # the scorer hung, or no model acted: not the model's doing
        return Status.TIMEOUT, None, error
    stuck = phases.cut_s
    if phases.current == "tools":
        own = adapter.model_call_s if isinstance(adapter, ModelTimedCalls) else None
        if stuck >= STUCK_SHARE * limit and (own is None or stuck > own):
            return Status.ENV_ERROR, None, (f"{error}: a call to the environment had not returned after {stuck:.1f} s "
                                            "(an environment that hangs, not the model's turns)")
    if phases.current == "generate" and stuck >= STUCK_SHARE * limit:
        return Status.POLICY_ERROR, None, (f"{error}: a generation had not returned after {stuck:.1f} s (a policy "
                                           "engine that hangs, not the model's turns)")
    return Status.TRUNCATED, config.truncated_reward, error


def check_prompt_fits(prompt_tokens: int, config: RolloutConfig) -> None:
    """Refuse an episode whose opening prompt leaves the model no token under `rollout.max_total_tokens`.

    Not the model's doing (it never wrote a token), and the same on every attempt: a task or config problem, so it is
    unscored and not retried, rather than a `truncated` rollout with no turn.

    Raises:
        TaskError: The prompt has `max_total_tokens` tokens or more (the message says both).
    """
    if prompt_tokens >= config.max_total_tokens:
        raise TaskError(f"the prompt is {prompt_tokens} tokens, at or over rollout.max_total_tokens="
                        f"{config.max_total_tokens}: no token is left for the model (raise "
                        "rollout.max_total_tokens, or shorten the task's prompt and tools)")


#: Tasks already warned about an agent timeout longer than the rollout's deadline (once per task per process).
_LONG_AGENT_TIMEOUTS: set[tuple[str, str]] = set()


async def agent_phase(traj: Trajectory, adapter: EnvAdapter, config: RolloutConfig, turns: Any) -> bool:
    """Run one step's model turns (`turns`, a `_turns` coroutine) under the environment's agent deadline, and say
    whether the step is to be scored (`_turns`' answer; True when the deadline stopped them).

    An adapter may bound them (`raygrpo.envs.base.AgentDeadline`, read after `start` and after each `next_step`):
    Harbor's task `[agent] timeout_sec` (a step's own where it sets one). As Harbor's trial does on its
    `AgentTimeoutError`, the turns are
    stopped there (a generation or tool call in flight is cancelled) and the episode is verified as usual: the reward
    is the verifier's, and `traj.error` says the agent timed out. `rollout.rollout_timeout_s` still bounds the whole
    episode, this included.
    """
    timeout_s = adapter.agent_timeout_s if isinstance(adapter, AgentDeadline) else None
    if not timeout_s:
        return await turns
    _warn_if_past_the_rollout_deadline(traj.task, float(timeout_s), config)
    try:
        async with asyncio.timeout(float(timeout_s)) as deadline:
            return await turns
    except TimeoutError:
        if not deadline.expired():  # raised inside the turns: not the agent deadline's
            raise
    traj.error = (f"the model's turns ran past the task's agent timeout ({timeout_s:g} s): stopped, then verified "
                  "as Harbor does")
    logger.info("%s/%s: %s", traj.task.env, traj.task.index, traj.error)
    return True


def _warn_if_past_the_rollout_deadline(task: TaskRef, timeout_s: float, config: RolloutConfig) -> None:
    """Warn once per task when its agent timeout is longer than `rollout.rollout_timeout_s`, which then ends the
    episode first (`truncated`, not verified)."""
    name = str(task.metadata.get("task_name") or task.index)
    if timeout_s <= config.rollout_timeout_s or (task.env, name) in _LONG_AGENT_TIMEOUTS:
        return
    _LONG_AGENT_TIMEOUTS.add((task.env, name))
    logger.warning("envs.%s task %s: its agent timeout (%g s) is longer than rollout.rollout_timeout_s=%g, which ends "
                   "the episode first (truncated, not verified)", task.env, name, timeout_s, config.rollout_timeout_s)
