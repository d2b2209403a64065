"""Elastic vs fixed env pool under a bursty workload: what elasticity saves in idle actor-seconds, and what it costs.

Issue 16 (DESIGN section 3.5: "idle actors drain and exit so idle nodes are released"). The workload: `--bursts`
bursts of `--burst-size` rollouts, each a single server-side nap of `--nap` seconds (the tests' `NapEnvironment`, served
from this process on 127.0.0.1), with `--gap` idle seconds after each burst. It runs twice, in the same process and
on the same simulated cluster (`ray.cluster_utils.Cluster` on 127.0.0.1: a head without the custom resource and
`--nodes` nodes with `sandbox_host: 4` each; every env pool actor asks for `sandbox_host: 1`):

- `fixed`: a pool of `peak` actors (K rollouts each, `peak` = burst size / K rounded up), started before the first
  burst and kept;
- `elastic`: the same environment with `min_actors: 0`, `max_actors: peak` and `idle_timeout_s` (`--idle-timeout`):
  actors start as a burst queues up and drain once idle.

During the gaps the orchestrator is polled in a loop (that ticks the pools, so the elastic one drains). Pool size and
demand (rollouts queued + in flight) are sampled at every poll and plotted (`<out>/pool_size.png`).

Prints progress to stderr and one JSON object last: per arm `requested`, `completed` (final trajectories with status
`ok`), `lost` (requested - final trajectories returned, any status; must be 0), `statuses`, `actor_seconds`,
`idle_actor_seconds`, `utilization` (rollout-seconds / (K x actor-seconds)), `peak_actors`, `actors_started`,
`pool_start_s` (starting the runtime: the fixed pool's actors start there), `burst_seconds` (each burst's
enqueue-to-last-result time); `cold_actor` (one env pool actor created on the running cluster before the arms:
`ready_s` from `.remote()` to its `ready()` answer, the heavy packages its process holds, the 1-minute load average);
`idle_saving` = 1 - elastic idle / fixed idle; the
elastic arm's scale-up reaction per burst (`first_actor_s`: enqueue to the first actor live, `all_actors_s`: to
`peak` live) and its medians.

Run: `python benchmarks/elastic.py` (3 bursts of 300, 20 s gaps: ~4 minutes on 2 cores) or `--quick` (2 bursts of 100,
8 s gaps: ~1 minute) or `--cold-actor` (the `cold_actor` figure only).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
# Ray reads these at import and at start: a simulated cluster kept on 127.0.0.1, token auth explicitly off.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

#: Resource per node and per actor: 4 actors fit a node.
NODE_SLOTS = 4
POOL = "envs.nap.pool"


def log(msg: str) -> None:
    print(f"[elastic] {msg}", file=sys.stderr, flush=True)


def policy(ctx: Any) -> str:
    """Scripted policy: one nap of `RAYGRPO_BENCH_NAP_S` seconds (set for the actors), then stop."""
    from raygrpo.agent.toolcalls import format_tool_call

    if any(m.get("role") == "tool" for m in ctx.messages):
        return "Done."
    return format_tool_call("nap", {"seconds": float(os.environ.get("RAYGRPO_BENCH_NAP_S", "1.5"))})


def arm_config(url: str, *, elastic: bool, peak: int, k: int, idle_timeout_s: float):
    from raygrpo.config import load_config

    pool: dict[str, Any] = {"max_concurrent_per_actor": k, "num_cpus": 0, "resources": {"sandbox_host": 1}}
    pool.update({"min_actors": 0, "max_actors": peak, "idle_timeout_s": idle_timeout_s} if elastic
                else {"num_actors": peak})
    return load_config(data={
        "envs": {"nap": {"kind": "ors", "url": url, "num_tasks": 64, "pool": pool}},
        "policy": {"kind": "scripted", "script": f"{HERE / 'elastic.py'}:policy"},
        "rollout": {"group_size": 1, "rollout_timeout_s": 300},
        "workers": {"actor_num_cpus": 0, "actor_start_timeout_s": 300, "max_retries": 2},
    })


def run_arm(name: str, url: str, args: argparse.Namespace, peak: int) -> dict[str, Any]:
    """Run the bursts on one arm's pool; returns its figures and its samples over time."""
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.attempts import RolloutRequest
    from raygrpo.driver.orchestrator import Orchestrator
    from raygrpo.driver.resolve import resolve_run

    cfg = arm_config(url, elastic=name == "elastic", peak=peak, k=args.k, idle_timeout_s=args.idle_timeout)
    finals = []
    samples: list[tuple[float, int, int, int]] = []  # (s, live actors, live + starting, demand)
    reactions: list[dict[str, float | None]] = []
    burst_seconds: list[float] = []
    began = time.monotonic()
    with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env, actor_prefix=f"bench-{name}") as runtime:
        pool_start_s = round(time.monotonic() - began, 2)  # the fixed pool's actors start here, before any burst
        pools = runtime.pools
        orchestrator = Orchestrator(pools=pools, max_retries=cfg.workers.max_retries)
        tasks = runtime.tasks
        t0 = time.monotonic()
        mark: dict[str, float | None] = {}

        def sample(o: Orchestrator) -> None:
            snap = pools.snapshot()[POOL]
            now = time.monotonic() - t0
            samples.append((round(now, 2), snap["actors"], snap["actors"] + snap["starting"],
                            o.queued + o.in_flight))
            since = now - mark["enqueued"]
            if snap["actors"] and mark["first"] is None:
                mark["first"] = since
            if snap["actors"] >= peak and mark["all"] is None:
                mark["all"] = since

        for b in range(args.bursts):
            requests = [RolloutRequest(tasks[i % len(tasks)], f"{name}-b{b}-{i}", 0) for i in range(args.burst_size)]
            mark.update(enqueued=time.monotonic() - t0, first=None, all=None)
            began = time.monotonic()
            finals += orchestrator.run(requests, on_poll=sample)
            burst_seconds.append(round(time.monotonic() - began, 2))
            reactions.append({"first_actor_s": _r(mark["first"]), "all_actors_s": _r(mark["all"])})
            log(f"{name}: burst {b + 1}/{args.bursts} done in {burst_seconds[-1]:.1f} s; pool "
                f"{pools.snapshot()[POOL]['actors']} live; idle gap of {args.gap:g} s")
            gap_end = time.monotonic() + args.gap
            while time.monotonic() < gap_end:
                orchestrator.poll(timeout=min(0.5, max(0.0, gap_end - time.monotonic())))
                sample(orchestrator)
        snap = pools.snapshot()[POOL]  # before closing: closing is not part of the workload
    statuses = Counter(t.status.value for t in finals)
    requested = args.bursts * args.burst_size
    log(f"{name}: {dict(statuses)}; {snap['actor_seconds']:.0f} actor-s, {snap['idle_actor_seconds']:.0f} idle, "
        f"utilization {snap['utilization']}")
    return {
        "requested": requested,
        "completed": statuses.get("ok", 0),
        "lost": requested - len(finals),
        "statuses": dict(statuses),
        "actor_seconds": snap["actor_seconds"],
        "idle_actor_seconds": snap["idle_actor_seconds"],
        "utilization": snap["utilization"],
        "peak_actors": max(s[1] for s in samples),
        "actors_started": snap["started"],
        "actors_drained": snap["drained"],
        "actors_lost": snap["lost"],
        "pool_start_s": pool_start_s,
        "burst_seconds": burst_seconds,
        "reaction": reactions,
        "leaked_envs": runtime.leaked_envs,
        "_samples": samples,
    }


def cold_actor_ready_s(url: str, k: int) -> dict[str, Any]:
    """One env pool actor (the arms' settings, scripted policy, the nap environment) created on a running cluster:
    seconds from `.remote()` to its `ready()` answer (a Ray worker process starts, imports the actor's module, loads
    the tokenizer and builds the worker), and the heavy packages its process then holds."""
    import ray

    from raygrpo.actors.env_pool import EnvPoolActor
    from raygrpo.agent.worker import WorkerSettings

    cfg = arm_config(url, elastic=False, peak=1, k=k, idle_timeout_s=3.0)
    settings = WorkerSettings("bench-cold", dict(cfg.envs), cfg.policy, cfg.model, cfg.sampling, cfg.rollout,
                              max_concurrent_per_actor=k, providers=dict(cfg.providers))
    began = time.monotonic()
    actor = EnvPoolActor.options(num_cpus=0, resources={"sandbox_host": 1}).remote(settings)
    try:
        ray.get(actor.ready.remote(), timeout=300)
        ready_s = round(time.monotonic() - began, 2)
        heavy = ray.get(actor.__ray_call__.remote(lambda self: sorted(
            {m.split(".")[0] for m in sys.modules} & {"torch", "trl", "transformers", "datasets", "openreward"})))
    finally:
        ray.kill(actor)
    log(f"cold actor: ready {ready_s:.2f} s after creation; holds {heavy}")
    return {"ready_s": ready_s, "heavy_modules": heavy, "load_avg_1m": round(os.getloadavg()[0], 2)}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def plot(arms: dict[str, dict[str, Any]], k: int, path: Path) -> None:
    """Actors (live; live + starting) against demand in actors' worth (rollouts queued + in flight, over K)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(arms), 1, figsize=(10, 3.2 * len(arms)), sharex=True, sharey=True)
    for ax, (name, arm) in zip(axes, arms.items()):
        t, live, active, demand = zip(*arm["_samples"])
        ax.step(t, [d / k for d in demand], where="post", color="tab:gray", label=f"demand / K (K={k})")
        ax.step(t, active, where="post", color="tab:orange", linestyle="--", label="actors live + starting")
        ax.step(t, live, where="post", color="tab:blue", label="actors live")
        ax.set_title(f"{name}: idle {arm['idle_actor_seconds']:.0f} of {arm['actor_seconds']:.0f} actor-s, "
                     f"utilization {arm['utilization']}")
        ax.set_ylabel("actors")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds since the first burst")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 bursts of 100, 8 s gaps (~1 minute)")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--burst-size", type=int, default=300)
    parser.add_argument("--gap", type=float, default=20.0, help="idle seconds after each burst")
    parser.add_argument("--nap", type=float, default=1.5, help="server-side seconds per rollout")
    parser.add_argument("--k", type=int, default=40, help="rollouts per actor at once")
    parser.add_argument("--idle-timeout", type=float, default=3.0, help="elastic arm's idle_timeout_s")
    parser.add_argument("--nodes", type=int, default=2, help=f"simulated nodes with sandbox_host: {NODE_SLOTS}")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-elastic")
    parser.add_argument("--cold-actor", action="store_true",
                        help="only measure one env pool actor's creation-to-ready seconds (~1 minute), no bursts")
    args = parser.parse_args()
    if args.quick:
        args.bursts, args.burst_size, args.gap = 2, 100, 8.0
    peak = math.ceil(args.burst_size / args.k)
    if peak > args.nodes * NODE_SLOTS:
        parser.error(f"{peak} actors at the peak do not fit {args.nodes} nodes x {NODE_SLOTS}: raise --nodes or --k")
    os.environ["RAYGRPO_BENCH_NAP_S"] = str(args.nap)

    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from raygrpo.core.environ import PROCESS_ENV, apply_process_env
    from raygrpo.envs.ors.server import serve_environments
    from tests.e2e_support import NapEnvironment  # the end-to-end tests' ORS environment: `nap(seconds)`, reward 1.0

    apply_process_env()
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import; the variable is set above, this covers a prior import
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    server = None
    try:
        for _ in range(args.nodes):
            # CPUs only for Ray's worker start-up concurrency (one worker process starting per CPU); actors take 0.
            cluster.add_node(num_cpus=NODE_SLOTS, resources={"sandbox_host": NODE_SLOTS})
        cluster.wait_for_nodes(timeout=120)
        env_vars = {k: os.environ[k] for k in [*PROCESS_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE",
                                               "PYTHONPATH", "RAYGRPO_BENCH_NAP_S"]}
        ray.init(address=cluster.address, runtime_env={"env_vars": env_vars}, logging_level=logging.WARNING)
        server = serve_environments(NapEnvironment, host="127.0.0.1", port=0)
        cold = cold_actor_ready_s(server.url, args.k)
        if args.cold_actor:
            print(json.dumps({"cold_actor": cold}))
            return
        log(f"{args.bursts} bursts of {args.burst_size} x {args.nap:g} s naps, {args.gap:g} s gaps; pools of up to "
            f"{peak} actors (K={args.k}) on {args.nodes} simulated nodes")
        arms = {name: run_arm(name, server.url, args, peak) for name in ("elastic", "fixed")}
    finally:
        if server is not None:
            server.stop()
        ray.shutdown()
        cluster.shutdown()

    plot_path = args.out / "pool_size.png"
    plot(arms, args.k, plot_path)
    elastic, fixed = arms["elastic"], arms["fixed"]
    firsts = [r["first_actor_s"] for r in elastic["reaction"] if r["first_actor_s"] is not None]
    alls = [r["all_actors_s"] for r in elastic["reaction"] if r["all_actors_s"] is not None]
    print(json.dumps({
        "workload": {"bursts": args.bursts, "burst_size": args.burst_size, "gap_s": args.gap, "nap_s": args.nap,
                     "k": args.k, "peak_actors": peak, "idle_timeout_s": args.idle_timeout, "nodes": args.nodes,
                     "cluster": "ray.cluster_utils.Cluster"},
        "elastic": {k: v for k, v in elastic.items() if not k.startswith("_")},
        "fixed": {k: v for k, v in fixed.items() if not k.startswith("_")},
        "idle_saving": round(1 - elastic["idle_actor_seconds"] / fixed["idle_actor_seconds"], 3)
        if fixed["idle_actor_seconds"] else None,
        "actor_seconds_saving": round(1 - elastic["actor_seconds"] / fixed["actor_seconds"], 3)
        if fixed["actor_seconds"] else None,
        "scale_up_first_actor_s_median": round(statistics.median(firsts), 2) if firsts else None,
        "scale_up_all_actors_s_median": round(statistics.median(alls), 2) if alls else None,
        "cold_actor": cold,
        "burst_seconds_elastic_over_fixed": round(sum(elastic["burst_seconds"]) / sum(fixed["burst_seconds"]), 3),
        "plot": str(plot_path),
    }))


if __name__ == "__main__":
    main()
