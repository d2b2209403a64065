"""Warm pool and hedged starts: how long a rollout waits for its sandbox, with and without them.

DESIGN section 6, item 6 (issue 18). One env pool actor's provider (`HarborProvider`, plain asyncio: the unit the
actor runs, without Ray) takes rollouts of the example suite `examples/harbor_local/tasks` arriving as a Poisson
process, through the real agent loop (`run_rollout`, tiny tokenizer, a scripted policy whose first turn keeps the
sandbox busy for about `busy_s`). Sandboxes cost no CPU: the null backend (`raygrpo.testing.null`) with start times
drawn here (`TimedStartNull`). The rollouts' tasks are known ahead, as the training schedule and the orchestrator's
queue know them: each is told to the provider (`HarborProvider.expect`) `lookahead_s` before it arrives.

- `pool`: starts uniform in [2, 10] s; without a warm pool, and with `warm_pool: {size: auto}`. Reports the time from
  dispatch to the first model turn (p50, p95), and the warm pool's idle sandbox-seconds (ready, untaken) against the
  rollouts' busy sandbox-seconds. Targets: p95 with the pool ≤ 10% of p95 without; idle ≤ 25% of busy.
- `hedge`: heavy-tailed starts (5% take 30 s, the rest [2, 10] s), no warm pool; without and with `hedge` (its
  defaults: the 90th percentile of recent starts, floor 5 s, cap 60 s). Reports the p99 rollout time (dispatch to closed) and the extra starts hedging cost.

The issue's figures are at `--time-scale 1` (2 arrivals/s, 300 rollouts, ~20 s busy, 2–10 s starts; about 15
minutes for both arms). The default `--time-scale 0.25` divides every duration by 4 and multiplies the arrival rate
by 4 (about 4 minutes); the ratios are what to compare. Prints progress to stderr and one JSON object last.
Run: `python benchmarks/warm_pool.py` (`--arms pool` or `--arms hedge` for one).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from raygrpo.testing.null import NullEnvironment  # noqa: E402

TASKS = ROOT / "examples" / "harbor_local" / "tasks"
ARMS = ("pool", "hedge")


def log(msg: str) -> None:
    print(f"[warm_pool] {msg}", file=sys.stderr, flush=True)


class TimedStartNull(NullEnvironment):
    """The null backend whose `start` takes a drawn time: `tail_s` with probability `tail_rate`, else uniform in
    [`low_s`, `high_s`] (seeded per process by `seed`, drawn in start order)."""

    _rng: random.Random | None = None

    def __init__(self, *args: Any, low_s: float = 2.0, high_s: float = 10.0, tail_rate: float = 0.0,
                 tail_s: float = 30.0, seed: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._draw = (low_s, high_s, tail_rate, tail_s)
        if TimedStartNull._rng is None:
            TimedStartNull._rng = random.Random(seed)

    async def start(self, force_build: bool) -> None:
        low, high, tail_rate, tail_s = self._draw
        rng = TimedStartNull._rng
        await asyncio.sleep(tail_s if rng.random() < tail_rate else rng.uniform(low, high))
        await super().start(force_build)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_case(*, rate: float, count: int, busy_s: float, start: dict[str, float], lookahead_s: float,
                   seed: int, warm_pool: dict[str, Any] | None = None,
                   hedge: dict[str, Any] | None = None) -> dict[str, Any]:
    """`count` Poisson arrivals at `rate`/s through one provider; returns the rollouts' figures."""
    from transformers import AutoTokenizer

    from raygrpo.agent.chat import ChatRenderer
    from raygrpo.config.rollout import RolloutConfig
    from raygrpo.envs.harbor.provider import HarborProvider
    from raygrpo.envs.harbor.tasks import list_harbor_tasks
    from raygrpo.policy.base import SamplingParams
    from raygrpo.policy.scripted import ScriptedPolicy
    from raygrpo.policy.tiny import resolve_model_path
    from raygrpo.governor.gate import reset_gates
    from raygrpo.agent.rollout import run_rollout
    from raygrpo.specs.harbor import HarborSpec
    from raygrpo.agent.toolcalls import format_tool_call

    TimedStartNull._rng = None
    reset_gates()
    spec = HarborSpec.model_validate({
        "path": str(TASKS), "import_path": "warm_pool:TimedStartNull", "probe_verifier": False,
        "environment_kwargs": {"reward": 1.0, "seed": seed, **start},
        "start_timeout_s": 300, "warm_pool": warm_pool, "hedge": hedge,
    })
    provider = HarborProvider(spec, name="bench")
    tasks = list_harbor_tasks(spec, "bench")
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model_path("tiny")))
    rng = random.Random(seed + 1)
    first_turn: dict[str, float] = {}
    busy_for: dict[str, float] = {}

    async def script(ctx) -> str:
        key = ctx.task.metadata["bench_key"]
        if ctx.turn == 0:
            first_turn[key] = time.monotonic()
            await asyncio.sleep(busy_for[key])
            return format_tool_call("bash", {"command": "true"})
        return "Done."

    policy = ScriptedPolicy(renderer.tokenizer, script)
    config = RolloutConfig(max_turns=2, max_total_tokens=4096, rollout_timeout_s=600)
    # The first arrival comes once the first tasks could have been told `lookahead_s` ahead (a schedule known before
    # its first step), so the run measures the pool in use rather than a pool that was told of nothing.
    arrivals, t = [], lookahead_s
    for i in range(count):
        t += rng.expovariate(rate)
        task = rng.choice(tasks)
        arrivals.append((t, dataclasses.replace(task, metadata={**task.metadata, "bench_key": str(i)})))
    for i, (_, task) in enumerate(arrivals):
        busy_for[str(i)] = busy_s * rng.uniform(0.8, 1.2)
    results: list[dict[str, Any]] = []
    t0 = time.monotonic()

    async def one(i: int, at: float, task) -> None:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        dispatched = time.monotonic()
        traj = await run_rollout(task, provider.adapter(), policy, renderer, SamplingParams(max_tokens=64), config)
        done = time.monotonic()
        key = str(i)
        results.append({"status": traj.status.value, "sandbox": traj.sandbox,
                        "to_first_turn": first_turn.get(key, done) - dispatched, "total": done - dispatched,
                        "busy": done - first_turn.get(key, done)})

    async def tell() -> None:
        for at, task in arrivals:  # each task is told `lookahead_s` before it comes
            await asyncio.sleep(max(0.0, t0 + at - lookahead_s - time.monotonic()))
            provider.expect([task])

    teller = asyncio.create_task(tell())
    last = 0
    runs = [asyncio.create_task(one(i, at, task)) for i, (at, task) in enumerate(arrivals)]
    while not all(r.done() for r in runs):
        await asyncio.sleep(1.0)
        if len(results) - last >= max(1, count // 10):
            last = len(results)
            log(f"  {len(results)}/{count} rollouts done ({time.monotonic() - t0:.0f} s)")
    await asyncio.gather(*runs)
    teller.cancel()
    stats = provider.stats()
    await provider.aclose()
    ok = [r for r in results if r["status"] == "ok"]
    waits = [r["to_first_turn"] for r in ok]
    totals = [r["total"] for r in ok]
    busy = sum(r["busy"] for r in ok)
    warm = stats.get("warm_pool", {})
    starts = stats["starts"]
    return {
        "rollouts": count, "ok": len(ok),
        "to_first_turn_s": {"p50": round(percentile(waits, 0.5), 3), "p95": round(percentile(waits, 0.95), 3)},
        "rollout_s": {"p50": round(percentile(totals, 0.5), 3), "p99": round(percentile(totals, 0.99), 3)},
        "busy_sandbox_s": round(busy, 1),
        "idle_sandbox_s": round(float(warm.get("idle_s", 0.0)), 1),
        "sandboxes": {k: sum(1 for r in ok if r["sandbox"] == k) for k in ("cold", "hedged", "warm")},
        "starts": starts["starts"] + starts["hedged"], "hedged": starts["hedged"], "hedge_wins": starts["hedge_wins"],
        "warm_pool": warm or None,
        "leaked": stats["open_sandboxes"],
    }


def pool_arm(args) -> dict[str, Any]:
    s = args.time_scale
    common = dict(rate=2.0 / s, count=args.rollouts, busy_s=20.0 * s, lookahead_s=15.0 * s, seed=args.seed,
                  start={"low_s": 2.0 * s, "high_s": 10.0 * s})
    log("pool arm: without a warm pool")
    without = asyncio.run(run_case(**common))
    log("pool arm: with warm_pool {size: auto}")
    with_pool = asyncio.run(run_case(**common, warm_pool={"size": "auto", "max_size": 64, "ttl_s": 300 * s}))
    ratio = with_pool["to_first_turn_s"]["p95"] / max(without["to_first_turn_s"]["p95"], 1e-9)
    idle = with_pool["idle_sandbox_s"] / max(with_pool["busy_sandbox_s"], 1e-9)
    return {"without": without, "with_pool": with_pool,
            "p95_ratio": round(ratio, 4), "p95_target": 0.10, "p95_ok": ratio <= 0.10,
            "idle_to_busy": round(idle, 4), "idle_target": 0.25, "idle_ok": idle <= 0.25}


def hedge_arm(args) -> dict[str, Any]:
    s = args.time_scale
    common = dict(rate=2.0 / s, count=args.rollouts, busy_s=20.0 * s, lookahead_s=15.0 * s, seed=args.seed,
                  start={"low_s": 2.0 * s, "high_s": 10.0 * s, "tail_rate": 0.05, "tail_s": 30.0 * s})
    log("hedge arm: heavy-tailed starts, no hedging")
    without = asyncio.run(run_case(**common))
    log("hedge arm: heavy-tailed starts, hedged")
    hedged = asyncio.run(run_case(**common, hedge={"percentile": 0.9, "floor_s": 5.0 * s, "cap_s": 60.0 * s,
                                                   "min_samples": 10}))
    return {"without": without, "hedged": hedged,
            "p99_rollout_s": {"without": without["rollout_s"]["p99"], "hedged": hedged["rollout_s"]["p99"]},
            "extra_starts": hedged["hedged"],
            "extra_start_fraction": round(hedged["hedged"] / max(1, args.rollouts), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--rollouts", type=int, default=300)
    parser.add_argument("--time-scale", type=float, default=0.25,
                        help="multiplies every duration and divides the arrival rate (1: the issue's figures)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"--arms: unknown {unknown}; choose from {list(ARMS)}")
    began = time.monotonic()
    out: dict[str, Any] = {"time_scale": args.time_scale, "rollouts": args.rollouts}
    if "pool" in arms:
        out["pool"] = pool_arm(args)
    if "hedge" in arms:
        out["hedge"] = hedge_arm(args)
    out["wall_s"] = round(time.monotonic() - began, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
