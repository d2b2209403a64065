"""A training job on a real multi-node Ray cluster on this machine: each node in its own network namespace with its
own address (`tests/netns_cluster.py`).

The cluster: a head without custom resources, two nodes carrying the docker hosts' resource (`docker_host`), and one
standing in for a GPU node (`learner_gpu`). `raygrpo train` on the echo example is submitted from a copy of it with
`ray job submit --working-dir .` and the repository's runtime_env. The run config places the echo environment's env
pool actors on the docker hosts, the learner and its transformers engine on the GPU node; the embedded ORS server
lands wherever Ray puts it and binds that node's address. Checked: every training rollout ran on a docker host and
both were used; the learner and the engine ran on the GPU node; the server was reached from a node other than its
own; every rollout is accounted for and nothing leaked.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raygrpo.core.types import Status
from tests.netns_cluster import NetnsCluster, NodeSpec, netns_ready  # noqa: F401 - a fixture
from tests.test_cluster_job import job_state, submit_job

REPO = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("netns_ready")]

HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_timeout_ms": 2000,
                 "health_check_failure_threshold": 4}

#: Placement as a cluster user writes it (cluster/README.md), sized for 2 cores: two steps, no warm-up.
OVERRIDES = [
    'envs.echo.pool={"num_actors": 2, "max_concurrent_per_actor": 16, "num_cpus": 0.25, '
    '"resources": {"docker_host": 0.5}}',
    'train.learner.resources={"learner_gpu": 0.5}',
    'policy.engine_resources={"learner_gpu": 0.5}',
    "train.warmup=null", "trainer.max_steps=2", "trainer.save_steps=100", "train.eval_every=0",
    "eval_envs={}", "workers.num_env_actors=1",
]


def _ray(cluster: NetnsCluster, *args: str, cwd: Path | None = None, timeout: float = 120) -> str:
    done = subprocess.run([RAY, *args], env=cluster.env(), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)


def _state(cluster: NetnsCluster, job: str) -> str:
    return job_state(_ray(cluster, "job", "status", job))


@pytest.mark.timeout(900)
def test_a_training_job_places_each_actor_where_its_config_says(tmp_path):
    workdir = Path(shutil.copytree(REPO / "examples" / "echo", tmp_path / "echo"))
    out = tmp_path / "run"
    workers = [NodeSpec("dock1", num_cpus=2, resources={"docker_host": 1}),
               NodeSpec("dock2", num_cpus=2, resources={"docker_host": 1}),
               NodeSpec("gpu", num_cpus=3, resources={"learner_gpu": 1})]
    with NetnsCluster(workers, head=NodeSpec("head", num_cpus=1), system_config=HEALTH_CHECKS) as cluster:
        ips = {name: cluster.node_ip(name) for name in ("head", "dock1", "dock2", "gpu")}
        sets = [arg for o in OVERRIDES for arg in ("--set", o)]
        job = submit_job(["--working-dir", ".", "--runtime-env", str(REPO / "cluster" / "runtime_env.yaml"),
                          "--no-wait", "--", "raygrpo", "-v", "train", "train.yaml", "--out", str(out),
                          "--no-progress", *sets], workdir, cluster.env())
        deadline = time.monotonic() + 780
        state = "UNKNOWN"
        while time.monotonic() < deadline and state not in ("SUCCEEDED", "FAILED", "STOPPED"):
            time.sleep(3)
            state = _state(cluster, job)
            if state == "RUNNING" and workdir.exists():
                shutil.rmtree(workdir)  # the job carries what it needs
        logs = _ray(cluster, "job", "logs", job)
        assert state == "SUCCEEDED", logs[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["leaked_envs"] == 0 and summary["interrupted"] is False
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    # The tiny random model, untrained, rarely answers: truncated and unanswered rollouts, but no infrastructure failure.
    assert len(rollouts) == 64 and not [t for t in rollouts if Status(t["status"]).is_infra_failure]
    assert {t["node"] for t in rollouts} == {ips["dock1"], ips["dock2"]}  # only docker hosts, and both of them
    assert {t["worker"] for t in rollouts} == {"raygrpo-train-envpool-echo-0", "raygrpo-train-envpool-echo-1"}
    placed = dict(re.findall(r"placed (learner|engine) on (\S+)", logs))
    assert placed == {"learner": ips["gpu"], "engine": ips["gpu"]}, logs[-4000:]
    served = re.search(r"serving environment echo at http://([\d.]+):\d+", logs)
    assert served and served.group(1) in ips.values(), logs[-4000:]
    assert {t["node"] for t in rollouts} - {served.group(1)}  # reached from another node through its address
