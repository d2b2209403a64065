"""Separate verifier environments (`[verifier] environment_mode = "separate"`, the default of `harbor tasks init`,
issue 44): tasks made with Harbor's own CLI and filled in, checked with `raygrpo check` on docker, where the verifier
runs in a container built from `tests/Dockerfile` with the task's declared artifacts copied over (per step for a
multi-step task); refused by name on the local backend. Leftovers are asked of docker itself."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from raygrpo.docker.owners import SANDBOX_LABEL

from raygrpo.envs.kinds import HarborKind
from tests.docker_utils import docker_ready, sandbox_objects  # noqa: F401 - a fixture
from tests.harbor_steps_utils import make_separate_task
from tests.test_harbor_spec import load
from tests.test_harbor_steps import check_and_read


@pytest.mark.timeout(60)
def test_the_local_backend_refuses_separate_verifiers_by_name(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    make_separate_task(suite, "separate")
    make_separate_task(suite, "separate-steps", steps=2)
    refused = []
    assert HarborKind().resolve(load({"path": "suite"}, tmp_path), "local", refused) == []
    assert [(Path(r.task_dir).name, r.task) for r in refused] == [("separate", "acme/separate"),
                                                                  ("separate-steps", "acme/separate-steps")]
    for refusal in refused:
        assert f"task {refusal.task!r} asks for a separate verifier environment" in refusal.cause
        assert "which raygrpo runs on docker only" in refusal.cause and "the local backend" in refusal.cause


@pytest.mark.ray
@pytest.mark.docker
@pytest.mark.timeout(600)
def test_check_of_separate_verifier_tasks_on_docker(docker_ready, ray_local, tmp_path):  # noqa: F811
    suite = tmp_path / "suite"
    suite.mkdir()
    make_separate_task(suite, "separate")
    make_separate_task(suite, "separate-steps", steps=2)
    verdicts, trajs = check_and_read(suite, tmp_path / "out", ["envs.tasks.environment_type=docker"])
    for name in ("separate", "separate-steps"):
        assert (verdicts[name].status, verdicts[name].oracle_reward, verdicts[name].noop_reward) == ("ok", 1.0, 0.0)
        for kind in ("oracle", "noop"):
            # test.sh ran in the verifier's own image (its marker is not in the task's), and saw the artifact.
            assert "verifier image: separate" in trajs[name][kind]["verifier"]["output_tail"], trajs[name][kind]
            assert trajs[name][kind]["timings"]["verify"] > 0
    assert trajs["separate-steps"]["oracle"]["step_rewards"] == [1.0, 1.0]  # step 2's artifact is step 2's answer
    assert trajs["separate-steps"]["noop"]["step_rewards"] == [0.0, 0.0]
    assert sandbox_objects() == []  # docker's own listing: neither kind of sandbox is left


class ContainerPeak:
    """Polls docker's own listing of raygrpo sandbox containers while a block runs: the most alive at once, and how
    many different ones were seen."""

    def __init__(self) -> None:
        self.peak = 0
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            done = subprocess.run(["docker", "ps", "-q", "--filter", f"label={SANDBOX_LABEL}"],
                                  capture_output=True, text=True, timeout=30)
            ids = set(done.stdout.split())
            self.peak = max(self.peak, len(ids))
            self.seen |= ids
            self._stop.wait(0.2)

    def __enter__(self) -> ContainerPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@pytest.mark.ray
@pytest.mark.docker
@pytest.mark.timeout(600)
def test_the_verifier_sandbox_counts_against_max_live(docker_ready, ray_local, tmp_path):  # noqa: F811
    """With the provider's `max_live: 1`, the oracle and noop rollouts of a separate-verifier task (four sandboxes in
    all) never have two sandboxes alive at once, and finish: the task's sandbox is stopped before its verifier's
    starts, which takes the freed slot."""
    suite = tmp_path / "suite"
    suite.mkdir()
    make_separate_task(suite, "separate")
    with ContainerPeak() as seen:
        verdicts, _ = check_and_read(suite, tmp_path / "out", ["envs.tasks.environment_type=docker",
                                                               "providers.docker.max_live=1"])
    assert (verdicts["separate"].status, verdicts["separate"].oracle_reward) == ("ok", 1.0)
    assert seen.peak == 1 and len(seen.seen) == 4, (seen.peak, seen.seen)
    assert sandbox_objects() == []
