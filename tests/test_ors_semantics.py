"""ORS environments as their authors write them, through the real adapter and agent loop (no Ray).

The server is `tests/ors_envs/toolbox/server.py`, written only against the openreward SDK and served by the SDK's own
`Server` in a process of its own: `@terminal` answers, rewards per DESIGN section 7 (`no_answer`, `truncated`,
never an intermediate reward), per-step rewards and metadata, roles of `get_messages` prompts, image blocks, and the
prompt TRL's OpenReward integration would build, token for token.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from raygrpo.agent.chat import ChatRenderer
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.ors.adapter import ORSProvider
from raygrpo.envs.ors.listing import list_ors_tasks
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.agent.rollout import run_rollout
from raygrpo.specs.ors import ORSSpec
from raygrpo.agent.toolcalls import format_tool_call
from raygrpo.core.types import ANSWER_STEP, SamplingParams, Status, TaskRef
from tests.ors_utils import (
    QuirkyToolsEnvironment,
    RichConversationEnvironment,
    SlowJudgeEnvironment,
    closed_port,
    ors_server,
    wait_until,
)

pytestmark = pytest.mark.timeout(180)

SERVER = Path(__file__).parent / "ors_envs" / "toolbox" / "server.py"


@pytest.fixture(scope="module")
def toolbox():
    """The SDK-only server in its own process on a free 127.0.0.1 port; stopped (and waited for) at the end."""
    port = closed_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "OPENREWARD_LOG_LEVEL": "WARNING"})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/list_environments", timeout=1).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None

    try:
        assert wait_until(up, 60) and proc.poll() is None, proc.stderr.read().decode()[-2000:]
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def quirks():
    """Environments that stretch what an adapter must handle, served in-process (`tests/ors_utils.py`)."""
    with ors_server([SlowJudgeEnvironment, RichConversationEnvironment, QuirkyToolsEnvironment]) as running:
        yield running.url


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


def _spec(url: str, env_name: str, **fields) -> ORSSpec:
    return ORSSpec(url=url, env_name=env_name, **fields)


def _rollout(renderer, spec: ORSSpec, turns: list[str], index: int = 0, split: str = "train", **limits):
    """One episode of task `index` through the real ORS adapter and agent loop, the model's turns scripted."""

    def script(ctx):
        return turns[ctx.turn] if ctx.turn < len(turns) else "Done."

    async def main():
        provider = ORSProvider(spec, name="t")
        try:
            return await run_rollout(TaskRef(env="t", index=index, split=split), provider.adapter(),
                                     ScriptedPolicy(renderer.tokenizer, script), renderer,
                                     SamplingParams(max_tokens=256), RolloutConfig(**limits))
        finally:
            await provider.aclose()

    return asyncio.run(main())


def _call(name: str, **arguments) -> str:
    return format_tool_call(name, arguments)


# ── @terminal ────────────────────────────────────────────────────────────────────────────────────────────────────


def test_a_terminal_tool_scores_the_models_plain_answer(toolbox, renderer):
    spec = _spec(toolbox, "terminalenvironment")
    right = _rollout(renderer, spec, ["6"], index=3)
    assert (right.status, right.reward) == (Status.OK, 1.0)
    assert right.steps == [{"tool": ANSWER_STEP, "reward": 1.0, "finished": True, "metadata": None}]
    wrong = _rollout(renderer, spec, ["7"], index=3)
    assert (wrong.status, wrong.reward) == (Status.OK, 0.0)
    # The terminal tool is hidden from the model; the others are shown.
    assert [t["function"]["name"] for t in _tools(renderer, spec)] == ["hint"]
    hinted = _rollout(renderer, spec, [_call("hint"), "6"], index=3)
    assert hinted.reward == 1.0 and [s["tool"] for s in hinted.steps] == ["hint", ANSWER_STEP]


def _tools(renderer, spec: ORSSpec) -> list[dict]:
    return _tools_of(renderer, spec, 0)


# ── deadlines ────────────────────────────────────────────────────────────────────────────────────────────────────


def test_a_tool_call_past_its_deadline_leaves_the_rollout_unscored(quirks, renderer):
    """A judge slower than `tool_timeout_s` may still grade and finish the episode on the server: the rollout is
    unscored (`env_error`, naming the tool), never a `no_answer` 0.0 for a right answer."""
    slow = _spec(quirks, "slowjudgeenvironment", tool_timeout_s=0.5)
    answered = _rollout(renderer, slow, ["Paris"])  # through the @terminal tool
    submitted = _rollout(renderer, slow, [_call("submit", answer="Paris"), _call("submit", answer="Paris")])
    for traj, tool in [(answered, "grade"), (submitted, "submit")]:
        assert (traj.status, traj.reward) == (Status.ENV_ERROR, None)
        assert f"tool '{tool}' did not answer within tool_timeout_s=0.5 s" in traj.error
    assert submitted.turns == 1  # no turn after it: the second submit is never written, nor sent
    patient = _rollout(renderer, _spec(quirks, "slowjudgeenvironment", tool_timeout_s=10), ["Paris"])
    assert (patient.status, patient.reward) == (Status.OK, 1.0)


# ── rewards ──────────────────────────────────────────────────────────────────────────────────────────────────────


def test_the_episode_reward_is_the_finishing_calls(toolbox, renderer):
    spec = _spec(toolbox, "toolboxenvironment")
    right = _rollout(renderer, spec, [_call("bonus"), _call("submit", answer="4")], index=2)
    assert (right.status, right.reward) == (Status.OK, 1.0)  # not 1.1, not the bonus
    assert right.steps == [
        {"tool": "bonus", "reward": 0.1, "finished": False, "metadata": {"bonus": 1}},
        {"tool": "submit", "reward": 1.0, "finished": True, "metadata": {"expected": "4"}},
    ]


def test_an_episode_ended_without_a_reward_after_a_bonus_is_no_answer(toolbox, renderer):
    spec = _spec(toolbox, "toolboxenvironment")
    turns = [_call("bonus"), _call("quit")]
    ended = _rollout(renderer, spec, turns)
    assert (ended.status, ended.reward) == (Status.NO_ANSWER, 0.0)  # not the intermediate 0.1
    masked = _rollout(renderer, spec, turns, unanswered_reward=None)
    assert (masked.status, masked.reward) == (Status.NO_ANSWER, None)
    silent = _rollout(renderer, spec, ["I would rather not."])
    assert (silent.status, silent.reward) == (Status.NO_ANSWER, 0.0)


def test_a_truncated_rollout_scores_the_truncated_reward(toolbox, renderer):
    spec = _spec(toolbox, "toolboxenvironment")
    turns = [_call("bonus"), _call("bonus"), _call("submit", answer="0")]
    cut = _rollout(renderer, spec, turns, max_turns=2)
    assert (cut.status, cut.reward) == (Status.TRUNCATED, 0.0)
    assert [s["reward"] for s in cut.steps] == [0.1, 0.1]
    masked = _rollout(renderer, spec, turns, max_turns=2, truncated_reward=None)
    assert (masked.status, masked.reward) == (Status.TRUNCATED, None)


@pytest.mark.parametrize("mode, expected", [("final", 0.0), ("sum", 0.2), ("last", 0.0)])
def test_reward_modes(toolbox, renderer, mode, expected):
    spec = _spec(toolbox, "toolboxenvironment", reward_mode=mode)
    traj = _rollout(renderer, spec, [_call("bonus"), _call("bonus"), _call("submit", answer="wrong")])
    assert traj.status is Status.OK and traj.reward == pytest.approx(expected)


# ── what the model sees ──────────────────────────────────────────────────────────────────────────────────────────


def test_prompt_roles_images_unicode_and_task_tools(toolbox, renderer):
    conversation = _rollout(renderer, _spec(toolbox, "conversationenvironment"), [_call("submit", answer="2")],
                            index=1)
    assert [(m["role"], m["content"]) for m in conversation.messages[:4]] == [
        ("system", "You are a calculator."), ("user", "What is 1 + 1?"), ("assistant", "2"),
        ("user", "What is 1 + 1?")]
    assert conversation.reward == 1.0

    toolbox_spec = _spec(toolbox, "toolboxenvironment")
    pictures = _rollout(renderer, toolbox_spec, [_call("picture"), _call("poem"), _call("quit")])
    assert pictures.messages[2]["content"] == "a pixel"  # the image block is dropped, as TRL drops it
    poem = pictures.messages[4]["content"]
    assert poem.startswith("Ünïcödé wörld 🌍 — 日本語の詩。") and "characters omitted" in poem and len(poem) <= 4000
    shown = _rollout(renderer, _spec(toolbox, "toolboxenvironment", image_blocks="placeholder"), [_call("picture")])
    assert shown.messages[2]["content"] == "[image]\na pixel"

    names = lambda index: [t["function"]["name"] for t in _tools_of(renderer, toolbox_spec, index)]  # noqa: E731
    assert "peek" not in names(0) and "peek" in names(2)  # a task's own tool, on its task only
    assert names(0) == sorted(names(0)) and len(names(0)) == 12
    holdout = list_ors_tasks(_spec(toolbox, "toolboxenvironment", split="holdout"), "t")
    assert [t.metadata["id"] for t in holdout] == [10, 11]


def _tools_of(renderer, spec: ORSSpec, index: int) -> list[dict]:
    return _observation(spec, index).tools


def test_a_conversations_rich_blocks_are_shown_as_the_sdk_flattens_them(quirks, renderer):
    """Reasoning, tool calls and tool results of a `get_messages` prompt are text, as the SDK's `flatten_messages`
    writes them for a `get_prompt` reader: the same text TRL's integration reads, turn by turn."""
    from trl.experimental.openreward.environment import _join_text_blocks

    from raygrpo.envs.ors.client import make_client, sdk_environment

    spec = _spec(quirks, "richconversationenvironment")
    ours = _observation(spec, 0).messages
    assert ours == [
        {"role": "system", "content": "You measure things."},
        {"role": "user", "content": "Look at this:\nHow long is it?"},
        {"role": "assistant", "content": '<think>I should measure it.</think>\n[tool_call measure] {"value": 1}'},
        {"role": "user", "content": "[tool_result (error)]\n1 is wrong\n[tool_result]\nnoted\nTry again."},
    ]
    client = make_client(spec, sync=True)
    try:
        with sdk_environment(spec, client).session(split="train", index=0) as session:
            theirs = _join_text_blocks(session.get_prompt())  # TRL's reset(): the flattened conversation's text
    finally:
        client.close()
    assert "\n".join(f"[{m['role']}]\n{m['content']}" for m in ours) == theirs
    placeholder = _observation(_spec(quirks, "richconversationenvironment", image_blocks="placeholder"), 0)
    assert placeholder.messages[1]["content"] == "Look at this:\n[image]\nHow long is it?"


def test_a_tool_whose_output_is_only_an_image_says_no_output(quirks, renderer):
    """No blank tool message: `(no output)`, as TRL's integration says it (`[image]` when images are shown)."""
    turns = [_call("screenshot"), _call("measure", value=3)]
    traj = _rollout(renderer, _spec(quirks, "richconversationenvironment"), turns)
    assert (traj.status, traj.reward) == (Status.OK, 1.0)
    assert [(m["name"], m["content"]) for m in traj.messages if m["role"] == "tool"] == [
        ("screenshot", "(no output)"), ("measure", "right")]
    shown = _rollout(renderer, _spec(quirks, "richconversationenvironment", image_blocks="placeholder"), turns[:1])
    assert [m["content"] for m in shown.messages if m["role"] == "tool"] == ["[image]"]


def test_tools_python_cannot_name_are_shown_and_work(quirks, renderer):
    """A parameter named `from` (a pydantic alias) and a task tool named `submit-answer` are shown and called (TRL
    cannot bind them as methods, and leaves them out)."""
    spec = _spec(quirks, "quirkytoolsenvironment")
    tools = {t["function"]["name"]: t["function"] for t in _observation(spec, 0).tools}
    assert list(tools) == ["move", "submit-answer"]
    assert tools["move"]["parameters"] == {
        "type": "object", "required": ["from", "to"],
        "properties": {"from": {"type": "string", "description": "Where the piece is."},
                       "to": {"type": "string", "description": "Where it goes."}}}
    traj = _rollout(renderer, spec, [_call("move", **{"from": "a", "to": "b"}), _call("submit-answer", answer="42")])
    assert (traj.status, traj.reward) == (Status.OK, 1.0)
    assert [(m["name"], m["content"]) for m in traj.messages if m["role"] == "tool"] == [
        ("move", "moved a to b"), ("submit-answer", "right")]


def _observation(spec: ORSSpec, index: int):
    async def main():
        provider = ORSProvider(spec, name="t")
        adapter = provider.adapter()
        try:
            return await adapter.start(TaskRef(env="t", index=index))
        finally:
            await adapter.close()
            await provider.aclose()

    return asyncio.run(main())
