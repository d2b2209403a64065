"""A driver for the elastic-pool fault tests on the namespaced cluster (`tests/test_cluster_elastic.py`).

Run on the head node's namespace from a copy of `examples/harbor_local` (with `slow.py` beside its config), it joins
the cluster named by `RAY_ADDRESS`, starts the run's env pools (two actors on the `sandbox_host` nodes) and
streams the batch, printing one line per event for the test to act on:

    ACTORS [{"name", "pid", "node"}, ...]   once the actors are live
    BUSY                                    once every actor has rollouts in flight
    DETECTED {"name", "state", "at"}        once per first actor, when the driver stops using it (unreachable or
                                            lost; `at` is `time.time()`)
    RESULT {...}                            the trajectories, the pool after it got back to its size and settled its
                                            unreachable actors (up to 90 s after the batch), dispatch stats,
                                            the batch's wall time
    FINAL {"leaked_envs": ...}              after the runtime shut down

Extra `--set`-style overrides may follow on the command line (e.g. `workers.unreachable_after_s=10`).
"""

from __future__ import annotations

import json
import sys
import time

import ray

from raygrpo.config import load_config
from raygrpo.driver.launch import RolloutRuntime
from raygrpo.driver.attempts import make_groups
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.driver.resolve import resolve_run
from raygrpo.driver.runtime import init_ray

OVERRIDES = [
    "policy.kind=scripted", "policy.script=slow.py:slow_right", "rollout.group_size=4", "workers.max_retries=3",
    "envs.local.exec_timeout_s=60",
    'envs.local.pool={"num_actors": 2, "max_concurrent_per_actor": 6, "num_cpus": 0, '
    '"resources": {"sandbox_host": 0.5}}',
]


def say(tag: str, payload: object = None) -> None:
    print(tag if payload is None else f"{tag} {json.dumps(payload)}", flush=True)


def main() -> None:
    init_ray()
    cfg = load_config("rollout.yaml", OVERRIDES + sys.argv[1:])
    with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env, actor_prefix="elastic-fault") as runtime:
        pools = runtime.pools
        first = {n for n, _ in runtime.actors}
        say("ACTORS", [{"name": n, "pid": ray.get(h.pid.remote()), "node": ray.get(h.node_ip.remote())}
                       for n, h in runtime.actors])
        busy = False
        detected: set[str] = set()

        def watch(orchestrator: Orchestrator) -> None:
            nonlocal busy
            slots = [s for p in pools.pools for s in p.slots]
            if not busy and len(slots) == 2 and all(s.in_flight >= 2 for s in slots):
                busy = True
                say("BUSY")
            states = {s.name: s.state.value for s in slots}
            for name in sorted(first - detected):
                if states.get(name, "dead") != "live":
                    detected.add(name)
                    say("DETECTED", {"name": name, "state": states.get(name, "dead"), "at": time.time()})

        orchestrator = Orchestrator(pools=pools, max_retries=cfg.workers.max_retries)
        began = time.monotonic()
        trajs = list(orchestrator.run(make_groups(runtime.tasks, cfg.rollout.group_size), on_poll=watch))
        wall_s = time.monotonic() - began
        deadline = time.monotonic() + 90
        def settled() -> bool:  # back to two live actors, and none left unreachable (retired or lost)
            snap = pools.snapshot()["envs.local.pool"]
            return snap["actors"] >= 2 and not snap["unreachable"] and not snap["draining"]

        while not settled() and time.monotonic() < deadline:
            pools.tick()
            time.sleep(0.5)
        say("RESULT", {
            "requested": len(runtime.tasks) * cfg.rollout.group_size,
            "trajectories": [{"id": f"{t.group_id}/{t.sample}", "status": t.status.value, "worker": t.worker,
                              "node": t.node, "attempt": t.attempt, "reward": t.reward} for t in trajs],
            "pool": pools.snapshot()["envs.local.pool"],
            "live_actor_nodes": [ray.get(h.node_ip.remote()) for _, h in runtime.actors],
            "lost_to_actors": orchestrator.stats.lost_to_actors, "retried": orchestrator.stats.retried,
            "abandoned": orchestrator.stats.abandoned, "duplicates_discarded": orchestrator.stats.duplicates_discarded,
            "wall_s": round(wall_s, 2),
        })
    say("FINAL", {"leaked_envs": runtime.leaked_envs})


if __name__ == "__main__":
    sys.exit(main())
