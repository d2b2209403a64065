"""The agent loop without Ray: token bookkeeping, limits, and bad model output that must never crash a rollout."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest

from raygrpo.agent.chat import ChatRenderer
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.base import EnvError
from raygrpo.policy.base import GenerationContext, SamplingParams
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.agent.rollout import run_rollout
from raygrpo.agent.toolcalls import format_tool_call
from raygrpo.core.types import ANSWER_STEP, Observation, Status, TaskRef, ToolResult

pytestmark = pytest.mark.timeout(60)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "dump", "description": "Print a lot.", "parameters": {"type": "object", "properties": {}}},
    },
    {
        "type": "function",
        "function": {"name": "submit", "description": "Submit.", "parameters": {"type": "object", "properties": {}}},
    },
]


class AddEnv:
    """A small in-process environment for loop tests: `add` checks its argument types like a real server would."""

    def __init__(self, die_on_call: int | None = None, call_delay_s: float = 0.0):
        self.calls: list[tuple[str, dict]] = []
        self.closed = 0
        self.reward: float | None = None
        self.die_on_call = die_on_call
        self.call_delay_s = call_delay_s

    async def start(self, task: TaskRef) -> Observation:
        return Observation(messages=[{"role": "user", "content": "Add 2 and 3, then submit."}], tools=TOOLS)

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.calls.append((name, arguments))
        if self.die_on_call is not None and len(self.calls) >= self.die_on_call:
            raise EnvError("session terminated by the server")
        await asyncio.sleep(self.call_delay_s)
        if name == "add":
            a, b = arguments.get("a"), arguments.get("b")
            if not isinstance(a, int) or not isinstance(b, int):
                return ToolResult("Error: a and b must be integers", error=True)
            return ToolResult(str(a + b))
        if name == "dump":
            return ToolResult("x" * 100_000)
        self.reward = 1.0
        return ToolResult("submitted", reward=1.0, finished=True)

    async def score(self) -> float | None:
        return self.reward

    async def close(self) -> None:
        self.closed += 1


def scripted(*turns: str | None):
    def script(ctx: GenerationContext) -> str | None:
        return turns[ctx.turn] if ctx.turn < len(turns) else "done"

    return script


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def _run(renderer, env, script, **limits):
    policy = ScriptedPolicy(renderer.tokenizer, script)
    task = TaskRef(env="add", index=0)
    config = RolloutConfig(**limits)
    return asyncio.run(run_rollout(task, env, policy, renderer, SamplingParams(max_tokens=512), config))


def test_multi_turn_bookkeeping(renderer):
    env = AddEnv()
    traj = _run(renderer, env, scripted(format_tool_call("add", {"a": 2, "b": 3}), format_tool_call("submit", {})))
    assert traj.status is Status.OK and traj.reward == 1.0
    assert env.calls == [("add", {"a": 2, "b": 3}), ("submit", {})] and env.closed == 1
    assert traj.turns == 2 and traj.tool_calls == 2
    assert len(traj.completion_ids) == len(traj.env_mask) == len(traj.logprobs)
    # The tool result of the first turn sits between the two model turns, masked out.
    first_env = traj.env_mask.index(0)
    env_tokens = [t for t, m in zip(traj.completion_ids, traj.env_mask) if m == 0]
    assert "5" in renderer.tokenizer.decode(env_tokens)
    assert traj.completion_ids[first_env - 1] == renderer.eos_token_id
    assert traj.env_mask[-1] == 1  # the finishing turn ends the trajectory: no dangling tool tokens
    assert [m["role"] for m in traj.messages] == ["user", "assistant", "tool", "assistant", "tool"]


def test_no_tool_call_means_no_answer(renderer):
    """The model stopped without the scoring tool: `no_answer`, scored `rollout.unanswered_reward` (0.0 by default,
    None masks it)."""
    traj = _run(renderer, AddEnv(), scripted("I think the answer is 5."))
    assert traj.status is Status.NO_ANSWER and traj.reward == 0.0 and traj.turns == 1 and traj.steps == []
    masked = _run(renderer, AddEnv(), scripted("I think the answer is 5."), unanswered_reward=None)
    assert masked.status is Status.NO_ANSWER and masked.reward is None


@pytest.mark.parametrize(
    "bad, expected",
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 2</tool_call>', "not valid JSON"),
        (format_tool_call("multiply", {"a": 2}), "unknown tool 'multiply'"),
        (format_tool_call("add", {"a": "two", "b": 3}), "must be integers"),
    ],
)
def test_bad_calls_become_messages_to_the_model(renderer, bad, expected):
    env = AddEnv()
    traj = _run(renderer, env, scripted(bad, format_tool_call("submit", {})))
    assert traj.status is Status.OK and traj.reward == 1.0
    assert expected in traj.messages[2]["content"]


def test_oversize_tool_output_is_truncated(renderer):
    traj = _run(renderer, AddEnv(), scripted(format_tool_call("dump", {}), format_tool_call("submit", {})),
                max_tool_output_chars=500)
    assert len(traj.messages[2]["content"]) <= 500 and "output truncated" in traj.messages[2]["content"]
    assert traj.reward == 1.0


def test_turn_limit_truncates_with_the_truncated_reward(renderer):
    """Whatever the steps gave on the way, a rollout that hit a limit scores `rollout.truncated_reward`."""
    call = format_tool_call("add", {"a": 1, "b": 1})
    traj = _run(renderer, AddEnv(), scripted(call, call, call, call), max_turns=2)
    assert traj.status is Status.TRUNCATED and traj.turns == 2 and traj.reward == 0.0
    masked = _run(renderer, AddEnv(), scripted(call, call, call, call), max_turns=2, truncated_reward=None)
    assert masked.status is Status.TRUNCATED and masked.reward is None
    assert [s["tool"] for s in traj.steps] == ["add", "add"]


def test_token_budget(renderer):
    call = format_tool_call("add", {"a": 1, "b": 1})
    traj = _run(renderer, AddEnv(), scripted(*[call] * 50), max_total_tokens=400, max_turns=50)
    assert traj.status is Status.TRUNCATED
    assert len(traj.prompt_ids) + len(traj.completion_ids) <= 400


def test_a_prompt_over_the_token_budget_is_an_unscored_task_error(renderer):
    """A prompt that leaves the model no token is the task's or the config's problem, never a `truncated` 0.0 with no
    turn: `task_error` (not retried), saying both sizes; no turn is generated."""
    env = AddEnv()
    traj = _run(renderer, env, scripted(format_tool_call("submit", {})), max_total_tokens=20)
    assert traj.status is Status.TASK_ERROR and traj.reward is None and traj.turns == 0 and env.closed == 1
    assert f"the prompt is {len(traj.prompt_ids)} tokens" in traj.error and "rollout.max_total_tokens=20" in traj.error
    assert not Status.TASK_ERROR.is_infra_failure


def test_dead_environment_is_unscored_env_error(renderer):
    env = AddEnv(die_on_call=1)
    traj = _run(renderer, env, scripted(format_tool_call("submit", {})))
    assert traj.status is Status.ENV_ERROR and traj.reward is None and env.closed == 1
    assert "terminated" in traj.error


def test_the_loop_leaves_tool_deadlines_to_the_adapter(renderer):
    """One owner per deadline: the adapter bounds its calls (and tells the model); the loop imposes none of its own,
    so a slow call that the adapter lets finish is not cut short."""
    env = AddEnv(call_delay_s=1.0)
    traj = _run(renderer, env, scripted(format_tool_call("add", {"a": 1, "b": 1}), format_tool_call("submit", {})))
    assert traj.messages[2]["content"] == "2" and traj.status is Status.OK and traj.reward == 1.0


def test_the_rollout_deadline_during_the_turns_truncates(renderer):
    """The model's turns used the time (many quick calls): the deadline is the model's, as a turn limit is."""
    env = AddEnv(call_delay_s=0.1)
    traj = _run(renderer, env, lambda ctx: format_tool_call("add", {"a": 1, "b": 1}), rollout_timeout_s=1.0,
                max_turns=1000)
    assert traj.status is Status.TRUNCATED and traj.reward == 0.0 and env.closed == 1 and traj.tool_calls >= 3
    assert "rollout_timeout_s=1" in traj.error


def test_a_tool_call_that_never_returns_is_env_error_whichever_deadline_fires(renderer):
    """One call that hung through most of the rollout's budget is the environment's failure (retried, unscored), as
    it is when the tool's own deadline fires first: never a 0.0 the model is trained on."""
    env = AddEnv(call_delay_s=30.0)
    traj = _run(renderer, env, scripted(format_tool_call("add", {"a": 1, "b": 1})), rollout_timeout_s=0.5)
    assert traj.status is Status.ENV_ERROR and traj.reward is None and env.closed == 1
    assert "rollout_timeout_s=0.5" in traj.error and "call to the environment had not returned" in traj.error


def test_a_generation_that_never_returns_is_policy_error(renderer):
    class HungPolicy(ScriptedPolicy):
        async def generate(self, prompt_ids, sampling, context=None):
            await asyncio.sleep(30)

    config = RolloutConfig(rollout_timeout_s=0.5)
    env = AddEnv()
    traj = asyncio.run(run_rollout(TaskRef(env="add", index=0), env, HungPolicy(renderer.tokenizer, scripted()),
                                   renderer, SamplingParams(max_tokens=512), config))
    assert traj.status is Status.POLICY_ERROR and traj.reward is None and "generation had not returned" in traj.error


class CommandEnv(AddEnv):
    """Tool calls that run the model's own commands under the adapter's deadline (`ModelTimedCalls`)."""

    model_call_s = 35.0


def test_a_models_own_command_within_its_deadline_is_the_models_time(renderer):
    env = CommandEnv(call_delay_s=30.0)
    traj = _run(renderer, env, scripted(format_tool_call("add", {"a": 1, "b": 1})), rollout_timeout_s=0.5)
    assert traj.status is Status.TRUNCATED and traj.reward == 0.0


def test_a_command_past_the_adapters_own_deadline_is_env_error(renderer):
    env = CommandEnv(call_delay_s=30.0)
    env.model_call_s = 0.2
    traj = _run(renderer, env, scripted(format_tool_call("add", {"a": 1, "b": 1})), rollout_timeout_s=0.5)
    assert traj.status is Status.ENV_ERROR and traj.reward is None


class AgentDeadlineEnv(AddEnv):
    """An environment with an agent deadline (Harbor's task `[agent] timeout_sec`) whose scorer judges the
    environment's state, as a verifier does, whether or not the model submitted."""

    def __init__(self, agent_timeout_s: float, **kwargs: Any):
        super().__init__(**kwargs)
        self.agent_timeout_s = agent_timeout_s
        self.scored = 0

    async def score(self) -> float | None:
        self.scored += 1
        return 0.25


def test_the_environments_agent_deadline_stops_the_turns_and_then_scores(renderer):
    """Harbor's trial on an AgentTimeoutError: the agent is stopped at the task's agent timeout, then the verifier
    runs and its reward is the episode's; the trajectory says the agent timed out."""
    env = AgentDeadlineEnv(0.5, call_delay_s=5.0)
    began = time.monotonic()
    traj = _run(renderer, env, scripted(format_tool_call("add", {"a": 1, "b": 1}), format_tool_call("submit", {})))
    assert time.monotonic() - began < 4
    assert traj.status is Status.OK and traj.reward == 0.25 and env.scored == 1 and env.closed == 1
    assert env.calls == [("add", {"a": 1, "b": 1})] and traj.turns == 1  # the call in flight was cancelled
    assert "agent timeout (0.5 s)" in traj.error and "verified" in traj.error


def test_the_rollout_deadline_still_bounds_a_longer_agent_deadline(renderer, caplog):
    env = AgentDeadlineEnv(30.0, call_delay_s=0.1)
    with caplog.at_level(logging.WARNING, logger="raygrpo.agent.rollout"):
        traj = _run(renderer, env, lambda ctx: format_tool_call("add", {"a": 1, "b": 1}), rollout_timeout_s=0.5,
                    max_turns=1000)
    assert traj.status is Status.TRUNCATED and env.scored == 0 and "rollout_timeout_s=0.5" in traj.error
    assert "agent timeout (30 s) is longer than rollout.rollout_timeout_s=0.5" in caplog.text


def test_cancellation_closes_the_environment(renderer):
    env = AddEnv(call_delay_s=10.0)
    policy = ScriptedPolicy(renderer.tokenizer, scripted(format_tool_call("add", {"a": 1, "b": 1})))

    async def main():
        task = asyncio.create_task(
            run_rollout(TaskRef("add", 0), env, policy, renderer, SamplingParams(), RolloutConfig())
        )
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert env.closed == 1


def test_missing_reward_is_its_own_unscored_status(renderer):
    from raygrpo.envs.base import RewardMissingError

    class NoRewardEnv(AddEnv):
        async def score(self):
            raise RewardMissingError("the verifier wrote no reward file")

    traj = _run(renderer, NoRewardEnv(), scripted(format_tool_call("submit", {})))
    assert traj.status is Status.TASK_ERROR and traj.reward is None and "no reward file" in traj.error


def test_scoring_past_its_deadline_is_unscored_timeout(renderer):
    class LateScorer(AddEnv):
        async def score(self):
            raise TimeoutError("the verifier did not finish within 0.3 s")  # the adapter's own deadline

    traj = _run(renderer, LateScorer(), scripted(format_tool_call("submit", {})))
    assert traj.status is Status.TIMEOUT and traj.reward is None and "0.3 s" in traj.error


def test_hung_scorer_without_a_deadline_ends_at_the_rollout_deadline(renderer):
    class HungScorer(AddEnv):
        async def score(self):
            await asyncio.sleep(30)

    env = HungScorer()
    traj = _run(renderer, env, scripted(format_tool_call("submit", {})), rollout_timeout_s=0.5)
    assert traj.status is Status.TIMEOUT and traj.reward is None and env.closed == 1


def test_the_start_does_not_count_against_the_rollout_deadline(renderer):
    """Provisioning has its own deadline (the adapter's); a slow start leaves the episode its whole budget."""

    class SlowStart(AddEnv):
        async def start(self, task):
            await asyncio.sleep(1.0)
            return await super().start(task)

    traj = _run(renderer, SlowStart(), scripted(format_tool_call("submit", {})), rollout_timeout_s=0.8)
    assert traj.status is Status.OK and traj.reward == 1.0 and traj.timings["provision"] >= 1.0


def test_a_start_that_raises_timeout_is_env_error(renderer):
    class StartTimesOut(AddEnv):
        async def start(self, task):
            raise TimeoutError("no sandbox within 1 s")

    env = StartTimesOut()
    traj = _run(renderer, env, scripted(format_tool_call("submit", {})))
    assert traj.status is Status.ENV_ERROR and "no sandbox within 1 s" in traj.error and env.closed == 1


def test_a_turn_that_stops_on_another_stop_token_is_closed_as_the_template_closes_it(renderer):
    """Qwen2.5-style models also stop on <|endoftext|>. The loop then closes the turn with the template's own
    end-of-turn token (environment glue, masked out) before the tool results, so the context the next turn is
    generated from reads as the template writes the conversation, the model's stop token aside."""
    from raygrpo.core.types import Turn

    tok = renderer.tokenizer
    other_stop = tok.convert_tokens_to_ids("<|endoftext|>")
    assert other_stop not in (None, tok.unk_token_id) and other_stop != renderer.eos_token_id
    texts = [format_tool_call("add", {"a": 2, "b": 3}), format_tool_call("submit", {})]

    class EndOfTextPolicy:
        policy_version = 0

        async def generate(self, prompt_ids, sampling, context=None):
            return Turn(output_ids=renderer.encode(texts[context.turn]) + [other_stop], logprobs=[-0.5] * 99,
                        finish_reason="stop")

    env = AddEnv()
    traj = asyncio.run(run_rollout(TaskRef("add", 0), env, EndOfTextPolicy(), renderer, SamplingParams(max_tokens=512),
                                   RolloutConfig()))
    assert traj.status is Status.OK and traj.reward == 1.0 and env.calls[0] == ("add", {"a": 2, "b": 3})
    first = renderer.encode(texts[0]) + [other_stop]
    glue = [renderer.eos_token_id, *renderer.tool_suffix_ids(traj.messages[2:3])]
    assert traj.completion_ids[: len(first) + len(glue)] == first + glue
    assert traj.env_mask[: len(first) + len(glue)] == [1] * len(first) + [0] * len(glue)
    # After the model's tokens: the turn closed and the tool results, as the template writes them after that turn.
    rendered = renderer.prompt_ids(traj.messages[:3], TOOLS)
    model_text = renderer.encode(texts[0])
    at = next(i for i in range(len(rendered)) if rendered[i : i + len(model_text)] == model_text) + len(model_text)
    assert rendered[at:] == glue
    assert traj.messages[1]["content"] == "" and "<|endoftext|>" not in json.dumps(traj.messages)


class RewardSteps(AddEnv):
    """Like an ORS environment: `bonus` gives +0.1 and goes on, `quit` ends the episode without a reward."""

    def __init__(self):
        super().__init__()
        self.final = None

    async def call(self, name, arguments):
        self.calls.append((name, arguments))
        if name == "dump":  # stands in for a tool with metadata
            return ToolResult("noted", reward=0.1, metadata={"note": "bonus"})
        if name == "submit":
            return ToolResult("bye", finished=True)
        return await super().call(name, arguments)

    async def score(self):
        return self.final  # the reward of the call that finished the episode: none


def test_an_episode_the_environment_ended_without_a_reward_is_no_answer_whatever_came_before(renderer):
    traj = _run(renderer, RewardSteps(), scripted(format_tool_call("dump", {}), format_tool_call("submit", {})))
    assert traj.status is Status.NO_ANSWER and traj.reward == 0.0  # not the intermediate 0.1
    assert traj.steps == [{"tool": "dump", "reward": 0.1, "finished": False, "metadata": {"note": "bonus"}},
                          {"tool": "submit", "reward": None, "finished": True, "metadata": None}]


def test_a_final_answer_goes_to_the_environment_when_it_scores_answers(renderer):
    class Terminal(AddEnv):
        async def answer(self, text):
            self.answered = text
            self.reward = 1.0 if text == "5" else 0.0
            return ToolResult("graded", reward=self.reward, finished=True)

    env = Terminal()
    traj = _run(renderer, env, scripted("5"))
    assert env.answered == "5" and traj.status is Status.OK and traj.reward == 1.0
    assert traj.steps == [{"tool": ANSWER_STEP, "reward": 1.0, "finished": True, "metadata": None}]
    assert _run(renderer, Terminal(), scripted("six")).reward == 0.0


def test_a_malformed_call_keeps_what_the_model_wrote(renderer):
    bad = 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 2</tool_call>'
    traj = _run(renderer, AddEnv(), scripted(bad, format_tool_call("submit", {})))
    assert traj.messages[1]["content"] == bad and "tool_calls" not in traj.messages[1]
    assert "not valid JSON" in traj.messages[2]["content"]


def test_arguments_longer_than_the_limit_are_refused_to_the_model(renderer):
    env = AddEnv()
    long_call = format_tool_call("add", {"a": 1, "b": 2, "note": "x" * 250})
    traj = _run(renderer, env, scripted(long_call, format_tool_call("submit", {})), max_tool_input_chars=200)
    assert env.calls == [("submit", {})] and traj.tool_calls == 1
    assert "at most 200 are accepted" in traj.messages[2]["content"]


def test_a_seeded_run_samples_alike_every_time_and_a_retry_anew(renderer):
    """With `sampling.seed` set, two runs of the same groups send the same per-request seeds: they derive from the
    group's task and place (`RolloutRequest.seed_key`), not from the random part of its group id; each sample and
    each attempt gets its own."""
    from raygrpo.agent.worker import RolloutWorker
    from raygrpo.driver.attempts import make_groups, next_attempt

    seeds: dict[tuple[int, int, int], int | None] = {}

    class Recording(ScriptedPolicy):
        async def generate(self, prompt_ids, sampling, context=None):
            seeds[current] = sampling.seed
            return await super().generate(prompt_ids, sampling, context)

    class Provider:
        def adapter(self):
            return AddEnv()

    worker = RolloutWorker("w", {"env": Provider()}, Recording(renderer.tokenizer, scripted("done")), renderer,
                           SamplingParams(seed=5), RolloutConfig(), max_concurrent_per_actor=1)

    def one_run() -> dict[tuple[int, int, int], int | None]:
        nonlocal current
        seeds.clear()
        requests = make_groups([TaskRef("env", 0), TaskRef("env", 1)], group_size=2)
        for r in [*requests, next_attempt(requests[0], "EnvError: lost")]:
            current = (r.task.index, r.sample, r.attempt)
            asyncio.run(worker.run(r.task, r.group_id, r.attempt, r.sample, seed_key=r.seed_key))
        return dict(seeds)

    current = (0, 0, 0)
    first, second = one_run(), one_run()
    assert first == second and None not in first.values()
    assert len(set(first.values())) == len(first) == 5  # every sample and the retry sample with seeds of their own
