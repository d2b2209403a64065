"""Tests of the network-namespace cluster harness (`tests/netns_cluster.py`): a real multi-node Ray cluster with
distinct node IPs schedules custom-resource work where it must, loses a node when the node's processes die, and
leaves nothing behind (namespaces, links, iptables rules, processes, temp dirs) -- also after a failed start or a
dead owner. They need root, `ip` and `iptables`: they skip where those are missing, and fail instead under
`RAYGRPO_REQUIRE_NETNS=1` (CI).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raygrpo.sandbox.os_probe import proc_start_ticks
from tests.netns_cluster import (
    NetnsCluster,
    NetnsError,
    NodeSpec,
    namespace_pids,
    netns_ready,  # noqa: F401 - a fixture
    process_alive,
    reap_stale,
)

pytestmark = pytest.mark.usefixtures("netns_ready")

#: Faster node-death detection than Ray's default (~15 s), loose enough for a loaded 2-core machine.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_timeout_ms": 2000,
                      "health_check_failure_threshold": 4}

DRIVER = r"""
import json, ray
ray.init()  # RAY_ADDRESS is the GCS address (cluster.env(cluster.gcs_address))

@ray.remote(num_cpus=0, resources={"docker_host": 1}, scheduling_strategy="SPREAD")
class DockerHost:
    def ip(self):
        return ray.util.get_node_ip_address()

@ray.remote(num_cpus=0, resources={"learner_gpu": 1})
def learner_ip():
    return ray.util.get_node_ip_address()

hosts = [DockerHost.remote() for _ in range(2)]
out = {"docker_host": ray.get([h.ip.remote() for h in hosts], timeout=120),
       "learner_gpu": ray.get(learner_ip.remote(), timeout=120),
       "nodes": [{"ip": n["NodeManagerAddress"], "alive": n["Alive"]} for n in ray.nodes()]}
print("RESULT " + json.dumps(out), flush=True)
"""


def _links() -> set[str]:
    done = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, timeout=30, check=True)
    return {line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines()}


def _netns_list() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=True)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


def _iptables_rules() -> str:
    return "\n".join(subprocess.run(["iptables", "-w", "10", "-S", chain], capture_output=True, text=True,
                                    timeout=30, check=True).stdout for chain in ("FORWARD", "INPUT", "OUTPUT"))


def _assert_nothing_left(cluster: NetnsCluster, pids: dict[int, int]) -> None:
    """No namespace, link, rule, temp dir or (recorded) process of the cluster is left on the machine."""
    assert not set(cluster.namespaces) & _netns_list()
    assert not set(cluster.links) & _links()
    assert cluster.comment not in _iptables_rules()
    assert not cluster.temp_root.exists()
    assert [pid for pid, start in pids.items() if process_alive(pid, start)] == []
    assert cluster.resources_left() == []


def _tcp_ok(ip: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout) as conn:
            return conn.recv(2) == b"ok"
    except OSError:
        return False


@pytest.mark.timeout(240)
def test_custom_resources_land_on_their_hosts_and_node_loss_is_seen() -> None:
    """Two `docker_host` workers and one `learner_gpu` worker: work lands on the right node IPs; killing a node's
    processes makes Ray drop it."""
    cluster = NetnsCluster(
        head=NodeSpec("head", num_cpus=1),
        workers=[NodeSpec("dock1", resources={"docker_host": 1}), NodeSpec("dock2", resources={"docker_host": 1}),
                 NodeSpec("gpu", resources={"learner_gpu": 1})],
        system_config=FAST_HEALTH_CHECKS)
    with cluster:
        print(f"\nnetns cluster set-up: {cluster.timings}")
        ips = {name: cluster.node_ip(name) for name in cluster.node_names}
        began = time.monotonic()
        driver = cluster.run_driver(DRIVER, timeout=180)
        print(f"driver round trip from the host namespace: {time.monotonic() - began:.1f} s")
        assert driver.returncode == 0, driver.stderr[-3000:]
        result = json.loads(next(line for line in driver.stdout.splitlines() if line.startswith("RESULT "))[7:])

        assert sorted(result["docker_host"]) == sorted([ips["dock1"], ips["dock2"]])  # both hosts, one each
        assert result["learner_gpu"] == ips["gpu"]
        alive = [n["ip"] for n in result["nodes"] if n["alive"]]
        assert len(alive) == 4 and set(alive) == set(ips.values())

        began = time.monotonic()
        job = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "submit", "--", "python", "-c",
                              "import ray; print('job-on', ray.util.get_node_ip_address())"],
                             env=cluster.env(), check=False, capture_output=True, text=True, timeout=120)
        print(f"`ray job submit` round trip from the host namespace: {time.monotonic() - began:.1f} s")
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
        assert f"job-on {ips['head']}" in job.stdout

        killed = cluster.kill_node("dock2")
        assert killed and cluster.pids("dock2") == []
        began = time.monotonic()
        left = cluster.wait_for_nodes(3, timeout=60, exact=True)
        print(f"node loss seen by the GCS after {time.monotonic() - began:.1f} s")
        assert {n["ip"] for n in left} == {ips["head"], ips["dock1"], ips["gpu"]}
    print(f"netns cluster teardown: {cluster.timings['teardown']:.1f} s")


@pytest.mark.timeout(240)
def test_teardown_leaves_nothing_behind() -> None:
    """After `__exit__`: no namespace, bridge, veth, iptables rule, temp dir or process of the harness is left --
    including processes started in a namespace after set-up and ones that daemonised there."""
    cluster = NetnsCluster(workers=[NodeSpec("w1", resources={"docker_host": 1})])
    with cluster:
        print(f"\nnetns cluster set-up: {cluster.timings}")
        assert set(cluster.namespaces) <= _netns_list()
        assert set(cluster.links) <= _links()
        assert cluster.comment in _iptables_rules()
        cluster.exec("w1", ["sleep", "600"])
        orphan = cluster.run("head", ["sh", "-c", "setsid sleep 600 >/dev/null 2>&1 & echo $!"], timeout=30)
        orphan_pid = int(orphan.stdout.strip())
        pids = {pid: start for pid in cluster.pids() if (start := proc_start_ticks(pid)) is not None}
        assert orphan_pid in pids
        cmdlines = " ".join(_cmdline(pid) for pid in pids)
        assert cmdlines.count("raylet/raylet") == 2 and "gcs_server" in cmdlines
    print(f"netns cluster teardown: {cluster.timings['teardown']:.1f} s ({len(pids)} processes)")
    _assert_nothing_left(cluster, pids)
    cluster.close()  # idempotent


@pytest.mark.timeout(120)
def test_network_survives_a_hostile_firewall_and_partitions_heal() -> None:
    """Network only: drop-everything rules for the bridge appended after the harness's own (as Docker's FORWARD
    policy DROP would) do not cut the nodes off; `partition` does, and `heal` restores the link."""
    cluster = NetnsCluster(workers=[NodeSpec("w1"), NodeSpec("w2")], start_ray=False)
    hostile = [["FORWARD", "-i", cluster.bridge, "-j", "DROP"], ["INPUT", "-i", cluster.bridge, "-j", "DROP"],
               ["OUTPUT", "-o", cluster.bridge, "-j", "DROP"]]
    with cluster:
        print(f"\nnetns network set-up: {cluster.timings}")
        try:
            for rule in hostile:
                subprocess.run(["iptables", "-w", "10", "-A", *rule], check=True, timeout=30)
            cluster.check_connectivity(timeout=10)
            if _bridged_traffic_filtered():
                # br_netfilter filters bridged traffic here: without the FORWARD accept rule, node <-> node fails.
                accept = next(r for r in cluster.rules if r[0] == "FORWARD" and r[-1] == "ACCEPT")
                subprocess.run(["iptables", "-w", "10", "-D", *accept], check=True, timeout=30)
                try:
                    with pytest.raises(NetnsError, match="head->"):
                        cluster.check_connectivity(timeout=0, probe_timeout=0.5)
                finally:
                    subprocess.run(["iptables", "-w", "10", "-I", accept[0], "1", *accept[1:]], check=True,
                                   timeout=30)
                cluster.check_connectivity(timeout=10)
        finally:
            for rule in hostile:
                subprocess.run(["iptables", "-w", "10", "-D", *rule], check=False, timeout=30)

        cluster.partition("w1")
        with pytest.raises(NetnsError, match="w1"):
            cluster.check_connectivity(timeout=0, probe_timeout=0.5)
        cluster.heal("w1")
        cluster.check_connectivity(timeout=15)
    _assert_nothing_left(cluster, {})


@pytest.mark.timeout(60)
def test_failed_start_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start that fails after the network exists removes all of it before the error propagates."""
    def broken(self: NetnsCluster, timeout: float = 15.0) -> None:
        raise NetnsError("injected connectivity failure")

    monkeypatch.setattr(NetnsCluster, "check_connectivity", broken)
    cluster = NetnsCluster(workers=[NodeSpec("w1")], start_ray=False)
    with pytest.raises(NetnsError, match="injected"), cluster:
        pytest.fail("the body must not run")
    assert len(cluster.namespaces) == 2 and cluster.rules  # it got that far
    _assert_nothing_left(cluster, {})


@pytest.mark.timeout(60)
def test_reap_stale_removes_what_a_dead_owner_left() -> None:
    """`reap_stale` (run by every new cluster) removes an instance whose owning process died without teardown,
    processes in its namespaces included; the instance's own close is then a no-op."""
    cluster = NetnsCluster(workers=[NodeSpec("w1")], start_ray=False)
    cluster.start()
    try:
        sleeper = cluster.exec("w1", ["sleep", "600"])
        dead = subprocess.Popen(["true"])
        dead.wait(timeout=30)
        state_file = cluster.temp_root / "state.json"
        state = json.loads(state_file.read_text())
        state.update(owner_pid=dead.pid, owner_start=None)
        state_file.write_text(json.dumps(state))
        sleeper_ns = cluster.namespace("w1")
        assert sleeper.pid in namespace_pids(sleeper_ns)
        assert cluster.id in reap_stale()
        sleeper.wait(timeout=10)
        _assert_nothing_left(cluster, {})
    finally:
        cluster.close()


def _bridged_traffic_filtered() -> bool:
    """Whether bridged traffic goes through iptables here (`br_netfilter` loaded and on)."""
    knob = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    return knob.exists() and knob.read_text().strip() == "1"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
