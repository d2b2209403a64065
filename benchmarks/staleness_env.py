"""The ORS environment of the staleness benchmark: the echo task, with a seeded random latency per rollout.

A subclass of `examples/echo`'s `EchoEnvironment` (call `echo(text=<target>)`, reward 1.0 on a match, 0.0
otherwise, the episode ends either way; same prompt and tool), so a model warmed up by `examples/echo/warmup.py`
learns it from the reward in a few dozen steps. What this class adds is how long a rollout takes: the `echo` call is answered only after a
latency drawn for each session, so rollouts differ in length the way agentic ones do (an environment step after the
model's turn: a test suite, a tool, a sandbox). The model's turn is generated first, with the weights the engine has
at dispatch; the group is complete, and can be consumed, only when its slowest rollout's `echo` returns. When the
slow latencies span a few training steps (the benchmark's scale 2.5 s), a group whose rollouts all answer quickly is
consumed within a step (0–1 versions stale) and one with a slow rollout later, up to 2 versions stale (or dropped
past `train.max_staleness`); when every latency ends within a step, the producer's run-ahead queues complete groups
and nearly all are consumed `max_staleness` versions stale.

The draw: each rollout is slow with probability `P_SLOW` (latency uniform in `SLOW` × scale) and otherwise fast
(uniform in `FAST` × scale), from one `random.Random(seed)` per split in the server process, one draw per session
in the order the sessions open. With 8 rollouts a group, 1 - (1 - 0.1)^8 ≈ 57% of the groups hold a slow rollout.

How scale and seed reach the server: raygrpo serves this class itself in a Ray actor, so they travel in the split
name, as in `overlap_env.py`: `stale-0.60-s1` means scale 0.60 s, seed 1 (`split_for(scale_s, seed)`, scale rounded
to `SCALE_STEP_S`). `list_splits` lists the grid (an ORS server only accepts the splits it lists).

Serve it on its own (e.g. to poke at it):  python benchmarks/staleness_env.py --port 8000
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from openreward.environments import JSONObject, ToolOutput, tool
from pydantic import BaseModel, Field

from raygrpo.core.imports import load_object

#: The echo example's module (loaded by path, as a run config names it): its task, prompt, tool and reward.
_echo = sys.modules[load_object(f"{Path(__file__).resolve().parent.parent / 'examples/echo/env.py'}:EchoEnvironment")
                    .__module__]
EchoEnvironment = _echo.EchoEnvironment
EchoParams = _echo.EchoParams
#: The echo task's train targets; the benchmark trains on the first.
TARGETS = _echo.TRAIN_TARGETS
#: Probability that a rollout is slow.
P_SLOW = 0.1
#: Latency range of a fast rollout and of a slow one, in units of the split's scale.
FAST = (0.0, 0.5)
SLOW = (1.5, 2.5)
#: The split grid: scales 0 to MAX_SCALE_S in SCALE_STEP_S steps, seeds 0 to MAX_SEED.
MAX_SCALE_S = 4.0
SCALE_STEP_S = 0.05
MAX_SEED = 9
SPLIT_PREFIX = "stale-"

#: One generator per split in this process: the n-th session of a split gets the n-th draw.
_RNGS: dict[str, random.Random] = {}


def split_for(scale_s: float, seed: int) -> str:
    """The split name for latency scale `scale_s` (rounded to the grid) and draw seed `seed`."""
    if not 0 <= scale_s <= MAX_SCALE_S:
        raise ValueError(f"scale must be within 0..{MAX_SCALE_S} s, got {scale_s}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be within 0..{MAX_SEED}, got {seed}")
    return f"{SPLIT_PREFIX}{round(scale_s / SCALE_STEP_S) * SCALE_STEP_S:.2f}-s{seed}"


def parse_split(split: str) -> tuple[float, int]:
    """`(scale_s, seed)` of a `stale-<scale>-s<seed>` split name."""
    if not split.startswith(SPLIT_PREFIX) or "-s" not in split[len(SPLIT_PREFIX):]:
        raise ValueError(f"not a staleness split: {split!r} (expected {SPLIT_PREFIX}<scale>-s<seed>)")
    scale, seed = split[len(SPLIT_PREFIX):].split("-s")
    return float(scale), int(seed)


def draw_latency(rng: random.Random, scale_s: float) -> float:
    """One rollout's latency: slow with probability `P_SLOW`, else fast (see the module docstring)."""
    low, high = SLOW if rng.random() < P_SLOW else FAST
    return scale_s * rng.uniform(low, high)


class StaleTaskSpec(BaseModel):
    target: str
    split: str
    scale_s: float = Field(ge=0)


class StalenessEchoEnvironment(EchoEnvironment):
    """`EchoEnvironment` whose `echo` call returns after this session's drawn latency.

    Args:
        task_spec: `{"target": str, "split": str, "scale_s": float}` (made by `list_tasks`).
        secrets: Per-session secrets (unused).
    """

    def __init__(self, task_spec: JSONObject = {}, secrets: dict[str, str] = {}) -> None:
        super().__init__(task_spec, secrets)
        self.stale = StaleTaskSpec.model_validate(task_spec)
        rng = _RNGS.setdefault(self.stale.split, random.Random(parse_split(self.stale.split)[1]))
        self.latency_s = draw_latency(rng, self.stale.scale_s)

    @classmethod
    def list_splits(cls) -> list[str]:
        scales = round(MAX_SCALE_S / SCALE_STEP_S)
        return [split_for(i * SCALE_STEP_S, seed) for i in range(scales + 1) for seed in range(MAX_SEED + 1)]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        scale, _ = parse_split(split)
        return [{"target": t, "split": split, "scale_s": scale} for t in TARGETS]

    @tool
    async def echo(self, params: EchoParams) -> ToolOutput:
        """Submit a string. Reward 1.0 if it matches the target, else 0.0; either way the episode ends.

        Args:
            text: The string to echo back.
        """
        await asyncio.sleep(self.latency_s)
        return await EchoEnvironment.echo(self, params)


if __name__ == "__main__":
    from raygrpo.envs.ors.server import main

    main(StalenessEchoEnvironment)
