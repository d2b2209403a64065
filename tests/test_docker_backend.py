"""Harbor tasks on a real Docker engine (Harbor's docker backend with raygrpo's labels, init and image reuse): the
stand-in base images, episodes, builds that install packages, a build that fails, and whole runs through Ray with a
cancelled batch and a SIGKILLed env pool actor. What is left is asked of docker itself (`docker ps -a` and
`docker network ls` by label).

Skipped where no Docker engine answers (`make docker-dev` sets one up); under RAYGRPO_REQUIRE_DOCKER=1 they fail
instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import ray
from harbor.environments.definition import environment_content_hash

from raygrpo.agent.chat import ChatRenderer
from raygrpo.config import load_config
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.core.errors import TaskError
from raygrpo.core.imports import load_object
from raygrpo.policy.base import SamplingParams
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.governor.gate import reset_gates
from raygrpo.agent.rollout import run_rollout
from raygrpo.docker.engine import COMPOSE_PROJECT, find, remove_images
from raygrpo.docker.owners import RUN_LABEL, SANDBOX_LABEL, owner_of
from raygrpo.specs.harbor import HarborSpec
from raygrpo.core.types import Status
from tests.docker_utils import (
    BASE_IMAGE,
    STAND_IN_LABEL,
    docker_ready,  # noqa: F401 - a fixture
    image_label,
    sandbox_objects,
    task_images,
)
from tests.harbor_utils import EXAMPLE_DIR, EXAMPLE_TASKS, make_task
from tests.ors_utils import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

HARBOR = "examples/harbor_local/rollout.yaml"
SUPPORT = str(Path(__file__).with_name("e2e_support.py"))
CONFIG = RolloutConfig(max_turns=4, max_total_tokens=4096, max_tool_output_chars=8000)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture(autouse=True)
def _gates():
    reset_gates()
    yield
    reset_gates()


def docker_spec(path, **fields) -> HarborSpec:
    return HarborSpec(path=str(path), environment_type="docker", **fields)


def project_objects(project: str) -> list:
    return find([f"{COMPOSE_PROJECT}={project}"])


# ── the stand-in base images ──────────────────────────────────────────────────────────────────────────────────────


def test_stand_in_base_image(docker_ready):
    if image_label(BASE_IMAGE, STAND_IN_LABEL) != "true":
        pytest.skip(f"{BASE_IMAGE} here is not a raygrpo stand-in")
    python = image_label(BASE_IMAGE, f"{STAND_IN_LABEL}.python")
    wheelhouse = image_label(BASE_IMAGE, f"{STAND_IN_LABEL}.wheelhouse")
    script = ("python --version; python3 --version; pytest --version; "
              "python -c 'import importlib.metadata as m; print(m.version(\"pytest-json-ctrf\"))'; "
              "pip config list | grep -o \"index-url='.*'\"; bash --version | head -1")
    done = subprocess.run(["docker", "run", "--rm", BASE_IMAGE, "bash", "-c", script],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == lines[1] == f"Python {python}"  # the label says which Python it really has
    assert lines[2:5] == ["pytest 8.4.1", "0.3.5", f"index-url='{wheelhouse}'"]  # pip installs from the wheelhouse
    assert lines[5].startswith("GNU bash")


# ── episodes ──────────────────────────────────────────────────────────────────────────────────────────────────────


async def test_episodes_are_labelled_run_under_an_init_reuse_the_image_and_leave_nothing(docker_ready):
    spec = docker_spec(EXAMPLE_TASKS)
    ref = next(t for t in list_harbor_tasks(spec, "suite") if t.metadata["task_dir"].endswith("count-words"))
    solve = (Path(ref.metadata["task_dir"]) / "solution" / "solve.sh").read_text()
    image = f"hb__{environment_content_hash(Path(ref.metadata['task_dir']) / 'environment')}"
    # An earlier run on this machine may have left the task's image (runs keep them for the next): start without.
    remove_images([image])
    provider = HarborProvider(spec, name="suite")
    runs = []
    try:
        for _ in range(2):
            adapter = provider.adapter()
            try:
                await adapter.start(ref)
                project = adapter.session_id.lower()
                objects = project_objects(project)
                pid1 = await adapter.call("bash", {"command": "cat /proc/1/comm"})
                await adapter.call("bash", {"command": solve})
                reward = await adapter.score()
                prebuilt = adapter.env.task_env_config.docker_image
            finally:
                await adapter.close()
            runs.append((project, objects, pid1.text, reward, prebuilt, dict(adapter.timings)))
    finally:
        await provider.aclose()
    for i, (project, objects, pid1, reward, prebuilt, timings) in enumerate(runs):
        assert reward == 1.0
        assert sorted(o.kind for o in objects) == ["container", "network"]
        for obj in objects:  # labelled with this process as the owner, through docker itself
            assert obj.labels[SANDBOX_LABEL] == "true" and owner_of(obj.labels)["pid"] == os.getpid()
        assert pid1.startswith("docker-init")  # the init, not `sleep infinity`, is PID 1
        assert timings["stop"] < 5.0, timings  # (without the init: Docker's 10 s stop timeout)
        assert project_objects(project) == []
        # The first sandbox built the task's image under its content-addressed name; the second started from it.
        assert prebuilt == (None if i == 0 else image)
    assert image in task_images()
    # No per-sandbox image tags (`<session>-main`) are left behind.
    tags = subprocess.run(["docker", "images", "--format", "{{.Repository}}", "--filter", "reference=count-words*"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert tags == []


def dangling_images() -> set[str]:
    done = subprocess.run(["docker", "images", "-q", "--no-trunc", "--filter", "dangling=true"],
                          capture_output=True, text=True, timeout=30, check=True)
    return set(done.stdout.split())


async def test_concurrent_first_starts_of_a_task_build_its_image_once(docker_ready, tmp_path):
    """Two env pool actors (two providers: the lock is per node, not per actor), three sandboxes of one new task
    each, all started at once before its image exists: one build, the other five start from its image, and no
    dangling image is left (concurrent builds each tag `hb__<hash>`, leaving the earlier ones untagged)."""
    make_task(tmp_path, "once", files={"run_id.txt": uuid.uuid4().hex}, dockerfile=(
        "FROM python:3.12-slim\nWORKDIR /app\nCOPY run_id.txt /app/run_id.txt\n"
        "RUN sleep 1 && date +%s%N > /app/built_at\n"))
    spec = docker_spec(tmp_path)
    ref = list_harbor_tasks(spec, "suite")[0]
    dangling = dangling_images()
    providers = [HarborProvider(spec, name="suite") for _ in range(2)]

    async def one(provider) -> tuple[str, str | None]:
        adapter = provider.adapter()
        try:
            await adapter.start(ref)
            built_at = await adapter.call("bash", {"command": "cat /app/built_at"})
            return built_at.text.split()[0], adapter.env.task_env_config.docker_image
        finally:
            await adapter.close()

    try:
        runs = await asyncio.gather(*(one(p) for p in providers for _ in range(3)))
    finally:
        for provider in providers:
            await provider.aclose()
    assert len({built_at for built_at, _ in runs}) == 1, runs  # one build, whatever sandbox started first
    assert sum(prebuilt is None for _, prebuilt in runs) == 1, runs  # five started from the built image
    assert dangling_images() - dangling == set()


async def test_a_build_that_apt_and_pip_installs_builds_and_scores(docker_ready, renderer, tmp_path):
    """`RUN apt-get install` reaches Debian's mirror; `RUN pip install` reaches the wheelhouse (pip.conf of the
    stand-in), which fetches through the host. `--ignore-installed`: the stand-in already has these two."""
    make_task(tmp_path, "installs", dockerfile=(
        "FROM python:3.12-slim\n"
        "WORKDIR /app\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/*\n"
        "RUN pip install --no-cache-dir --ignore-installed pytest==8.4.1 pytest-json-ctrf==0.3.5\n"
    ), test_sh="""#!/bin/bash
cat > /tmp/test_out.py <<'EOF'
def test_out():
    assert open("/app/out.txt").read().strip() == "ok"
EOF
if pytest -q --ctrf /logs/verifier/ctrf.json /tmp/test_out.py; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
""", solve_sh="echo '{\"v\": \"ok\"}' | jq -r .v > /app/out.txt")
    spec = docker_spec(tmp_path, exec_timeout_s=60)
    script = load_object(f"{EXAMPLE_DIR}/policies.py:right")
    provider = HarborProvider(spec, name="suite")
    try:
        traj = await run_rollout(list_harbor_tasks(spec, "suite")[0], provider.adapter(),
                                 ScriptedPolicy(renderer.tokenizer, script), renderer, SamplingParams(max_tokens=512),
                                 CONFIG)
    finally:
        await provider.aclose()
    assert traj.status is Status.OK, traj.error
    assert traj.reward == 1.0


async def test_an_image_that_downloads_from_elsewhere_is_a_task_error_in_seconds(docker_ready, renderer, tmp_path):
    make_task(tmp_path, "offline", dockerfile=(
        "FROM python:3.12-slim\n"
        "WORKDIR /app\n"
        "RUN echo first step\n"
        "RUN python3 -c \"import urllib.request; urllib.request.urlopen('https://example.com/data.tgz', timeout=20)\"\n"
        "RUN echo never\n"
    ))
    spec = docker_spec(tmp_path)
    containers_before = set(subprocess.run(["docker", "ps", "-a", "-q"], capture_output=True, text=True).stdout.split())
    provider = HarborProvider(spec, name="suite")
    ref = list_harbor_tasks(spec, "suite")[0]
    adapter = provider.adapter()
    began = time.monotonic()
    try:
        with pytest.raises(TaskError) as raised:
            await adapter.start(ref)
        took = time.monotonic() - began
        # Through the agent loop: task_error, unscored, with the step in the message.
        traj = await run_rollout(ref, provider.adapter(), ScriptedPolicy(renderer.tokenizer, lambda ctx: "Done."),
                                 renderer, SamplingParams(max_tokens=64), CONFIG)
    finally:
        await adapter.close()
        await provider.aclose()
    message = str(raised.value)
    assert "the task's image does not build: step 4/6 `RUN python3 -c" in message, message
    assert "exited with code 1" in message and "urlopen error" in message
    assert took < 60, took
    assert traj.status is Status.TASK_ERROR and traj.reward is None and "step 4/6" in (traj.error or "")
    # The classic builder keeps the failed step's container; it is removed.
    containers_after = set(subprocess.run(["docker", "ps", "-a", "-q"], capture_output=True, text=True).stdout.split())
    assert containers_after <= containers_before
    assert sandbox_objects() == []


# ── whole runs through Ray ────────────────────────────────────────────────────────────────────────────────────────


@pytest.fixture
def suite_with_a_broken_task(tmp_path) -> Path:
    """The example suite plus one task whose image cannot build here."""
    suite = tmp_path / "tasks"
    shutil.copytree(EXAMPLE_TASKS, suite)
    make_task(suite, "zz-offline", dockerfile=(
        "FROM python:3.12-slim\nRUN python3 -c \"import urllib.request; urllib.request.urlopen('https://example.com')\"\n"))
    return suite


@pytest.mark.ray
@pytest.mark.timeout(400)
def test_example_suite_on_docker_through_ray(docker_ready, ray_local, tmp_path, suite_with_a_broken_task):
    from raygrpo.driver.collect import collect

    cfg = load_config(HARBOR, ["envs.local.environment_type=docker", f"envs.local.path={suite_with_a_broken_task}"])
    summary = collect(cfg, tmp_path / "out", progress=False)
    assert summary["completed"] == summary["requested"] == 10 * 2
    assert summary["status_counts"] == {"ok": 18, "task_error": 2}
    assert summary["retried_attempts"] == 0  # a broken image is not retried
    assert summary["reward_mean"] == 1.0 and summary["scored"] == 18
    broken = [t for t in map(json.loads, (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines())
              if t["status"] == "task_error"]
    assert {Path(t["task"]["metadata"]["task_dir"]).name for t in broken} == {"zz-offline"}
    assert all("image does not build: step 2/" in t["error"] and "`RUN python3 -c" in t["error"] for t in broken)
    assert summary["leaked_envs"] == 0
    assert sandbox_objects() == []


def _busy_runtime():
    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.resolve import resolve_run

    cfg = load_config(HARBOR, ["envs.local.environment_type=docker", "envs.local.num_tasks=4",
                               "policy.kind=scripted", f"policy.script={SUPPORT}:bash_sleep",
                               "envs.local.exec_timeout_s=600", "rollout.rollout_timeout_s=120"])
    return RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env)


def run_containers(run_id: str) -> list:
    return find([f"{RUN_LABEL}={run_id}"], kinds=("container",))


def sleeping(containers: list) -> int:
    """How many of `containers` run the policy's `sleep 300` (found through /proc: the cgroup names the container)."""
    ids = {c.id for c in containers}
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                if f.read() != b"sleep\x00300\x00":
                    continue
            with open(f"/proc/{entry.name}/cgroup") as f:
                cgroup = f.read()
        except OSError:
            continue
        count += any(i in cgroup for i in ids)
    return count


def _stream(runtime, max_retries: int):
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.orchestrator import Orchestrator
    from raygrpo.driver.pools import PoolSet

    stop = threading.Event()
    orchestrator = Orchestrator(PoolSet.of_actors(runtime.actors, 8), max_retries=max_retries)
    finished: list = []
    consumer = threading.Thread(target=lambda: finished.extend(orchestrator.run(make_groups(runtime.tasks, 2), stop)))
    consumer.start()
    return stop, consumer, finished


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_cancelled_batch_on_docker_leaves_nothing(docker_ready, ray_local):
    with _busy_runtime() as runtime:
        stop, consumer, finished = _stream(runtime, max_retries=2)
        # Every rollout sleeps: wait until the 8 sandboxes run their sleeps, then cancel the batch (as Ctrl-C does).
        busy = wait_until(lambda: sleeping(run_containers(runtime.run_id)) >= 16, 180, interval_s=0.5)
        stop.set()
        consumer.join(60)
        assert busy, run_containers(runtime.run_id)
        assert not consumer.is_alive() and finished == []
    assert runtime.leaked_envs == 0
    assert find([f"{RUN_LABEL}={runtime.run_id}"]) == []


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_sigkill_of_an_env_pool_actor_on_docker_is_reaped(docker_ready, ray_local):
    with _busy_runtime() as runtime:
        (victim_name, victim), _ = runtime.actors
        victim_pid = ray.get(victim.pid.remote())
        stop, consumer, finished = _stream(runtime, max_retries=0)
        victims = lambda: find([f"io.raygrpo.owner.pid={victim_pid}"])  # noqa: E731
        assert wait_until(lambda: sleeping(run_containers(runtime.run_id)) >= 16, 180, interval_s=0.5)
        assert victims()
        os.kill(victim_pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # Within 30 s docker has no container or network of the victim's sandboxes left.
        assert wait_until(lambda: not victims(), 30, interval_s=0.5), victims()
        reaped_after = time.monotonic() - killed_at
        assert wait_until(lambda: len(finished) >= 4, 30), finished
        assert all(t.status.value == "env_error" and victim_name in (t.error or "") for t in finished)
        stop.set()
        consumer.join(60)
    assert find([f"{RUN_LABEL}={runtime.run_id}"]) == []
    print(f"victim's docker sandboxes reaped {reaped_after:.1f} s after its SIGKILL")
