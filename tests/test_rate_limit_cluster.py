"""Acceptance: the cluster-wide create-rate limit holds across 4 actors on 3 simulated nodes at 5 creates/s.

Four async actors, placed on three `ray.cluster_utils.Cluster` nodes (kept on 127.0.0.1) by a custom resource per
node, each run several starts at once through their own `ProvisioningGate` of one provider key; the gates share
the named governor actor (created by whichever actor asks first). Every "create" is timestamped inside the slot,
in the actor process, where the backend's create would be called. Over at least 10 s and 50 creates, no sliding
1 s window may hold more than 5 creates, and the creates must reach 90% of the rate.

The cluster runs in a subprocess (this file run as a script): it must not meet the session's local Ray runtime
(`ray_local`) in the pytest process, and a subprocess can be killed whole if it hangs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

if not __package__:  # run as a script (the cluster's subprocess): `tests` is importable from the repo root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.sim_cluster import CLUSTER_ENV  # noqa: E402

RATE = 5.0
NODES = 3
ACTORS = 4
STARTS_PER_ACTOR = 3
RUN_S = 12.0
KEY = "acceptance-e2b"


def _run_cluster() -> dict:
    """Start the cluster, run the probes, return the measurements (runs in the subprocess)."""
    import asyncio

    import ray

    from raygrpo.governor import max_per_window
    from tests.sim_cluster import simulated_cluster

    @ray.remote(num_cpus=0)
    class CreateProbe:
        """Starts sandboxes that do not exist: each "create" is a timestamp taken inside the gate's slot."""

        async def where(self) -> str:
            return ray.get_runtime_context().get_node_id()

        async def run(self, key: str, rate: float, starts: int, begin_at: float, end_at: float) -> dict:
            from raygrpo.governor.actor import RayGovernorClient
            from raygrpo.governor.gate import gate_for

            gate = gate_for(key, max_concurrent_starts=starts, rate_per_s=rate, governors=RayGovernorClient)
            creates: list[float] = []

            async def starter(i: int) -> None:
                await asyncio.sleep(max(0.0, begin_at - time.time()))
                while time.time() < end_at:
                    async with gate.start_slot():
                        creates.append(time.time())  # where the backend's create is called
                        await asyncio.sleep(0.2 + 0.1 * i)  # the rest of a start

            await asyncio.gather(*(starter(i) for i in range(starts)))
            return {"creates": creates, "stats": gate.stats()}

    with simulated_cluster(NODES, ACTORS):
        ips = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})
        alive = sum(1 for n in ray.nodes() if n["Alive"])
        probes = [CreateProbe.options(resources={f"node{i % NODES}": 1}).remote() for i in range(ACTORS)]
        nodes = ray.get([p.where.remote() for p in probes], timeout=60)
        begin_at = time.time() + 1.0
        end_at = begin_at + RUN_S
        results = ray.get(
            [p.run.remote(KEY, RATE, STARTS_PER_ACTOR, begin_at, end_at) for p in probes], timeout=RUN_S + 60
        )
    creates = sorted(t for r in results for t in r["creates"])
    span = creates[-1] - creates[0]
    return {
        "node_ips": ips,
        "nodes_alive": alive,
        "probe_nodes": len(set(nodes)),
        "creates": len(creates),
        "span_s": round(span, 3),
        "rate_per_s": round((len(creates) - 1) / span, 3),
        "max_per_1s_window": max_per_window(creates, 1.0),
        "min_gap_5_apart_s": round(min(b - a for a, b in zip(creates, creates[int(RATE):])), 4),
        "per_actor": [len(r["creates"]) for r in results],
        "late_wakes": sum(r["stats"]["late_wakes"] for r in results),
        "mean_wait_s": round(sum(r["stats"]["mean_wait_s"] for r in results) / ACTORS, 3),
    }


@pytest.mark.timeout(180)
def test_create_rate_holds_across_nodes():
    env = {**os.environ, **CLUSTER_ENV}
    proc = subprocess.Popen(
        [sys.executable, __file__], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the script shuts its cluster down on SIGTERM
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"cluster run timed out\n{err[-3000:]}")
    assert proc.returncode == 0, err[-5000:]
    report = json.loads(out.strip().splitlines()[-1])
    print(json.dumps(report))
    assert report["node_ips"] == ["127.0.0.1"] and report["nodes_alive"] == NODES
    assert report["probe_nodes"] == NODES
    assert report["creates"] >= 50 and report["span_s"] >= 10.0
    assert report["max_per_1s_window"] <= RATE
    assert report["rate_per_s"] >= 0.9 * RATE
    assert all(n > 0 for n in report["per_actor"])


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.time()
    measured = _run_cluster()
    measured["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(measured), flush=True)
