"""Cluster scale: 10,000 Harbor rollouts on a simulated multi-node Ray cluster against a rate- and live-limited
sandbox provider, one node lost midway (issue 17, DESIGN section 6 item 7).

What runs:

- The provider: raygrpo's fake sandbox provider (`raygrpo.testing.fake_provider`) in its own process on 127.0.0.1,
  enforcing `--create-rate` creates in any sliding 1 s window and `--live-cap` sandboxes alive at once (HTTP 429
  beyond either) and logging every call. Every limit, 429 and leak below is counted from that log
  (`raygrpo.testing.fake_provider.audit.audit`), not from raygrpo's bookkeeping.
- The cluster: `ray.cluster_utils.Cluster` on 127.0.0.1, a head (the driver, no env pool actors) and `--nodes` worker
  nodes, each carrying the custom resource `cluster_scale_host: 2 x --actors-per-node`; the env pool actors ask for
  `cluster_scale_host: 1` each (`envs.fake.pool: {num_actors, max_concurrent_per_actor, num_cpus: 0, resources}`),
  so Ray spreads them `--actors-per-node` per node and a lost node's actors have room to come back on the others.
- The run: one Harbor environment on the fake provider's backend
  (`raygrpo.testing.fake_provider.backend:FakeProviderEnvironment`, `environment_kwargs: {url, reward: 1.0}`) with its
  provider's cluster-wide `create_rate_per_s` and `max_live` (`providers.fake`) set to the provider's limits, driven
  programmatically (`RolloutRuntime` + `Orchestrator`, as `raygrpo rollout` does). Each rollout is the real path (env
  pool actor, agent loop, chat template and tool-call parser of the tiny model, Harbor adapter, provisioning gate and
  verifier) with a scripted policy (`policy` below) whose first turn waits `--hold-s` seconds (a model thinking, at no
  CPU cost) and then makes one `bash` call; the second turn ends the episode and Harbor's verifier scores it 1.0. A
  sandbox is therefore held for about `--hold-s` plus the path's own time, so with hold = live cap / create rate both
  limits bind. The run's lease ledger lives in the benchmark's own work folder (`RAYGRPO_LEASE_DIR`), so it neither
  reaps nor waits on what other runs on the machine left.
- The loss: when half the rollouts have completed, the worker node hosting the most env pool actors is removed
  (`Cluster.remove_node(..., allow_graceful=False)`: its raylet and every worker on it are killed). Its rollouts
  must be retried on the other actors (`workers.max_retries`), nothing may be lost. `removed_node` in the JSON says
  which node went, its actors, and which node the provider key's governor actor was on (`governor_on`).

Printed: progress lines (logging, stderr) and ONE JSON object last (stdout), with:

- `requested`, `completed` (final trajectories with status `ok` and a reward), `lost` (requested - final trajectories
  returned, any status: every rollout must be scored or accounted for), `statuses`, `retried`, `lost_to_actors`;
- from the provider's log: `max_live` (most sandboxes alive at once) and `live_cap`; `max_create_rate` (most accepted
  creates in any sliding 1 s window) and `create_limit_per_s`; `rejected_429` (creates answered 429, split in
  `rejected_429_rate` / `rejected_429_live`); `leaked` (sandboxes the provider still had alive once the run's runtime
  had shut down, read from its listing); `live_after_rollouts` (alive once the last trajectory came back, before the
  runtime's shutdown: the lost node's sandboxes, until something stops them); `expired` (sandboxes whose lifetime
  ended before anyone deleted them); `hold_s_median` / `hold_s_p95` (create to delete, per sandbox);
- `create_utilization`: accepted creates per second / `create_limit_per_s` over the window where demand exceeded the
  cap. The window opens at the first accepted create and closes when the rollouts still outstanding at the driver
  (queued + in flight) first drop below `live_cap` (from then on the run cannot keep `live_cap` sandboxes busy, so
  neither limit binds). `create_utilization_before_loss` is the same up to the node's removal;
- `wall_s`: from the first dispatch to the last trajectory (cluster start-up and shutdown excluded; `total_wall_s`
  includes them);
- raygrpo's CPU per rollout: user + system CPU seconds of the driver and every process of the Ray session (all
  descendants of this process: GCS, raylets, Ray's agents, the env pool actors and every other worker; the fake
  provider's process excluded; this script's own sampling thread subtracted), sampled when the completed rollouts cross
  each tenth of the run. `cpu_ms_per_rollout_first` is over rollouts 1..N/10 (10,000 rollouts: 1-1,000, counted from the
  first dispatch, so the actors' start-up is excluded but their first rollouts are not), `cpu_ms_per_rollout_last` over
  rollouts 9N/10+1..N (9,001-10,000), `cpu_growth` = last / first (target <= 1.3), `cpu_ms_per_rollout_by_tenth` all
  ten, `cpu_ms_per_rollout_by_process_first` / `_last` the first and last tenths per kind of process (`ray::EnvPool`,
  the governor `ray::GovernorActor`, `raylet`, `driver`, ...) and `cpu_s_by_process` the whole session's; `governor`:
  the governor actor's own counts at the end (create slots granted, live tickets granted, returned, expired and
  forgotten, refusals); `gates`: the surviving env pool actors' provisioning gates (create slots missed because a start
  woke past the slot's margin, `late_wakes`; of those, the ones already past their deadline when the wait began,
  `late_on_arrival`; the latest miss, `late_max_s`). A process that exits keeps the CPU it had at its last sample (the
  sampler runs every second), so the removed node's processes count up to their death. Note the windows are not
  symmetric in the work they hold: the first tenth also carries the starts of the rollouts in flight when it closes, the
  last one finishes those its predecessor started and drains to zero (fewer rollouts/s over Ray's fixed background CPU).

Run: `python benchmarks/cluster_scale.py` (10,000 rollouts at 40 creates/s and 400 live, 10 s holds, 4 nodes: at
least 250 s of creates; about 5.5 minutes on a 2-core machine, see benchmarks/README.md) or
`--quick` (600 rollouts at 12/s and 24 live, 1.5 s holds, 4 nodes: about 3 minutes on 2 cores, half of it starting
the cluster and the actors). Options: `--rollouts`, `--create-rate`, `--live-cap`, `--hold-s`, `--nodes`,
`--actors-per-node`, `--out FILE` (the JSON also written there), `--keep` (keep the provider's log and the lease
ledger). Ray and the provider are shut down whatever happens (an error, Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
# Ray reads these at import and at start: a simulated cluster kept on 127.0.0.1, token auth explicitly off.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from session_cpu import SessionCpu  # noqa: E402

logger = logging.getLogger("cluster_scale")

TASKS = ROOT / "examples" / "harbor_local" / "tasks"
BACKEND = "raygrpo.testing.fake_provider.backend:FakeProviderEnvironment"
#: The custom resource that marks the simulated worker nodes (env pool actors ask for 1 each).
NODE_RESOURCE = "cluster_scale_host"
#: The fake provider's name in the run config: its `providers:` entry holds the limits the governor enforces.
PROVIDER = "fake"
#: Read by `policy` in the env pool actors: seconds its first turn waits.
HOLD_ENV = "RAYGRPO_BENCH_HOLD_S"
ENV_NAME = "fake"


@dataclass(frozen=True)
class Shape:
    """One benchmark run's workload."""

    rollouts: int
    create_rate: float
    live_cap: int
    hold_s: float
    nodes: int
    actors_per_node: int


FULL = Shape(rollouts=10_000, create_rate=40.0, live_cap=400, hold_s=10.0, nodes=4, actors_per_node=1)
QUICK = Shape(rollouts=600, create_rate=12.0, live_cap=24, hold_s=1.5, nodes=4, actors_per_node=1)


async def policy(ctx: Any) -> str:
    """Scripted policy: wait `RAYGRPO_BENCH_HOLD_S` seconds (a model thinking, no CPU), make one `bash` call, stop."""
    from raygrpo.agent.toolcalls import format_tool_call

    if ctx.turn > 0 or any(m.get("role") == "tool" for m in ctx.messages):
        return "Done."
    await asyncio.sleep(float(os.environ.get(HOLD_ENV, "10")))
    return format_tool_call("bash", {"command": "true"})


# ── the run ────────────────────────────────────────────────────────────────────────────────────────────────────────


@dataclass
class Marks:
    """What the driver records while dispatching."""

    t0: float = 0.0
    outstanding: list[tuple[float, int]] = field(default_factory=list)
    cpu: list[tuple[int, float, float]] = field(default_factory=list)  # (completed, cpu_s, time.time())
    cpu_kinds: list[dict[str, float]] = field(default_factory=list)  # CPU seconds per kind of process, same points
    removed_at: float | None = None
    removed: dict[str, Any] = field(default_factory=dict)


def run_config(shape: Shape, url: str, per_actor: int) -> Any:
    from raygrpo.config import load_config

    env: dict[str, Any] = {
        "kind": "harbor",
        "path": str(TASKS),
        "import_path": BACKEND,
        "environment_kwargs": {"url": url, "reward": 1.0},
        "provider": PROVIDER,
        # Deadlines a few times what a rollout needs: the ledger derives each sandbox's lifetime at the provider
        # from them (start + rollout + verifier + stop + a margin), which bounds how long a lost node's sandboxes live.
        "start_timeout_s": 60,
        "exec_timeout_s": 30,
        "verifier_timeout_s": 30,
        "stop_timeout_s": 30,
        "pool": {"num_actors": shape.nodes * shape.actors_per_node, "max_concurrent_per_actor": per_actor,
                 "num_cpus": 0, "resources": {NODE_RESOURCE: 1}},
    }
    return load_config(data={
        "envs": {ENV_NAME: env},
        # The provider's own limits, so the governor keeps under them without a 429.
        "providers": {PROVIDER: {"create_rate_per_s": shape.create_rate, "max_live": shape.live_cap}},
        "model": "tiny",
        "policy": {"kind": "scripted", "script": f"{HERE / 'cluster_scale.py'}:policy"},
        "sampling": {"max_tokens": 256},
        "rollout": {"group_size": 1, "max_turns": 3, "max_total_tokens": 4096, "rollout_timeout_s": 60},
        "workers": {"actor_num_cpus": 0, "actor_start_timeout_s": 300, "max_retries": 3},
    })


def actor_nodes(cluster: Any, runtime: Any) -> dict[str, list[Any]]:
    """Env pool actor names per worker node (by the raylet that started each actor's process)."""
    import psutil
    import ray

    raylets = {node.all_processes["raylet"][0].process.pid: node for node in cluster.worker_nodes}
    placed: dict[str, list[Any]] = {}
    pids = ray.get([h.pid.remote() for _, h in runtime.actors], timeout=60)
    for (name, _), pid in zip(runtime.actors, pids):
        try:
            parent = psutil.Process(pid).ppid()
        except psutil.Error:
            continue
        node = raylets.get(parent)
        if node is not None:
            placed.setdefault(node.node_id, []).append(name)
    return placed


def gate_state(runtime: Any) -> dict[str, Any]:
    """The env pool actors' provisioning gates, summed over the actors alive at the end (the lost one's are gone):
    create slots missed because the start woke past its slot's margin (`late_wakes`), those whose deadline had
    passed before the wait began (`late_on_arrival`), and the latest miss (`late_max_s`)."""
    import ray

    try:
        per_actor = ray.get([handle.stats.remote() for _, handle in runtime.actors], timeout=30)
    except Exception as exc:  # noqa: BLE001 - a figure left out, not a failed run
        logger.warning("the env pool actors did not answer: %s", exc)
        return {}
    gates = [gate for stats in per_actor for gate in stats.get("gates", [])]
    return {
        "actors": len(per_actor),
        "granted": sum(g["granted"] for g in gates),
        "late_wakes": sum(g["late_wakes"] for g in gates),
        "late_on_arrival": sum(g["late_on_arrival"] for g in gates),
        "late_max_s": round(max((g["late_max_s"] for g in gates), default=0.0), 3),
        "late_wakes_by_actor": [g["late_wakes"] for g in gates],
    }


def governor_state(cfg: Any) -> dict[str, Any]:
    """The governor's own counts (slots granted, live tickets, refusals), or {} when it does not answer."""
    import ray

    from raygrpo.governor.actor import NAMESPACE, governor_name

    try:
        handle = ray.get_actor(governor_name(cfg.envs[ENV_NAME].provider_key), namespace=NAMESPACE)
        return ray.get(handle.ping.remote(), timeout=30)
    except Exception as exc:  # noqa: BLE001 - a figure left out, not a failed run
        logger.warning("the governor did not answer: %s", exc)
        return {}


def governor_node(cluster: Any) -> str | None:
    """Which node the provider's governor actor (`ray::GovernorActor`; `ray::RateLimiter` before) runs on: `head`, a
    worker node's id prefix, or None when it is not found."""
    import psutil

    raylets = {cluster.head_node.all_processes["raylet"][0].process.pid: "head"}
    raylets.update({n.all_processes["raylet"][0].process.pid: n.node_id[:12] for n in cluster.worker_nodes})
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name().startswith("ray::") and any(k in proc.name() for k in ("RateLimiter", "Governor")):
                return raylets.get(proc.ppid())
        except psutil.Error:
            continue
    return None


def remove_busiest_node(cluster: Any, runtime: Any, marks: Marks) -> threading.Thread:
    """Remove the worker node hosting the most env pool actors, in a thread (the driver keeps polling)."""
    placed = actor_nodes(cluster, runtime)
    node_id = max(placed, key=lambda n: len(placed[n]))
    node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    marks.removed = {"node": node_id[:12], "actors": placed[node_id],
                     "placement": {n[:12]: len(a) for n, a in placed.items()}, "governor_on": governor_node(cluster)}
    logger.warning("removing node %s with env pool actor(s) %s", node_id[:12], ", ".join(placed[node_id]))

    def remove() -> None:
        began = time.monotonic()
        marks.removed_at = time.time()
        cluster.remove_node(node, allow_graceful=False)
        marks.removed["remove_s"] = round(time.monotonic() - began, 2)
        logger.warning("node %s removed in %.1f s", node_id[:12], marks.removed["remove_s"])

    thread = threading.Thread(target=remove, name="remove-node", daemon=True)
    thread.start()
    return thread


def run(shape: Shape, work: Path) -> dict[str, Any]:
    """Start the provider and the cluster, run the rollouts, shut everything down; return the figures."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from raygrpo.core.environ import PROCESS_ENV, apply_process_env
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.attempts import RolloutRequest
    from raygrpo.driver.orchestrator import Orchestrator
    from raygrpo.driver.resolve import resolve_run
    from raygrpo.testing.fake_provider.audit import audit
    from raygrpo.testing.fake_provider.service import FakeProviderProcess
    from raygrpo.testing.fake_provider.state import Limits

    apply_process_env()
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import; the variable is set above, this covers a prior import
    os.environ[HOLD_ENV] = str(shape.hold_s)
    # A lease ledger of the benchmark's own (`raygrpo.leases.ledger`; the runtime hands it to the actors): it
    # neither reaps nor waits on leases other runs on this machine left.
    os.environ["RAYGRPO_LEASE_DIR"] = str(work / "leases")
    actors = shape.nodes * shape.actors_per_node
    # Twice the live cap in flight, so demand still exceeds it after a node's actors are lost.
    per_actor = math.ceil(2 * shape.live_cap / actors)
    log_path = work / "provider.jsonl"
    began_all = time.monotonic()
    provider = FakeProviderProcess(log_path, Limits(create_rate_per_s=shape.create_rate, max_live=shape.live_cap))
    cluster: Any = None
    finals: list[Any] = []
    marks = Marks()
    remover: threading.Thread | None = None
    leaked_listing: list[dict[str, Any]] = []
    try:
        provider.start()
        logger.info("fake provider at %s: %g creates/s, %d live; log %s", provider.url, shape.create_rate,
                    shape.live_cap, log_path)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        for _ in range(shape.nodes):
            # CPUs only for Ray's worker start-up concurrency; the actors take none.
            cluster.add_node(num_cpus=2, resources={NODE_RESOURCE: 2 * shape.actors_per_node})
        cluster.wait_for_nodes(timeout=120)
        env_vars = {k: os.environ[k] for k in [*PROCESS_ENV, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE",
                                               "PYTHONPATH", HOLD_ENV]}
        ray.init(address=cluster.address, runtime_env={"env_vars": env_vars}, logging_level=logging.WARNING)
        # Ray's in-process head node and `ray.init` each put a SIGTERM handler of their own (kill the node's
        # processes, exit) in place of ours; SIGTERM takes Ctrl-C's way out instead, through every clean-up below.
        signal.signal(signal.SIGTERM, _interrupt)
        cfg = run_config(shape, provider.url, per_actor)
        with SessionCpu(exclude={provider.proc.pid}) as cpu, \
                RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env, actor_prefix="cluster-scale") as runtime:
            placement = actor_nodes(cluster, runtime)
            logger.info("%d env pool actors (K=%d) on %d nodes: %s", len(runtime.actors), per_actor, len(placement),
                        {n[:12]: len(a) for n, a in placement.items()})
            tasks = runtime.tasks
            requests = [RolloutRequest(tasks[i % len(tasks)], f"cs-{i}", 0) for i in range(shape.rollouts)]
            orchestrator = Orchestrator(pools=runtime.pools, max_retries=cfg.workers.max_retries)
            tenths = [math.ceil(shape.rollouts * k / 10) for k in range(1, 11)]
            last_log = [time.monotonic(), 0]
            marks.t0 = time.time()
            marks.cpu.append((0, cpu.sample(), marks.t0))
            marks.cpu_kinds.append(cpu.by_kind())

            def on_poll(o: Orchestrator) -> None:
                nonlocal remover
                done = len(finals)
                marks.outstanding.append((time.time(), o.outstanding))
                while len(marks.cpu) <= len(tenths) and done >= tenths[len(marks.cpu) - 1]:
                    marks.cpu.append((done, cpu.sample(), time.time()))
                    marks.cpu_kinds.append(cpu.by_kind())
                if remover is None and done >= shape.rollouts // 2:
                    remover = remove_busiest_node(cluster, runtime, marks)
                now = time.monotonic()
                if now - last_log[0] >= 5.0:
                    rate = (done - last_log[1]) / (now - last_log[0])
                    logger.info("%5d/%d done (%.1f/s), %d in flight, %d queued, %d retried, %d actors, cpu %.0f s",
                                done, shape.rollouts, rate, o.in_flight, o.queued, o.stats.retried,
                                len(runtime.actors), cpu.latest)
                    last_log[:] = [now, done]

            for traj in orchestrator.run(requests, on_poll=on_poll):
                finals.append(traj)
            on_poll(orchestrator)  # the last tenth's sample
            wall_s = time.time() - marks.t0
            # Every rollout is done: what the provider still has are the lost node's sandboxes (before the run's
            # shutdown reaps this run's stale leases).
            live_after_rollouts = len(provider.live())
            cpu_by_kind = cpu.by_kind()
            stats = orchestrator.stats
            governor_stats = governor_state(cfg)
            gates = gate_state(runtime)
            if remover is not None:
                remover.join(120)
        pool = runtime.pool_snapshot.get(f"envs.{ENV_NAME}.pool", {})
        leaked_listing = provider.live()
        leaked_envs = runtime.leaked_envs
        ray.shutdown()
        cluster.shutdown()
        cluster = None
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            # The provider first: the run's sandboxes were closed when the runtime exited, and nothing of Ray's
            # shutdown below may leave it running.
            provider.stop()
        finally:
            try:
                ray.shutdown()
                if cluster is not None:
                    cluster.shutdown()
            finally:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                signal.signal(signal.SIGTERM, _interrupt)

    figures = audit(log_path)
    statuses = Counter(t.status.value for t in finals)
    completed = sum(1 for t in finals if t.status.value == "ok" and t.reward is not None)
    utilization = create_utilization(figures.create_times, marks, shape)
    before_loss = create_utilization(figures.create_times, marks, shape, until=marks.removed_at)
    per_tenth = cpu_per_tenth(marks.cpu)
    holds = hold_times(log_path)
    first, last = (per_tenth[0], per_tenth[-1]) if len(per_tenth) == 10 else (None, None)
    return {
        "requested": shape.rollouts,
        "completed": completed,
        "lost": shape.rollouts - len(finals),
        "statuses": dict(statuses),
        "retried": stats.retried,
        "lost_to_actors": stats.lost_to_actors,
        "max_live": figures.max_live,
        "live_cap": shape.live_cap,
        "max_create_rate": figures.max_creates_per_s,
        "create_limit_per_s": shape.create_rate,
        "create_utilization": utilization,
        "create_utilization_before_loss": before_loss,
        "rejected_429": figures.rejected,
        "rejected_429_rate": figures.rejected_rate,
        "rejected_429_live": figures.rejected_live,
        "creates": figures.creates,
        "leaked": len(leaked_listing),
        "live_after_rollouts": live_after_rollouts,
        "expired": figures.expired,
        "leaked_envs_raygrpo": leaked_envs,
        "wall_s": round(wall_s, 1),
        "total_wall_s": round(time.monotonic() - began_all, 1),
        "cpu_ms_per_rollout_first": first,
        "cpu_ms_per_rollout_last": last,
        "cpu_growth": round(last / first, 3) if first and last else None,
        "cpu_ms_per_rollout_by_tenth": per_tenth,
        "cpu_s_by_process": cpu_by_kind,
        "cpu_ms_per_rollout_by_process_first": cpu_by_kind_between(marks, 0, 1),
        "cpu_ms_per_rollout_by_process_last": cpu_by_kind_between(marks, 9, 10),
        "hold_s_median": holds[0],
        "hold_s_p95": holds[1],
        "governor_live_cap_set": cfg.providers[PROVIDER].max_live is not None,
        "governor": governor_stats,
        "gates": gates,
        "nodes": shape.nodes,
        "actors": actors,
        "max_concurrent_per_actor": per_actor,
        "hold_s": shape.hold_s,
        "removed_node": marks.removed,
        "pool": {k: pool.get(k) for k in ("started", "lost", "actors")},
        "provider_log": str(log_path),  # removed from the JSON unless --keep
    }


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM as Ctrl-C: unwind through every clean-up (the runtime's, Ray's, the provider's)."""
    raise KeyboardInterrupt(f"signal {signum}")


def create_utilization(create_times: list[float], marks: Marks, shape: Shape,
                       until: float | None = None) -> float | None:
    """Accepted creates per second / the create limit, from the first accepted create until the driver's
    outstanding rollouts first fell below the live cap (or `until`, if earlier)."""
    if not create_times:
        return None
    start = create_times[0]
    end = next((t for t, n in marks.outstanding if n < shape.live_cap), marks.outstanding[-1][0])
    if until is not None:
        end = min(end, until)
    if end <= start:
        return None
    accepted = sum(1 for t in create_times if start <= t < end)
    return round(accepted / (end - start) / shape.create_rate, 3)


def cpu_by_kind_between(marks: Marks, a: int, b: int) -> dict[str, float]:
    """CPU ms per completed rollout per kind of process between the `a`th and `b`th samples (tenths)."""
    if len(marks.cpu_kinds) <= b or marks.cpu[b][0] <= marks.cpu[a][0]:
        return {}
    n = marks.cpu[b][0] - marks.cpu[a][0]
    before, after = marks.cpu_kinds[a], marks.cpu_kinds[b]
    out = {k: round(1000 * (v - before.get(k, 0.0)) / n, 2) for k, v in after.items()}
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v >= 0.05}


def cpu_per_tenth(samples: list[tuple[int, float, float]]) -> list[float]:
    """CPU ms per completed rollout between consecutive samples (one per tenth of the run)."""
    return [round(1000 * (c1 - c0) / (n1 - n0), 2) for (n0, c0, _), (n1, c1, _) in zip(samples, samples[1:])
            if n1 > n0]


def hold_times(log_path: Path) -> tuple[float | None, float | None]:
    """Median and 95th percentile of create-to-delete seconds per sandbox, from the provider's log."""
    created: dict[str, float] = {}
    held: list[float] = []
    with open(log_path) as log:
        for line in log:
            record = json.loads(line)
            if record["op"] == "create" and record["status"] == 201:
                created[record["id"]] = record["t"]
            elif record["op"] == "delete" and record["status"] == 204 and record["id"] in created:
                held.append(record["t"] - created.pop(record["id"]))
    if not held:
        return None, None
    held.sort()
    return round(statistics.median(held), 2), round(held[int(0.95 * (len(held) - 1))], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK.rollouts} rollouts at {QUICK.create_rate:g}/s and {QUICK.live_cap} live, "
                             f"{QUICK.hold_s:g} s holds (about 3 minutes on 2 cores)")
    parser.add_argument("--rollouts", type=int)
    parser.add_argument("--create-rate", type=float, help="the provider's creates per second (and the spec's)")
    parser.add_argument("--live-cap", type=int, help="the provider's live sandboxes (and the spec's max_live)")
    parser.add_argument("--hold-s", type=float, help="seconds the policy waits in each sandbox before its bash call")
    parser.add_argument("--nodes", type=int, help="simulated worker nodes (>= 2: one is removed midway)")
    parser.add_argument("--actors-per-node", type=int)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work folder (the provider's log, the lease ledger; its path is in the JSON)")
    args = parser.parse_args()
    base = QUICK if args.quick else FULL
    shape = Shape(
        rollouts=args.rollouts or base.rollouts,
        create_rate=args.create_rate or base.create_rate,
        live_cap=args.live_cap or base.live_cap,
        hold_s=base.hold_s if args.hold_s is None else args.hold_s,
        nodes=args.nodes or base.nodes,
        actors_per_node=args.actors_per_node or base.actors_per_node,
    )
    if shape.nodes < 2:
        parser.error("--nodes must be at least 2: one is removed midway")
    if shape.rollouts < 10:
        parser.error("--rollouts must be at least 10 (CPU is sampled per tenth)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [cluster_scale] %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per call to the provider otherwise
    signal.signal(signal.SIGTERM, _interrupt)  # unwinds through the clean-up, as Ctrl-C does
    logger.info("%d rollouts, %g creates/s, %d live, %g s holds, %d nodes x %d actors", shape.rollouts,
                shape.create_rate, shape.live_cap, shape.hold_s, shape.nodes, shape.actors_per_node)
    work = Path(tempfile.mkdtemp(prefix="raygrpo-cluster-scale-"))
    try:
        # Ray prints its processes' output (a killed raylet's last words...) to stdout: keep stdout for the JSON.
        with contextlib.redirect_stdout(sys.stderr):
            report = run(shape, work)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if not args.keep:
        report.pop("provider_log")
    logger.info("%d/%d completed, lost %d, max live %d/%d, max creates %d/%g per s, utilization %s, leaked %d, "
                "cpu ms/rollout %s -> %s (growth %s)", report["completed"], report["requested"], report["lost"],
                report["max_live"], report["live_cap"], report["max_create_rate"], report["create_limit_per_s"],
                report["create_utilization"], report["leaked"], report["cpu_ms_per_rollout_first"],
                report["cpu_ms_per_rollout_last"], report["cpu_growth"])
    text = json.dumps(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text, flush=True)


if __name__ == "__main__":
    main()
