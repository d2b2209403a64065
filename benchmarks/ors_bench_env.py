"""The ORS environment the throughput benchmark runs against.

Each episode is `CALLS_PER_EPISODE` calls of `step`; every call answers after `STEP_SECONDS` (standing in for a hosted
environment across a network and the environment's own work); only the last call is rewarded. Run it as a server
with `python benchmarks/ors_bench_env.py --port 8000` (binds 127.0.0.1).
"""

from __future__ import annotations

import argparse
import asyncio

from openreward.environments import Environment, JSONObject, Server, TextBlock, ToolOutput, tool
from pydantic import BaseModel

STEP_SECONDS = 0.05
CALLS_PER_EPISODE = 4
NUM_TASKS = 256


class StepParams(BaseModel):
    n: int


class BenchEnvironment(Environment):
    """Call `step(n)` with n = 1, 2, ... until the episode finishes."""

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}):
        super().__init__(task_spec)
        self.calls = 0

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return [{"id": i, "calls": CALLS_PER_EPISODE} for i in range(NUM_TASKS)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(type="text", text=f"Call step {CALLS_PER_EPISODE} times.")]

    @tool
    async def step(self, params: StepParams) -> ToolOutput:
        """Take one step.

        Args:
            n: The step number, from 1.
        """
        await asyncio.sleep(STEP_SECONDS)
        self.calls += 1
        finished = self.calls >= CALLS_PER_EPISODE
        return ToolOutput(
            blocks=[TextBlock(type="text", text=f"step {self.calls} done")],
            reward=1.0 if finished else None,
            finished=finished,
        )


def policy(ctx) -> str:
    """Scripted policy for the raygrpo arm: one `step` call per turn."""
    from raygrpo.agent.toolcalls import format_tool_call

    return format_tool_call("step", {"n": ctx.turn + 1})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    Server([BenchEnvironment]).run(host=args.host, port=args.port)
