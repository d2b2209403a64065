"""raygrpo's rollout path alone: the CPU of one rollout in an env pool actor's worker, without Ray.

The remote arm of `provisioning.py` states the CPU per rollout of the whole Ray session, where Ray's own share
(`ray_call_cost.py`: ~3.3 ms per actor call, most of it an idle session's background) and the run-to-run noise
(±15%) hide what the rollout path itself costs. This runs the same rollouts (the example suite's 8 tasks × 8, the
null backend under the fault injector with 1.0 s starts, 50 ms execs and a 200 ms verifier, the scripted policy, the
Harbor adapter, the agent loop) through one `RolloutWorker` on this process's event loop, built and set up as an
env pool actor builds its own (`raygrpo.actors.heap.freeze_heap` after the build), and measures this process's
CPU (`getrusage`, every thread) over `--repeats` batches after a first one: `cpu_ms_per_rollout` is their mean (a
full collection lands in one batch, and counts), the rollout path's share of an env pool actor's CPU per rollout;
the garbage collector's runs in the timed batches are reported beside it.

`--no-freeze` leaves the heap unfrozen (as the actors were before), `--profile N` prints the N functions with the
most CPU of their own (cProfile on the thread's CPU clock, which inflates every figure: compare them with each
other, not with the total). Prints one JSON object. Run: `python benchmarks/rollout_path.py` (~20 s).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from provisioning import REMOTE_FAULTS, raygrpo_config  # noqa: E402


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class GcRuns:
    """Collections per generation and the CPU they took, from `gc.callbacks`."""

    def __init__(self) -> None:
        self.runs = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._began = 0.0
        gc.callbacks.append(self._observe)

    def _observe(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.thread_time()
        else:
            generation = info["generation"]
            self.runs[generation] += 1
            self.seconds[generation] += time.thread_time() - self._began

    def reset(self) -> None:
        self.runs, self.seconds = [0, 0, 0], [0.0, 0.0, 0.0]


async def measure(args) -> dict:
    from raygrpo.actors.heap import freeze_heap
    from raygrpo.driver.resolve import resolve_run
    from raygrpo.agent.worker import RolloutWorker, WorkerSettings

    cfg = raygrpo_config(list(range(args.tasks)), 1, args.tasks * args.group_size, faults=REMOTE_FAULTS, remote=True)
    tasks = [t for refs in resolve_run(cfg).tasks_by_env.values() for t in refs]
    worker = RolloutWorker.build(WorkerSettings(
        name="rollout-path", envs=dict(cfg.envs), policy=cfg.policy, model=cfg.model, sampling=cfg.sampling,
        rollout=cfg.rollout, max_concurrent_per_actor=len(tasks) * args.group_size,
        providers=dict(cfg.providers)))
    if not args.no_freeze:
        freeze_heap()
    total = len(tasks) * args.group_size

    async def batch() -> None:
        trajs = await asyncio.gather(*(worker.run(task, f"g{i}", 0, s) for i, task in enumerate(tasks)
                                       for s in range(args.group_size)))
        bad = [t.status.value for t in trajs if t.reward != 1.0]
        if bad:
            raise RuntimeError(f"{len(bad)} of {total} rollouts did not score 1.0: {bad[:5]}")

    gcs = GcRuns()
    try:
        await batch()  # the first batch makes the trial dirs' spares and warms the caches
        profile = cProfile.Profile(time.thread_time) if args.profile else None
        gcs.reset()
        per_batch, walls = [], []
        for _ in range(args.repeats):
            began_cpu, began = _cpu_s(), time.perf_counter()
            if profile is not None:
                profile.enable()
            await batch()
            if profile is not None:
                profile.disable()
            walls.append(time.perf_counter() - began)
            per_batch.append(1000 * (_cpu_s() - began_cpu) / total)
    finally:
        await worker.aclose()
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.profile)
        print(out.getvalue(), file=sys.stderr)
    return {
        "rollouts_per_batch": total, "repeats": args.repeats, "heap_frozen": not args.no_freeze,
        "cpu_ms_per_rollout": round(statistics.fmean(per_batch), 3),
        "cpu_ms_per_rollout_batches": [round(x, 3) for x in per_batch],
        "batch_seconds": [round(w, 3) for w in walls], "profiled": bool(args.profile),
        "gc_runs_by_generation": gcs.runs, "gc_ms_per_rollout": round(1000 * sum(gcs.seconds) / (total * args.repeats), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--no-freeze", action="store_true", help="leave the heap unfrozen")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print the N costliest functions")
    print(json.dumps(asyncio.run(measure(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
