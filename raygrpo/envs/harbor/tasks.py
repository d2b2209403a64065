"""Harbor task folders on disk: finding the task dirs of a suite, checking each with Harbor's own loader, listing
the tasks a `HarborSpec` selects, and loading the backend class an `import_path` names.

Runs on the driver when a run resolves (before Ray starts), so a broken task dir fails naming its path; env pool
actors use `load_task` to parse the tasks they run.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raygrpo.core.errors import first_line
from raygrpo.core.imports import ImportSpecError, load_object
from raygrpo.specs.harbor import HarborSpec
from raygrpo.core.types import TaskRef

if TYPE_CHECKING:
    from harbor.models.task.task import Task

logger = logging.getLogger(__name__)

#: TaskRef.metadata keys raygrpo sets itself; task.toml `[metadata]` keys with these names are left out.
RESERVED_METADATA = ("task_dir", "task_name", "instruction")


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


def check_task_dir(task_dir: Path) -> None:
    """Validate one task dir with Harbor's own loader, plus what raygrpo needs on top.

    Raises:
        ValueError: The message names the task dir and what is wrong (a missing `task.toml`, `instruction.md`,
            `tests/test.sh` or `environment/`, an invalid `task.toml`, or a feature raygrpo does not run: multi-step
            tasks and separate verifier environments).
    """
    from harbor.models.task.config import TaskConfig
    from harbor.utils.scripts import discover_script

    if not (task_dir / "task.toml").is_file():
        raise ValueError(f"task dir {task_dir} is missing task.toml")
    try:
        config = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    except Exception as exc:  # noqa: BLE001 - TOML syntax and pydantic errors alike
        raise ValueError(f"task dir {task_dir}: task.toml is invalid: {_toml_error(exc)}") from None
    # Shapes raygrpo does not run yet are named before the files they lay out differently are looked for (a
    # multi-step task has no top-level instruction.md).
    unsupported = unsupported_shape(config)
    if unsupported is not None:
        raise ValueError(f"task dir {task_dir}: {unsupported}")
    if not (task_dir / "instruction.md").is_file():
        raise ValueError(f"task dir {task_dir} is missing instruction.md")
    if discover_script(task_dir / "tests", "test") is None:
        raise ValueError(f"task dir {task_dir} is missing tests/test.sh")
    try:
        task = load_task(str(task_dir))
    except Exception as exc:  # noqa: BLE001 - Harbor's own checks (missing files, unsafe paths)
        raise ValueError(f"task dir {task_dir}: {first_line(exc) or type(exc).__name__}") from None
    if task.paths.discovered_test_path_for(task.config.environment.os) is None:
        raise ValueError(f"task dir {task_dir} is missing tests/test.sh")
    if not task.paths.environment_dir.is_dir() and not task.config.environment.docker_image:
        raise ValueError(f"task dir {task_dir} is missing environment/ (or [environment].docker_image in task.toml)")


def unsupported_shape(config: Any) -> str | None:
    """What raygrpo cannot run yet in a parsed task.toml (Harbor's `TaskConfig`), as a message naming the task and
    the feature; None when the task's shape is supported.

    Two shapes that Harbor runs are not run here yet: multi-step tasks (`[[steps]]`, each step with its own
    instruction, tests and solution) and a separate verifier environment (`[verifier] environment_mode =
    "separate"`, or a `[verifier.environment]` table: the default of `harbor tasks init`), where the verifier runs
    in its own container instead of the task's sandbox.
    """
    from harbor.models.task.verifier_mode import resolve_task_verifier_mode

    name = f"task {config.task.name!r}" if config.task is not None else "this task"
    if config.steps:
        return (f"{name} is a multi-step task ({len(config.steps)} [[steps]] in task.toml), which raygrpo does not run "
                "yet: give single-step tasks (instruction.md and tests/ at the top of the task dir)")
    if resolve_task_verifier_mode(config).value != "shared":
        return (f"{name} asks for a separate verifier environment ([verifier] environment_mode = \"separate\", the "
                "default of `harbor tasks init`), which raygrpo does not run yet: set environment_mode = \"shared\" "
                "so that tests/test.sh runs in the task's own sandbox")
    return None


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
    """Check every task dir of the suite and return the selected tasks as `TaskRef`s.

    `TaskRef.index` is the task's position in the sorted suite (what `indices` selects); `metadata` holds `task_dir`,
    `task_name`, `instruction` and the task.toml `[metadata]` table (keys clashing with those three are left out).

    Raises:
        ValueError: The folder or a task dir is broken, or an index is out of range.
    """
    dirs = discover_task_dirs(Path(spec.path))
    for task_dir in dirs:
        check_task_dir(task_dir)
    refs = []
    for index, task_dir in selected_dirs(spec, [str(d) for d in dirs]):
        task = load_task(task_dir)
        meta: dict[str, Any] = {"task_dir": task_dir, "task_name": task.name, "instruction": task.instruction}
        for key, value in (task.config.metadata or {}).items():
            if key not in RESERVED_METADATA:
                meta[key] = value
        refs.append(TaskRef(env=name, index=index, split="train", metadata=meta))
    return refs


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
