"""Nothing of a crashed run stays on any node of a real multi-node cluster (`tests/netns_cluster.py`), a run's
leftovers are counted on the node where they are, and a node whose actors fail to start is kept out of placement.

The cluster: a head where the drivers run, whose sandbox root is unusable, and two workers carrying
`sandbox_host: 1`; each node has a sandbox root of its own (`RAYGRPO_SANDBOX_ROOT` in its `ray start` environment). The
example Harbor suite runs on the local backend in a pool of two actors, one per worker. A "planter" process stands for a sandbox that outlives its run
on purpose: it puts a live sandbox (its own, beating) in every run folder that appears on the second worker.

1. A run whose commands sleep is `kill -9`ed (its driver) with sandboxes on both workers: their folders stay.
2. A second run: its actors' start-up reap removes what the first run left on both workers (the planted sandbox,
   whose owner lives, is left alone); it completes, and its summary counts the one sandbox it left, on that worker.
3. The planter is killed and `raygrpo reap --address` (a task per node) removes the planted sandboxes and the run
   folders, saying what it removed: nothing is left on any node.

Then a pool of two actors on `cool_host` (the second worker and the head carry it): the actor placed on the head
fails to start, and its replacement keeps off that node (`workers.node_cooldown_s`) instead of failing
there again: one start failure, every rollout run on the good node.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raygrpo.sandbox.os_probe import pid_alive, sandbox_processes
from raygrpo.sandbox.owners import read_json
from raygrpo.sandbox.run_folders import reap_base
from tests.netns_cluster import NetnsCluster, NodeSpec, netns_ready  # noqa: F401 - a fixture
from tests.ors_utils import wait_until
from tests.test_netns_cluster import FAST_HEALTH_CHECKS

REPO = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("netns_ready")]


SLOW = '''
from raygrpo.agent.toolcalls import format_tool_call


def slow(ctx):
    """Sleep in the sandbox twice, then stop."""
    done = sum(1 for m in ctx.messages if m.get("role") == "tool")
    return format_tool_call("bash", {"command": "sleep 5"}) if done < 2 else "Done."
'''

PLANTER = r'''
import sys, time, uuid
from pathlib import Path
from raygrpo.sandbox.owners import Registration

base, seen, regs = Path(sys.argv[1]), set(), []
while True:
    for folder in sorted(base.glob("run-*")) if base.is_dir() else []:
        if folder.name not in seen and any(folder.glob(".user-*.json")):
            seen.add(folder.name)
            reg = Registration(folder, f"planted-{uuid.uuid4().hex[:8]}")
            reg.create()
            regs.append(reg)
            print("PLANTED", reg.dir, flush=True)
    time.sleep(0.2)
'''

POOL = ('envs.local.pool={"num_actors": 2, "max_concurrent_per_actor": 4, "num_cpus": 0, '
        '"resources": {"sandbox_host": 1}}')


def _run(cluster: NetnsCluster, folder: Path, policy: str, pool: str = POOL) -> subprocess.Popen:
    sets = [arg for s in (pool, "policy.kind=scripted", f"policy.script={policy}") for arg in ("--set", s)]
    log = open(folder / "driver.log", "w")  # noqa: SIM115 - the child holds it
    with log:
        return cluster.exec("head", [sys.executable, "-m", "raygrpo.cli", "rollout", "rollout.yaml", "--out", "out",
                                     "--no-progress", "--address", cluster.gcs_address, *sets],
                            cwd=folder, stdout=log, stderr=subprocess.STDOUT)


def _tail(folder: Path) -> str:
    return (folder / "driver.log").read_text(errors="replace")[-4000:]


def _sandboxes(base: Path, run: str | None = None) -> list[str]:
    """`<run>/<sandbox>` of every sandbox directory under a node's root."""
    folders = [base / run] if run else sorted(base.glob("run-*"))
    return sorted(f"{f.name}/{d.name}" for f in folders if f.is_dir() for d in f.iterdir()
                  if (d / "owner.json").exists())


def _real(base: Path) -> list[str]:
    """The sandboxes under a node's root that the runs made (not the planted ones)."""
    return [s for s in _sandboxes(base) if "planted-" not in s]


def _runs(base: Path) -> list[str]:
    return sorted(f.name for f in base.glob("run-*"))


#: The head's sandbox root: a path under a file, which no actor can create.
BROKEN_ROOT = "/dev/null/raygrpo-sandboxes"


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("roots")
    return {name: root / name for name in ("w1", "w2")}


@pytest.fixture(scope="module")
def cluster(bases):
    workers = [NodeSpec("w1", num_cpus=1, resources={"sandbox_host": 1}, env={"RAYGRPO_SANDBOX_ROOT": str(bases["w1"])}),
               NodeSpec("w2", num_cpus=1, resources={"sandbox_host": 1, "cool_host": 2},
                        env={"RAYGRPO_SANDBOX_ROOT": str(bases["w2"])})]
    head = NodeSpec("head", num_cpus=1, resources={"cool_host": 2}, env={"RAYGRPO_SANDBOX_ROOT": BROKEN_ROOT})
    with NetnsCluster(workers, head=head, system_config=FAST_HEALTH_CHECKS) as c:
        yield c


@pytest.mark.timeout(420)
def test_crashed_runs_are_reaped_on_every_node_and_leftovers_counted_where_they_are(tmp_path, cluster, bases):
    folders = {}
    for name in ("first", "second"):
        folders[name] = Path(shutil.copytree(REPO / "examples" / "harbor_local", tmp_path / name))
        (folders[name] / "slow.py").write_text(SLOW)
    planter = subprocess.Popen([sys.executable, "-c", PLANTER, str(bases["w2"])], cwd=REPO, text=True,
                               stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        ips = {name: cluster.node_ip(name) for name in ("w1", "w2")}
        first = _run(cluster, folders["first"], "slow.py:slow")
        assert wait_until(lambda: all(_real(bases[n]) for n in ("w1", "w2")) or first.poll() is not None,
                          240, interval_s=0.2), _tail(folders["first"])
        (run1,) = _runs(bases["w1"])
        owners = {(o["pid"], o["pid_start"]) for n in ("w1", "w2") for s in _real(bases[n])
                  if (o := read_json(bases[n] / s / "owner.json"))}
        os.kill(first.pid, signal.SIGKILL)  # the driver: its actors go with it (a sandbox may outlive them)
        first.wait(30)
        assert wait_until(lambda: not any(pid_alive(*o) for o in owners), 60), owners
        assert all(_real(bases[n]) for n in ("w1", "w2"))  # the folders stay
        planted_1 = [s for s in _sandboxes(bases["w2"], run1) if "planted-" in s]
        assert len(planted_1) == 1

        second = _run(cluster, folders["second"], "policies.py:wrong")
        began = time.monotonic()
        # The second run's actors reap what the first left on their nodes as they start; the planted sandbox
        # (its owner alive) stays.
        assert wait_until(lambda: _sandboxes(bases["w2"], run1) == planted_1 and not (bases["w1"] / run1).exists(),
                          120, interval_s=0.2), (_sandboxes(bases["w1"]), _sandboxes(bases["w2"]))
        startup_reap_s = time.monotonic() - began
        assert sandbox_processes(bases["w1"] / run1) == [] and sandbox_processes(bases["w2"] / run1) == []
        assert second.wait(240) == 0, _tail(folders["second"])
        summary = json.loads((folders["second"] / "out" / "summary.json").read_text())
        assert summary["status_counts"] == {"ok": 18}, summary
        assert summary["leaked_envs"] == 1 and summary["leaked_envs_by_node"] == {ips["w2"]: 1}, summary
        assert _runs(bases["w1"]) == []  # the second run's folder went at its end, the first's at its start
        planted = _sandboxes(bases["w2"])
        assert len(planted) == 2 and all("planted-" in s for s in planted), planted

        planter.kill()
        planter.wait(10)
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "raygrpo.cli", "reap", "--address", cluster.gcs_address],
                              env=cluster.env(cluster.gcs_address), cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        reap_s = time.monotonic() - began
        assert done.returncode == 0, done.stdout + done.stderr
        for sandbox in planted:
            assert f"{ips['w2']}: removed sandbox {sandbox} under {bases['w2']}" in done.stdout, done.stdout
            assert f"{ips['w2']}: removed run folder {bases['w2']}/{sandbox.split('/')[0]}" in done.stdout
        assert "removed on 3 node(s)" in done.stdout, done.stdout
        print(done.stdout)
        print(f"start-up reap of the crashed run: {startup_reap_s:.1f} s after the second run began; "
              f"raygrpo reap on 3 nodes: {reap_s:.1f} s; leaked_envs_by_node {summary['leaked_envs_by_node']}")
    finally:
        if planter.poll() is None:
            planter.kill()
        planter.wait(10)
        for base in bases.values():  # whatever a failed test left: every owner is gone with the cluster
            reap_base(base, stale_after_s=0)
    for base in bases.values():
        assert not base.exists() or list(base.iterdir()) == [], (base, list(base.iterdir()))


@pytest.mark.timeout(300)
def test_replacements_keep_off_a_node_whose_actor_failed_to_start(tmp_path, cluster):
    folder = Path(shutil.copytree(REPO / "examples" / "harbor_local", tmp_path / "run"))
    pool = POOL.replace('"sandbox_host"', '"cool_host"')
    began = time.monotonic()
    run = _run(cluster, folder, "policies.py:wrong", pool)
    assert run.wait(240) == 0, _tail(folder)
    wall_s = time.monotonic() - began
    summary = json.loads((folder / "out" / "summary.json").read_text())
    trajs = [json.loads(x) for x in (folder / "out" / "trajectories.jsonl").read_text().splitlines()]
    (snapshot,) = summary["pools"].values()
    log = _tail(folder)
    # SPREAD put one of the two actors on each node; the head's failed, once. A replacement starts only if the run
    # still needs a second actor once the retry back-off (2 s) has passed: under load the one live actor may finish
    # all 18 rollouts first (started 2, seen in a CI run); a replacement that does start keeps off the head (every
    # rollout below ran on w2).
    assert snapshot["start_failures"] == 1 and snapshot["started"] in (2, 3), (snapshot, log)
    assert "keep off node" in (folder / "driver.log").read_text(), log
    assert summary["status_counts"] == {"ok": 18} and {t["node"] for t in trajs} == {cluster.node_ip("w2")}
    print(f"one failed start, replaced on the good node; run took {wall_s:.1f} s")


@pytest.mark.timeout(480)
def test_a_killed_workers_leftovers_are_reaped_when_it_comes_back_and_the_next_run_starts(tmp_path, cluster, bases):
    """Last in this file: it kills w1 (every process in its namespace, as a lost host) and starts it again."""
    first_folder = Path(shutil.copytree(REPO / "examples" / "harbor_local", tmp_path / "first"))
    (first_folder / "slow.py").write_text(SLOW)
    try:
        first = _run(cluster, first_folder, "slow.py:slow")
        assert wait_until(lambda: _real(bases["w1"]) or first.poll() is not None, 240, interval_s=0.2), \
            _tail(first_folder)
        (run1,) = _runs(bases["w1"])
        cluster.kill_node("w1")
        # The run carries on without w1: its rollouts there are retried on w2, and every rollout ends ok.
        assert first.wait(300) == 0, _tail(first_folder)
        summary = json.loads((first_folder / "out" / "summary.json").read_text())
        assert summary["status_counts"] == {"ok": 18}, summary
        left = _sandboxes(bases["w1"], run1)
        assert left, "the killed node kept nothing to reap"  # the folders of the sandboxes w1 ran when it died

        cluster.restart_node("w1")
        second_folder = Path(shutil.copytree(REPO / "examples" / "harbor_local", tmp_path / "second"))
        second = _run(cluster, second_folder, "policies.py:wrong")
        began = time.monotonic()
        assert wait_until(lambda: not (bases["w1"] / run1).exists(), 180, interval_s=0.2), \
            (_sandboxes(bases["w1"]), _tail(second_folder))
        reaped_s = time.monotonic() - began
        assert sandbox_processes(bases["w1"] / run1) == []
        assert second.wait(240) == 0, _tail(second_folder)
        summary = json.loads((second_folder / "out" / "summary.json").read_text())
        assert summary["status_counts"] == {"ok": 18} and summary["leaked_envs"] == 0, summary
        trajs = [json.loads(x) for x in (second_folder / "out" / "trajectories.jsonl").read_text().splitlines()]
        assert cluster.node_ip("w1") in {t["node"] for t in trajs}  # the returned node took part
        print(f"{len(left)} sandbox folder(s) of the killed node's run reaped {reaped_s:.1f} s after the next run "
              "began")
    finally:
        for base in bases.values():
            reap_base(base, stale_after_s=0)
    for base in bases.values():
        assert not base.exists() or list(base.iterdir()) == [], (base, list(base.iterdir()))
