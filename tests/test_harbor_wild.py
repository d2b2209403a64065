"""Harbor task folders as other people write them (`tests/harbor_wild/`, see its README), checked with `raygrpo check`:
the oracle must score what the task's reference solution earns and noop less, on the local backend (with the
verifier toolbox, offline tooling, and the `RUN` commands that make the tasks' data) and on docker; with the tooling absent from the start, the affected rollouts
are `verifier_error`, never a 0.0; shapes the local backend does not run fail at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from raygrpo.driver.check import load_target, run_check
from raygrpo.core.errors import ResolveError
from raygrpo.driver.resolve import resolve_run
from tests.docker_utils import docker_ready  # noqa: F401 - a fixture

WILD = Path(__file__).with_name("harbor_wild")
TASKS = WILD / "tasks"
#: reward.json with named keys (fizzbuzz-named-rewards) is reduced by their mean: both must pass.
COMMON = ["envs.tasks.offline_tooling=true", "envs.tasks.reward_reduce=mean"]
#: Writes no reward at all, on purpose.
NO_REWARD = "dedupe-emails-no-reward"
#: Their test.sh needs pytest (or `python`), which only the toolbox gives a local sandbox.
NEEDS_TOOLBOX = {"access-log-5xx", "csv-revenue-by-region", "dedupe-emails-no-reward", "fibonacci-uvx-template",
                 "fix-median-relative", "primes-init-shared", "slugify-module", "top-words-python-alias"}

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local"), pytest.mark.timeout(600)]


def verdicts(overrides: list[str]) -> dict:
    result = run_check(load_target(TASKS, COMMON + overrides))
    assert result.leaked_envs == 0
    return {Path(v.task_dir).name: v for v in result.verdicts}


def test_the_suite_has_every_shape():
    assert len(list(TASKS.iterdir())) >= 13


def test_on_the_local_backend_with_the_toolbox_and_offline_tooling():
    got = verdicts([])
    for name, v in got.items():
        if name == NO_REWARD:
            assert (v.oracle_status, v.noop_status) == ("task_error", "task_error"), v
        else:
            assert (v.status, v.oracle_reward, v.noop_reward) == ("ok", 1.0, 0.0), v


@pytest.mark.docker
def test_on_docker_every_oracle_passes_and_every_noop_fails(docker_ready):  # noqa: F811
    got = verdicts(["envs.tasks.environment_type=docker"])
    for name, v in got.items():
        if name == NO_REWARD:
            assert (v.oracle_status, v.noop_status) == ("task_error", "task_error"), v
        else:
            assert (v.status, v.oracle_reward, v.noop_reward) == ("ok", 1.0, 0.0), v


def test_with_the_tooling_absent_from_the_start_nothing_is_a_false_zero():
    got = verdicts(['envs.tasks.environment_kwargs={"toolbox": false}'])
    for name, v in got.items():
        if name in NEEDS_TOOLBOX:
            assert (v.oracle_status, v.noop_status) == ("verifier_error", "verifier_error"), v
            assert v.oracle_reward is None and v.noop_reward is None
            assert "before the model acted" in v.cause
        else:
            assert (v.status, v.oracle_reward, v.noop_reward) == ("ok", 1.0, 0.0), v


@pytest.mark.parametrize("folder, feature", [
    ("separate-verifier-wordcount", "asks for a separate verifier environment"),
])
def test_shapes_the_local_backend_does_not_run_fail_at_load(folder, feature):
    task = WILD / "unsupported" / folder
    assert task.is_dir(), sorted(p.name for p in (WILD / "unsupported").iterdir())
    with pytest.raises(ResolveError, match="envs.tasks.path: ") as raised:
        resolve_run(load_target(task))
    assert feature in str(raised.value) and "which raygrpo runs on docker only" in str(raised.value)
