"""HarborSpec and the Harbor kind's resolve step: loading the example suite, task selection, relative paths,
load-time field errors, and resolve-time errors that name the field or the task dir (no sandbox is started here)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from raygrpo.envs.harbor.context import SuiteContext
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.tasks import discover_task_dirs, list_harbor_tasks
from raygrpo.envs.kinds import HarborKind
from raygrpo.core.errors import ResolveError
from raygrpo.specs.harbor import HarborSpec
from raygrpo.specs.provider import ProviderSpec
from tests.harbor_utils import EXAMPLE_DIR, EXAMPLE_TASKS, TASK_TOML, example_task_names, make_task

pytestmark = pytest.mark.timeout(60)


def load(data: dict, base_dir=None) -> HarborSpec:
    return HarborSpec.model_validate(data, context={"base_dir": str(base_dir)} if base_dir else None)


def error_of(data: dict, base_dir=None) -> str:
    """The load-time (field validation) error."""
    with pytest.raises(ValidationError) as info:
        load(data, base_dir)
    return str(info.value)


def resolve_error(data: dict, base_dir=None) -> str:
    """The resolve-time error: the spec loads, what it names does not (the message starts with the field)."""
    spec = load(data, base_dir)
    with pytest.raises(ResolveError) as info:
        HarborKind().resolve(spec, "local")
    return str(info.value)


def task_dirs(spec: HarborSpec) -> list[str]:
    return [str(d) for d in discover_task_dirs(Path(spec.path))]


# ── the example suite ──────────────────────────────────────────────────────────────────────────────────────────


def test_example_suite_loads_relative_to_base_dir():
    spec = load({"kind": "harbor", "path": "tasks"}, base_dir=EXAMPLE_DIR)
    assert spec.path == str(EXAMPLE_TASKS)
    names = example_task_names()
    assert len(names) >= 8
    assert [os.path.basename(d) for d in task_dirs(spec)] == names
    # The folder above `tasks/` works too.
    assert task_dirs(load({"path": str(EXAMPLE_DIR)})) == task_dirs(spec)
    assert HarborKind().resolve(spec, "local") == list_harbor_tasks(spec, "local")


def test_list_tasks_carries_dir_instruction_and_metadata():
    spec = load({"path": "tasks"}, base_dir=EXAMPLE_DIR)
    refs = list_harbor_tasks(spec, "local")
    assert [r.index for r in refs] == list(range(len(example_task_names())))
    first = refs[0]
    assert first.env == "local" and first.split == "train"
    task_dir = EXAMPLE_TASKS / example_task_names()[0]
    assert first.metadata["task_dir"] == str(task_dir)
    assert first.metadata["instruction"] == (task_dir / "instruction.md").read_text()
    assert first.metadata["task_name"] == f"raygrpo/{task_dir.name}"
    assert first.metadata["difficulty"] == "easy" and first.metadata["category"]  # task.toml [metadata]


def test_selection(caplog):
    base = {"path": str(EXAMPLE_TASKS)}
    assert [r.index for r in list_harbor_tasks(load({**base, "num_tasks": 3}), "x")] == [0, 1, 2]
    assert [r.index for r in list_harbor_tasks(load({**base, "indices": [4, 1]}), "x")] == [4, 1]
    many = load({**base, "num_tasks": 1000})
    assert len(list_harbor_tasks(many, "x")) == len(example_task_names())
    assert "num_tasks=1000" in caplog.text
    assert resolve_error({**base, "indices": [0, 99]}).startswith("envs.local.indices: `indices`: index 99 is out of")
    assert "`indices` must be >= 0" in error_of({**base, "indices": [-1]})
    assert "must not be empty" in error_of({**base, "indices": []})


def test_example_rollout_yaml_env_entry_validates():
    import yaml

    data = yaml.safe_load((EXAMPLE_DIR / "rollout.yaml").read_text())
    (entry,) = data["envs"].values()
    spec = load(entry, base_dir=EXAMPLE_DIR)
    assert spec.kind == "harbor" and spec.backend == "local" and spec.path == str(EXAMPLE_TASKS)


def test_faults_are_validated():
    spec = load({"path": str(EXAMPLE_TASKS), "faults": {"start_latency_s": 1.0, "start_failure_rate": 0.2}})
    assert spec.faults.start_latency_s == 1.0 and spec.faults.start_failure_rate == 0.2
    assert "faults.start_failure_rate" in error_of({"path": str(EXAMPLE_TASKS), "faults": {"start_failure_rate": 2}})
    assert "faults.latency" in error_of({"path": str(EXAMPLE_TASKS), "faults": {"latency": 1}})


def test_spec_pickles_and_is_plain_data():
    spec = load({"path": "tasks", "environment_kwargs": {"a": 1}}, base_dir=EXAMPLE_DIR)
    copy = pickle.loads(pickle.dumps(spec))
    assert copy == spec
    # A provider carries only its configuration: the spec, and its provider's limits.
    provider = pickle.loads(pickle.dumps(HarborProvider(spec, name="local", limits=ProviderSpec(max_live=3))))
    assert provider.spec == spec and provider.name == "local" and provider.live_sandboxes == 0
    assert provider.limits == ProviderSpec(max_live=3)


def test_the_suites_parts_share_a_frozen_context_and_never_hold_the_provider():
    """`HarborProvider` only assembles: its starts, warm pool and episodes get the suite's `SuiteContext` (and each
    other, where they work together), never the provider."""
    spec = load({"path": str(EXAMPLE_TASKS), "warm_pool": {"size": 1}, "hedge": {"floor_s": 1.0}})
    provider = HarborProvider(spec, name="local")
    context = provider.context
    assert isinstance(context, SuiteContext) and context.spec == spec and context.label == provider.label
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.spec = spec  # type: ignore[misc]
    adapter = provider.adapter()
    for part in (provider.starts, provider.warm, adapter):
        assert part.context is context
        assert all(value is not provider for value in vars(part).values()), type(part).__name__
    assert adapter.starts is provider.starts and adapter.warm is provider.warm and provider.warm.starts is provider.starts


def test_the_local_backends_old_start_timeout_kwarg_fails_naming_init_timeout():
    """The local sandbox's own bound (its init coming up) is `init_timeout_s`; the old name fails at load, not in
    every rollout, and names the new one and the environment's `start_timeout_s`."""
    message = error_of({"path": str(EXAMPLE_TASKS), "environment_kwargs": {"start_timeout_s": 5}})
    assert "`start_timeout_s` in environment_kwargs is now `init_timeout_s`" in message
    assert load({"path": str(EXAMPLE_TASKS), "environment_kwargs": {"init_timeout_s": 5}}).start_timeout_s == 300.0
    # Another backend's kwargs are its own business.
    assert load({"path": str(EXAMPLE_TASKS), "environment_type": "e2b", "environment_kwargs": {"start_timeout_s": 5}})


# ── backend selection ─────────────────────────────────────────────────────────────────────────────────────────


def test_backend_defaults_and_image_reuse():
    local = load({"path": str(EXAMPLE_TASKS)})
    assert local.backend == "local"
    assert local.environment_import_path == "raygrpo.sandbox.local:LocalSandboxEnvironment"
    assert local.stop_delete is True and local.provider_key == "local"
    docker = load({"path": str(EXAMPLE_TASKS), "environment_type": "Docker"})
    assert docker.environment_type == "docker" and docker.environment_import_path is None
    assert docker.stop_delete is False  # keep the built image for the next rollout
    e2b = load({"path": str(EXAMPLE_TASKS), "environment_type": "e2b"})
    assert e2b.stop_delete is True and e2b.provider_key == "e2b"
    assert load({"path": str(EXAMPLE_TASKS), "environment_type": "e2b", "provider": "team"}).provider_key == "team"


def test_import_path_file_resolves_against_base_dir(tmp_path):
    (tmp_path / "backend.py").write_text(
        "from harbor.environments.docker.docker import DockerEnvironment\n"
        "class MyEnv(DockerEnvironment):\n    pass\n"
        "class NotAnEnv:\n    pass\n"
    )
    spec = load({"path": str(EXAMPLE_TASKS), "import_path": "backend.py:MyEnv"}, base_dir=tmp_path)
    assert spec.import_path == f"{tmp_path / 'backend.py'}:MyEnv"
    assert spec.backend == spec.import_path == spec.provider_key
    message = resolve_error({"path": str(EXAMPLE_TASKS), "import_path": "backend.py:NotAnEnv"}, base_dir=tmp_path)
    assert message.startswith("envs.local.import_path:") and "BaseEnvironment subclass" in message
    message = resolve_error({"path": str(EXAMPLE_TASKS), "import_path": "backend.py:Missing"}, base_dir=tmp_path)
    assert message.startswith("envs.local.import_path:") and "no attribute 'Missing'" in message
    assert "import_path" in error_of({"path": str(EXAMPLE_TASKS), "import_path": "no_colon"})


def test_harness_selectors(tmp_path):
    assert load({"path": str(EXAMPLE_TASKS)}).harness == "bash"
    (tmp_path / "my_harness.py").write_text(
        "from raygrpo.envs.harbor.harness import BashHarness\n"
        "class Shell(BashHarness):\n    pass\n"
        "class Broken:\n    pass\n"
    )
    spec = load({"path": str(EXAMPLE_TASKS), "harness": "my_harness.py:Shell"}, base_dir=tmp_path)
    assert spec.harness == f"{tmp_path / 'my_harness.py'}:Shell"
    assert HarborProvider(spec).harness_cls.__name__ == "Shell"
    assert resolve_error({"path": str(EXAMPLE_TASKS), "harness": "zsh"}).startswith("envs.local.harness: unknown")
    message = resolve_error({"path": str(EXAMPLE_TASKS), "harness": "my_harness.py:Broken"}, base_dir=tmp_path)
    assert message.startswith("envs.local.harness:") and "`tools` list" in message
    assert "no module named" in resolve_error({"path": str(EXAMPLE_TASKS), "harness": "no_such_mod:Cls"})


# ── config errors ─────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"num_tasks": 2, "indices": [0]}, "`num_tasks` and `indices` are exclusive"),
        (
            {"environment_type": "docker", "import_path": "harbor.environments.docker.docker:DockerEnvironment"},
            "`environment_type` and `import_path` are exclusive",
        ),
        ({"reward_key": "acc", "reward_reduce": "mean"}, "`reward_key` applies to reward_reduce='key' only"),
        ({"environment_type": "dockr"}, "unknown Harbor environment type 'dockr'"),
        ({"environment": "docker"}, "environment\n  Extra inputs are not permitted"),
        ({"reward_reduce": "median"}, "reward_reduce"),
        ({"exec_timeout_s": 0}, "exec_timeout_s"),
        ({"max_concurrent_starts": 0}, "max_concurrent_starts"),
        ({"provider": " "}, "`provider` names an entry of `providers:`"),
        # A provider's limits moved to the run config's `providers:` section.
        ({"create_rate_per_s": 5}, "`create_rate_per_s` moved to providers.<provider>.create_rate_per_s"),
        ({"max_live": 10}, "`max_live` moved to providers.<provider>.max_live"),
        ({"rate_limit_backoff": {"initial_s": 2}}, "`rate_limit_backoff` moved to providers.<provider>."),
        ({"rate_limit_key": "team"}, "`rate_limit_key` is now envs.<name>.provider"),
    ],
)
def test_field_errors(data, expected):
    # Field errors need no task folder: validating a spec reads nothing from disk.
    assert expected in error_of({"path": "/no/such/folder", **data})


def test_path_errors(tmp_path):
    assert resolve_error({"path": "nope"}, base_dir=tmp_path) == f"envs.local.path: {tmp_path / 'nope'} does not exist"
    (tmp_path / "file.txt").write_text("x")
    assert "is not a folder" in resolve_error({"path": "file.txt"}, base_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    assert f"no Harbor task dirs under {tmp_path / 'empty'}" in resolve_error({"path": "empty"}, base_dir=tmp_path)
    assert "path" in error_of({"path": " "})


def test_relative_path_without_base_dir_uses_cwd(monkeypatch):
    monkeypatch.chdir(EXAMPLE_DIR)
    assert load({"path": "tasks"}).path == str(EXAMPLE_TASKS)


def test_suite_forms(tmp_path):
    one = make_task(tmp_path / "single", "only")
    assert task_dirs(load({"path": str(one)})) == [str(one)]  # a task dir itself
    make_task(tmp_path / "nested" / "tasks", "b")
    make_task(tmp_path / "nested" / "tasks", "a")
    (tmp_path / "nested" / "tasks" / ".cache").mkdir()  # hidden folders are not tasks
    spec = load({"path": "nested"}, base_dir=tmp_path)
    assert [os.path.basename(d) for d in task_dirs(spec)] == ["a", "b"]


def _break(task, how: str) -> None:
    if how == "task.toml":
        (task / "task.toml").unlink()
    elif how == "instruction.md":
        (task / "instruction.md").unlink()
    elif how == "tests/test.sh":
        (task / "tests" / "test.sh").unlink()
    elif how == "environment/":
        for f in (task / "environment").iterdir():
            f.unlink()
        (task / "environment").rmdir()
    elif how == "invalid":
        (task / "task.toml").write_text("[verifier]\ntimeout_sec = 'soon'\n")
    elif how == "steps":
        (task / "task.toml").write_text('schema_version = "1.4"\n[[steps]]\nname = "one"\n')


@pytest.mark.parametrize(
    "how, expected",
    [
        ("task.toml", ": missing task.toml"),
        ("instruction.md", ": missing instruction.md"),
        ("tests/test.sh", ": missing tests/test.sh"),
        ("environment/", ": missing environment/"),
        ("invalid", "task.toml is invalid"),
        ("steps", "Step directory not found"),  # a multi-step task's step folder is missing: Harbor's own reason
    ],
)
def test_bad_task_dir_fails_naming_it(tmp_path, how, expected):
    make_task(tmp_path / "suite", "good")
    bad = make_task(tmp_path / "suite", "broken")
    _break(bad, how)
    message = resolve_error({"path": "suite"}, base_dir=tmp_path)
    assert f"task dir {bad}" in message and expected in message
    assert message.startswith("envs.local.path: ")  # the error names the `path` field


@pytest.mark.timeout(30)
def test_a_run_fails_at_load_listing_every_refused_task_at_once(tmp_path):
    """Issue 43: four refused tasks took five loads to find. One load names every one, with its own cause; a task
    with compose services is refused by the local backend by name, and runs on docker."""
    make_task(tmp_path / "suite", "good")
    _break(make_task(tmp_path / "suite", "no-tests"), "tests/test.sh")
    _break(make_task(tmp_path / "suite", "bad-toml"), "invalid")
    sidecar = make_task(tmp_path / "suite", "sidecar")
    (sidecar / "environment" / "docker-compose.yaml").write_text("services:\n  db:\n    image: debian:bookworm\n")
    message = resolve_error({"path": "suite"}, base_dir=tmp_path)
    assert message.startswith("envs.local.path: 3 task(s) of the suite cannot be run:")
    assert f"task dir {tmp_path / 'suite' / 'no-tests'}: missing tests/test.sh" in message
    assert f"task dir {tmp_path / 'suite' / 'bad-toml'}: task.toml is invalid" in message
    assert f"task dir {sidecar}: compose services are not run by the local backend" in message
    # Kept instead of raised (what `raygrpo check` does): the loadable task, and the refusals with their causes.
    refused = []
    tasks = HarborKind().resolve(load({"path": "suite"}, tmp_path), "local", refused)
    assert [Path(t.metadata["task_dir"]).name for t in tasks] == ["good"]
    assert [(r.index, Path(r.task_dir).name, r.task) for r in refused] == [
        (0, "bad-toml", "bad-toml"), (2, "no-tests", "tests/no-tests"), (3, "sidecar", "tests/sidecar")]
    # On docker the compose task loads.
    docker = HarborKind().resolve(load({"path": "suite", "environment_type": "docker"}, tmp_path), "d", [])
    assert sorted(Path(t.metadata["task_dir"]).name for t in docker) == ["good", "sidecar"]


@pytest.mark.timeout(30)
def test_tasks_sharing_a_name_are_named_by_their_folder(tmp_path):
    for folder in ("copy-a", "copy-b"):
        make_task(tmp_path / "suite", folder, toml=TASK_TOML.format(name="shared", metadata="", verifier_timeout=60,
                                                                   environment="").replace("tests/shared", "acme/same"))
    make_task(tmp_path / "suite", "unique")
    tasks = HarborKind().resolve(load({"path": "suite"}, tmp_path), "local")
    assert [t.metadata["task_name"] for t in tasks] == ["copy-a", "copy-b", "tests/unique"]
    assert [t.metadata.get("harbor_name") for t in tasks] == ["acme/same", "acme/same", None]


def test_a_separate_verifier_task_fails_at_load_on_the_local_backend_naming_the_feature_and_the_task(tmp_path):
    """A task dir as `harbor tasks init` writes it by default: a separate verifier environment, which the local backend
    refuses by name (docker runs it, and a multi-step task made by `--steps` loads: tests/test_harbor_steps.py)."""
    from harbor.cli.tasks import init

    make_task(tmp_path / "suite", "good")
    init(name="acme/odd-one", tasks_dir=tmp_path / "suite")
    message = resolve_error({"path": "suite"}, base_dir=tmp_path)
    assert message.startswith("envs.local.path: ")
    assert f"task dir {tmp_path / 'suite' / 'odd-one'}" in message and "task 'acme/odd-one'" in message
    assert 'asks for a separate verifier environment ([verifier] environment_mode = "separate"' in message
    assert "which raygrpo runs on docker only" in message


def test_a_task_dir_harbor_rejects_fails_with_harbors_reason(tmp_path):
    bad = make_task(tmp_path / "suite", "unnamed")
    toml = (bad / "task.toml").read_text()
    (bad / "task.toml").write_text(re.sub(r'(?m)^name = .*$', 'name = "no-org"', toml))
    message = resolve_error({"path": "suite"}, base_dir=tmp_path)
    assert f"task dir {bad}: task.toml is invalid: task.name:" in message and "'org/name' format" in message


def _with_toml(task: Path, extra: str) -> Path:
    (task / "task.toml").write_text((task / "task.toml").read_text() + extra)
    return task


def test_tasks_every_start_of_which_would_fail_are_refused_at_load_naming_the_field(tmp_path, monkeypatch):
    """What fails every start (or every verification) alike is a task problem, refused when the run loads, naming the
    task and the field, instead of a retried `env_error` per rollout: `[environment] gpus` on the local backend (unless
    `override_gpus: 0` clears it), a host variable that `[environment.env]`, `[verifier.env]` or a step's verifier env
    names and that is not set (a default, or a variable that is set, is fine), a Dockerfile the local backend cannot
    read."""
    monkeypatch.delenv("RAYGRPO_TEST_UNSET", raising=False)
    monkeypatch.setenv("RAYGRPO_TEST_SET", "yes")
    suite = tmp_path / "suite"
    make_task(suite, "good",
              environment='[environment.env]\nA = "${RAYGRPO_TEST_SET}"\nB = "${RAYGRPO_TEST_UNSET:-x}"\n')
    make_task(suite, "gpu", environment="gpus = 1\n")
    make_task(suite, "env-unset", environment='[environment.env]\nURL = "${RAYGRPO_TEST_UNSET}"\n')
    _with_toml(make_task(suite, "verifier-unset"), '\n[verifier.env]\nJUDGE = "${RAYGRPO_TEST_UNSET}"\n')
    make_task(suite, "bad-dockerfile", dockerfile="FROM x\nCOPY missing.txt /app/\n")
    refused: list = []
    tasks = HarborKind().resolve(load({"path": "suite"}, tmp_path), "local", refused)
    assert [Path(t.metadata["task_dir"]).name for t in tasks] == ["good"]
    causes = {Path(r.task_dir).name: r.cause for r in refused}
    assert causes["gpu"].startswith("task 'tests/gpu': [environment] gpus = 1: the local backend allocates no GPU")
    assert causes["env-unset"].startswith("task 'tests/env-unset': [environment.env] URL = '${RAYGRPO_TEST_UNSET}': "
                                          "Environment variable 'RAYGRPO_TEST_UNSET' not found")
    assert causes["verifier-unset"].startswith("task 'tests/verifier-unset': [verifier.env] JUDGE = ")
    assert causes["bad-dockerfile"].startswith("environment/Dockerfile cannot be read by the local backend: ")
    assert "Dockerfile:2: COPY source 'missing.txt' not found" in causes["bad-dockerfile"]
    assert len(refused) == 4
    # Harbor's override clears the GPU request; docker may have GPUs (its own check decides when it starts).
    overridden = load({"path": "suite", "indices": [3], "environment_kwargs": {"override_gpus": 0}}, tmp_path)
    refused = []
    cleared = HarborKind().resolve(overridden, "local", refused)
    assert [Path(t.metadata["task_dir"]).name for t in cleared] == ["gpu"]
    assert "gpu" not in {Path(r.task_dir).name for r in refused}
    # Joining a cluster, the actors' nodes may hold what the driver lacks (a Secret on worker pods): only warned
    # about at load, and checked in the actor (a task_error before the episode: test_harbor_adapter).
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    refused = []
    joined = HarborKind().resolve(load({"path": "suite", "indices": [1, 4]}, tmp_path), "local", refused)
    assert sorted(Path(t.metadata["task_dir"]).name for t in joined) == ["env-unset", "verifier-unset"]
    assert sorted(Path(r.task_dir).name for r in refused) == ["bad-dockerfile", "gpu"]


def test_a_steps_verifier_env_naming_an_unset_variable_is_refused_at_load(tmp_path, monkeypatch):
    from tests.harbor_steps_utils import make_counter_task

    monkeypatch.delenv("RAYGRPO_TEST_UNSET", raising=False)
    task = make_counter_task(tmp_path / "suite", "steps", steps=2)
    toml = (task / "task.toml").read_text()
    step = 'name = "step-2"\nartifacts = []\n'
    assert step in toml
    unset = '[steps.verifier.env]\nTOKEN = "${RAYGRPO_TEST_UNSET}"\n'
    (task / "task.toml").write_text(toml.replace(step, step + unset))
    message = resolve_error({"path": "suite"}, base_dir=tmp_path)
    assert "[steps.verifier.env] of step 'step-2' TOKEN = '${RAYGRPO_TEST_UNSET}'" in message


def test_a_suite_verifier_timeout_replacing_a_tasks_own_is_warned_about_once_per_task(tmp_path, caplog):
    """`verifier_timeout_s` wins over a task's `[verifier] timeout_sec` both ways (documented); the run says so, once
    per task, with both values; a task whose own value it matches is not mentioned."""
    make_task(tmp_path / "suite", "short", verifier_timeout=6.0)
    make_task(tmp_path / "suite", "long", verifier_timeout=900.0)
    make_task(tmp_path / "suite", "same", verifier_timeout=60.0)
    spec = load({"path": "suite", "verifier_timeout_s": 60}, tmp_path)
    with caplog.at_level("WARNING", logger="raygrpo.envs.harbor.tasks"):
        HarborKind().resolve(spec, "override")
        HarborKind().resolve(spec, "override")  # the driver lists a suite's tasks more than once
    told = [r.getMessage() for r in caplog.records if "verifier_timeout_s" in r.getMessage()]
    assert sorted(told) == [
        "envs.override.verifier_timeout_s=60 replaces task tests/long's [verifier] timeout_sec=900 (the suite's "
        "value wins, shorter or longer)",
        "envs.override.verifier_timeout_s=60 replaces task tests/short's [verifier] timeout_sec=6 (the suite's "
        "value wins, shorter or longer)"]


def test_task_toml_fields_the_backend_does_not_apply_are_warned_about_once_per_suite_per_field(tmp_path, caplog):
    """A task.toml field raygrpo does not apply on the suite's backend is named once per suite per field at load,
    with how many tasks set it, a few of them and what happens instead; fields left at Harbor's default are not."""
    suite = tmp_path / "suite"
    for name in ("a", "b", "c", "d"):
        make_task(suite, name, environment="memory_mb = 2048\ncpus = 2" if name != "d" else 'memory = "1G"')
    make_task(suite, "extras", environment='storage_mb = 4096\nskills_dir = "/skills"\nmcp_servers = [{name = "fs", '
              'transport = "stdio", command = "mcp-fs"}]\n\n[[verifier.collect]]\ncommand = "true"')
    make_task(suite, "built", toml='artifacts = ["/app/out.txt"]\n\n[task]\nname = "tests/built"\n\n'
              '[environment]\nbuild_timeout_sec = 1200.0\n')
    make_task(suite, "plain")  # build_timeout_sec = 600.0: Harbor's default, set or not
    spec = load({"path": "suite"}, tmp_path)
    with caplog.at_level("WARNING", logger="raygrpo.envs.harbor.tasks"):
        HarborKind().resolve(spec, "s")
        HarborKind().resolve(spec, "s")  # the driver lists a suite's tasks more than once
    told = sorted(r.getMessage() for r in caplog.records if r.getMessage().startswith("envs.s: "))
    assert told == sorted([
        "envs.s: 1 task set [[verifier.collect]], which raygrpo does not run: no hook runs before the verifier "
        "(e.g. task 'tests/extras')",
        "envs.s: 1 task set artifacts, which raygrpo collects only for a separate verifier: a task verified in its "
        "own sandbox has them neither collected nor kept (e.g. task 'tests/built')",
        "envs.s: 1 task set [environment] build_timeout_sec, which raygrpo does not apply: the suite's "
        "start_timeout_s=300 bounds each start, image build included (e.g. task 'tests/built')",
        "envs.s: 1 task set [environment] mcp_servers, which raygrpo's agent is not given: its tools are the "
        "harness's (e.g. task 'tests/extras')",
        "envs.s: 1 task set [environment] skills_dir, which raygrpo's agent is not given (e.g. task 'tests/extras')",
        "envs.s: 1 task set [environment] storage_mb (or storage), which the local backend does not enforce: the "
        "sandbox has no disk limit (e.g. task 'tests/extras')",
        "envs.s: 3 tasks set [environment] cpus, which the local backend does not enforce: the sandbox shares the "
        "host's CPUs (e.g. task 'tests/a', 'tests/b', 'tests/c')",
        "envs.s: 4 tasks set [environment] memory_mb (or memory), which the local backend does not enforce: the "
        "sandbox has no memory limit (e.g. task 'tests/a', 'tests/b', 'tests/c', ...)"])
    # Harbor's docker backend enforces cpus and memory_mb (compose limits), not storage_mb.
    caplog.clear()
    docker = load({"path": "suite", "environment_type": "docker"}, tmp_path)
    with caplog.at_level("WARNING", logger="raygrpo.envs.harbor.tasks"):
        list_harbor_tasks(docker, "d")
    told = [r.getMessage() for r in caplog.records if r.getMessage().startswith("envs.d: ")]
    assert not [m for m in told if "cpus" in m or "memory_mb" in m]
    assert any("storage_mb (or storage), which the docker backend does not enforce" in m for m in told)
