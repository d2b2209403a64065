"""Provisioning: 64 Harbor rollouts whose sandbox start takes 1.0 s, TRL's serial path vs raygrpo, in two arms.

DESIGN section 6, item 1 (issue 18). Both arms run the example suite `examples/harbor_local/tasks` (8 tasks × 8
rollouts), each rollout replaying the task's `solution/solve.sh` through `bash` and then running the task's verifier.
TRL's side is its own `HarborBashEnv` (only its backend swapped), driven the way GRPOTrainer drives it: every `reset`
of the batch one after another, then each rollout's call, then the rewards; it runs `--serial-rollouts` (16) and its
time is scaled to the batch (stated as such in the output). raygrpo's side is the real rollout path (env pool
actors, agent loop, scripted policy, Harbor adapter, the fault wrapper), warm pool off; Ray start-up and actor
creation outside the timer; the median of `--repeats` batches.

- `remote`: sandboxes that cost no local CPU, as a remote provider's do: the null backend
  (`raygrpo.sandbox.null:NullEnvironment`, its verifier finds reward 1.0) under the fault injector with 1.0 s per
  start, 50 ms per exec and 200 ms more for the verifier's test script. The ideal is computed from those latencies,
  not measured through raygrpo: `start + tool_calls × exec + (verifier_execs × exec + verifier)`, with `tool_calls`
  the most tool calls of any rollout and `verifier_execs` the execs Harbor's verifier makes (3: removing old rewards,
  `chmod +x`, the test). Anything else raygrpo sends the sandbox (its verifier probe) counts against it. Targets:
  `speedup ≥ 30`, `ratio_to_ideal ≤ 1.3`.
- `local`: raygrpo's bwrap backend with 1.0 s of injected start latency. `ideal` = 1.0 s + the longest task run alone
  (through raygrpo, no injected latency, measured in the same run). The sandboxes' own processes run on the same
  cores as raygrpo, so the limit is `max(ideal, sandbox_cpu_s / cores)`, where `sandbox_cpu_s` is the CPU of the same
  64 rollouts' sandbox commands (start, `solve.sh`, Harbor's verifier, stop) run one after another through the
  backend in this process, without Ray or the agent loop (`getrusage` of its children). Target:
  `ratio_to_limit ≤ 1.3`.

raygrpo's own CPU per rollout (`remote.cpu_ms_per_rollout`) is measured over this process and every process of its
Ray session (psutil over all descendants, `benchmarks/session_cpu.py`) during the timed batches, so work moved from
one process to another does not count as saved; `machine_cpu_ms_per_rollout` is the whole machine's busy CPU over
the same batches (/proc/stat), an upper bound from outside any process list (on a machine otherwise idle). (The
`local` arm does not state them: its sandboxes' short-lived processes are not seen by the sampler.)

Prints progress to stderr and one JSON object last, a section per arm. Run: `python benchmarks/provisioning.py`
(`--arms remote` or `--arms local` for one; about 3 minutes for both on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from raygrpo.sandbox.local import LocalSandboxEnvironment  # noqa: E402

TASKS = ROOT / "examples" / "harbor_local" / "tasks"
POLICIES = ROOT / "examples" / "harbor_local" / "policies.py"
NULL_BACKEND = "raygrpo.sandbox.null:NullEnvironment"
START_LATENCY_S = 1.0
#: The remote arm's injected latencies.
REMOTE_FAULTS = {"start_latency_s": START_LATENCY_S, "exec_latency_s": 0.05, "verifier_latency_s": 0.2}
#: Execs Harbor's verifier makes per rollout: removing old reward files, `chmod +x` of the test, the test.
VERIFIER_EXECS = 3
ARMS = ("remote", "local")


def log(msg: str) -> None:
    print(f"[provisioning] {msg}", file=sys.stderr, flush=True)


class SlowStartSandbox(LocalSandboxEnvironment):
    """The local sandbox with the local arm's start latency, for TRL's side (loaded by import path)."""

    async def start(self, force_build: bool) -> None:
        await asyncio.sleep(START_LATENCY_S)
        await super().start(force_build)


def task_dirs(count: int) -> list[Path]:
    dirs = sorted(p for p in TASKS.iterdir() if (p / "task.toml").is_file())
    return dirs[:count]


# ── TRL's serial path: HarborBashEnv ──────────────────────────────────────────────────────────────────────────────


def run_serial(dirs: list[Path], import_path: str, kwargs: dict[str, Any] | None = None,
               faults: dict[str, Any] | None = None) -> float:
    """TRL's `HarborBashEnv` over `dirs`, its backend swapped for `import_path` (wrapped in the fault injector when
    `faults` is given); returns the wall time of the resets, calls and rewards."""
    from unittest import mock

    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.trial.config import EnvironmentConfig
    from trl.experimental.harbor._env import HarborBashEnv

    from raygrpo.sandbox.faults import wrap_environment

    create = EnvironmentFactory.create_environment_from_config

    def create_swapped(config, **factory_kwargs):
        # TRL hard-codes `type=`; swap only the backend, everything else is TRL's own start sequence.
        env = create(config=EnvironmentConfig(import_path=import_path, kwargs=dict(kwargs or {})), **factory_kwargs)
        return wrap_environment(env, faults)

    envs = [HarborBashEnv(environment_type="docker") for _ in dirs]
    try:
        with mock.patch.object(EnvironmentFactory, "create_environment_from_config", staticmethod(create_swapped)):
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
        raise RuntimeError(f"TRL side: expected every reward 1.0, got {rewards}")
    return wall


def serial_figures(dirs: list[Path], count: int, total: int, **backend: Any) -> dict[str, Any]:
    serial_dirs = [dirs[i % len(dirs)] for i in range(count)]
    measured = run_serial(serial_dirs, **backend)
    serial = measured * total / count
    log(f"serial (TRL): {count} rollouts in {measured:.2f} s -> {serial:.1f} s for {total}")
    return {"serial_seconds": serial, "serial_measured_rollouts": count, "serial_measured_seconds": round(measured, 2),
            "serial_note": f"TRL's side ran {count} rollouts; its time is scaled to {total}"}


# ── raygrpo ────────────────────────────────────────────────────────────────────────────────────────────────────────


def raygrpo_config(indices: list[int], actors: int, per_actor: int, *, faults: dict[str, Any] | None,
                   remote: bool):
    from raygrpo.config import load_config

    harbor: dict[str, Any] = {"kind": "harbor", "path": str(TASKS), "indices": indices, "exec_timeout_s": 60,
                              "verifier_timeout_s": 60}
    if remote:
        harbor.update(import_path=NULL_BACKEND, environment_kwargs={"reward": 1.0})
    if faults:
        harbor["faults"] = faults
    return load_config(data={
        "envs": {"suite": harbor},
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

    orchestrator = Orchestrator(pools=runtime.pools)
    start = time.perf_counter()
    trajs = list(orchestrator.run(requests))
    return time.perf_counter() - start, trajs


def raygrpo_batches(cfg, group_size: int, repeats: int, total: int) -> dict[str, Any]:
    """`repeats` batches of every task × `group_size` through raygrpo; their walls, raygrpo's CPU during them, and
    the most tool calls any rollout made."""
    from raygrpo.orchestrator import make_groups
    from session_cpu import SessionCpu

    cpu = SessionCpu(exclude=set())
    walls, cpu_s, machine_s, tool_calls = [], 0.0, 0.0, 0
    with _runtime(cfg) as runtime:
        for r in range(repeats):
            before, machine_before = cpu.sample(), _machine_busy_s()
            wall, trajs = run_batch(runtime, make_groups(runtime.tasks, group_size))
            cpu_s += cpu.sample() - before
            machine_s += _machine_busy_s() - machine_before
            rewards = [t.reward for t in trajs]
            if len(trajs) != total or rewards != [1.0] * total:
                raise RuntimeError(f"raygrpo: {len(trajs)} rollouts, statuses {[t.status for t in trajs]}")
            tool_calls = max(tool_calls, *(t.tool_calls for t in trajs))
            walls.append(wall)
            log(f"raygrpo batch {r + 1}: {total} rollouts in {wall:.2f} s")
    return {"raygrpo_seconds": statistics.median(walls), "raygrpo_batches_s": [round(w, 3) for w in walls],
            "cpu_ms_per_rollout": round(1000 * cpu_s / (repeats * total), 2),
            "machine_cpu_ms_per_rollout": round(1000 * machine_s / (repeats * total), 2), "tool_calls": tool_calls}


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (every process, the kernel included; /proc/stat)."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


# ── the local arm's physical limit ────────────────────────────────────────────────────────────────────────────────


async def _sandbox_commands(task_dir: Path, work: Path) -> None:
    """One rollout's sandbox commands through the local backend, as Harbor's factory and verifier run them."""
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.task.task import Task
    from harbor.models.trial.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths
    from harbor.verifier.verifier import Verifier

    task = Task(task_dir)
    paths = TrialPaths(work / "trials" / uuid.uuid4().hex[:8])
    paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        EnvironmentConfig(import_path="raygrpo.sandbox.local:LocalSandboxEnvironment",
                          kwargs={"sandbox_root": str(work / "sandboxes")}),
        environment_dir=task.paths.environment_dir, environment_name=task.short_name,
        session_id=f"{task.short_name}__{uuid.uuid4().hex[:6]}", trial_paths=paths,
        task_env_config=task.config.environment)
    await env.start(force_build=False)
    try:
        await env.exec((task_dir / "solution" / "solve.sh").read_text(), cwd="/app")
        result = await Verifier(task=task, trial_paths=paths, environment=env).verify()
    finally:
        await env.stop(delete=True)
    if (result.rewards or {}).get("reward") != 1.0:
        raise RuntimeError(f"{task_dir.name}: the solution scored {result.rewards} without raygrpo")


def sandbox_cpu_seconds(dirs: list[Path], group_size: int, work: Path) -> float:
    """CPU seconds of the batch's sandbox commands (its children's, by `getrusage`), run one after another."""

    async def all_of_them() -> None:
        for _ in range(group_size):
            for task_dir in dirs:
                await _sandbox_commands(task_dir, work)

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    asyncio.run(all_of_them())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# ── the arms ──────────────────────────────────────────────────────────────────────────────────────────────────────


def remote_arm(args, dirs: list[Path], total: int, per_actor: int) -> dict[str, Any]:
    from raygrpo.runtime import init_ray, shutdown_ray

    log("remote arm: null backend, 1.0 s starts, 50 ms execs, 200 ms verifier")
    init_ray(num_cpus=8)
    try:
        cfg = raygrpo_config(list(range(len(dirs))), args.actors, per_actor, faults=REMOTE_FAULTS, remote=True)
        ours = raygrpo_batches(cfg, args.group_size, args.repeats, total)
    finally:
        shutdown_ray()
    theirs = serial_figures(dirs, args.serial_rollouts, total, import_path=NULL_BACKEND, kwargs={"reward": 1.0},
                            faults=REMOTE_FAULTS)
    exec_s = REMOTE_FAULTS["exec_latency_s"]
    ideal = (REMOTE_FAULTS["start_latency_s"] + ours["tool_calls"] * exec_s
             + VERIFIER_EXECS * exec_s + REMOTE_FAULTS["verifier_latency_s"])
    return {
        "speedup": round(theirs["serial_seconds"] / ours["raygrpo_seconds"], 1),
        "ratio_to_ideal": round(ours["raygrpo_seconds"] / ideal, 3),
        "raygrpo_seconds": round(ours["raygrpo_seconds"], 3),
        "serial_seconds": round(theirs["serial_seconds"], 2),
        "ideal_seconds": round(ideal, 3),
        "ideal_note": (f"computed: start {REMOTE_FAULTS['start_latency_s']} s + {ours['tool_calls']} tool call(s) "
                       f"x {exec_s} s + {VERIFIER_EXECS} verifier execs x {exec_s} s + verifier "
                       f"{REMOTE_FAULTS['verifier_latency_s']} s"),
        "cpu_ms_per_rollout": ours["cpu_ms_per_rollout"],
        **{k: v for k, v in ours.items() if k not in ("raygrpo_seconds", "cpu_ms_per_rollout")},
        **{k: v for k, v in theirs.items() if k != "serial_seconds"},
        "faults": REMOTE_FAULTS,
    }


def local_arm(args, dirs: list[Path], total: int, per_actor: int, work: Path) -> dict[str, Any]:
    from raygrpo.orchestrator import make_groups
    from raygrpo.runtime import init_ray, shutdown_ray

    log("local arm: bwrap backend, 1.0 s of injected start latency")
    cores = os.cpu_count() or 1
    sandbox_cpu_s = sandbox_cpu_seconds(dirs, args.group_size, work)
    log(f"the batch's sandbox commands alone: {sandbox_cpu_s:.2f} CPU-s ({cores} cores)")
    init_ray(num_cpus=8)
    try:
        # Each task alone, no injected latency: the longest one bounds any batch.
        with _runtime(raygrpo_config(list(range(len(dirs))), 1, 1, faults=None, remote=False)) as runtime:
            alone = []
            for task in runtime.tasks:
                wall, trajs = run_batch(runtime, make_groups([task], 1))
                if trajs[0].reward != 1.0:
                    raise RuntimeError(f"alone: {trajs[0]}")
                alone.append(wall)
        ideal = START_LATENCY_S + max(alone)
        log(f"each task alone: longest {max(alone):.3f} s -> ideal {ideal:.3f} s")
        cfg = raygrpo_config(list(range(len(dirs))), args.actors, per_actor,
                             faults={"start_latency_s": START_LATENCY_S}, remote=False)
        ours = raygrpo_batches(cfg, args.group_size, args.repeats, total)
    finally:
        shutdown_ray()
    theirs = serial_figures(dirs, args.serial_rollouts, total, import_path="provisioning:SlowStartSandbox")
    limit = max(ideal, sandbox_cpu_s / cores)
    return {
        "ratio_to_limit": round(ours["raygrpo_seconds"] / limit, 3),
        "raygrpo_seconds": round(ours["raygrpo_seconds"], 3),
        "limit_seconds": round(limit, 3),
        "ideal_seconds": round(ideal, 3),
        "sandbox_cpu_s": round(sandbox_cpu_s, 3),
        "cores": cores,
        "speedup": round(theirs["serial_seconds"] / ours["raygrpo_seconds"], 1),
        "serial_seconds": round(theirs["serial_seconds"], 2),
        "alone_seconds": [round(a, 3) for a in alone],
        **{k: v for k, v in ours.items() if "seconds" not in k and "cpu_ms" not in k},
        **{k: v for k, v in theirs.items() if k != "serial_seconds"},
    }


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task (64 in all by default)")
    parser.add_argument("--serial-rollouts", type=int, default=16)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="raygrpo batches; the median is reported")
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"--arms: unknown {unknown}; choose from {list(ARMS)}")

    dirs = task_dirs(args.tasks)
    total = len(dirs) * args.group_size
    per_actor = -(-total // args.actors)
    out: dict[str, Any] = {"rollouts": total, "start_latency_s": START_LATENCY_S, "actors": args.actors,
                           "max_concurrent_per_actor": per_actor}
    with tempfile.TemporaryDirectory(prefix="raygrpo-provisioning-") as work:
        if "remote" in arms:
            out["remote"] = remote_arm(args, dirs, total, per_actor)
        if "local" in arms:
            out["local"] = local_arm(args, dirs, total, per_actor, Path(work))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
