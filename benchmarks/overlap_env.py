"""The ORS environment of the learner-overlap benchmark: every rollout takes at least a set latency.

The latency stands in for a slow environment (a sandbox start, a remote service). It is paid when the session's
prompt is fetched (`get_prompt` awaits it), which the agent loop does before the model's first turn, so every rollout
takes at least that long whatever the model writes, tool call or not. The tiny untrained model rarely calls a tool;
its rollouts then end unscored after one turn, which costs the learner the same training compute as a scored one.

How the latency reaches the server: raygrpo serves this class itself, in a Ray actor (`raygrpo.actors.ors_server`)
whose process the benchmark cannot configure, so the latency travels in the split name, which the run config already
sends: `split: latency-1.25` means 1.25 s per rollout. `list_splits` offers a grid of such names (0.00 to
`MAX_LATENCY_S` s in 10 ms steps: an ORS server only accepts splits it lists, and checks the name against
all of them at every session it opens, so the grid stays short), `list_tasks` parses the name and puts
the latency into every task spec, and each session reads it back from its own task. Use `split_for(latency_s)` to
build the name (rounded to the grid).

The one tool, `answer(text)`, ends the episode with reward 1.0 for a non-empty text (0.0 otherwise).

Serve it on its own (e.g. to poke at it):  python benchmarks/overlap_env.py --port 8000
"""

from __future__ import annotations

import argparse
import asyncio

from openreward.environments import Environment, JSONObject, Server, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field

#: Largest latency the split grid offers, in seconds.
MAX_LATENCY_S = 5.0
#: Grid step of the latency splits, in seconds.
LATENCY_STEP_S = 0.01
#: Tasks per split (their words only vary the prompts).
WORDS = ["hello", "world", "yes", "done", "ok", "the answer", "think step", "hello world"]
SPLIT_PREFIX = "latency-"


def split_for(latency_s: float) -> str:
    """The split name that gives every rollout `latency_s` seconds of latency (rounded to 10 ms)."""
    if not 0 <= latency_s <= MAX_LATENCY_S:
        raise ValueError(f"latency must be within 0..{MAX_LATENCY_S} s, got {latency_s}")
    return f"{SPLIT_PREFIX}{round(latency_s / LATENCY_STEP_S) * LATENCY_STEP_S:.2f}"


def latency_of(split: str) -> float:
    """The latency, in seconds, that a `latency-<seconds>` split name stands for."""
    if not split.startswith(SPLIT_PREFIX):
        raise ValueError(f"not a latency split: {split!r} (expected {SPLIT_PREFIX}<seconds>)")
    return float(split[len(SPLIT_PREFIX):])


class OverlapTaskSpec(BaseModel):
    word: str
    latency_s: float = Field(ge=0)


class AnswerParams(BaseModel):
    text: str


class OverlapEnvironment(Environment):
    """Wait `latency_s` before handing out the prompt; `answer(text)` ends the episode.

    Args:
        task_spec: `{"word": str, "latency_s": float}` (made by `list_tasks`).
        secrets: Per-session secrets (unused).
    """

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec)
        self.config = OverlapTaskSpec.model_validate(task_spec)

    @classmethod
    def list_splits(cls) -> list[str]:
        steps = round(MAX_LATENCY_S / LATENCY_STEP_S)
        return [f"{SPLIT_PREFIX}{i * LATENCY_STEP_S:.2f}" for i in range(steps + 1)]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        latency = latency_of(split)
        return [{"word": w, "latency_s": latency} for w in WORDS]

    async def get_prompt(self) -> list[TextBlock]:
        await asyncio.sleep(self.config.latency_s)
        return [TextBlock(type="text", text=f"Answer '{self.config.word}' to win. Call the answer tool with it.")]

    @tool
    async def answer(self, params: AnswerParams) -> ToolOutput:
        """Submit an answer. Reward 1.0 if it is not empty, else 0.0; either way the episode ends.

        Args:
            text: The answer.
        """
        return ToolOutput(
            blocks=[TextBlock(type="text", text="accepted" if params.text else "empty")],
            reward=1.0 if params.text else 0.0,
            finished=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    Server([OverlapEnvironment]).run(host=args.host, port=args.port)
