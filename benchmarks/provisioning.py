"""Provisioning: a batch of 64 Harbor rollouts whose sandbox start takes 1.0 s, TRL-style serial vs raygrpo.

DESIGN section 6, item 1. Both arms run the example suite `examples/harbor_local/tasks` (8 tasks × 8 rollouts) in
raygrpo's local sandbox backend, with 1.0 s of injected start latency, each rollout replaying the task's
`solution/solve.sh` through `bash` and then running the task's verifier:

- **serial**: TRL's own `HarborBashEnv` (only its backend swapped for the local one plus the same 1.0 s start
  latency), driven the way GRPOTrainer drives it: every `reset` of the batch one after another, then each rollout's
  call, then the rewards. It runs 16 rollouts and its time is scaled to 64 (`serial_seconds`, stated as such in
  the output).
- **raygrpo**: the real rollout path (env pool actors, agent loop, scripted policy, Harbor adapter, the fault
  wrapper's start latency), warm pool off; Ray start-up and actor creation outside the timer.

`ideal_seconds` = the start latency + the longest rollout when each task runs alone (measured in the same run, through
raygrpo without injected latency). Prints progress to stderr and one JSON object last. Run:
`python benchmarks/provisioning.py` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from raygrpo.sandbox.local import LocalSandboxEnvironment  # noqa: E402

TASKS = ROOT / "examples" / "harbor_local" / "tasks"
POLICIES = ROOT / "examples" / "harbor_local" / "policies.py"
START_LATENCY_S = 1.0


def log(msg: str) -> None:
    print(f"[provisioning] {msg}", file=sys.stderr, flush=True)


class SlowStartSandbox(LocalSandboxEnvironment):
    """The local sandbox with the benchmark's start latency, for TRL's arm (loaded by import path)."""

    async def start(self, force_build: bool) -> None:
        await asyncio.sleep(START_LATENCY_S)
        await super().start(force_build)


def task_dirs(count: int) -> list[Path]:
    dirs = sorted(p for p in TASKS.iterdir() if (p / "task.toml").is_file())
    return dirs[:count]


# ── serial arm: TRL's HarborBashEnv ────────────────────────────────────────────────────────────────────────────────


def run_serial(dirs: list[Path]) -> float:
    from unittest import mock

    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.trial.config import EnvironmentConfig
    from trl.experimental.harbor._env import HarborBashEnv

    create = EnvironmentFactory.create_environment_from_config

    def create_local(config, **kwargs):
        # TRL hard-codes `type=`; swap only the backend, everything else is TRL's own start sequence.
        return create(config=EnvironmentConfig(import_path="provisioning:SlowStartSandbox"), **kwargs)

    envs = [HarborBashEnv(environment_type="docker") for _ in dirs]
    try:
        with mock.patch.object(EnvironmentFactory, "create_environment_from_config", staticmethod(create_local)):
            start = time.perf_counter()
            for env, task_dir in zip(envs, dirs):
                env.reset(task_dir=str(task_dir))
            for env, task_dir in zip(envs, dirs):
                env.bash((task_dir / "solution" / "solve.sh").read_text())
            rewards = [env.reward for env in envs]
            wall = time.perf_counter() - start
    finally:
        # Stop the sandboxes now; TRL's `__del__` then finds nothing to stop and ends each env's loop thread.
        for env in envs:
            env._run(env._stop())
    if rewards != [1.0] * len(dirs):
        raise RuntimeError(f"TRL arm: expected every reward 1.0, got {rewards}")
    return wall


# ── raygrpo ────────────────────────────────────────────────────────────────────────────────────────────────────────


def raygrpo_config(indices: list[int], latency_s: float, actors: int, per_actor: int):
    from raygrpo.config import load_config

    harbor = {"kind": "harbor", "path": str(TASKS), "indices": indices, "exec_timeout_s": 60, "verifier_timeout_s": 60}
    if latency_s:
        harbor["faults"] = {"start_latency_s": latency_s}
    return load_config(data={
        "envs": {"local": harbor},
        "policy": {"kind": "scripted", "script": f"{POLICIES}:right"},
        "sampling": {"max_tokens": 2048},
        "rollout": {"group_size": 1, "max_turns": 3, "max_total_tokens": 8192},
        "workers": {"num_env_actors": actors, "max_concurrent_per_actor": per_actor},
    })


def _runtime(cfg):
    """The run's actors on Ray, for a config resolved here."""
    from raygrpo.launch import RolloutRuntime
    from raygrpo.resolve import resolve_run

    return RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env)


def run_batch(runtime, requests) -> tuple[float, list]:
    from raygrpo.orchestrator import Orchestrator

    orchestrator = Orchestrator(runtime.actors, max_in_flight_per_actor=runtime.cfg.workers.max_concurrent_per_actor)
    start = time.perf_counter()
    trajs = list(orchestrator.run(requests))
    return time.perf_counter() - start, trajs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task (64 in all by default)")
    parser.add_argument("--serial-rollouts", type=int, default=16)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="raygrpo batches; the median is reported")
    args = parser.parse_args()

    from raygrpo.orchestrator import make_groups
    from raygrpo.runtime import init_ray, shutdown_ray

    dirs = task_dirs(args.tasks)
    total = len(dirs) * args.group_size
    per_actor = -(-total // args.actors)
    init_ray(num_cpus=8)
    try:
        # Each task alone, no injected latency: the longest one bounds any batch.
        with _runtime(raygrpo_config(list(range(len(dirs))), 0.0, 1, 1)) as runtime:
            alone = []
            for task in runtime.tasks:
                wall, trajs = run_batch(runtime, make_groups([task], 1))
                assert trajs[0].reward == 1.0, trajs[0]
                alone.append(wall)
        ideal = START_LATENCY_S + max(alone)
        log(f"each task alone: longest {max(alone):.3f} s -> ideal {ideal:.3f} s")

        with _runtime(raygrpo_config(list(range(len(dirs))), START_LATENCY_S, args.actors, per_actor)) as rt:
            batches = []
            for r in range(args.repeats):
                wall, trajs = run_batch(rt, make_groups(rt.tasks, args.group_size))
                rewards = [t.reward for t in trajs]
                if len(trajs) != total or rewards != [1.0] * total:
                    raise RuntimeError(f"raygrpo arm: {len(trajs)} rollouts, statuses {[t.status for t in trajs]}")
                batches.append(wall)
                log(f"raygrpo batch {r + 1}: {total} rollouts in {wall:.2f} s")
        shutdown_ray()

        serial_dirs = [dirs[i % len(dirs)] for i in range(args.serial_rollouts)]
        serial_measured = run_serial(serial_dirs)
        serial = serial_measured * total / len(serial_dirs)
        log(f"serial (TRL): {len(serial_dirs)} rollouts in {serial_measured:.2f} s -> {serial:.1f} s for {total}")
    finally:
        shutdown_ray()

    raygrpo_s = statistics.median(batches)
    print(json.dumps({
        "serial_seconds": round(serial, 2),
        "raygrpo_seconds": round(raygrpo_s, 3),
        "speedup": round(serial / raygrpo_s, 1),
        "ideal_seconds": round(ideal, 3),
        "ratio_to_ideal": round(raygrpo_s / ideal, 3),
        "rollouts": total,
        "start_latency_s": START_LATENCY_S,
        "serial_measured_rollouts": len(serial_dirs),
        "serial_measured_seconds": round(serial_measured, 2),
        "serial_note": f"TRL arm ran {len(serial_dirs)} rollouts; its time is scaled to {total}",
        "raygrpo_batches_s": [round(b, 3) for b in batches],
        "alone_seconds": [round(a, 3) for a in alone],
        "actors": args.actors,
        "max_concurrent_per_actor": per_actor,
    }))


if __name__ == "__main__":
    main()
