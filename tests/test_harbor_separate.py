"""Separate verifier environments (`[verifier] environment_mode = "separate"`, the default of `harbor tasks init`,
issue 44): tasks made with Harbor's own CLI and filled in, checked with `raygrpo check` on docker, where the verifier
runs in a container built from `tests/Dockerfile` with the task's declared artifacts copied over (per step for a
multi-step task); refused by name on the local backend. Leftovers are asked of docker itself."""

from __future__ import annotations

from pathlib import Path

import pytest

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
