"""Provisioning: Harbor rollouts through TRL's serial path vs raygrpo, in three arms (remote, local, docker).

DESIGN section 6, item 1 (issue 18). The `remote` and `local` arms run 64 rollouts whose sandbox start takes 1.0 s:
the example suite `examples/harbor_local/tasks` (8 tasks × 8 rollouts), each rollout replaying the task's
`solution/solve.sh` through `bash` and then running the task's verifier. TRL's side is its own `HarborBashEnv` (only
its backend swapped), driven the way GRPOTrainer drives it: every `reset` of the batch one after another, then each
rollout's call, then the rewards; it runs `--serial-rollouts` (16) and its time is scaled to the batch (stated as
such in the output). raygrpo's side is the real rollout path (env pool actors, agent loop, scripted policy, Harbor
adapter, the fault wrapper), warm pool off; Ray start-up and actor creation outside the timer; the median of
`--repeats` batches.

- `remote`: sandboxes that cost no local CPU, as a remote provider's do: the null backend
  (`raygrpo.testing.null:NullEnvironment`, its verifier finds reward 1.0) under the fault injector with 1.0 s per
  start, 50 ms per exec and 200 ms more for the verifier's test script. The ideal is computed from those latencies,
  not measured through raygrpo: `start + tool_calls × exec + (verifier_execs × exec + verifier)`, with `tool_calls`
  the most tool calls of any rollout and `verifier_execs` the execs Harbor's verifier makes (3: removing old rewards,
  `chmod +x`, the test). Anything else raygrpo sends the sandbox (its verifier probe) counts against it. Targets:
  `speedup ≥ 30`, `ratio_to_ideal ≤ 1.3`.
- `local`: raygrpo's bwrap backend with 1.0 s of injected start latency. `ideal` = 1.0 s + the longest task run alone
  (through raygrpo, no injected latency, measured in the same run). The sandboxes' own processes run on the same
  cores as raygrpo, so the limit is `max(ideal, commands_machine_cpu_s / cores)`, where `commands_machine_cpu_s` is
  the CPU-seconds of the same 64 rollouts' sandbox commands (start, `solve.sh`, Harbor's verifier, stop) run one
  after another through the backend in this process, without Ray or the agent loop: the whole machine's busy CPU
  while they run (/proc/stat; Ray is not started yet), which is the commands' own processes (`sandbox_cpu_s`,
  `getrusage` of this process's children), this process driving them through the backend and Harbor's verifier
  (`backend_cpu_s`, `getrusage` of itself: raygrpo's actors spend it too) and the kernel's work for them. Target:
  `ratio_to_limit ≤ 1.3`. That limit lets the sandboxes' CPU overlap the injected start latency, which it cannot
  (the latency comes before each sandbox's start, and all 64 start at once), so the arm also states
  `floor_seconds` = 1.0 s + `commands_machine_cpu_s / cores`, below which no orchestrator can go. And it runs
  a stream, in its own runtime after one untimed batch there (`stream_warmup_s`; the batches' median does not count
  a slow first one either): `--stream-batches` (8) batches queued at once, `--stream-in-flight` (256) rollouts
  running at a time (`stream_in_flight`; more than one batch, so that later rollouts' start latency can overlap
  earlier ones' commands as the limit assumes), its time per batch (`stream_seconds_per_batch`,
  `stream_ratio_to_limit`), the whole machine's busy CPU per batch (`stream_machine_cpu_s_per_batch`, /proc/stat)
  and the share of the cores it kept busy (`stream_machine_busy`); and the same over the stream's steady state, the
  middle half of its completions (`stream_steady_seconds_per_batch`, `stream_steady_ratio_to_limit`,
  `stream_steady_machine_cpu_s_per_batch`, `stream_steady_machine_busy`), without the first starts' latency and the
  drain at the end (for a stream of at least twice `--stream-in-flight` rollouts; else `stream_steady_note` says why
  not).
- `docker`: 16 rollouts (the suite's first `--docker-tasks` (2) tasks × `--group-size` (8)) on the local Docker
  engine (`make docker-dev`), no injected latency, three sides, each over all 16 (nothing scaled), in this order:
  - `trl_as_shipped`: TRL's `HarborBashEnv` with Harbor's docker backend as TRL makes it (nothing swapped): every
    start runs `docker compose build` (from Docker's layer cache) and every stop is `down --rmi local`, which deletes
    that image again; `sleep infinity` is PID 1 and ignores SIGTERM, so each stop waits out Docker's 10 s timeout.
  - raygrpo with `environment_type: docker` (`raygrpo.envs.harbor.docker`): each task's image built once as
    `hb__<hash>` and started from as a prebuilt image afterwards, the service under an init. One batch first, which
    builds the images (`raygrpo_first_batch_s`), then the median of `--repeats` batches.
  - `trl_reuse_init`: the same TRL driving loop with Harbor's docker backend given raygrpo's two fixes through the
    same swap as the other arms (`reuse_and_init`): raygrpo's compose overlay (init, image name, owner labels), and
    the prebuilt image once it exists — here from raygrpo's batches, so it pays no build.

  TRL's stops are inside its timer (GRPOTrainer's next `reset` pays them: TRL stops an env's previous sandbox
  there); raygrpo's rollouts end with theirs. Per rollout: TRL's phases (`resets`: start and TRL's set-up execs;
  `calls`; `rewards`: Harbor's verifier; `stops`), raygrpo's medians of its rollouts' `timings` and sandbox life
  (`env_span`). `machine_cpu_s_per_rollout` is the whole machine's busy CPU (/proc/stat), docker's daemons and CLI
  processes included, and whatever else runs there (hence `load_avg_1m`, before and after); `machine_busy` is the
  share of the cores it kept busy (near 1.0: the side was bound by the CPU, not by waiting). The arm runs on copies
  of the tasks with one more file (this run's id) in `environment/`, so the images it builds are its own on an engine
  others may use: it removes them, the images another build's tag moved off them (two env pool actors building one
  task's image at once; found through `docker events`), and reports what docker still has of its sandboxes
  (`left_behind`; all 0 expected). No docker engine: `{"skipped": ...}` saying why. Reported, no target.

raygrpo's own CPU per rollout (`remote.cpu_ms_per_rollout`) is measured over this process and every process of its
Ray session (psutil over all descendants, `benchmarks/session_cpu.py`) during the timed batches, so work moved from
one process to another does not count as saved; `machine_cpu_ms_per_rollout` is the whole machine's busy CPU over
the same batches (/proc/stat), an upper bound from outside any process list (on a machine otherwise idle). (The
`local` arm does not state them: its sandboxes' short-lived processes are not seen by the sampler.)

Prints progress to stderr and one JSON object last, a section per arm. Run: `python benchmarks/provisioning.py`
(`--arms remote`, `--arms local` or `--arms docker` for one; about 3 minutes for the first two on 2 cores, 6 for the
docker arm, most of it TRL as shipped waiting out its stops).
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
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from raygrpo.sandbox.local import LocalSandboxEnvironment  # noqa: E402

TASKS = ROOT / "examples" / "harbor_local" / "tasks"
POLICIES = ROOT / "examples" / "harbor_local" / "policies.py"
NULL_BACKEND = "raygrpo.testing.null:NullEnvironment"
START_LATENCY_S = 1.0
#: The remote arm's injected latencies.
REMOTE_FAULTS = {"start_latency_s": START_LATENCY_S, "exec_latency_s": 0.05, "verifier_latency_s": 0.2}
#: Execs Harbor's verifier makes per rollout: removing old reward files, `chmod +x` of the test, the test.
VERIFIER_EXECS = 3
ARMS = ("remote", "local", "docker")


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


def backend_swap(import_path: str, kwargs: dict[str, Any] | None = None,
                 faults: dict[str, Any] | None = None) -> Callable[..., Any]:
    """A `run_serial` swap that makes `import_path`'s backend instead of the one TRL names (wrapped in the fault
    injector when `faults` is given)."""
    from harbor.models.trial.config import EnvironmentConfig

    from raygrpo.envs.harbor.faults import wrap_environment

    def swap(create, config, **factory_kwargs):
        env = create(config=EnvironmentConfig(import_path=import_path, kwargs=dict(kwargs or {})), **factory_kwargs)
        return wrap_environment(env, faults)

    return swap


def run_serial(dirs: list[Path], swap: Callable[..., Any] | None = None, *, stops_timed: bool = False,
               sessions: list[str] | None = None) -> dict[str, Any]:
    """TRL's `HarborBashEnv` over `dirs`, driven as GRPOTrainer drives it, its backend made by `swap(create, config,
    **factory_kwargs)` where one is given (TRL's own `docker` backend otherwise). Returns the wall time of the resets,
    calls and rewards (and of the stops, with `stops_timed`: GRPOTrainer's next batch pays them, since TRL's `reset`
    stops the env's previous sandbox first), each phase's seconds, and the sandboxes' session ids (Harbor's docker
    backend names its compose project after it; also appended to `sessions` as they start, when given), and the
    machine's busy CPU seconds meanwhile (/proc/stat)."""
    import shutil
    from unittest import mock

    from harbor.environments.factory import EnvironmentFactory
    from trl.experimental.harbor._env import HarborBashEnv

    create = EnvironmentFactory.create_environment_from_config
    sessions = [] if sessions is None else sessions

    def create_swapped(config, **factory_kwargs):
        # TRL hard-codes `type=`; swap only the backend, everything else is TRL's own start sequence.
        sessions.append(factory_kwargs["session_id"])
        return swap(create, config, **factory_kwargs) if swap is not None else create(config=config, **factory_kwargs)

    envs = [HarborBashEnv(environment_type="docker") for _ in dirs]
    marks: list[float] = []
    machine_before = _machine_busy_s()
    try:
        with mock.patch.object(EnvironmentFactory, "create_environment_from_config", staticmethod(create_swapped)):
            marks.append(time.perf_counter())
            for env, task_dir in zip(envs, dirs):
                env.reset(task_dir=str(task_dir))
            marks.append(time.perf_counter())
            for env, task_dir in zip(envs, dirs):
                env.bash((task_dir / "solution" / "solve.sh").read_text())
            marks.append(time.perf_counter())
            rewards = [env.reward for env in envs]
            marks.append(time.perf_counter())
            if stops_timed:
                for env in envs:
                    env._run(env._stop())
                marks.append(time.perf_counter())
            machine_s = _machine_busy_s() - machine_before
    finally:
        # Stop the sandboxes now; TRL's `__del__` then finds nothing to stop and ends each env's loop thread. TRL
        # leaves its trial directory behind per reset: removed here.
        for env in envs:
            env._run(env._stop())
            if env._paths is not None:
                shutil.rmtree(env._paths.trial_dir, ignore_errors=True)
    if rewards != [1.0] * len(dirs):
        raise RuntimeError(f"TRL side: expected every reward 1.0, got {rewards}")
    phases = dict(zip(("resets", "calls", "rewards", "stops"), (b - a for a, b in zip(marks, marks[1:]))))
    return {"wall": marks[-1] - marks[0], "phases": phases, "sessions": sessions, "machine_cpu_s": machine_s}


def serial_figures(dirs: list[Path], count: int, total: int, **backend: Any) -> dict[str, Any]:
    serial_dirs = [dirs[i % len(dirs)] for i in range(count)]
    measured = run_serial(serial_dirs, backend_swap(**backend))["wall"]
    serial = measured * total / count
    log(f"serial (TRL): {count} rollouts in {measured:.2f} s -> {serial:.1f} s for {total}")
    return {"serial_seconds": serial, "serial_measured_rollouts": count, "serial_measured_seconds": round(measured, 2),
            "serial_note": f"TRL's side ran {count} rollouts; its time is scaled to {total}"}


# ── raygrpo ────────────────────────────────────────────────────────────────────────────────────────────────────────


def raygrpo_config(indices: list[int], actors: int, per_actor: int, *, faults: dict[str, Any] | None,
                   remote: bool, path: Path = TASKS, environment_type: str | None = None):
    from raygrpo.config import load_config

    harbor: dict[str, Any] = {"kind": "harbor", "path": str(path), "indices": indices, "exec_timeout_s": 60,
                              "verifier_timeout_s": 60}
    if remote:
        harbor.update(import_path=NULL_BACKEND, environment_kwargs={"reward": 1.0})
    if environment_type is not None:
        harbor["environment_type"] = environment_type
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
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.resolve import resolve_run

    return RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env)


def run_batch(runtime, requests) -> tuple[float, list]:
    from raygrpo.driver.orchestrator import Orchestrator

    orchestrator = Orchestrator(pools=runtime.pools)
    start = time.perf_counter()
    trajs = list(orchestrator.run(requests))
    return time.perf_counter() - start, trajs


def raygrpo_batches(cfg, group_size: int, repeats: int, total: int, *, first_apart: bool = False) -> dict[str, Any]:
    """`repeats` batches of every task × `group_size` through raygrpo; their walls, raygrpo's CPU during them, the
    most tool calls any rollout made, the medians of the rollouts' phases, and the sandboxes the runtime found left
    after it. `first_apart`: one more batch first, reported on its own (`first_batch_s`: on docker it builds the
    tasks' images)."""
    from raygrpo.driver.attempts import make_groups
    from session_cpu import SessionCpu

    cpu = SessionCpu(exclude=set())
    walls, cpu_s, machine_s, tool_calls, timed = [], 0.0, 0.0, 0, []
    first: dict[str, Any] = {}
    with _runtime(cfg) as runtime:
        if first_apart:
            wall, trajs = run_batch(runtime, make_groups(runtime.tasks, group_size))
            if len(trajs) != total or [t.reward for t in trajs] != [1.0] * total:
                raise RuntimeError(f"raygrpo first batch: {len(trajs)} rollouts, statuses {[t.status for t in trajs]}")
            first = {"first_batch_s": round(wall, 3)}
            log(f"raygrpo first batch: {total} rollouts in {wall:.2f} s")
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
            timed += trajs
            log(f"raygrpo batch {r + 1}: {total} rollouts in {wall:.2f} s")
    return {"raygrpo_seconds": statistics.median(walls), "raygrpo_batches_s": [round(w, 3) for w in walls], **first,
            "cpu_ms_per_rollout": round(1000 * cpu_s / (repeats * total), 2),
            "machine_cpu_ms_per_rollout": round(1000 * machine_s / (repeats * total), 2), "tool_calls": tool_calls,
            "per_rollout_s": rollout_phases(timed), "leaked_envs": runtime.leaked_envs}


def raygrpo_stream(cfg, group_size: int, batches: int, total: int, in_flight: int) -> dict[str, Any]:
    """`batches` batches of every task × `group_size` queued at once (as `raygrpo rollout` queues a dataset), after
    one untimed batch (`stream_warmup_s`): a sandbox's start latency can overlap other rollouts' commands, as the
    local arm's limit assumes. Its wall, the wall per batch, and the whole machine's busy CPU per batch (/proc/stat)
    with the share of the cores it kept busy; the same for its steady state (`stream_steady_*`): the middle half of
    its completions, from the n/4-th to the 3n/4-th, which leaves out the first starts' latency and the drain at the
    end; only for a stream of at least twice `in_flight` rollouts (the most run at once), so that its middle is past
    the first wave."""
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.orchestrator import Orchestrator

    cores = os.cpu_count() or 1
    with _runtime(cfg) as runtime:
        # One batch first, untimed (the batches' median does not count a slow first one either): the actors'
        # first-use costs (their thread pools, caches of the tasks) belong to a run's start, not to its batches.
        warmup_s, warm = run_batch(runtime, make_groups(runtime.tasks, group_size))
        if len(warm) != total or any(t.reward != 1.0 for t in warm):
            raise RuntimeError(f"raygrpo stream's warm-up: {len(warm)} rollouts, {sorted({t.status for t in warm})}")
        requests = [r for _ in range(batches) for r in make_groups(runtime.tasks, group_size)]
        quarter, three_quarters = len(requests) // 4, 3 * len(requests) // 4
        marks: dict[int, tuple[float, float]] = {}
        trajs = []
        began, machine_before = time.perf_counter(), _machine_busy_s()
        for traj in Orchestrator(pools=runtime.pools).run(requests):
            trajs.append(traj)
            for mark in (quarter, three_quarters):
                if len(trajs) >= mark and mark not in marks:
                    marks[mark] = (time.perf_counter(), _machine_busy_s())
        wall, busy = time.perf_counter() - began, _machine_busy_s() - machine_before
    if len(trajs) != batches * total or any(t.reward != 1.0 for t in trajs):
        raise RuntimeError(f"raygrpo stream: {len(trajs)} rollouts, statuses {sorted({t.status for t in trajs})}")
    log(f"raygrpo stream: {batches} x {total} rollouts in {wall:.2f} s, machine busy {busy / (wall * cores):.2f}")
    out: dict[str, Any] = {"stream_batches": batches, "stream_warmup_s": round(warmup_s, 3),
                           "stream_seconds": round(wall, 3),
                           "stream_seconds_per_batch": round(wall / batches, 3),
                           "stream_machine_cpu_s_per_batch": round(busy / batches, 3),
                           "stream_machine_busy": round(busy / (wall * cores), 3)}
    if len(requests) < 2 * in_flight:
        out["stream_steady_note"] = (f"no steady state: {len(requests)} rollouts, fewer than twice the {in_flight} "
                                     "run at once")
        return out
    steady_batches = (three_quarters - quarter) / total
    steady_wall = marks[three_quarters][0] - marks[quarter][0]
    steady_busy = marks[three_quarters][1] - marks[quarter][1]
    log(f"raygrpo stream, steady state: {steady_wall / steady_batches:.3f} s per batch, machine busy "
        f"{steady_busy / (steady_wall * cores):.2f}")
    return {**out, "stream_steady_seconds_per_batch": round(steady_wall / steady_batches, 3),
            "stream_steady_machine_cpu_s_per_batch": round(steady_busy / steady_batches, 3),
            "stream_steady_machine_busy": round(steady_busy / (steady_wall * cores), 3)}


def rollout_phases(trajs: list) -> dict[str, float]:
    """Medians over `trajs` of each phase raygrpo times (`provision`, `tools`, `verify`, `total`, ...) and of the
    sandbox's life (`env_span`: opened to closed, its stop included)."""
    keys = sorted({k for t in trajs for k in t.timings})
    out = {k: round(statistics.median(t.timings[k] for t in trajs if k in t.timings), 3) for k in keys}
    spans = [t.env_span[1] - t.env_span[0] for t in trajs if t.env_span]
    if spans:
        out["env_span"] = round(statistics.median(spans), 3)
    return out


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (every process, the kernel included; /proc/stat)."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


# ── the local arm's physical limit ────────────────────────────────────────────────────────────────────────────────


def local_sandbox(task: Any, work: Path) -> tuple[Any, Any]:
    """A local (bwrap) sandbox for Harbor `task` made by Harbor's factory, as raygrpo's actors make one, with its
    sandbox root and a fresh trial folder under `work`; the sandbox and the trial's paths."""
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.trial.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    paths = TrialPaths(work / "trials" / uuid.uuid4().hex[:8])
    paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        EnvironmentConfig(import_path="raygrpo.sandbox.local:LocalSandboxEnvironment",
                          kwargs={"sandbox_root": str(work / "sandboxes")}),
        environment_dir=task.paths.environment_dir, environment_name=task.short_name,
        session_id=f"{task.short_name}__{uuid.uuid4().hex[:6]}", trial_paths=paths,
        task_env_config=task.config.environment)
    return env, paths


async def _sandbox_commands(task_dir: Path, work: Path) -> None:
    """One rollout's sandbox commands through the local backend, as Harbor's factory and verifier run them."""
    from harbor.models.task.task import Task
    from harbor.verifier.verifier import Verifier

    task = Task(task_dir)
    env, paths = local_sandbox(task, work)
    await env.start(force_build=False)
    try:
        await env.exec((task_dir / "solution" / "solve.sh").read_text(), cwd="/app")
        result = await Verifier(task=task, trial_paths=paths, environment=env).verify()
    finally:
        await env.stop(delete=True)
    if (result.rewards or {}).get("reward") != 1.0:
        raise RuntimeError(f"{task_dir.name}: the solution scored {result.rewards} without raygrpo")


def sandbox_cpu_seconds(dirs: list[Path], group_size: int, work: Path) -> dict[str, float]:
    """The batch's sandbox commands run one after another through the backend and Harbor's verifier: the whole
    machine's busy CPU seconds meanwhile (`commands_machine_cpu_s`), of which the commands' own processes
    (`sandbox_cpu_s`, this process's children by `getrusage`) and this process driving them (`backend_cpu_s`);
    the wall they took (`sandbox_serial_seconds`). One rollout's commands run first, untimed: this process's
    first-use costs (Harbor's imports, the verifier toolbox's check) belong to no batch."""

    async def all_of_them() -> None:
        for _ in range(group_size):
            for task_dir in dirs:
                await _sandbox_commands(task_dir, work)

    def used(who: int) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    asyncio.run(_sandbox_commands(dirs[0], work))
    children, own, machine = used(resource.RUSAGE_CHILDREN), used(resource.RUSAGE_SELF), _machine_busy_s()
    began = time.perf_counter()
    asyncio.run(all_of_them())
    wall = time.perf_counter() - began
    return {"commands_machine_cpu_s": _machine_busy_s() - machine,
            "sandbox_cpu_s": used(resource.RUSAGE_CHILDREN) - children,
            "backend_cpu_s": used(resource.RUSAGE_SELF) - own, "sandbox_serial_seconds": wall}


# ── the arms ──────────────────────────────────────────────────────────────────────────────────────────────────────


def remote_arm(args, dirs: list[Path], total: int, per_actor: int) -> dict[str, Any]:
    from raygrpo.driver.runtime import init_ray, shutdown_ray

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
        **{k: v for k, v in ours.items() if k not in ("raygrpo_seconds", "cpu_ms_per_rollout", "per_rollout_s")},
        **{k: v for k, v in theirs.items() if k != "serial_seconds"},
        "faults": REMOTE_FAULTS,
    }


def local_arm(args, dirs: list[Path], total: int, per_actor: int, work: Path) -> dict[str, Any]:
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.runtime import init_ray, shutdown_ray

    log("local arm: bwrap backend, 1.0 s of injected start latency")
    cores = os.cpu_count() or 1
    commands = sandbox_cpu_seconds(dirs, args.group_size, work)
    log(f"the batch's sandbox commands through the backend, one after another: {commands['sandbox_serial_seconds']:.2f}"
        f" s, {commands['commands_machine_cpu_s']:.2f} CPU-s of the machine ({commands['sandbox_cpu_s']:.2f} in the "
        f"commands' processes, {commands['backend_cpu_s']:.2f} driving them; {cores} cores)")
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
        latency = {"start_latency_s": START_LATENCY_S}
        cfg = raygrpo_config(list(range(len(dirs))), args.actors, per_actor, faults=latency, remote=False)
        ours = raygrpo_batches(cfg, args.group_size, args.repeats, total)
        stream: dict[str, Any] = {}
        if args.stream_batches:
            # More in flight than one batch: while some rollouts' starts wait out their latency, others' commands run.
            in_flight = max(args.stream_in_flight, total)
            stream_cfg = raygrpo_config(list(range(len(dirs))), args.actors, -(-in_flight // args.actors),
                                        faults=latency, remote=False)
            stream = {"stream_in_flight": in_flight,
                      **raygrpo_stream(stream_cfg, args.group_size, args.stream_batches, total, in_flight)}
    finally:
        shutdown_ray()
    theirs = serial_figures(dirs, args.serial_rollouts, total, import_path="provisioning:SlowStartSandbox")
    cpu_bound = commands["commands_machine_cpu_s"] / cores
    limit = max(ideal, cpu_bound)
    # No sandbox command can run before its start's injected latency is over: the batch's CPU comes after it.
    floor = START_LATENCY_S + cpu_bound
    return {
        "ratio_to_limit": round(ours["raygrpo_seconds"] / limit, 3),
        "raygrpo_seconds": round(ours["raygrpo_seconds"], 3),
        "limit_seconds": round(limit, 3),
        "limit_note": (f"the {'ideal' if ideal >= cpu_bound else 'commands CPU'}: ideal {ideal:.3f} s, commands "
                       f"{commands['commands_machine_cpu_s']:.3f} CPU-s / {cores} cores = {cpu_bound:.3f} s"),
        "ideal_seconds": round(ideal, 3),
        "floor_seconds": round(floor, 3),
        "ratio_to_floor": round(ours["raygrpo_seconds"] / floor, 3),
        **{k: round(v, 3) for k, v in commands.items()},
        "cores": cores,
        "speedup": round(theirs["serial_seconds"] / ours["raygrpo_seconds"], 1),
        "serial_seconds": round(theirs["serial_seconds"], 2),
        "alone_seconds": [round(a, 3) for a in alone],
        **stream,
        **({"stream_ratio_to_limit": round(stream["stream_seconds_per_batch"] / limit, 3)} if stream else {}),
        **({"stream_steady_ratio_to_limit": round(stream["stream_steady_seconds_per_batch"] / limit, 3)}
           if "stream_steady_seconds_per_batch" in stream else {}),
        **{k: v for k, v in ours.items() if "seconds" not in k and "cpu_ms" not in k and k != "per_rollout_s"},
        **{k: v for k, v in theirs.items() if k != "serial_seconds"},
    }


# ── the docker arm ────────────────────────────────────────────────────────────────────────────────────────────────


def docker_suite(dirs: list[Path], work: Path) -> list[Path]:
    """Copies of `dirs` whose environment folders hold one more file, this run's id (no Dockerfile copies it), so
    that their `hb__<content hash>` images are this run's own on an engine others use too: built from nothing here
    (Docker's layer cache aside) and removed afterwards without touching anyone else's."""
    import shutil

    run_id = uuid.uuid4().hex
    suite = work / "docker-suite"
    copies = []
    for task_dir in dirs:
        copy = suite / task_dir.name
        shutil.copytree(task_dir, copy)
        (copy / "environment" / "provisioning-run-id").write_text(run_id + "\n")
        copies.append(copy)
    return copies


def image_name(task_dir: Path) -> str:
    """The image raygrpo builds a task as and reuses: `hb__` + Harbor's content hash of its environment folder."""
    from harbor.environments.definition import environment_content_hash

    return f"hb__{environment_content_hash(task_dir / 'environment')}"


def reuse_and_init(run_id: str) -> tuple[Callable[..., Any], list[bool]]:
    """A `run_serial` swap giving Harbor's docker backend raygrpo's two fixes, as `raygrpo.envs.harbor.docker` makes
    them: raygrpo's compose overlay (the service under an init, owner labels of run `run_id`, the image named
    `hb__<hash>`), and the task's image started from as a prebuilt one once it exists. TRL's own start sequence and
    its `stop(delete=True)` are unchanged (`down --rmi local` keeps an image the compose file names). Returns the swap
    and a list that gets, per start, whether it started from the existing image."""
    from harbor.models.trial.config import EnvironmentConfig

    from raygrpo.envs.harbor.docker import OVERLAY_NAME
    from raygrpo.docker.engine import image_exists
    from raygrpo.docker.owners import owner_labels, write_overlay

    reused: list[bool] = []
    known: set[str] = set()

    def swap(create, config, **factory_kwargs):
        env_dir = Path(factory_kwargs["environment_dir"])
        name = image_name(env_dir.parent)
        if name not in known and image_exists(name):
            known.add(name)
        task_env = factory_kwargs["task_env_config"].model_copy(deep=True)
        if name in known:
            task_env.docker_image = name
        reused.append(name in known)
        overlay = write_overlay(factory_kwargs["trial_paths"].trial_dir / OVERLAY_NAME, owner_labels(run_id),
                                image=name)
        config = EnvironmentConfig(type="docker", kwargs={"extra_docker_compose": [str(overlay)]})
        return create(config=config, **{**factory_kwargs, "task_env_config": task_env})

    return swap, reused


class TagWatch:
    """Every image tagged while it runs, by name (`docker events`, streamed to a file: the daemon keeps only its
    last 256 events). A build whose tag another build of the same image name moved on (two env pool actors building
    a task's image at once) leaves its image dangling: only these events tell it was this arm's."""

    def __init__(self, work: Path) -> None:
        import subprocess

        self.log = work / "docker-image-tags.log"
        self._out = self.log.open("w")
        self._proc = subprocess.Popen(
            ["docker", "events", "--since", str(int(time.time()) - 1), "--filter", "type=image", "--filter",
             "event=tag", "--format", "{{.ID}} {{.Actor.Attributes.name}}"], stdout=self._out,
            stderr=subprocess.DEVNULL)

    def close(self) -> dict[str, set[str]]:
        """Stop watching; image ids by the names they were tagged as (`name`, without `:tag`)."""
        time.sleep(1.0)  # events of the last commands reach the stream
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._out.close()
        tagged: dict[str, set[str]] = {}
        for line in self.log.read_text().splitlines():
            image_id, _, name = line.partition(" ")
            tagged.setdefault(name.rsplit(":", 1)[0], set()).add(image_id)
        return tagged


def remove_dangling(image_ids: set[str]) -> int:
    """Remove those of `image_ids` that no tag names any more (without force: one a container or a child image
    still uses stays); returns how many were removed."""
    import subprocess

    removed = 0
    for image_id in sorted(image_ids):
        tags = subprocess.run(["docker", "image", "inspect", "--format", "{{len .RepoTags}}", image_id],
                              capture_output=True, text=True).stdout.strip()
        if tags == "0" and subprocess.run(["docker", "rmi", image_id], capture_output=True).returncode == 0:
            removed += 1
    return removed


def docker_left(sessions: list[str], images: list[str], run_id: str) -> dict[str, int]:
    """What docker still has of the sandboxes this arm started: containers and networks of their compose projects
    (Harbor names a project after its session id; the reuse-and-init side also by its run label), and images the arm
    built (`hb__` names of its suite, and the `<session>-main` tags Harbor as shipped builds)."""
    import subprocess

    from raygrpo.docker.engine import COMPOSE_PROJECT
    from raygrpo.docker.owners import run_leftovers

    def listed(*cmd: str) -> list[str]:
        return subprocess.run(["docker", *cmd], capture_output=True, text=True, check=True).stdout.split()

    projects = {sid.lower() for sid in sessions}
    label = f'{{{{.Label "{COMPOSE_PROJECT}"}}}}'
    containers = [p for p in listed("ps", "-a", "--format", label) if p in projects]
    networks = [p for p in listed("network", "ls", "--format", label) if p in projects]
    names = set(images) | {f"{p}-main" for p in projects}
    left_images = [r for r in listed("images", "--format", "{{.Repository}}") if r in names]
    return {"containers": len(containers), "networks": len(networks), "images": len(left_images),
            "labelled_projects": len(run_leftovers(run_id))}


def trl_figures(run: dict[str, Any], rollouts: int) -> dict[str, Any]:
    """A TRL serial run's wall seconds and its per-rollout seconds by phase (TRL's `reset`: the sandbox's start and
    TRL's set-up execs; the `bash` call; `reward`: Harbor's verifier; the stop), the machine's busy CPU per rollout,
    and the share of the machine's cores busy meanwhile."""
    per = {phase: round(s / rollouts, 3) for phase, s in run["phases"].items()}
    return {"seconds": round(run["wall"], 2), "per_rollout_s": {**per, "total": round(run["wall"] / rollouts, 3)},
            "machine_cpu_s_per_rollout": round(run["machine_cpu_s"] / rollouts, 3),
            "machine_busy": round(run["machine_cpu_s"] / (run["wall"] * (os.cpu_count() or 1)), 2)}


def docker_arm(args, work: Path) -> dict[str, Any]:
    """16 rollouts on the local Docker engine: TRL's serial path as shipped, raygrpo, TRL's serial path with image
    reuse and the init (see the module docstring)."""
    import subprocess

    from raygrpo.driver.runtime import init_ray, shutdown_ray
    from raygrpo.docker.engine import docker_problem, remove_images

    problem = docker_problem()
    if problem:
        log(f"docker arm skipped: {problem}")
        return {"skipped": f"docker engine not reachable: {problem} (`make docker-dev` sets one up)"}
    dirs = docker_suite(task_dirs(args.docker_tasks), work)
    total = len(dirs) * args.group_size
    per_actor = -(-total // args.actors)
    rollouts = [dirs[i % len(dirs)] for i in range(total)]
    images = [image_name(d) for d in dirs]
    run_id = f"provisioning-{uuid.uuid4().hex[:8]}"
    sessions: list[str] = []
    load_before = os.getloadavg()[0]
    watch = TagWatch(work)
    try:
        log(f"docker arm: TRL as shipped, {total} rollouts (a build per start, `sleep infinity` PID 1)")
        shipped = run_serial(rollouts, stops_timed=True, sessions=sessions)
        log(f"TRL as shipped: {shipped['wall']:.1f} s")
        init_ray(num_cpus=8)
        try:
            cfg = raygrpo_config(list(range(len(dirs))), args.actors, per_actor, faults=None, remote=False,
                                 path=dirs[0].parent, environment_type="docker")
            ours = raygrpo_batches(cfg, args.group_size, args.repeats, total, first_apart=True)
        finally:
            shutdown_ray()
        swap, reused = reuse_and_init(run_id)
        log(f"docker arm: TRL with image reuse and the init, {total} rollouts")
        fixed = run_serial(rollouts, swap, stops_timed=True, sessions=sessions)
        log(f"TRL with reuse and init: {fixed['wall']:.1f} s")
    finally:
        remove_images(images)
        tagged = watch.close()
        ours_tagged = set().union(*(ids for name, ids in tagged.items()
                                    if name in images or name in {f"{sid.lower()}-main" for sid in sessions}))
        dangling = remove_dangling(ours_tagged)
        left = docker_left(sessions, images, run_id)
    version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                             text=True).stdout.strip()
    compose = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True,
                             text=True).stdout.strip()
    ray_s = ours["raygrpo_seconds"]
    ray_machine_s = ours["machine_cpu_ms_per_rollout"] / 1000 * args.repeats * total
    return {
        "rollouts": total,
        "tasks": [d.name for d in dirs],
        "speedup_vs_trl_as_shipped": round(shipped["wall"] / ray_s, 1),
        "speedup_vs_trl_reuse_init": round(fixed["wall"] / ray_s, 1),
        "raygrpo_seconds": round(ray_s, 3),
        "raygrpo_batches_s": ours["raygrpo_batches_s"],
        "raygrpo_first_batch_s": ours["first_batch_s"],
        "first_batch_speedup_vs_trl_as_shipped": round(shipped["wall"] / ours["first_batch_s"], 1),
        "trl_as_shipped": trl_figures(shipped, total),
        "trl_reuse_init": {**trl_figures(fixed, total), "starts_from_reused_image": sum(reused)},
        "raygrpo_per_rollout_s": ours["per_rollout_s"],
        "raygrpo_machine_cpu_s_per_rollout": round(ours["machine_cpu_ms_per_rollout"] / 1000, 3),
        "raygrpo_machine_busy": round(ray_machine_s / (sum(ours["raygrpo_batches_s"]) * (os.cpu_count() or 1)), 2),
        "leaked_envs": ours["leaked_envs"],
        "left_behind": left,
        "task_images": len(images),
        "task_image_ids_tagged": sum(len(tagged.get(name, ())) for name in images),
        "dangling_images_removed": dangling,
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "docker": version,
        "compose": compose,
    }


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task (64 in all by default)")
    parser.add_argument("--serial-rollouts", type=int, default=16)
    parser.add_argument("--docker-tasks", type=int, default=2,
                        help="tasks of the docker arm (× --group-size rollouts: 16 by default)")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="raygrpo batches; the median is reported")
    parser.add_argument("--stream-batches", type=int, default=8,
                        help="the local arm's stream: this many batches queued at once (0: none)")
    parser.add_argument("--stream-in-flight", type=int, default=256,
                        help="the local arm's stream: rollouts run at once across the actors (at least one batch)")
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
        if "docker" in arms:
            try:
                out["docker"] = docker_arm(args, Path(work))
            except Exception as exc:  # noqa: BLE001 - the other arms' figures are printed all the same
                import traceback

                traceback.print_exc()
                out["docker"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))
    if "error" in out.get("docker", {}):
        sys.exit(1)


if __name__ == "__main__":
    main()
