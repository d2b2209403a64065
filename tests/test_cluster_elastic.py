"""Env pool actors lost on a real multi-node cluster cost retries, not rollouts (`tests/netns_cluster.py`).

The cluster: a head without custom resources, where the driver runs (`tests/elastic_driver.py`), and three nodes
carrying `sandbox_host: 1`; the Harbor example suite runs on the local sandbox backend in an env pool of two
actors that each ask for `sandbox_host: 0.5`. Each rollout sleeps 6 s in its sandbox, then solves the task. Mid-batch,
with both actors busy, one of three faults hits an actor:

- its process is `kill -9`ed;
- its node is cut off (the node's link down until Ray has declared it dead, then up again);
- its node is killed (every process in the node's namespace).

Then: every requested rollout ends exactly once, scored (the retries succeed), none of them on the lost actor after
it was lost; the pool is back to two live actors on the nodes that remain; and the OS finds no sandbox process or
mount of the run left (`--die-with-parent` ends a lost actor's sandboxes with it; a partitioned node's raylet
exits once it learns it was declared dead, taking its workers along).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from raygrpo.sandbox.os_probe import process_env_marks, sandbox_mounts
from tests.netns_cluster import NetnsCluster, NodeSpec, netns_ready  # noqa: F401 - a fixture
from tests.ors_utils import wait_until

REPO = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).with_name("elastic_driver.py")

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("netns_ready")]

HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_timeout_ms": 2000,
                 "health_check_failure_threshold": 4}

SLOW_POLICY = '''
from pathlib import Path

from raygrpo.agent.toolcalls import format_tool_call


def slow_right(ctx):
    """Sleep 6 s in the sandbox, then run the task's solution."""
    calls = sum(1 for m in ctx.messages if m.get("role") == "tool")
    if calls == 0:
        return format_tool_call("bash", {"command": "sleep 6"})
    if calls == 1:
        script = Path(ctx.task.metadata["task_dir"]) / "solution" / "solve.sh"
        return format_tool_call("bash", {"command": script.read_text()})
    return "Done."
'''


@pytest.fixture(scope="module")
def cluster():
    workers = [NodeSpec(f"sb{i}", num_cpus=1, resources={"sandbox_host": 1}) for i in (1, 2, 3)]
    with NetnsCluster(workers, head=NodeSpec("head", num_cpus=2), system_config=HEALTH_CHECKS) as c:
        yield c


class _Driver:
    """The driver running on the head node; its event lines are collected by a reader thread."""

    def __init__(self, cluster: NetnsCluster, workdir: Path, sandbox_base: Path, args: tuple[str, ...] = ()) -> None:
        env = {**cluster.env(cluster.gcs_address), "RAYGRPO_SANDBOX_ROOT": str(sandbox_base)}
        self.proc = cluster.exec("head", [sys.executable, str(DRIVER), *args], cwd=workdir, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self.events: dict[str, object] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            tag, _, payload = line.strip().partition(" ")
            if tag in ("ACTORS", "BUSY", "DETECTED", "RESULT", "FINAL"):
                self.events[tag] = json.loads(payload) if payload else True

    def wait(self, tag: str, timeout: float) -> object:
        assert wait_until(lambda: tag in self.events or self.proc.poll() is not None, timeout, interval_s=0.2), \
            self.log()
        assert tag in self.events, self.log()
        return self.events[tag]

    def log(self) -> str:
        return "\n".join(self.lines[-80:])


def _os_leaks(base: Path) -> tuple[list[int], list[str]]:
    pids = [pid for pid, (root, _) in process_env_marks().items() if root and root.startswith(str(base))]
    return pids, sandbox_mounts(base)


def _run_with_fault(cluster: NetnsCluster, tmp_path: Path, fault, *, args: tuple[str, ...] = (),
                    detection: dict | None = None, leak_wait_s: float = 30.0) -> tuple[dict, dict, dict]:
    """Start the driver (extra overrides `args`), apply `fault(actor)` to the first actor once both are busy (None:
    no fault; it may return a callable to run once the driver is done), check the OS for leftovers, and return the
    first actor, the driver's RESULT and its FINAL. With `detection`, it gets the driver's DETECTED line
    (`detected`) and the seconds from the fault to it (`detection_s`)."""
    workdir = Path(shutil.copytree(REPO / "examples" / "harbor_local", tmp_path / "suite"))
    (workdir / "slow.py").write_text(SLOW_POLICY)
    base = tmp_path / "sandboxes"
    driver = _Driver(cluster, workdir, base, args)
    settle = None
    try:
        actors = driver.wait("ACTORS", 240)
        assert len({a["node"] for a in actors}) == 2, actors  # SPREAD: one per node
        driver.wait("BUSY", 120)
        victim = actors[0]
        struck = time.time()
        settle = fault(victim) if fault is not None else None
        if detection is not None and fault is not None:
            detection["detected"] = driver.wait("DETECTED", 120)
            detection["detection_s"] = detection["detected"]["at"] - struck
        result = driver.wait("RESULT", 300)
        final = driver.wait("FINAL", 180)
        assert driver.proc.wait(60) == 0, driver.log()
    finally:
        if driver.proc.poll() is None:
            driver.proc.kill()
        if callable(settle):
            settle()
    assert wait_until(lambda: _os_leaks(base) == ([], []), leak_wait_s), _os_leaks(base)
    return victim, result, final


def _check_accounted(victim: dict, result: dict, final: dict, lost_node: str | None) -> None:
    trajs = result["trajectories"]
    assert len(trajs) == result["requested"] == 36
    assert len({t["id"] for t in trajs}) == 36  # each exactly once
    assert {t["status"] for t in trajs} == {"ok"} and all(t["reward"] == 1.0 for t in trajs)
    assert not [t for t in trajs if t["worker"] == victim["name"]]  # it was lost with all it ran
    assert result["lost_to_actors"] >= 1 and result["retried"] >= result["lost_to_actors"]
    assert sum(t["attempt"] > 0 for t in trajs) == result["retried"]
    pool = result["pool"]
    # A replacement Ray placed on the dying node before it was declared dead fails to start and is started again.
    assert pool["lost"] == 1 and pool["started"] == 3 + pool["start_failures"] and pool["actors"] == 2, pool
    if lost_node is not None:
        assert lost_node not in result["live_actor_nodes"]  # refilled on the nodes that remain
    assert final["leaked_envs"] == 0


@pytest.mark.timeout(600)
def test_kill_9_of_an_env_pool_actor(cluster, tmp_path):
    victim, result, final = _run_with_fault(cluster, tmp_path, lambda a: os.kill(a["pid"], signal.SIGKILL))
    _check_accounted(victim, result, final, lost_node=None)


def _node_of(cluster: NetnsCluster, ip: str) -> str:
    return next(name for name in cluster.node_names if cluster.node_ip(name) == ip)


@pytest.mark.timeout(600)
def test_a_partitioned_node_then_healed(cluster, tmp_path):
    def cut_off(actor: dict):
        node = _node_of(cluster, actor["node"])
        cluster.partition(node)

        def heal_later() -> None:
            # Ray declares the node dead after ~6-8 s of failed health checks; heal after that, while the batch
            # still runs (its retries are under way), so anything the node still had cannot be counted again.
            time.sleep(12)
            cluster.heal(node)

        healer = threading.Thread(target=heal_later, daemon=True)
        healer.start()
        return lambda: healer.join(30)

    victim, result, final = _run_with_fault(cluster, tmp_path, cut_off)
    _check_accounted(victim, result, final, lost_node=victim["node"])


@pytest.mark.timeout(600)
def test_a_killed_node(cluster, tmp_path):
    victim, result, final = _run_with_fault(cluster, tmp_path,
                                            lambda a: cluster.kill_node(_node_of(cluster, a["node"])))
    _check_accounted(victim, result, final, lost_node=victim["node"])
