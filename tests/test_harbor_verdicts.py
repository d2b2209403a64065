"""Harbor verdicts that never misread a task (issue 43), on task folders shaped like public Harbor tasks
(`tests/harbor_verdicts/tasks`): one per class of misreading the issue found, checked with `raygrpo check` on the
local backend and on docker.

- `probe-misread`: test.sh with `2>&1`, `[ ! -f ]` and a multi-line `python3 -c` body: judged `ok`, never
  `verifier_error`;
- `zig-toolchain-missing`: solve.sh needs a toolchain neither the image nor this machine has: the cause is the
  shell's own `zig: command not found`;
- `unpullable-sidecar-image`: a compose sidecar whose image no registry here serves: `task_error` on docker with the
  daemon's line, `refused` on the local backend by name;
- `sidecar-named-volume`: a sidecar built from a local base image sharing a named volume with the sandbox: `ok` on
  docker with docker's listings the same before and after, `refused` on the local backend by name;
- `shared-name-upper` / `shared-name-lower`: one `[task] name`, named by their folders;
- `refused-no-tests`, `refused-bad-toml`: each its own `refused` verdict; the others are judged all the same (exit 1).

`tests/harbor_verdicts/tooling` (local backend): the verifier's missing tooling against the model's missing work
(`venv-abs-pytest`, `pip-in-test`, `pip-in-test-satisfied`, `build-cli-on-path`).

Also on docker: each sidecar episode leaves nothing the moment it is closed, and bash itself reports the commands
the verifier missed (the verify-time half of the tooling rule).
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from raygrpo.cli import main
from tests.docker_utils import docker_ready  # noqa: F401 - a fixture

TASKS = Path(__file__).with_name("harbor_verdicts") / "tasks"
LOCAL_COMPOSE = "compose services are not run by the local backend"
UNPULLABLE = "ghcr.io/example-org/nonexistent-cache:1.2"

#: The `raygrpo check` tests run over the session's local Ray.
over_ray = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]


def check(target: Path, tmp_path: Path, *overrides: str) -> tuple[int, dict[str, dict], str]:
    """`raygrpo check TARGET --json FILE`: (exit code, the verdicts by folder, stdout)."""
    sets = [arg for o in overrides for arg in ("--set", o)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["check", str(target), "--json", str(tmp_path / "check.json"), "--no-progress", *sets])
    data = json.loads((tmp_path / "check.json").read_text())
    assert data["leaked_envs"] == 0
    return code, {Path(v["task_dir"]).name: v for v in data["verdicts"]}, out.getvalue()


def assert_common(got: dict[str, dict]) -> None:
    """What both backends judge alike."""
    probe = got["probe-misread"]
    assert (probe["status"], probe["oracle_reward"], probe["noop_reward"]) == ("ok", 1.0, 0.0), probe
    zig = got["zig-toolchain-missing"]
    assert (zig["status"], zig["oracle_reward"]) == ("oracle_below_threshold", 0.0), zig
    assert zig["cause"] == "solve.sh: zig: command not found"
    for folder in ("shared-name-upper", "shared-name-lower"):
        assert (got[folder]["status"], got[folder]["task"]) == ("ok", folder), got[folder]
    assert got["refused-no-tests"]["status"] == "refused"
    assert got["refused-no-tests"]["cause"] == "missing tests/test.sh"
    assert got["refused-bad-toml"]["status"] == "refused"
    assert got["refused-bad-toml"]["cause"].startswith("task.toml is invalid: verifier.timeout_sec")
    assert got["refused-bad-toml"]["oracle_reward"] is None and got["refused-bad-toml"]["oracle_status"] == "refused"


@over_ray[0]
@over_ray[1]
@pytest.mark.timeout(600)
def test_on_the_local_backend_every_task_gets_its_verdict_and_compose_tasks_are_refused_by_name(
        tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGRPO_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    code, got, stdout = check(TASKS, tmp_path)
    assert code == 1 and len(got) == 8
    assert_common(got)
    for folder in ("unpullable-sidecar-image", "sidecar-named-volume"):
        assert got[folder]["status"] == "refused" and got[folder]["cause"].startswith(LOCAL_COMPOSE), got[folder]
    assert "refused" in stdout and "zig: command not found" in stdout


TOOLING = Path(__file__).with_name("harbor_verdicts") / "tooling"


@over_ray[0]
@over_ray[1]
@pytest.mark.timeout(300)
def test_the_verifiers_missing_tooling_and_the_models_missing_work_are_told_apart(tmp_path, monkeypatch):
    """The verifier's tooling, missing on the local backend (a venv's pytest run by its path, a package test.sh
    pip-installs from an index it cannot reach), is `verifier_error` naming it, never a 0.0; a command the instruction
    asks the model to make is the model's 0.0 when it is not made, never `verifier_error`; a `pip install` of what
    the sandbox has scores as usual."""
    monkeypatch.setenv("RAYGRPO_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    code, got, _ = check(TOOLING, tmp_path)
    assert code == 1 and len(got) == 4
    for folder in ("build-cli-on-path", "pip-in-test-satisfied"):
        assert (got[folder]["status"], got[folder]["oracle_reward"], got[folder]["noop_reward"]) == ("ok", 1.0, 0.0), \
            got[folder]
    for folder, named in (("venv-abs-pytest", "the command `/opt/verifier-venv/bin/pytest`"),
                          ("pip-in-test", "the Python package `numpy==1.26.4`")):
        verdict = got[folder]
        assert (verdict["oracle_status"], verdict["noop_status"]) == ("verifier_error", "verifier_error"), verdict
        assert f"before the model acted: {named}; its verdict (reward 0) is not the model's" in verdict["cause"]


def docker_listings() -> dict[str, list[str]]:
    """What docker lists: containers, volumes, networks, and images (tagged or dangling) other than the task images
    (`hb__*`, and the layers under them) that a check builds once and reuses."""
    def ls(*args: str) -> list[str]:
        return sorted(subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60,
                                     check=True).stdout.split())

    images = [line for line in ls("images", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}}@{{.ID}}")
              if not line.startswith("hb__")]
    return {"containers": ls("ps", "-a", "-q", "--no-trunc"), "volumes": ls("volume", "ls", "-q"),
            "networks": ls("network", "ls", "-q", "--no-trunc"), "images": images}


@over_ray[0]
@over_ray[1]
@pytest.mark.docker
@pytest.mark.timeout(600)
def test_on_docker_sidecars_run_unpullable_images_are_the_tasks_and_nothing_is_left(docker_ready, tmp_path):  # noqa: F811
    before = docker_listings()
    code, got, _ = check(TASKS, tmp_path, "envs.tasks.environment_type=docker")
    assert code == 1 and len(got) == 8
    assert_common(got)
    sidecar = got["sidecar-named-volume"]
    assert (sidecar["status"], sidecar["oracle_reward"], sidecar["noop_reward"]) == ("ok", 1.0, 0.0), sidecar
    unpullable = got["unpullable-sidecar-image"]
    assert unpullable["status"] == "oracle_task_error", unpullable
    assert f"the image {UNPULLABLE} cannot be pulled: Error response from daemon: " in unpullable["cause"]
    assert "-f /" not in unpullable["cause"]  # the daemon's line, not the start of the compose command
    after = docker_listings()
    changed = {kind: {"gone": sorted(set(before[kind]) - set(after[kind])),
                      "new": sorted(set(after[kind]) - set(before[kind]))} for kind in before}
    assert after == before, changed


@pytest.mark.docker
@pytest.mark.timeout(300)
async def test_each_sidecar_episode_removes_its_volume_at_once_and_reuses_its_images(docker_ready):  # noqa: F811
    """Per rollout, not by the run's reaper: once an episode of the sidecar task is closed, nothing of its compose
    project is left (containers, network, named volume), and the sidecar's image has one name per task, reused."""
    from harbor.environments.definition import environment_content_hash

    from raygrpo.docker.engine import COMPOSE_PROJECT, find
    from raygrpo.docker.owners import SANDBOX_LABEL
    from raygrpo.docker.sidecars import SESSION_LABEL
    from raygrpo.envs.harbor.provider import HarborProvider
    from raygrpo.envs.harbor.tasks import list_harbor_tasks
    from raygrpo.specs.harbor import HarborSpec

    task_dir = TASKS / "sidecar-named-volume"
    spec = HarborSpec(path=str(task_dir), environment_type="docker")
    [ref] = list_harbor_tasks(spec, "suite")
    image = f"hb__{environment_content_hash(task_dir / 'environment')}"
    provider = HarborProvider(spec, name="suite")
    runs = []
    try:
        for _ in range(2):
            adapter = provider.adapter()
            try:
                await adapter.start(ref)
                project = adapter.session_id.lower()
                during = find([f"{COMPOSE_PROJECT}={project}"])
                await adapter.call("bash", {"command": "cp /shared/token /app/answer.txt"})
                reward = await adapter.score()
            finally:
                await adapter.close()
            runs.append((project, during, reward, find([f"{COMPOSE_PROJECT}={project}"])))
            vault_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", f"{image}-vault"],
                                      capture_output=True, text=True, timeout=30, check=True).stdout.strip()
            runs[-1] += (vault_id,)
    finally:
        await provider.aclose()
    for project, during, reward, after, _ in runs:
        assert reward == 1.0
        assert sorted(o.kind for o in during) == ["container", "container", "network", "volume"], during
        assert all(o.labels.get(SANDBOX_LABEL) == "true" for o in during)  # the sidecar and the volume too
        assert len({o.labels.get(SESSION_LABEL) for o in during} - {None}) == 1  # one sandbox's objects
        assert after == []  # right after the episode, before any reaper pass
    assert runs[0][4] == runs[1][4]  # one sidecar image, reused
    tags = subprocess.run(["docker", "images", "--format", "{{.Repository}}", "--filter",
                           "reference=sidecar-named-volume*"], capture_output=True, text=True, check=True).stdout.split()
    assert tags == []  # no per-sandbox `<project>-vault` / `<project>-main` tags (docker_ready removes `hb__*`)


@pytest.mark.timeout(60)
def test_rollout_fails_at_load_naming_every_refused_task_at_once(tmp_path, capsys):
    """One load names all four tasks the local backend cannot run (before Ray starts: exit 2)."""
    config = tmp_path / "rollout.yaml"
    config.write_text(f"envs: {{tasks: {{kind: harbor, path: {TASKS}}}}}\npolicy: {{kind: oracle}}\n")
    assert main(["rollout", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "envs.tasks.path: 4 task(s) of the suite cannot be run:" in err
    for folder, cause in (("refused-bad-toml", "task.toml is invalid"), ("refused-no-tests", "missing tests/test.sh"),
                          ("sidecar-named-volume", LOCAL_COMPOSE), ("unpullable-sidecar-image", LOCAL_COMPOSE)):
        assert f"task dir {TASKS / folder}: {cause}" in err, (folder, err)
    assert not (tmp_path / "run").exists()


@pytest.mark.timeout(60)
def test_a_check_of_refused_tasks_only_judges_them_without_running_anything(tmp_path):
    from raygrpo.driver.check import load_target, run_check

    suite = tmp_path / "suite"
    suite.mkdir()
    for folder in ("refused-no-tests", "refused-bad-toml"):
        (suite / folder).symlink_to(TASKS / folder)
    result = run_check(load_target(suite))
    assert [(v.task, v.status) for v in result.verdicts] == [("refused-bad-toml", "refused"),
                                                            ("verdicts/refused-no-tests", "refused")]
    assert len(result.broken) == 2 and result.leaked_envs == 0


@pytest.mark.docker
@pytest.mark.timeout(300)
async def test_on_docker_bash_reports_the_commands_the_verifier_missed(docker_ready, tmp_path):  # noqa: F811
    """The verify-time half of the tooling rule in a docker sandbox: `report-tool`, missing before the model acted,
    counts against the verdict only on the path where test.sh runs it (bash's `command_not_found_handle`)."""
    from raygrpo.core.errors import VerifierError
    from raygrpo.envs.harbor.provider import HarborProvider
    from raygrpo.envs.harbor.tasks import list_harbor_tasks
    from raygrpo.specs.harbor import HarborSpec
    from tests.harbor_utils import make_task

    test_sh = ('#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n'
               'if [ -f /app/debug ]; then report-tool /app/out.txt 2>/dev/null; fi\n')
    make_task(tmp_path / "suite", "t", test_sh=test_sh, dockerfile="FROM python:3.12-slim\nWORKDIR /app\n")
    spec = HarborSpec(path=str(tmp_path / "suite"), environment_type="docker")
    [ref] = list_harbor_tasks(spec, "suite")
    provider = HarborProvider(spec, name="suite")
    try:
        outcomes = []
        for debug in (False, True):
            adapter = provider.adapter()
            try:
                await adapter.start(ref)
                if debug:
                    await adapter.call("bash", {"command": "touch /app/debug"})
                try:
                    outcomes.append(await adapter.score())
                except VerifierError as exc:
                    outcomes.append(str(exc))
                outcomes.append(adapter.verifier)
            finally:
                await adapter.close()
    finally:
        await provider.aclose()
    quiet_reward, quiet, loud_error, loud = outcomes
    assert quiet_reward == 0.0 and quiet["tooling_missing"] == ["the command `report-tool`"]
    assert "missing_at_verify" not in quiet
    # Its stderr went to /dev/null: bash's handler, not the output, is what saw it.
    assert "before the model acted" in loud_error and loud["missing_at_verify"] == ["report-tool"]
