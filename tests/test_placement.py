"""Placement per environment: `envs.<name>.pool`, the feasibility check at start, routing, and config paths that
follow a job's working_dir onto each node. Placement on real separate nodes is tested in `test_cluster_job.py`."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from raygrpo.driver.collect import collect
from raygrpo.config import ConfigError, load_config
from raygrpo.driver.attempts import make_groups
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.driver.placement import PlacementError, actor_resources, check_fits, check_fits_together, wait_placed
from raygrpo.driver.pools import PoolSet
from raygrpo.core.types import TaskRef
from raygrpo.core.workdir import relocate

pytestmark = pytest.mark.timeout(120)

ECHO = Path(__file__).resolve().parent.parent / "examples" / "echo"


# ── feasibility ──────────────────────────────────────────────────────────────────────────────────────────────────

def test_a_resource_no_node_offers_fails_naming_field_and_resource():
    nodes = [{"CPU": 4.0, "memory": 8e9}, {"CPU": 2.0, "docker_host": 1.0}]
    check_fits({"envs.a.pool": actor_resources(1, resources={"docker_host": 0.5})}, nodes, [])
    with pytest.raises(PlacementError) as info:
        check_fits({"envs.swe.pool": actor_resources(0.25, resources={"sandbox_client": 1})}, nodes, [])
    message = str(info.value)
    assert message.startswith("envs.swe.pool:") and "'sandbox_client'" in message
    assert "no autoscaler" in message and "docker_host" in message  # what the nodes do offer


def test_an_autoscaler_node_type_makes_a_missing_resource_feasible():
    nodes = [{"CPU": 0.0}]
    types = [{"CPU": 8.0, "docker_host": 1.0}, {"CPU": 8.0, "GPU": 1.0, "learner_gpu": 1.0}]
    check_fits({"envs.swe.pool": actor_resources(1, resources={"docker_host": 0.5}),
                "train.learner": actor_resources(1, 1, resources={"learner_gpu": 1})}, nodes, types)
    with pytest.raises(PlacementError, match=r"^train\.learner: .*no single node has"):
        check_fits({"train.learner": actor_resources(1, 2)}, nodes, types)  # 2 GPUs on one node: none has


def test_memory_counts_per_node():
    nodes = [{"CPU": 4.0, "memory": 3 * 2**30}]
    check_fits({"envs.a.pool": actor_resources(1, memory=2 * 2**30)}, nodes, [])
    with pytest.raises(PlacementError, match="memory=4GiB"):
        check_fits({"envs.a.pool": actor_resources(1, memory=4 * 2**30)}, nodes, [])


def test_actors_that_do_not_fit_together_on_a_local_ray_fail_naming_each_field():
    engine, learner, pool = actor_resources(1), actor_resources(1), actor_resources(0.25)
    check_fits_together({"policy.engine_resources": (engine, 1), "train.learner": (learner, 1),
                         "workers": (pool, 2)}, available={"CPU": 2.5})
    with pytest.raises(PlacementError) as err:
        check_fits_together({"policy.engine_resources": (engine, 2), "train.learner": (learner, 1),
                             "workers": (pool, 2), "envs.swe.pool": (actor_resources(0, resources={"x": 1}), 1)},
                            available={"CPU": 2.5, "x": 1}, hint="set ray.num_cpus")
    assert str(err.value) == (
        "the run's actors together ask for {CPU=3.5} (policy.engine_resources {CPU=1} x2, train.learner {CPU=1}, "
        "workers {CPU=0.25} x2), but the Ray runtime has CPU=2.5 free and no autoscaler: one of them would wait "
        "forever; set ray.num_cpus")


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_a_training_run_whose_learner_would_never_be_placed_fails_at_start(tmp_path, tiny_model_dir):
    import ray

    from raygrpo.train.run import train

    # The engine and the env pool fit the local Ray; the learner, started last, would find its CPUs taken and wait
    # forever (it did, before the run counted the actors together).
    cpus = ray.available_resources()["CPU"]
    cfg = load_config(ECHO / "train.yaml", [f"model={tiny_model_dir}", "train.warmup=null", "trainer.max_steps=1",
                                            f"policy.engine_num_cpus={cpus - 1.25}", "train.learner.num_cpus=2"])
    began = time.monotonic()
    with pytest.raises(PlacementError, match=r"^the run's actors together .*train\.learner \{CPU=2\}.*ray\.num_cpus"):
        train(cfg, tmp_path / "out", progress=False)
    assert time.monotonic() - began < 60
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["leaked_envs"] == 0


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_waiting_for_an_actor_to_be_placed_says_what_it_waits_for(caplog):
    import logging
    import threading

    import ray

    @ray.remote
    class Holder:
        def ip(self) -> str:
            return "placed"

    free = ray.available_resources()["CPU"]
    blocker = Holder.options(num_cpus=free).remote()
    ray.get(blocker.ip.remote(), timeout=60)
    waiting = Holder.options(num_cpus=1).remote()
    threading.Timer(2.0, ray.kill, [blocker]).start()
    with caplog.at_level(logging.WARNING, logger="raygrpo.driver.placement"):
        assert wait_placed(waiting.ip.remote(), "train.learner", actor_resources(1), warn_every_s=0.5) == "placed"
    warned = [r.getMessage() for r in caplog.records if "train.learner: not placed" in r.getMessage()]
    assert warned and "asks for {CPU=1}" in warned[0] and "CPU=0" in warned[0]
    ray.kill(waiting)


def test_pool_fields_are_validated_naming_the_field():
    with pytest.raises(ConfigError, match=r"envs\.echo\.pool\.resources"):
        load_config(ECHO / "rollout.yaml", ["envs.echo.pool.resources={\"CPU\": 1}"])
    with pytest.raises(ConfigError, match=r"envs\.echo\.pool\.memory"):
        load_config(ECHO / "rollout.yaml", ["envs.echo.pool.memory=lots"])
    cfg = load_config(ECHO / "rollout.yaml", ["envs.echo.pool.memory=2GiB", "envs.echo.pool.num_actors=3"])
    assert cfg.envs["echo"].pool.memory == 2 * 2**30 and cfg.envs["echo"].pool.num_actors == 3


# ── config paths on other nodes ──────────────────────────────────────────────────────────────────────────────────

def test_relocate_moves_paths_under_the_driver_workdir_only():
    cfg = load_config(ECHO / "rollout.yaml")
    src, dst = str(ECHO.parent.parent), "/tmp/ray/session_x/runtime_resources/working_dir_files/_ray_pkg_1"
    moved = relocate(cfg, src, dst)
    assert moved.envs["echo"].environment == f"{dst}/examples/echo/env.py:EchoEnvironment"
    assert moved.policy.script == f"{dst}/examples/echo/policies.py:right"
    assert cfg.envs["echo"].environment.startswith(src)  # the original is untouched
    task = TaskRef(env="t", split="train", index=0, metadata={"task_dir": f"{src}/tasks/a", "other": "/mnt/shared/x"})
    out = relocate(task, src, dst)
    assert out.metadata == {"task_dir": f"{dst}/tasks/a", "other": "/mnt/shared/x"}
    assert relocate(task, None, dst) is task and relocate(task, src, src) is task
    assert relocate(f"{src}-other/file", src, dst) == f"{src}-other/file"  # a sibling folder is not under src


# ── routing ──────────────────────────────────────────────────────────────────────────────────────────────────────

def test_the_orchestrator_refuses_an_environment_no_actor_serves():
    orchestrator = Orchestrator(PoolSet.of_actors([("a-0", object())], 4, envs={"a"}))
    with pytest.raises(ValueError, match="no env pool actor serves environment 'b'"):
        orchestrator.enqueue(make_groups([TaskRef(env="b", split="train", index=0)], 1))


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_an_environment_with_a_pool_runs_on_its_own_actors(tmp_path):
    """Two environments: `shared` on the default actors, `own` on a pool of its own (K=2). Every rollout of `own`
    runs on its actors, none of `shared` does, and `own` never has more than 2 in flight per actor."""
    cfg = load_config(ECHO / "rollout.yaml", data=None, overrides=[
        "envs.own={\"kind\": \"ors\", \"environment\": \"%s:EchoEnvironment\", \"split\": \"train\", "
        "\"pool\": {\"num_actors\": 1, \"max_concurrent_per_actor\": 2, \"num_cpus\": 0.1}}" % (ECHO / "env.py"),
        "workers.num_env_actors=1",
    ])
    summary = collect(cfg, tmp_path / "out", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    assert summary["completed"] == summary["requested"] == len(lines) and summary["leaked_envs"] == 0
    by_env = {env: {t["worker"] for t in lines if t["task"]["env"] == env} for env in ("echo", "own")}
    assert by_env["own"] == {"raygrpo-envpool-own-0"}
    assert by_env["echo"] == {"raygrpo-envpool-0"}
    assert all(t["reward"] == 1.0 and t["node"] for t in lines)
    spans = sorted((t["env_span"][0], +1) for t in lines if t["task"]["env"] == "own")
    spans += sorted((t["env_span"][1], -1) for t in lines if t["task"]["env"] == "own")
    live, peak = 0, 0
    for _, step in sorted(spans, key=lambda s: (s[0], s[1])):
        live += step
        peak = max(peak, live)
    assert peak <= 2


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_a_pool_asking_for_a_missing_resource_fails_at_start(tmp_path):
    cfg = load_config(ECHO / "rollout.yaml", ["envs.echo.pool.resources={\"docker_host\": 0.5}"])
    began = time.monotonic()
    with pytest.raises(PlacementError, match=r"^envs\.echo\.pool: .*'docker_host'"):
        collect(cfg, tmp_path / "out", progress=False)
    assert time.monotonic() - began < 60
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["leaked_envs"] == 0 and os.path.exists(tmp_path / "out")
