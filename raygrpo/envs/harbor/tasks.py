"""Harbor task folders on disk: finding the task dirs of a suite, checking each with Harbor's own loader, listing
the tasks a `HarborSpec` selects, and loading the backend class an `import_path` names.

Runs on the driver when a run resolves (before Ray starts), so a broken task dir fails naming its path; env pool
actors use `load_task` to parse the tasks they run.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raygrpo.core.errors import first_line
from raygrpo.core.imports import ImportSpecError, load_object
from raygrpo.envs.harbor.refusals import Refusal, TaskDirError, TaskRefusals
from raygrpo.envs.harbor.unapplied import ignored_fields, warn_ignored_fields, warn_verifier_timeout_override
from raygrpo.specs.harbor import HarborSpec
from raygrpo.core.types import TaskRef

if TYPE_CHECKING:
    from harbor.models.task.task import Task

logger = logging.getLogger(__name__)

#: TaskRef.metadata keys raygrpo sets itself; task.toml `[metadata]` keys with these names are left out.
RESERVED_METADATA = ("task_dir", "task_name", "instruction", "harbor_name")


def discover_task_dirs(folder: Path) -> list[Path]:
    """The task dirs of a suite folder, sorted by name.

    `folder` is one task dir (it has `task.toml`), a folder with a `tasks/` subfolder, or a folder of task dirs. In
    the last two, every sub-folder not starting with `.` or `_` counts as a task dir (a broken one must fail loudly,
    not vanish from the suite).

    Raises:
        ValueError: The folder does not exist, or holds no task dir (the message names the folder).
    """
    if not folder.exists():
        raise ValueError(f"{folder} does not exist")
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder (give a folder of Harbor task dirs)")
    if (folder / "task.toml").is_file():
        return [folder.resolve()]
    root = folder / "tasks" if (folder / "tasks").is_dir() else folder
    dirs = sorted(p.resolve() for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not dirs:
        raise ValueError(f"no Harbor task dirs under {root} (a task dir holds instruction.md, task.toml, "
                         "environment/ and tests/test.sh)")
    return dirs


#: What the local backend answers for a task whose environment brings compose services (sidecars).
LOCAL_COMPOSE_REFUSAL = ("compose services are not run by the local backend: environment/docker-compose.yaml "
                         "starts containers beside the sandbox; run the task with environment_type: docker")
#: The task-dir file that declares compose services (Harbor's docker backend merges it into its own).
COMPOSE_FILE = "docker-compose.yaml"


def check_task_dir(task_dir: Path, backend: str | None = None, overrides: Mapping[str, Any] | None = None) -> None:
    """Validate one task dir with Harbor's own loader, plus what raygrpo needs on top.

    Args:
        task_dir: The task folder.
        backend: The suite's backend (`HarborSpec.backend`); `"local"` refuses tasks with compose services.
        overrides: The suite's `environment_kwargs`, whose Harbor overrides (`override_gpus`, `override_tpu`) replace
            the task's own requests.

    Raises:
        TaskDirError: The message names the task dir and what is wrong (a missing `task.toml`, `instruction.md`,
            `tests/test.sh` or `environment/` (for a multi-step task: a step's folder, `instruction.md` or test
            script, as Harbor's loader checks them), an invalid `task.toml`, a host variable its environment tables
            name that is not set (`unset_variables`), a feature the suite's backend does not run: separate verifier
            environments off docker; compose services, GPUs, TPUs or a Dockerfile it cannot read on the local
            backend).
    """
    from harbor.models.task.config import TaskConfig
    from harbor.utils.scripts import discover_script

    if not (task_dir / "task.toml").is_file():
        raise TaskDirError(task_dir, "missing task.toml")
    try:
        config = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    except Exception as exc:  # noqa: BLE001 - TOML syntax and pydantic errors alike
        raise TaskDirError(task_dir, f"task.toml is invalid: {_toml_error(exc)}") from None
    name = config.task.name if config.task is not None else None
    # Shapes the backend does not run are named before the files they lay out differently are looked for.
    unsupported = unsupported_shape(config, backend, overrides) or _unset_here(config)
    if unsupported is not None:
        raise TaskDirError(task_dir, unsupported, name)
    # A multi-step task has no top-level instruction.md, and may keep its tests per step: Harbor's loader checks
    # every step's folder, instruction and test script.
    if not config.steps:
        if not (task_dir / "instruction.md").is_file():
            raise TaskDirError(task_dir, "missing instruction.md", name)
        if discover_script(task_dir / "tests", "test") is None:
            raise TaskDirError(task_dir, "missing tests/test.sh", name)
    try:
        task = load_task(str(task_dir))
    except Exception as exc:  # noqa: BLE001 - Harbor's own checks (missing files, unsafe paths)
        raise TaskDirError(task_dir, first_line(exc) or type(exc).__name__, name) from None
    if not config.steps and task.paths.discovered_test_path_for(task.config.environment.os) is None:
        raise TaskDirError(task_dir, "missing tests/test.sh", name)
    if not task.paths.environment_dir.is_dir() and not task.config.environment.docker_image:
        raise TaskDirError(task_dir, "missing environment/ (or [environment].docker_image in task.toml)", name)
    if backend == "local":
        if (task.paths.environment_dir / COMPOSE_FILE).is_file():
            raise TaskDirError(task_dir, LOCAL_COMPOSE_REFUSAL, name)
        _check_local_dockerfile(task_dir, task, name)


def _check_local_dockerfile(task_dir: Path, task: Task, name: str | None) -> None:
    """The local backend reads the task's Dockerfile itself (`raygrpo.sandbox.dockerfile`): one it cannot read fails
    every start alike, so it is refused here, naming the file and the line.

    Raises:
        TaskDirError: The Dockerfile does not parse, or copies from outside its build context.
    """
    from raygrpo.sandbox.dockerfile import DockerfileError, load_plan

    try:
        load_plan(task.paths.environment_dir)
    except DockerfileError as exc:
        raise TaskDirError(task_dir, f"environment/Dockerfile cannot be read by the local backend: {exc}",
                           name) from None


def unsupported_shape(config: Any, backend: str | None = None,
                      overrides: Mapping[str, Any] | None = None) -> str | None:
    """What raygrpo cannot run in a parsed task.toml (Harbor's `TaskConfig`) on the suite's `backend`, as a message
    naming the task and the feature; None when the task's shape is supported.

    Multi-step tasks (`[[steps]]`) run everywhere (`raygrpo.envs.harbor.steps`). A separate verifier environment
    (`[verifier] environment_mode = "separate"`, or a `[verifier.environment]` table: the default of `harbor tasks
    init`; for a multi-step task, on any step, as Harbor resolves each step's mode) runs on docker only
    (`raygrpo.envs.harbor.separate`). The local backend allocates no GPU or TPU: a task that asks for one (and
    whose request `overrides`, the suite's `environment_kwargs`, do not clear with `override_gpus: 0`) is refused, as
    Harbor's own check would refuse every start of it.
    """
    from raygrpo.envs.harbor.separate import SEPARATE_BACKENDS, SEPARATE_REFUSAL, uses_separate_verifier

    name = f"task {config.task.name!r}" if config.task is not None else "this task"
    if uses_separate_verifier(config) and backend not in SEPARATE_BACKENDS:
        return f"{name} " + SEPARATE_REFUSAL.format(backend=backend or "local")
    if (backend or "local") == "local":
        overrides = overrides or {}
        environment = config.environment
        gpus = overrides.get("override_gpus")
        gpus = environment.gpus if gpus is None else gpus
        if gpus:
            return (f"{name}: [environment] gpus = {gpus}: the local backend allocates no GPU; run it on a backend "
                    "that does (docker with the NVIDIA runtime, modal, ...)")
        if (overrides.get("override_tpu") or environment.tpu) is not None:
            return f"{name}: [environment] tpu: the local backend allocates no TPU; run it on a backend that does"
    return None


def unset_variables(config: Any) -> str | None:
    """What of a parsed task.toml's environment tables names a host variable that is not set here, as a message
    naming the task, the table and the key; None when every one resolves.

    The tables are those Harbor resolves with `harbor.utils.env.resolve_env_vars` when it starts the sandbox
    (`[environment.env]`) and when it verifies (`[verifier.env]`, each step's `[steps.verifier.env]`): a `${VAR}`
    without a default that is not set fails there, the same way every time. Run at load (the driver's environment)
    and again when an episode starts (the env pool actor's, which is what Harbor reads), so that a task that cannot
    be verified fails before its episode runs, not after. `[solution] env` is the oracle's alone and is checked when
    it runs (`raygrpo.envs.harbor.solution`).
    """
    from harbor.utils.env import resolve_env_vars

    name = f"task {config.task.name!r}" if config.task is not None else "this task"
    tables = [("[environment.env]", config.environment.env), ("[verifier.env]", config.verifier.env)]
    tables += [(f"[steps.verifier.env] of step {step.name!r}", step.verifier.env) for step in config.steps or []]
    for table, values in tables:
        for key, value in (values or {}).items():
            try:
                resolve_env_vars({key: value})
            except ValueError as exc:
                return (f"{name}: {table} {key} = {value!r}: {first_line(exc)} (set it in the environment raygrpo "
                        "and its env pool actors run in, or give it a default: ${VAR:-default})")
    return None


def _unset_here(config: Any) -> str | None:
    """`unset_variables` as the driver sees them. Joining a cluster (`RAY_ADDRESS`, as in a `ray job submit` job) the
    env pool actors' nodes may hold a variable the driver's does not (a Secret on the worker pods): there it is only
    warned about here, and the actor's own check makes such a task a `task_error` before its episode."""
    unset = unset_variables(config)
    if unset is not None and os.environ.get("RAY_ADDRESS"):
        logger.warning("%s; joining the cluster at %s, the env pool actors' nodes may set it: checked there",
                       unset, os.environ["RAY_ADDRESS"])
        return None
    return unset


def _toml_error(exc: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3])
    return first_line(exc) or type(exc).__name__


def load_task(task_dir: str) -> Task:
    """Harbor's `Task` for a task dir (parses task.toml, reads the instruction, checks the tests exist), with its
    file filter's answers kept for the run (`run_file_filter`)."""
    from harbor.models.task.task import Task

    task = Task(task_dir=Path(task_dir))
    task.file_filter = run_file_filter(task.file_filter)
    return task


def run_file_filter(original: Any) -> Any:
    """`original` (a task's `TaskFileFilter`) with its answers kept: which paths `.harborignore` excludes, and the
    selection of each input tree (`tests/`, `solution/`) once validated.

    Harbor's verifier selects and validates the task's test files again on every verification (pattern matching
    over every path, a few ms per rollout); a task dir is read once per run here, as its `task.toml` and
    instruction already are, so a task edited while a run goes on is seen by the next run.
    """
    return _run_file_filter_class()(original.task_dir)


@functools.cache
def _run_file_filter_class() -> type:
    from harbor.models.task.file_filter import TaskFileFilter

    class RunFileFilter(TaskFileFilter):
        def __init__(self, task_dir: Path) -> None:
            super().__init__(task_dir)
            self.is_excluded = functools.cache(super().is_excluded)  # type: ignore[method-assign]
            self.select = functools.cache(super().select)  # type: ignore[method-assign]

    return RunFileFilter


def selected_dirs(spec: HarborSpec, dirs: list[str]) -> list[tuple[int, str]]:
    """The tasks `spec` selects from the suite's sorted task dirs, as `(index, task dir)` pairs in schedule order.

    Raises:
        ValueError: An index is out of range (the message names `indices` and the suite's size).
    """
    if spec.indices is not None:
        bad = [i for i in spec.indices if i >= len(dirs)]
        if bad:
            raise ValueError(f"`indices`: index {bad[0]} is out of range: {spec.path} has {len(dirs)} tasks "
                             f"(0..{len(dirs) - 1})")
        return [(i, dirs[i]) for i in spec.indices]
    if spec.num_tasks is not None:
        if spec.num_tasks > len(dirs):
            logger.warning("%s: num_tasks=%d but the suite has only %d tasks; using all of them",
                           spec.path, spec.num_tasks, len(dirs))
        return list(enumerate(dirs))[: spec.num_tasks]
    return list(enumerate(dirs))


def list_harbor_tasks(spec: HarborSpec, name: str) -> list[TaskRef]:
    """Check every task dir of the suite and return the selected tasks as `TaskRef`s (see `scan_harbor_tasks`).

    Raises:
        TaskRefusals: Task dirs of the suite cannot be loaded or run (every one is listed).
        ValueError: The folder is broken, or an index is out of range.
    """
    refs, refused = scan_harbor_tasks(spec, name)
    if refused:
        raise TaskRefusals(refused)
    return refs


def scan_harbor_tasks(spec: HarborSpec, name: str) -> tuple[list[TaskRef], list[Refusal]]:
    """Check every task dir of the suite: the selected tasks that load as `TaskRef`s, and every task dir of the
    suite that cannot be loaded or run on the suite's backend (selected or not: a broken task dir never vanishes
    from a suite) as a `Refusal`.

    `TaskRef.index` is the task's position in the sorted suite (what `indices` selects); `metadata` holds `task_dir`,
    `task_name`, `instruction` and the task.toml `[metadata]` table (keys clashing with those three are left out).
    `task_name` is Harbor's name of the task, or the folder's name when another task of the suite has the same
    `[task] name` (summaries and verdicts must tell them apart). The task.toml fields the selected tasks set and
    raygrpo does not apply on the suite's backend are warned about once per field (`raygrpo.envs.harbor.unapplied`).

    Raises:
        ValueError: The folder holds no task dir, or an index is out of range.
    """
    dirs = discover_task_dirs(Path(spec.path))
    refused: dict[str, Refusal] = {}
    for index, task_dir in enumerate(dirs):
        try:
            check_task_dir(task_dir, spec.backend, spec.environment_kwargs)
        except TaskDirError as exc:
            refused[str(task_dir)] = Refusal(index=index, task_dir=str(task_dir), task=exc.task or task_dir.name,
                                             cause=exc.cause)
    refs = []
    ignored: dict[str, list[str]] = {}
    for index, task_dir in selected_dirs(spec, [str(d) for d in dirs]):
        if task_dir in refused:
            continue
        task = load_task(task_dir)
        warn_verifier_timeout_override(spec, name, task)
        for field in ignored_fields(task.config, spec):
            ignored.setdefault(field, []).append(task.name)
        # A multi-step task opens with its first step's instruction.
        instruction = task.step_instruction(task.config.steps[0].name) if task.has_steps else task.instruction
        meta: dict[str, Any] = {"task_dir": task_dir, "task_name": task.name, "instruction": instruction}
        for key, value in (task.config.metadata or {}).items():
            if key not in RESERVED_METADATA:
                meta[key] = value
        refs.append(TaskRef(env=name, index=index, split="train", metadata=meta))
    _name_collisions_by_folder(refs, name)
    warn_ignored_fields(spec, name, ignored)
    return refs, list(refused.values())


def _name_collisions_by_folder(refs: list[TaskRef], env: str) -> None:
    """Tasks sharing a `[task] name` are named by their folder instead (in place), with a warning."""
    counts = Counter(ref.metadata["task_name"] for ref in refs)
    shared = sorted(n for n, c in counts.items() if c > 1)
    if not shared:
        return
    for ref in refs:
        if ref.metadata["task_name"] in shared:
            ref.metadata["harbor_name"] = ref.metadata["task_name"]
            ref.metadata["task_name"] = Path(ref.metadata["task_dir"]).name
    logger.warning("envs.%s: tasks share a [task] name (%s); they are named by their folder", env, ", ".join(shared))


def load_environment_class(spec: str) -> type:
    """The `BaseEnvironment` subclass an import path or file path names.

    Raises:
        ValueError: It does not load or is not a `BaseEnvironment` subclass (the message names the spec).
    """
    from harbor.environments.base import BaseEnvironment

    try:
        cls = load_object(spec)
    except ImportSpecError as exc:
        raise ValueError(str(exc)) from None
    if not (isinstance(cls, type) and issubclass(cls, BaseEnvironment)):
        raise ValueError(f"{spec!r} must name a harbor.environments.base.BaseEnvironment subclass, got {cls!r}")
    return cls
