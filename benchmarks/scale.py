"""Scale: 2,000 Harbor rollouts at once, over a few env pool actors, against sandboxes that only wait.

DESIGN section 6, item 3. The backend is raygrpo's null Harbor environment (`raygrpo.testing.null:NullEnvironment`:
no process, file or socket per sandbox; its verifier download writes `reward.txt`), wrapped by the fault injector
with a start latency (default 3 s, so every sandbox of the batch is up at the same time) and a small exec latency.
Each rollout is the real raygrpo path: env pool actor, agent loop, chat template and tool-call parser, a scripted
policy making one `bash` call (`policy` below), Harbor's adapter and verifier, the provisioning gate. The tasks are
the example suite's (`examples/harbor_local/tasks`); the null backend never looks inside them.

Ray start-up and actor creation stay outside the timer. While the batch runs, a driver thread samples the RSS of
the env pool actor processes (psutil). Prints progress to stderr and one JSON object last:

- `requested`, `completed` (trajectories returned with a reward), `lost` (requested - trajectories returned);
- `wall_seconds` of the batch;
- `max_concurrent_envs`: most sandboxes alive at one instant, counted between backend start and stop from the
  trajectories' `env_span`, as `summary.json` does (`raygrpo.driver.summary.peak_concurrency`);
- `rss_mb_per_env`: (peak summed RSS of the actors - their RSS before the batch) / `max_concurrent_envs`.

Targets: `lost == 0`, `max_concurrent_envs >= 2000`. Run: `python benchmarks/scale.py` (about a minute on 2 cores;
`--rollouts`, `--actors`, `--start-latency`, `--exec-latency` change the shape).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

TASKS = ROOT / "examples" / "harbor_local" / "tasks"
NULL_BACKEND = "raygrpo.testing.null:NullEnvironment"


def log(msg: str) -> None:
    print(f"[scale] {msg}", file=sys.stderr, flush=True)


def policy(ctx) -> str:
    """Scripted policy: one `bash` call, then stop."""
    from raygrpo.agent.toolcalls import format_tool_call

    if any(m.get("role") == "tool" for m in ctx.messages):
        return "Done."
    return format_tool_call("bash", {"command": "true"})


def scale_config(rollouts: int, actors: int, start_latency_s: float, exec_latency_s: float, tasks: int):
    from raygrpo.config import load_config

    per_actor = -(-rollouts // actors)
    faults = {"start_latency_s": start_latency_s}
    if exec_latency_s:
        faults["exec_latency_s"] = exec_latency_s
    return load_config(data={
        "envs": {"null": {
            "kind": "harbor",
            "path": str(TASKS),
            "indices": list(range(tasks)),
            "import_path": NULL_BACKEND,
            "environment_kwargs": {"reward": 1.0},
            "faults": faults,
            "exec_timeout_s": 60,
            "verifier_timeout_s": 120,
            "start_timeout_s": 300,
        }},
        "model": "tiny",
        "policy": {"kind": "scripted", "script": f"{HERE / 'scale.py'}:policy"},
        "sampling": {"max_tokens": 256},
        # Every deadline well above what a loaded 2-core machine needs for 2,000 rollouts at once.
        "rollout": {"group_size": 1, "max_turns": 3, "max_total_tokens": 4096, "rollout_timeout_s": 900},
        "workers": {"num_env_actors": actors, "max_concurrent_per_actor": per_actor, "max_retries": 0},
    })


class RssSampler:
    """Samples the summed RSS of some processes every `interval_s` in a thread; keeps the peak."""

    def __init__(self, pids: list[int], interval_s: float = 0.1) -> None:
        import psutil

        self.procs = [psutil.Process(pid) for pid in pids]
        self.interval_s = interval_s
        self.baseline = self.sample()
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)

    def sample(self) -> int:
        total = 0
        for proc in self.procs:
            try:
                total += proc.memory_info().rss
            except Exception:  # noqa: BLE001 - a dead actor adds nothing
                pass
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self.sample())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        self.peak = max(self.peak, self.sample())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--actors", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=8, help="example tasks the rollouts are spread over")
    parser.add_argument("--start-latency", type=float, default=3.0, help="injected sandbox start latency (s)")
    parser.add_argument("--exec-latency", type=float, default=0.05, help="injected latency per exec (s)")
    args = parser.parse_args()

    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.attempts import RolloutRequest
    from raygrpo.driver.orchestrator import Orchestrator
    from raygrpo.driver.pools import PoolSet
    from raygrpo.driver.resolve import resolve_run
    from raygrpo.driver.runtime import init_ray, shutdown_ray
    from raygrpo.driver.summary import peak_concurrency

    cfg = scale_config(args.rollouts, args.actors, args.start_latency, args.exec_latency, args.tasks)
    init_ray(num_cpus=max(4, args.actors))
    try:
        with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env) as runtime:
            import ray

            pids = ray.get([h.pid.remote() for _, h in runtime.actors])
            tasks = runtime.tasks
            requests = [
                RolloutRequest(tasks[i % len(tasks)], f"scale-{i % len(tasks)}", i // len(tasks))
                for i in range(args.rollouts)
            ]
            orchestrator = Orchestrator(PoolSet.of_actors(runtime.actors, cfg.workers.max_concurrent_per_actor),
                                        max_retries=cfg.workers.max_retries)
            log(f"{args.rollouts} rollouts over {args.actors} actors (K={cfg.workers.max_concurrent_per_actor}), "
                f"start latency {args.start_latency:g} s")
            with RssSampler(pids) as rss:
                start = time.perf_counter()
                trajs = list(orchestrator.run(requests))
                wall = time.perf_counter() - start
            actor_stats = ray.get([h.stats.remote() for _, h in runtime.actors])
        leaked = runtime.leaked_envs
        shutdown_ray()
    finally:
        shutdown_ray()

    statuses = Counter(t.status.value for t in trajs)
    completed = sum(1 for t in trajs if t.reward is not None)
    spans = [t.env_span for t in trajs if t.env_span]
    peak = peak_concurrency(spans)
    rss_delta_mb = (rss.peak - rss.baseline) / 2**20
    phases: dict[str, float] = {}
    for t in trajs:
        for k, v in (t.timings or {}).items():
            phases[k] = phases.get(k, 0.0) + v
    log(f"{len(trajs)} trajectories in {wall:.1f} s, statuses {dict(statuses)}, peak {peak} live sandboxes")
    print(json.dumps({
        "requested": args.rollouts,
        "completed": completed,
        "lost": args.rollouts - len(trajs),
        "wall_seconds": round(wall, 2),
        "max_concurrent_envs": peak,
        "rss_mb_per_env": round(rss_delta_mb / peak, 3) if peak else None,
        "statuses": dict(statuses),
        "actors": args.actors,
        "max_concurrent_per_actor": cfg.workers.max_concurrent_per_actor,
        "start_latency_s": args.start_latency,
        "exec_latency_s": args.exec_latency,
        "actor_peak_envs": [s.get("peak_envs") for s in actor_stats],
        "rss_mb_before": round(rss.baseline / 2**20, 1),
        "rss_mb_peak": round(rss.peak / 2**20, 1),
        "leaked_envs": leaked,
        "mean_phase_seconds": {k: round(v / len(trajs), 3) for k, v in phases.items()} if trajs else {},
    }))


if __name__ == "__main__":
    main()
