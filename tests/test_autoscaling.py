"""Elastic env pools on a cluster whose autoscaler adds and removes nodes (`tests/autoscaling_cluster.py`).

The head carries no `sandbox_host`; the one worker node type does (1 per node, up to 3 nodes, none at start). The
environment's pool is elastic (0 to 6 actors, each asking for `sandbox_host: 0.5`, K=4), so every actor needs a node
the autoscaler has to add. A burst of rollouts must grow the pool to its maximum and bring up the nodes; once the
burst is over the actors drain and the autoscaler removes the idle nodes. Nodes are counted from Ray's own node
table (`ray.nodes()`), sessions by the ORS server, not only by the pools' bookkeeping.

These tests need a cluster of their own with the autoscaler: they run in their own pytest invocation
(`pytest -m autoscaler`, the second half of `make test`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.autoscaling_cluster import LocalAutoscalingCluster

pytestmark = [pytest.mark.autoscaler]

#: Pool bounds and rollouts per actor; two actors fit a node (`sandbox_host: 0.5` of 1), so the maximum needs 3.
MAX_ACTORS, K, NODES = 6, 4, 3
#: Two waves of rollouts at the maximum: demand stays at the maximum until every actor is live.
BURST = 2 * MAX_ACTORS * K
NAP_S = 5.0

NAP_SCRIPT = f'''
from raygrpo.agent.toolcalls import format_tool_call


def nap(ctx):
    """One server-side nap of {NAP_S} s, then done."""
    if any(m.get("role") == "tool" for m in ctx.messages):
        return "Done."
    return format_tool_call("nap", {{"seconds": {NAP_S}}})
'''


def sandbox_nodes() -> set[str]:
    """Alive nodes that carry `sandbox_host`, by node id, from the GCS."""
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive") and "sandbox_host" in (n.get("Resources") or {})}


@pytest.fixture
def cluster() -> Iterator[LocalAutoscalingCluster]:
    """The autoscaling cluster, joined by this process; afterwards none of its processes is left."""
    import ray

    with LocalAutoscalingCluster(
            {"CPU": 1}, {"sandbox": {"resources": {"CPU": 1, "sandbox_host": 1}, "min_workers": 0,
                                     "max_workers": NODES}},
            idle_timeout_minutes=0.05) as running:
        running.connect()
        try:
            yield running
        finally:
            ray.shutdown()
    assert running.own_processes() == []


@pytest.mark.timeout(30)
def test_the_cluster_config_is_ours_and_valid():
    """The inline config passes Ray's schema, has the provider settings the fake nodes need, and no node type but
    the worker type carries `sandbox_host` (so a burst cannot be served by the head)."""
    from ray.autoscaler._private.util import validate_config

    c = LocalAutoscalingCluster({"CPU": 1}, {"sandbox": {"resources": {"CPU": 1, "sandbox_host": 1},
                                                          "max_workers": NODES}}, idle_timeout_minutes=0.05)
    validate_config(c.config)
    provider = c.config["provider"]
    assert provider["type"] == "fake_multinode" and provider["gcs_address"] == c.address
    assert provider["gcs_address"].startswith("127.0.0.1:") and provider["use_node_id_as_ip"] is True
    types = c.config["available_node_types"]
    assert [t for t, spec in types.items() if "sandbox_host" in spec["resources"]] == ["sandbox"]
    assert types["sandbox"]["min_workers"] == 0 and c.config["idle_timeout_minutes"] == 0.05
    assert not Path(c.temp_dir).exists()  # nothing started by building it


@pytest.mark.timeout(300)
def test_a_burst_adds_nodes_and_they_go_when_the_pool_drains(cluster, tmp_path):
    """48 rollouts on an elastic pool of 0-6 actors that need nodes the autoscaler adds: the pool grows to 6 on 3 new
    nodes, every rollout ends `ok`, then every actor drains (`drained == started`) and the nodes are removed."""
    from raygrpo.config import load_config
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.orchestrator import Orchestrator
    from raygrpo.driver.resolve import resolve_run
    from tests.e2e_support import NapEnvironment
    from tests.ors_utils import ors_server

    script = tmp_path / "burst.py"
    script.write_text(NAP_SCRIPT)
    NapEnvironment.reset_counters()
    assert sandbox_nodes() == set()
    with ors_server(NapEnvironment) as server:
        cfg = load_config(data={
            "envs": {"nap": {"kind": "ors", "url": server.url, "num_tasks": BURST, "pool": {
                "min_actors": 0, "max_actors": MAX_ACTORS, "idle_timeout_s": 2.0, "num_cpus": 0,
                "max_concurrent_per_actor": K, "resources": {"sandbox_host": 0.5}}}},
            "policy": {"kind": "scripted", "script": f"{script}:nap"},
            "rollout": {"group_size": 1},
            "workers": {"actor_num_cpus": 0, "actor_start_timeout_s": 120},
        })
        with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env, actor_prefix="autoscale") as runtime:
            pools = runtime.pools
            name = "envs.nap.pool"
            assert pools.snapshot()[name]["actors"] == 0
            orchestrator = Orchestrator(pools=pools)
            seen_nodes: set[str] = set()
            peak_nodes = 0
            timeline: list[tuple[float, int, int, int]] = []  # (s, live actors, starting, sandbox nodes)
            # The head has no `sandbox_host`: every live actor runs on a node the autoscaler added.
            first_node = all_nodes = first_live = all_live = None
            finals = []
            t0 = time.monotonic()
            orchestrator.enqueue(make_groups(runtime.tasks, 1))
            try:
                while orchestrator.outstanding:
                    finals += orchestrator.poll(timeout=0.2)
                    live = pools.snapshot()[name]["actors"]
                    now = time.monotonic() - t0
                    if live and first_live is None:
                        first_live = now
                    if live == MAX_ACTORS and all_live is None:
                        all_live = now
                    nodes = sandbox_nodes()
                    if nodes and first_node is None:
                        first_node = now
                    if len(nodes) >= NODES and all_nodes is None:
                        all_nodes = now
                    seen_nodes |= nodes
                    peak_nodes = max(peak_nodes, len(nodes))
                    timeline.append((round(now, 1), live, pools.snapshot()[name]["starting"], len(nodes)))
                    assert now < 200, (pools.snapshot(), orchestrator.outstanding)
            finally:
                orchestrator.cancel()
            burst_s = time.monotonic() - t0
            print(f"\ntimeline (s, live, starting, sandbox nodes), every 5th poll: {timeline[::5]}")
            snap = pools.snapshot()[name]
            assert len(finals) == BURST and all(t.status.value == "ok" for t in finals), \
                [(t.status.value, t.error) for t in finals if t.status.value != "ok"]
            assert len({(t.group_id, t.sample) for t in finals}) == BURST
            assert first_live is not None and all_live is not None, snap
            assert snap["started"] == MAX_ACTORS and snap["lost"] == 0 and snap["start_failures"] == 0, snap
            assert len({t.worker for t in finals}) == MAX_ACTORS
            # Ray's v1 autoscaler may overshoot for a moment (it then removes nodes above `max_workers`).
            assert peak_nodes >= NODES, timeline

            # The burst is over: keep ticking the pools; every actor drains, then the autoscaler removes the nodes.
            t1 = time.monotonic()
            drained_at = None
            while sandbox_nodes() or drained_at is None:
                orchestrator.poll(timeout=0.2)
                snap = pools.snapshot()[name]
                if drained_at is None and snap["actors"] == 0 and snap["drained"] == snap["started"]:
                    drained_at = time.monotonic() - t1
                assert time.monotonic() - t1 < 90, (snap, sandbox_nodes())
            nodes_gone = time.monotonic() - t1
            snap = pools.snapshot()[name]
            assert snap["actors"] == snap["starting"] == snap["draining"] == 0 and snap["drained"] == MAX_ACTORS
            assert 0 < snap["utilization"] < 1 and 0 < snap["idle_actor_seconds"] < snap["actor_seconds"], snap
        assert runtime.leaked_envs == 0
        assert server.live_sessions() == 0
    print(f"\nautoscaling: burst of {BURST} x {NAP_S:g} s on 0-{MAX_ACTORS} actors: first new node up after "
          f"{first_node:.1f} s, all {NODES} after {all_nodes:.1f} s; first actor on a new node live "
          f"after {first_live:.1f} s, all {MAX_ACTORS} after {all_live:.1f} s, burst done in {burst_s:.1f} s; "
          f"pool drained {drained_at:.1f} s and the {NODES} nodes gone {nodes_gone:.1f} s after it; "
          f"utilization {snap['utilization']:.2f} ({snap['actor_seconds']:.0f} actor-s, "
          f"{snap['idle_actor_seconds']:.0f} idle); sandbox nodes: peak {peak_nodes} at once, {len(seen_nodes)} in all")
