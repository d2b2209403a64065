"""The agent loop: one rollout of one task, from opening the environment to its reward.

Plain asyncio, no Ray: it takes an `EnvAdapter`, a `PolicyClient` and a `ChatRenderer` and returns a `Trajectory`.
The loop renders the chat with the tools, generates, parses tool calls, runs them, appends the tool results as
tokens with env_mask 0, and repeats until the episode is finished, the model stops calling tools, or a limit is
hit. Whatever the model writes, the loop does not crash: bad calls become error messages to the model. The
environment is always closed.

A policy that writes no text (`raygrpo.policy.acting`: the oracle runs the task's reference solution, noop does
nothing) takes a small path of its own: once the environment is up it acts on the adapter directly, what it did is
recorded as a step (the oracle's: `SOLUTION_STEP`, with the script's exit code and the tail of its output), and the
episode is scored as usual. No turn is generated, so nothing it runs into is the model's doing: a deadline it
reaches is `timeout`, not `truncated`, and an environment that cannot run it is `env_error`, never 0.0.

Deadlines: the loop owns the limits of the model's side (`RolloutConfig`: turns, tokens, `rollout_timeout_s` for the
episode once its environment is up; and an environment's own agent deadline, `agent_timeout_s` on the adapter:
Harbor's task `[agent] timeout_sec`, past which the model's turns of the step are stopped and the episode is scored,
as Harbor's trial does); the adapter owns the deadlines of the environment's operations (start, each tool call,
scoring, close), set on the environment's spec. None is counted twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from raygrpo.core.aio import run_to_end
from raygrpo.agent.chat import ChatRenderer, assistant_message
from raygrpo.agent.limits import Phases, agent_phase, check_prompt_fits, past_deadline
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.base import EnvAdapter, refuse_call
from raygrpo.core.errors import EnvError, PolicyError, TaskError, VerifierError, describe
from raygrpo.policy.acting import ActingPolicy
from raygrpo.policy.base import GenerationContext, PolicyClient, SamplingParams, request_seed
from raygrpo.agent.toolcalls import ToolCallProblem, parse_tool_calls
from raygrpo.core.types import ANSWER_STEP, Status, TaskRef, ToolCall, ToolResult, Trajectory

logger = logging.getLogger(__name__)

#: Characters of a task error's cause kept (more than other errors': a broken task's cause, such as the line in which
#: the Docker daemon says why an image cannot be had, is what its author must read whole).
TASK_ERROR_CHARS = 2000


def truncate_text(text: str, limit: int) -> str:
    """Cut `text` to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    note = f"\n[output truncated: {len(text) - limit} of {len(text)} characters omitted]"
    return text[: max(0, limit - len(note))] + note


async def run_rollout(
    task: TaskRef,
    adapter: EnvAdapter,
    policy: PolicyClient | ActingPolicy,
    renderer: ChatRenderer | None,
    sampling: SamplingParams,
    config: RolloutConfig,
    *,
    on_env_open: Any = None,
    on_env_close: Any = None,
    sample_key: str = "",
) -> Trajectory:
    """Run one episode of `task` and return its trajectory. Never raises except on cancellation.

    Args:
        task: The task to run.
        adapter: A fresh, unstarted environment adapter; it is closed before this returns.
        policy: The policy that writes the assistant turns, or an `ActingPolicy` that acts on the environment
            directly (oracle, noop).
        renderer: Renders prompts and tool results with the run's tokenizer (None for an acting policy).
        sampling: Sampling settings; `max_tokens` is further capped by the rollout's token budget.
        config: Limits of the rollout.
        on_env_open: Called (no arguments) right before the environment is started, for live-env accounting.
        on_env_close: Called (no arguments) once the environment is closed.
        sample_key: Names this rollout among its group (e.g. `group_id/sample/attempt`); with `sampling.seed` set,
            each turn's seed derives from it, so the G rollouts of a group do not all sample alike.
    """
    traj = Trajectory(task=task)
    acting = isinstance(policy, ActingPolicy)
    phases = Phases()
    started = time.perf_counter()
    if on_env_open is not None:
        on_env_open()
    try:
        with phases.timed("provision"):
            try:
                obs = await adapter.start(task)  # the adapter owns the start's deadline
            except TimeoutError as exc:  # an adapter that reports its start deadline as a plain TimeoutError
                raise EnvError(f"the environment did not start: {describe(exc)}") from exc
        if acting:
            episode = _act(traj, obs, phases, adapter, policy, config)
        else:
            if renderer is None:
                raise ValueError("run_rollout needs a renderer for a policy that writes text")
            episode = _episode(traj, obs, phases, adapter, policy, renderer, sampling, config, sample_key)
        await asyncio.wait_for(episode, timeout=config.rollout_timeout_s)
    except TimeoutError:  # who the deadline is on: the model's turns, a hung call, a hung scorer (`past_deadline`)
        traj.status, traj.reward, traj.error = past_deadline(phases, adapter, config, acting)
    except EnvError as exc:
        traj.status, traj.reward, traj.error = Status.ENV_ERROR, None, describe(exc)
    except PolicyError as exc:
        traj.status, traj.reward, traj.error = Status.POLICY_ERROR, None, describe(exc)
    except TaskError as exc:  # e.g. the task's image does not build: its cause is kept whole (the daemon's line)
        traj.status, traj.reward, traj.error = Status.TASK_ERROR, None, describe(exc, limit=TASK_ERROR_CHARS)
    except asyncio.CancelledError:
        traj.status, traj.reward, traj.error = Status.CANCELLED, None, "cancelled"
        raise
    except Exception as exc:  # noqa: BLE001 - an adapter bug must not take the whole batch down
        logger.exception("rollout of %s/%s failed unexpectedly", task.env, task.index)
        traj.status, traj.reward, traj.error = Status.ENV_ERROR, None, describe(exc)
    finally:
        try:
            with phases.timed("provision"):
                await _close(adapter)
        finally:
            if on_env_close is not None:
                on_env_close()
            traj.timings = {**phases.seconds, "total": time.perf_counter() - started}
            # Inside "provision": waiting for the provider's governor, backing off its refusals, waiting for a warm
            # sandbox, and the sandbox's own start.
            waited = getattr(adapter, "timings", None) or {}
            traj.timings.update({k: waited[k] for k in PROVISION_PARTS if k in waited})
            traj.sandbox = getattr(adapter, "provenance", None)
    return traj


#: The parts of `provision` an adapter may time (`timings`) that a trajectory reports on their own.
PROVISION_PARTS = ("governor_wait", "backoff", "warm_wait", "start")

#: How long a cancelled rollout keeps waiting for its environment to close (the adapter bounds the close itself).
CLOSE_GRACE_S = 60.0


async def _close(adapter: EnvAdapter) -> None:
    """Close the environment; if the rollout is cancelled meanwhile, finish closing first, then re-raise.

    A cancelled rollout must still release its session or sandbox, and must not report it closed before it is.
    """
    cancelled = None
    try:
        cancelled = await run_to_end(adapter.close(), CLOSE_GRACE_S)
    except TimeoutError:
        logger.warning("an environment did not close within %g s", CLOSE_GRACE_S)
    except Exception as exc:  # noqa: BLE001 - close never raises by contract; report a broken adapter
        logger.warning("closing an environment failed: %s", describe(exc))
    if cancelled is not None:
        raise cancelled


def _opening(obs: Any, config: RolloutConfig) -> list[dict[str, Any]]:
    """The conversation an episode opens with: the run's system prompt, if any, then the environment's messages."""
    messages: list[dict[str, Any]] = []
    if config.system_prompt:
        messages.append({"role": "system", "content": config.system_prompt})
    messages.extend(obs.messages)
    return messages


async def _episode(
    traj: Trajectory,
    obs: Any,
    phases: Phases,
    adapter: EnvAdapter,
    policy: PolicyClient,
    renderer: ChatRenderer,
    sampling: SamplingParams,
    config: RolloutConfig,
    sample_key: str,
) -> None:
    messages = traj.messages = _opening(obs, config)
    traj.prompt_ids = renderer.prompt_ids(messages, obs.tools)
    check_prompt_fits(len(traj.prompt_ids), config)
    tool_names = {t.get("function", t).get("name") for t in obs.tools}
    state = _TurnState()
    while True:  # one pass per step of the episode (one for an environment without steps)
        ended = await agent_phase(traj, adapter, config, _turns(traj, phases, adapter, policy, renderer, sampling,
                                                                 config, sample_key, tool_names, state))
        if not ended:  # a turn or token limit: whatever the steps gave on the way, the rollout is truncated
            traj.status, traj.reward = Status.TRUNCATED, config.truncated_reward
            return
        following = await _score(traj, phases, adapter, config)
        if following is None:
            return
        # The next step of the episode: its messages open a new user turn (environment tokens, not trained on).
        messages.extend(following.messages)
        suffix = renderer.user_suffix_ids(following.messages)
        if state.stopped_on is not None and state.stopped_on != renderer.eos_token_id:
            suffix = [renderer.eos_token_id, *suffix]
        if len(traj.prompt_ids) + len(traj.completion_ids) + len(suffix) >= config.max_total_tokens:
            traj.status, traj.reward = Status.TRUNCATED, config.truncated_reward
            return
        traj.completion_ids.extend(suffix)
        traj.logprobs.extend([0.0] * len(suffix))
        traj.env_mask.extend([0] * len(suffix))
        state.stopped_on = None


class _TurnState:
    """Where an episode's model turns stand, kept up to date as they go (a deadline may stop them at any point):
    the index of the next turn, and the stop token the last turn ended on while nothing followed it yet (None after
    environment tokens, or when it was cut off)."""

    def __init__(self) -> None:
        self.next_turn = 0
        self.stopped_on: int | None = None


async def _turns(traj: Trajectory, phases: Phases, adapter: EnvAdapter, policy: PolicyClient, renderer: ChatRenderer,
                 sampling: SamplingParams, config: RolloutConfig, sample_key: str, tool_names: set[str],
                 state: _TurnState) -> bool:
    """The model's turns of one step, from turn `state.next_turn` on: whether the step ended before a limit (the
    model answered, or the environment finished it). `state` follows the turns (see `_TurnState`)."""
    messages = traj.messages
    for turn_index in range(state.next_turn, config.max_turns):
        budget = config.max_total_tokens - len(traj.prompt_ids) - len(traj.completion_ids)
        if budget <= 0:
            return False
        request = SamplingParams(
            max_tokens=min(sampling.max_tokens, budget),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=request_seed(sampling.seed, sample_key, turn_index),
            min_version=sampling.min_version,
        )
        context = GenerationContext(task=traj.task, messages=list(messages), turn=turn_index)
        with phases.timed("generate"):
            turn = await policy.generate(traj.prompt_ids + traj.completion_ids, request, context)
        traj.turns += 1
        state.next_turn = turn_index + 1
        traj.policy_versions.append(turn.policy_version)
        traj.completion_ids.extend(turn.output_ids)
        traj.logprobs.extend(turn.logprobs)
        traj.env_mask.extend([1] * len(turn.output_ids))

        # A turn that stopped by itself ends on a stop token: the template's end of turn (the eos), or another one
        # the model's generation config stops at (Qwen2.5's <|endoftext|>). The text is what comes before it.
        stopped_on = state.stopped_on = (turn.output_ids[-1] if turn.finish_reason == "stop" and turn.output_ids
                                         else None)
        text_ids = turn.output_ids[:-1] if stopped_on is not None else turn.output_ids
        raw = renderer.decode(text_ids)
        content, parsed = parse_tool_calls(raw)
        calls = [c for c in parsed if isinstance(c, ToolCall)]
        # A malformed call keeps what the model wrote in the transcript (the parsed content would drop it).
        malformed = any(isinstance(c, ToolCallProblem) for c in parsed)
        messages.append(assistant_message(raw.strip() if malformed else content, calls))
        if turn.finish_reason == "length":
            return False  # cut off mid-turn: its tool calls may be incomplete
        if not parsed:
            # The model answered without calling a tool: an environment may score that answer.
            answer = getattr(adapter, "answer", None)
            if answer is not None:
                with phases.timed("tools"):
                    result = await answer(content)
                if result is not None:
                    _record_step(traj, ANSWER_STEP, result)
            return True

        tool_messages, finished = await _run_calls(traj, phases, adapter, parsed, tool_names, config)
        messages.extend(tool_messages)
        if finished:
            return True
        suffix = renderer.tool_suffix_ids(tool_messages)
        if stopped_on is not None and stopped_on != renderer.eos_token_id:
            # The template closes an assistant turn with its end-of-turn token; close it so before the tool results
            # (environment glue, not trained on), so the next turn sees the conversation the template would write.
            suffix = [renderer.eos_token_id, *suffix]
        if len(traj.prompt_ids) + len(traj.completion_ids) + len(suffix) >= config.max_total_tokens:
            return False
        traj.completion_ids.extend(suffix)
        traj.logprobs.extend([0.0] * len(suffix))
        traj.env_mask.extend([0] * len(suffix))
        state.stopped_on = None
    state.next_turn = max(state.next_turn, config.max_turns)
    return False


async def _act(
    traj: Trajectory, obs: Any, phases: Phases, adapter: EnvAdapter, policy: ActingPolicy, config: RolloutConfig
) -> None:
    """The episode of a policy that acts on the environment directly: act once per step, record it, score."""
    traj.messages = _opening(obs, config)
    while True:
        with phases.timed("tools"):
            try:
                result = await policy.act(adapter)
            except TimeoutError as exc:  # e.g. a reference solution past its deadline: unscored, not a 0.0
                traj.status, traj.reward, traj.error = Status.TIMEOUT, None, describe(exc)
                return
        if result is not None:
            _record_step(traj, policy.step, result)
        following = await _score(traj, phases, adapter, config)
        if following is None:
            return
        traj.messages.extend(following.messages)


async def _score(traj: Trajectory, phases: Phases, adapter: EnvAdapter, config: RolloutConfig) -> Any:
    """Score the finished episode (or step) and set the trajectory's status and reward.

    For an adapter whose episode has steps (`SteppedAdapter.multi_step`), the step's reward joins
    `traj.step_rewards`; returns the next step's `Observation` when another step follows (None otherwise), and the
    trajectory's reward is the episode's once its last step is scored."""
    with phases.timed("verify"):
        try:
            reward = await adapter.score()  # the adapter owns scoring's deadline (a verifier's timeout)
        except TimeoutError as exc:
            traj.status, traj.reward = Status.TIMEOUT, None
            traj.error = describe(exc)
            return None
        except TaskError as exc:
            traj.status, traj.reward, traj.error = Status.TASK_ERROR, None, describe(exc)
            return None
        except VerifierError as exc:
            traj.status, traj.reward, traj.error = Status.VERIFIER_ERROR, None, describe(exc)
            return None
        finally:
            # What the verifier left behind (Harbor: exit code, output tail, raw rewards), however scoring ended.
            traj.verifier = getattr(adapter, "verifier", None)
    if getattr(adapter, "multi_step", False):
        traj.step_rewards.append(None if reward is None else float(reward))
        with phases.timed("tools"):
            following = await adapter.next_step()  # type: ignore[attr-defined] - a SteppedAdapter
        if following is not None:
            return following
        reward = adapter.episode_reward()  # type: ignore[attr-defined]
    if reward is None:  # the episode ended without a reward, by the model's doing
        traj.status, traj.reward = Status.NO_ANSWER, config.unanswered_reward
    else:
        traj.status, traj.reward = Status.OK, float(reward)
    return None


async def _run_calls(
    traj: Trajectory,
    phases: Phases,
    adapter: EnvAdapter,
    parsed: list[ToolCall | ToolCallProblem],
    tool_names: set[str],
    config: RolloutConfig,
) -> tuple[list[dict[str, Any]], bool]:
    """Run one turn's tool calls in order; returns the tool messages and whether the episode finished."""
    tool_messages: list[dict[str, Any]] = []
    for position, call in enumerate(parsed):
        if position >= config.max_tool_calls_per_turn:
            result = ToolResult(
                f"Error: at most {config.max_tool_calls_per_turn} tool calls per turn; this one was not run.",
                error=True,
            )
            name = call.name if isinstance(call, ToolCall) else "invalid_tool_call"
        elif isinstance(call, ToolCallProblem):
            result, name = ToolResult(call.message, error=True), "invalid_tool_call"
        elif (refused := refuse_call(call.name, call.arguments, tool_names)) is not None:
            result, name = refused, call.name
        elif (size := len(json.dumps(call.arguments, ensure_ascii=False))) > config.max_tool_input_chars:
            result, name = ToolResult(f"Error: the arguments of {call.name!r} are {size} characters long; at most "
                                      f"{config.max_tool_input_chars} are accepted.", error=True), call.name
        else:
            name = call.name
            with phases.timed("tools"):
                result = await adapter.call(call.name, call.arguments)  # the adapter owns the call's deadline
            traj.tool_calls += 1
            _record_step(traj, name, result)
        text = truncate_text(result.text, config.max_tool_output_chars)
        tool_messages.append({"role": "tool", "name": name, "content": text})
        if result.finished:
            return tool_messages, True
    return tool_messages, False


def _record_step(traj: Trajectory, tool: str, result: ToolResult) -> None:
    traj.steps.append({"tool": tool, "reward": result.reward, "finished": result.finished,
                       "metadata": result.metadata})
