"""A lost actor's replacement keeps off the lost actor's node while Ray still counts that node alive.

On a `ray.cluster_utils.Cluster` with Ray's default health checks, a node whose raylet was killed stays alive in
Ray's view for ~12 s. A pool of two env pool actors, one on each of two nodes that each offer `pool_host: 2`: the
node of one actor is removed (`allow_graceful=False`) and the pool is told the actor is lost. With SPREAD alone the
replacement goes to the emptiest node — the removed one — and fails ~12 s later (`benchmarks/cluster_scale.py`
saw exactly this). The pool must place it on the node that remains, where it goes live with no failed start and
without waiting for Ray to declare the removed node dead: about as soon as the first actors went live after their
spawn. The bound is relative to that measured start, not a number of seconds, because an actor's start (Ray's
worker, then the imports of transformers with torch and of the openreward SDK) takes ~9 s on one machine of this kind
and 12-17 s on another, longer than the dead-node delay itself.

Like the other simulated-cluster tests, the cluster runs in a subprocess (this file run as a script).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

if not __package__:  # run as a script (the cluster's subprocess): `tests` is importable from the repo root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.sim_cluster import CLUSTER_ENV  # noqa: E402


def _run_cluster() -> dict:
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    from raygrpo.config import load_config
    from raygrpo.core.environ import PROCESS_ENV, apply_process_env
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.resolve import resolve_run
    from tests.e2e_support import NapEnvironment
    from tests.ors_utils import ors_server, wait_until

    apply_process_env()
    ray_constants.ENABLE_RAY_CLUSTER = False
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        workers = {cluster.add_node(num_cpus=1, resources={"pool_host": 2}) for _ in range(2)}
        cluster.wait_for_nodes(timeout=60)
        env_vars = {k: os.environ[k] for k in [*PROCESS_ENV, *CLUSTER_ENV]}
        ray.init(address=cluster.address, runtime_env={"env_vars": env_vars})
        with ors_server(NapEnvironment) as server:
            cfg = load_config(data={
                "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": 4,
                                 "pool": {"num_actors": 2, "max_concurrent_per_actor": 2, "num_cpus": 0,
                                          "resources": {"pool_host": 1}}}},
                "policy": {"kind": "scripted", "script": "tests/e2e_support.py:nap_one_and_a_half_seconds"},
            })
            spawned_at = time.monotonic()
            with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env, actor_prefix="node-loss") as runtime:
                pools = runtime.pools
                (pool,) = pools.pools

                def live_slots():
                    pools.tick()
                    return [s for s in pool.slots if s.state.value == "live"]

                assert wait_until(lambda: len(live_slots()) == 2, 120), pool.snapshot()
                first_live_s = time.monotonic() - spawned_at
                first = {s.name: s.node_id for s in live_slots()}
                victim = live_slots()[0]
                node = next(n for n in workers if n.node_id == victim.node_id)
                cluster.remove_node(node, allow_graceful=False)
                lost_at = time.monotonic()
                pools.lost(victim, "its node was removed")
                assert wait_until(lambda: len(live_slots()) == 2, 120), pool.snapshot()
                live_after_s = time.monotonic() - lost_at
                after = {s.name: s.node_id for s in live_slots()}

                def removed_alive() -> bool:
                    return any(n["NodeID"] == victim.node_id and n["Alive"] for n in ray.nodes())

                seen_dead = wait_until(lambda: not removed_alive(), 60, interval_s=0.2)
                dead_after_s = time.monotonic() - lost_at if seen_dead else None
                return {"first": first, "after": after, "removed": victim.node_id, "first_live_s": first_live_s,
                        "live_after_s": live_after_s, "dead_after_s": dead_after_s,
                        "start_failures": pool.start_failures}
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.timeout(300)
def test_a_replacement_keeps_off_the_lost_actors_node(tmp_path):
    out = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | CLUSTER_ENV
    proc = subprocess.run([sys.executable, __file__, str(out)], env=env, cwd=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(out.read_text())
    assert len(set(result["first"].values())) == 2  # one actor on each node
    (replacement,) = set(result["after"]) - set(result["first"])
    assert result["after"][replacement] != result["removed"]
    assert result["start_failures"] == 0
    # Had its start waited for Ray to declare the node dead, it would have gone live a dead-node delay (~12 s, in
    # `dead_after_s`) plus a start after the loss: half that delay is the margin.
    assert result["dead_after_s"] is not None, result
    assert result["live_after_s"] < result["first_live_s"] + result["dead_after_s"] / 2, result


if __name__ == "__main__":
    result = _run_cluster()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
