"""The docker and e2b paths: the spec's backend settings reach Harbor's `EnvironmentFactory` and the backend class
as Harbor would pass them (type, constructor kwargs, the task's environment config, session id, trial paths), and
the adapter drives the backend through Harbor's calls (start, exec with the exec timeout, the verifier's upload /
run / download, stop with the right `delete`).

No real sandbox starts here (no e2b account; real docker sandboxes are `tests/test_docker_backend.py`): the test
swaps the backend class at the factory's loading boundary (`harbor.environments.factory._load_environment_class`) for
a recording one. For docker the recording class subclasses Harbor's real `DockerEnvironment`, so its real constructor
and definition checks run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raygrpo.envs.base import RewardMissingError
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.docker import OVERLAY_NAME
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.governor.gate import reset_gates
from raygrpo.specs.harbor import HarborSpec
from raygrpo.specs.provider import ProviderSpec
from tests.harbor_utils import EXAMPLE_TASKS, RecordingMixin, make_task, recording_backend

pytestmark = pytest.mark.timeout(60)

TASK = "count-words"


@pytest.fixture
def loaded(monkeypatch):
    """Backend types Harbor's factory was asked to load; the classes it gets are recording ones."""
    from harbor.environments import factory
    from harbor.environments.docker.docker import DockerEnvironment
    from harbor.models.environment_type import EnvironmentType

    class DockerRecorder(RecordingMixin, DockerEnvironment):
        pass

    types: list = []

    def load(env_type):
        types.append(env_type)
        return DockerRecorder if env_type is EnvironmentType.DOCKER else recording_backend(env_type.value)

    monkeypatch.setattr(factory, "_load_environment_class", load)
    RecordingMixin.instances.clear()
    monkeypatch.setattr(RecordingMixin, "reward_text", "1")
    reset_gates()
    yield types
    reset_gates()


def task_ref(spec: HarborSpec, name: str = TASK):
    return next(t for t in list_harbor_tasks(spec, "suite") if Path(t.metadata["task_dir"]).name == name)


async def episode(spec: HarborSpec, ref, command: str = "wc -w poem.txt", limits: ProviderSpec | None = None):
    provider = HarborProvider(spec, name="suite", limits=limits)
    adapter = provider.adapter()
    try:
        obs = await adapter.start(ref)
        result = await adapter.call("bash", {"command": command})
        try:
            reward = await adapter.score()
        except RewardMissingError as exc:
            reward = exc
        gate_stats = provider.gate.stats()
    finally:
        await adapter.close()
        await provider.aclose()
    (env,) = RecordingMixin.instances
    return obs, result, reward, env, gate_stats, adapter


async def test_e2b_config_reaches_the_factory(loaded):
    from harbor.models.environment_type import EnvironmentType
    from harbor.models.task.task import Task

    spec = HarborSpec(
        path=str(EXAMPLE_TASKS),
        environment_type="e2b",
        environment_kwargs={"sandbox_timeout_secs": 900, "override_cpus": 2},
        exec_timeout_s=12,
    )
    ref = task_ref(spec)
    obs, result, reward, env, gate, adapter = await episode(spec, ref, limits=ProviderSpec(create_rate_per_s=5))
    assert loaded == [EnvironmentType.E2B]
    kw = env.init_kwargs
    task = Task(ref.metadata["task_dir"])
    assert kw["environment_dir"] == task.paths.environment_dir
    assert kw["environment_name"] == TASK
    assert re.fullmatch(rf"{TASK}__[0-9a-f]{{10}}__env", kw["session_id"]) and kw["session_id"] == adapter.session_id
    # The task's [environment] table (memory_mb=512 ...), with Harbor's override_cpus applied by the backend (the
    # adapter hands each backend its own copy, so the cached task is untouched).
    got = kw["task_env_config"]
    assert got.model_dump(exclude={"cpus"}) == task.config.environment.model_dump(exclude={"cpus"})
    assert got.memory_mb == 512 and got.cpus == 2 and task.config.environment.cpus == 1
    assert kw["sandbox_timeout_secs"] == 900 and kw["override_cpus"] == 2  # environment_kwargs
    assert not Path(kw["trial_paths"].trial_dir).exists()  # the episode's host folder is removed on close
    assert env.calls[0] == ("start", False)
    assert env.calls[-1] == ("stop", True)  # e2b sandboxes are deleted
    bash = [c[1] for c in env.calls if c[0] == "exec" and c[1]["command"] == "wc -w poem.txt"]
    assert bash == [{"command": "wc -w poem.txt", "timeout_sec": 12, "user": None, "env": None}]
    assert obs.messages == [{"role": "user", "content": task.instruction}]
    assert [t["function"]["name"] for t in obs.tools] == ["bash"]
    assert result.text == "[exit code 0]" and not result.error
    # The verifier: tests uploaded to /tests, test.sh run, /logs/verifier downloaded, reward.txt read.
    assert ("upload_dir", (str(task.paths.tests_dir), "/tests")) in env.calls
    assert any(c[0] == "exec" and "/tests/test.sh" in c[1]["command"] for c in env.calls)
    assert any(c[0] == "download_dir" and c[1][0] == "/logs/verifier" for c in env.calls)
    assert reward == 1.0
    assert gate["key"] == "e2b" and gate["rate_per_s"] == 5 and gate["granted"] == 1
    # e2b builds have dropped COPY'd build-context files: poem.txt is uploaded again, staged and moved as root.
    (staged,) = [c[1] for c in env.calls if c[0] == "upload_file"]
    assert staged[0] == str(task.paths.environment_dir / "poem.txt") and staged[1].startswith("/tmp/raygrpo-upload-")
    move = next(c[1] for c in env.calls if c[0] == "exec" and staged[1] in c[1]["command"])
    assert move["command"] == f"mkdir -p /app && mv -f {staged[1]} /app/poem.txt" and move["user"] == "root"
    assert env.calls.index(("upload_file", staged)) < min(
        i for i, c in enumerate(env.calls) if c[0] == "exec" and c[1]["command"] == "wc -w poem.txt")


async def test_e2b_reuploads_copied_directories(loaded):
    spec = HarborSpec(path=str(EXAMPLE_TASKS), environment_type="e2b")
    ref = task_ref(spec, "find-largest-file")  # COPY data /app/data
    *_, reward, env, _, _ = await episode(spec, ref)
    (staged,) = [c[1] for c in env.calls if c[0] == "upload_dir" and c[1][1].startswith("/tmp/raygrpo-upload-")]
    assert staged[0] == str(Path(ref.metadata["task_dir"]) / "environment" / "data")
    assert any(c[0] == "exec" and c[1]["command"].startswith(f"mkdir -p /app/data && cp -a {staged[1]}/. /app/data/")
               for c in env.calls)
    off = HarborSpec(path=str(EXAMPLE_TASKS), environment_type="e2b", reupload_copied_files=False)
    assert off.reuploads_copied_files is False


async def test_docker_keeps_the_image_and_gets_its_kwargs(loaded, tmp_path):
    from harbor.models.environment_type import EnvironmentType

    user_compose = tmp_path / "mine.yaml"
    user_compose.write_text("services:\n  main:\n    environment: {A: '1'}\n")
    spec = HarborSpec(path=str(EXAMPLE_TASKS), environment_type="docker", max_concurrent_starts=3,
                      environment_kwargs={"keep_containers": False, "extra_docker_compose": [str(user_compose)]})
    ref = task_ref(spec)
    _, _, reward, env, gate, _ = await episode(spec, ref)
    assert loaded == [EnvironmentType.DOCKER]
    assert type(env).__mro__[2].__name__ == "DockerEnvironment"  # Harbor's real constructor ran
    assert env.init_kwargs["keep_containers"] is False and env._keep_containers is False
    # raygrpo's compose file (an init, owner labels, the image's name) comes after the user's, in the episode's folder.
    mine, ours = env.init_kwargs["extra_docker_compose"]
    assert mine == str(user_compose)
    assert Path(ours).name == OVERLAY_NAME and Path(ours).parent == Path(env.init_kwargs["trial_paths"].trial_dir)
    # `docker compose down` without --rmi: containers go, the built image stays for the next rollout.
    assert env.calls[-1] == ("stop", False)
    assert not any(c[0].startswith("upload") and c[1][1].startswith("/tmp/raygrpo-upload-") for c in env.calls)
    assert reward == 1.0
    assert gate["key"] == "docker" and gate["max_concurrent_starts"] == 3 and gate["rate_per_s"] is None


async def test_users_and_verifier_env_follow_task_toml(loaded, tmp_path):
    make_task(tmp_path, "users", metadata="", environment="",
              toml='schema_version = "1.4"\n[agent]\nuser = "agent"\n[verifier]\nuser = "grader"\n'
                   '[verifier.env]\nEXPECTED = "42"\n')
    spec = HarborSpec(path=str(tmp_path), environment_type="e2b")
    _, _, reward, env, _, _ = await episode(spec, list_harbor_tasks(spec, "suite")[0], command="whoami")
    execs = [c[1] for c in env.calls if c[0] == "exec"]
    assert next(e for e in execs if e["command"] == "whoami")["user"] == "agent"
    run = next(e for e in execs if "/tests/test.sh" in e["command"] and not e["command"].startswith("chmod"))
    assert run["user"] == "grader" and run["env"] == {"EXPECTED": "42"}
    assert reward == 1.0


async def test_missing_reward_on_a_remote_backend(loaded, monkeypatch):
    monkeypatch.setattr(RecordingMixin, "reward_text", None)
    spec = HarborSpec(path=str(EXAMPLE_TASKS), environment_type="e2b")
    *_, reward, env, _, _ = await episode(spec, task_ref(spec))
    assert isinstance(reward, RewardMissingError) and "no usable reward" in str(reward)
    assert env.calls[-1] == ("stop", True)


async def test_custom_import_path_backend(loaded, tmp_path):
    (tmp_path / "mybackend.py").write_text(
        "from tests.harbor_utils import RecordingMixin\n"
        "from harbor.environments.base import BaseEnvironment\n"
        "class MyBackend(RecordingMixin, BaseEnvironment):\n"
        "    @staticmethod\n"
        "    def type():\n        return 'mine'\n"
        "    def _validate_definition(self):\n        pass\n"
    )
    spec = HarborSpec.model_validate(
        {"path": str(EXAMPLE_TASKS), "import_path": "mybackend.py:MyBackend", "environment_kwargs": {"flavour": "x"}},
        context={"base_dir": str(tmp_path)},
    )
    *_, reward, env, gate, _ = await episode(spec, task_ref(spec))
    assert loaded == []  # an import path bypasses Harbor's built-in registry
    assert type(env).__name__ == "MyBackend" and env.init_kwargs["flavour"] == "x"
    assert env.calls[-1] == ("stop", True) and reward == 1.0
    assert gate["key"] == spec.import_path
