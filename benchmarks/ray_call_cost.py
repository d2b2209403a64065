"""What Ray costs per rollout with nothing in the rollout: the floor under `provisioning.py`'s remote arm.

The remote arm's `cpu_ms_per_rollout` counts the driver and every process of the Ray session. Part of it is Ray's
own: each rollout is one call of an async actor method (submitted by the driver, run on the actor's event loop, its
return value serialized and stored, the driver waking on it through `ray.wait`), and a Ray session spends CPU when
nothing runs. This script makes the same calls with nothing inside them: 2 async actors (`max_concurrency` as
raygrpo's env pool actors get for K = 32), batches of 64 calls that each hold for `--hold-s` (the remote arm's 1.4 s
ideal rollout) and return `--payload-bytes` of data (4.5 KB: the median of the remote arm's trajectories pickled,
3.7–5.4 KB), collected as the orchestrator does (`ray.wait` one at a time). `--per-call N` puts N of them in one call
that returns their N payloads in a list, as the orchestrator sends a group's rollouts (`EnvPool.run_many`). Counted the
same way (`session_cpu.SessionCpu`): the CPU per rollout over the timed batches, per process, and what the session
costs idle over as long a wall right after.

Run: `python benchmarks/ray_call_cost.py` (about 30 s). Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--per-actor", type=int, default=32)
    parser.add_argument("--calls", type=int, default=64, help="rollouts per batch")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--hold-s", type=float, default=1.4)
    parser.add_argument("--payload-bytes", type=int, default=4_500)
    parser.add_argument("--per-call", type=int, default=1, help="rollouts per call (a group's, in one list)")
    args = parser.parse_args()

    import ray

    from raygrpo.driver.runtime import init_ray, shutdown_ray
    from session_cpu import SessionCpu

    @ray.remote(num_cpus=0)
    class Holder:
        async def run(self, i: int, hold_s: float, payload: int) -> dict:
            await asyncio.sleep(hold_s)
            return {"i": i, "data": bytes(payload)}

        async def run_many(self, items: list[int], hold_s: float, payload: int) -> list[dict]:
            return list(await asyncio.gather(*(self.run(i, hold_s, payload) for i in items)))

    init_ray(num_cpus=8)
    try:
        actors = [Holder.options(max_concurrency=args.per_actor + 16).remote() for _ in range(args.actors)]
        ray.get([a.run.remote(0, 0.0, 0) for a in actors])

        def batch() -> float:
            began = time.perf_counter()
            if args.per_call == 1:
                pending = [actors[i % len(actors)].run.remote(i, args.hold_s, args.payload_bytes)
                           for i in range(args.calls)]
            else:
                starts = range(0, args.calls, args.per_call)
                pending = [actors[n % len(actors)].run_many.remote(list(range(i, min(i + args.per_call, args.calls))),
                                                                   args.hold_s, args.payload_bytes)
                           for n, i in enumerate(starts)]
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)
            return time.perf_counter() - began

        batch()
        cpu = SessionCpu(exclude=set())
        cpu.sample()
        before, began = cpu.by_kind(), time.perf_counter()
        walls = [batch() for _ in range(args.repeats)]
        wall = time.perf_counter() - began
        cpu.sample()
        busy = cpu.by_kind()
        time.sleep(wall)
        cpu.sample()
        idle = cpu.by_kind()
    finally:
        shutdown_ray()
    rollouts = args.calls * args.repeats

    def per_rollout(after: dict[str, float], start: dict[str, float]) -> dict[str, float]:
        ms = {k: round(1000 * (v - start.get(k, 0.0)) / rollouts, 2) for k, v in after.items()}
        return {k: v for k, v in ms.items() if v}

    busy_ms, idle_ms = per_rollout(busy, before), per_rollout(idle, busy)
    print(json.dumps({
        "cpu_ms_per_rollout": round(sum(busy_ms.values()), 2),
        "idle_cpu_ms_per_rollout_equivalent": round(sum(idle_ms.values()), 2),
        "cpu_ms_per_rollout_by_process": busy_ms,
        "idle_cpu_ms_by_process": idle_ms,
        "batch_walls_s": [round(w, 3) for w in walls],
        **vars(args),
    }))


if __name__ == "__main__":
    main()
