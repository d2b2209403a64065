"""The Harbor environment source: a local folder of Harbor task dirs, run in sandboxes of any Harbor backend.

A `HarborSpec` is user config (pydantic, validated when the run config loads: every task dir is checked with
Harbor's own task loader, so a broken one fails naming its path). It lists its tasks on the driver (`list_tasks`,
`dataset`) and builds the per-actor `HarborProvider` that starts sandboxes. The spec is what travels to actors: it
holds only strings and numbers (absolute paths once validated), never a sandbox, a loop or a secret value.

Relative paths (`path`, a file-path `harness` or `import_path`) resolve against the folder given as `base_dir` in the
pydantic validation context (`HarborSpec.model_validate(data, context={"base_dir": folder})`; the run config passes
the config file's folder), else against the working directory. After validation they are absolute.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from raygrpo.envs.harness import load_harness, resolve_harness_spec
from raygrpo.imports import ImportSpecError, is_file_spec, load_object, resolve_file, split_spec
from raygrpo.sandbox.faults import FaultConfig
from raygrpo.specs.selection import check_indices
from raygrpo.types import TaskRef

if TYPE_CHECKING:
    import datasets
    from harbor.models.task.task import Task

    from raygrpo.envs.harbor import HarborProvider

logger = logging.getLogger(__name__)

#: The backend used when neither `environment_type` nor `import_path` is set: raygrpo's bwrap sandbox.
LOCAL_BACKEND = "raygrpo.sandbox.local:LocalSandboxEnvironment"
#: Backends whose `stop(delete=True)` removes the built image (`docker compose down --rmi local`): raygrpo stops
#: them with `delete=False`, which still removes containers, networks and the sandbox, but keeps the image for the
#: next rollout of the task. Every other backend gets `delete=True` (for cloud sandboxes such as Daytona,
#: `delete=False` keeps the sandbox itself alive and billing).
IMAGE_REUSE_BACKENDS = frozenset({"docker", "podman"})
#: Backends whose remote image builds have been seen to drop the files a Dockerfile `COPY`s from the build context
#: (TRL's HarborEnv re-uploads them for e2b): raygrpo uploads those files again after such a sandbox starts.
REUPLOAD_BACKENDS = frozenset({"e2b"})
#: TaskRef.metadata keys raygrpo sets itself; task.toml `[metadata]` keys with these names are left out.
RESERVED_METADATA = ("task_dir", "task_name", "instruction")


class HarborSpec(BaseModel):
    """A local Harbor task suite as a source of tasks for raygrpo.

    Each task is a Harbor task dir (`instruction.md`, `task.toml`, `environment/`, `tests/test.sh`, optionally
    `solution/`). Task selection mirrors TRL's `HarborSpec`: every task dir (sorted by name), the first `num_tasks`,
    or explicit `indices` into the sorted list. The sandbox backend is any Harbor `BaseEnvironment`: a built-in
    `environment_type` (docker, e2b, daytona, modal, ...), a custom class by `import_path`, or by default raygrpo's
    local bubblewrap sandbox (`raygrpo.sandbox.local:LocalSandboxEnvironment`, for development and CI; no security
    boundary).

    Args:
        kind (`Literal["harbor"]`, *optional*, defaults to `"harbor"`):
            Discriminator of environment specs.
        path (`str`):
            A folder of task dirs, a folder with a `tasks/` subfolder of task dirs, or one task dir. Relative paths
            resolve against the config file's folder. Every sub-folder (except hidden ones and `_`-prefixed ones)
            must be a valid task dir.
        num_tasks (`int`, *optional*):
            Use only the first `num_tasks` tasks (>= 1). Exclusive with `indices`.
        indices (`list[int]`, *optional*):
            Use exactly these positions in the sorted task list. Exclusive with `num_tasks`.
        harness (`str`, *optional*, defaults to `"bash"`):
            The tool surface: a built-in name (`"bash"`), an import path `"pkg.module:Class"` or a file path
            `"path/to/file.py:Class"` (relative to the config file) of a harness class (see
            `raygrpo.envs.harness.BaseHarness`).
        environment_type (`str`, *optional*):
            A Harbor `EnvironmentType`: `"docker"`, `"e2b"`, `"daytona"`, `"modal"`, ... The backend's extra must be
            installed where the env pool actors run (`pip install 'harbor[e2b]'`) and its credentials set there
            (e.g. `E2B_API_KEY`). Exclusive with `import_path`.
        import_path (`str`, *optional*):
            A custom Harbor `BaseEnvironment` subclass, `"pkg.module:Class"` or `"path/to/file.py:Class"`. Exclusive
            with `environment_type`. Neither set: the local sandbox backend.
        environment_kwargs (`dict`, *optional*, defaults to `{}`):
            Extra keyword arguments of the backend's constructor (Harbor's `--ek`), e.g. `{"keep_containers": true}`
            for docker or `{"sandbox_timeout_secs": 3600}` for e2b; also Harbor's trial-level overrides such as
            `override_cpus`. Do not put secrets here: backends read their credentials from environment variables.
        start_timeout_s (`float`, *optional*, defaults to `300.0`):
            Deadline for creating and starting the sandbox plus the task's healthcheck (waiting for a provisioning
            slot does not count). A start that misses it is an infrastructure failure (retried). The run's
            `rollout.start_timeout_s` also applies, and counts the wait for a slot.
        exec_timeout_s (`float`, *optional*, defaults to `30.0`):
            Deadline of one tool command in the sandbox; past it the command is stopped and the model is told. Keep
            it under the run's `rollout.tool_timeout_s`.
        verifier_timeout_s (`float`, *optional*):
            Deadline of the task's verifier (`tests/test.sh`); None uses the task's `[verifier] timeout_sec`
            (Harbor's default 600). A verifier that misses it leaves the rollout unscored with status `timeout`
            (not retried). The run's `rollout.score_timeout_s` also applies.
        stop_timeout_s (`float`, *optional*, defaults to `60.0`):
            Deadline for stopping a sandbox; past it raygrpo gives up waiting and logs it (the sandbox registry's
            reaper gets what is left).
        reupload_copied_files (`bool`, *optional*):
            After the sandbox starts (before the healthcheck), upload the files `environment/Dockerfile` `COPY`s from
            the build context to their destinations again, as TRL does for e2b, whose remote builds have dropped
            them. None: on for e2b, off elsewhere (docker and the local backend apply `COPY` themselves).
        max_output_chars (`int`, *optional*, defaults to `8000`):
            Tool outputs longer than this are cut (head and tail kept). The run's `rollout.max_tool_output_chars`
            cuts again.
        reward_key (`str`, *optional*):
            The entry of `reward.json` to use (with `reward_reduce="key"`). None: `"reward"`, or the only entry.
        reward_reduce (`Literal["key", "mean", "sum", "min", "max"]`, *optional*, defaults to `"key"`):
            How a `reward.json` with several named rewards becomes one number: one entry (`"key"`, see
            `reward_key`), or the mean, sum, min or max of all entries. A `reward.txt` holds one number.
        faults (`FaultConfig`, *optional*):
            Fault and latency injection around the backend (start latency, start failures, exec hangs, sandbox
            death), for benchmarks and reliability tests.
        max_concurrent_starts (`int`, *optional*):
            Most sandbox starts in flight at once per env pool actor. None: no per-actor limit.
        create_rate_per_s (`float`, *optional*):
            Cluster-wide limit of sandbox creates per second, shared by every env pool actor on every node (e.g. 5
            for e2b Pro). None: no rate limit.
        rate_limit_key (`str`, *optional*):
            Name of the shared create-rate limit. None: the backend name (`"e2b"`, `"docker"`, `"local"` or the
            import path), so every suite on the same backend shares one limit.
        weight (`float`, *optional*, defaults to `1.0`):
            Relative sampling weight when several environments are mixed (> 0).
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    kind: Literal["harbor"] = "harbor"
    path: str
    num_tasks: int | None = Field(default=None, ge=1)
    indices: list[int] | None = None
    harness: str = "bash"
    environment_type: str | None = None
    import_path: str | None = None
    environment_kwargs: dict[str, Any] = Field(default_factory=dict)
    start_timeout_s: float = Field(default=300.0, gt=0)
    exec_timeout_s: float = Field(default=30.0, gt=0)
    verifier_timeout_s: float | None = Field(default=None, gt=0)
    stop_timeout_s: float = Field(default=60.0, gt=0)
    reupload_copied_files: bool | None = None
    max_output_chars: int = Field(default=8000, ge=64)
    reward_key: str | None = None
    reward_reduce: Literal["key", "mean", "sum", "min", "max"] = "key"
    faults: FaultConfig | None = None
    max_concurrent_starts: int | None = Field(default=None, ge=1)
    create_rate_per_s: float | None = Field(default=None, gt=0)
    rate_limit_key: str | None = None
    weight: float = Field(default=1.0, gt=0)

    # Every task dir of the suite (absolute, sorted), found while validating `path`.
    _all_dirs: list[str] = PrivateAttr(default_factory=list)

    # ── validation ──────────────────────────────────────────────────────────────────────────────────────────────

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str, info: ValidationInfo) -> str:
        folder = Path(resolve_file(value, _base_dir(info)))
        if not folder.exists():
            raise ValueError(f"{folder} does not exist")
        if not folder.is_dir():
            raise ValueError(f"{folder} is not a folder (give a folder of Harbor task dirs)")
        for task_dir in discover_task_dirs(folder):
            check_task_dir(task_dir)
        return str(folder)

    @field_validator("indices")
    @classmethod
    def _check_indices(cls, value: list[int] | None) -> list[int] | None:
        return check_indices(value)

    @field_validator("harness")
    @classmethod
    def _check_harness(cls, value: str, info: ValidationInfo) -> str:
        value = value.strip()
        try:
            resolved = resolve_harness_spec(value, _base_dir(info))
        except ImportSpecError as exc:
            raise ValueError(str(exc)) from None
        load_harness(resolved)
        return resolved

    @field_validator("environment_type")
    @classmethod
    def _check_environment_type(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from harbor.models.environment_type import EnvironmentType

        value = value.strip().lower()
        known = [t.value for t in EnvironmentType]
        if value not in known:
            raise ValueError(f"unknown Harbor environment type {value!r}; Harbor knows: {', '.join(known)} (for a "
                             "custom BaseEnvironment use `import_path`)")
        return value

    @field_validator("import_path")
    @classmethod
    def _check_import_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        value = value.strip()
        try:
            target, attr = split_spec(value)
        except ImportSpecError as exc:
            raise ValueError(str(exc)) from None
        if is_file_spec(target):
            value = f"{resolve_file(target, _base_dir(info))}:{attr}"
        load_environment_class(value)
        return value

    @model_validator(mode="after")
    def _check_combination(self) -> HarborSpec:
        if self.num_tasks is not None and self.indices is not None:
            raise ValueError("`num_tasks` and `indices` are exclusive: set one of them, or neither for every task")
        if self.environment_type is not None and self.import_path is not None:
            raise ValueError("`environment_type` and `import_path` are exclusive: a built-in Harbor backend, or a "
                             "custom BaseEnvironment class (neither: the local sandbox backend)")
        if self.reward_key is not None and self.reward_reduce != "key":
            raise ValueError(f"`reward_key` applies to reward_reduce='key' only (got reward_reduce="
                             f"{self.reward_reduce!r}, which reduces every entry of reward.json)")
        self._all_dirs = [str(d) for d in discover_task_dirs(Path(self.path))]
        if self.indices is not None:
            bad = [i for i in self.indices if i >= len(self._all_dirs)]
            if bad:
                raise ValueError(f"`indices`: index {bad[0]} is out of range: {self.path} has {len(self._all_dirs)} "
                                 f"tasks (0..{len(self._all_dirs) - 1})")
        return self

    # ── identity and display ────────────────────────────────────────────────────────────────────────────────────

    @property
    def backend(self) -> str:
        """The backend's name: the `environment_type`, `"local"` for the default, else the import path."""
        if self.environment_type is not None:
            return self.environment_type
        return "local" if self.import_path is None else self.import_path

    @property
    def environment_import_path(self) -> str | None:
        """The `BaseEnvironment` import path Harbor's factory gets (the local backend's by default); None for a
        built-in `environment_type`."""
        if self.environment_type is not None:
            return None
        return self.import_path or LOCAL_BACKEND

    @property
    def stop_delete(self) -> bool:
        """The `delete` flag of `BaseEnvironment.stop`: False for docker/podman (keep the built image for the next
        rollout; containers are still removed), True for everything else (cloud sandboxes must be deleted)."""
        return self.environment_type not in IMAGE_REUSE_BACKENDS

    @property
    def reuploads_copied_files(self) -> bool:
        """Whether `COPY`'d build-context files are uploaded again after start (see `reupload_copied_files`)."""
        if self.reupload_copied_files is not None:
            return self.reupload_copied_files
        return self.environment_type in REUPLOAD_BACKENDS

    @property
    def effective_rate_limit_key(self) -> str:
        """Name of the cluster-wide create-rate limit this suite draws from."""
        return self.rate_limit_key or self.backend

    def describe(self) -> str:
        """One line for logs and progress displays."""
        return f"Harbor {self.path} ({len(self.selected_dirs())} tasks, backend {self.backend}, harness {self.harness})"

    def field_path(self, name: str | None, field: str = "path") -> str:
        """`envs.<name>.<field>` for error messages."""
        return f"envs.{name}.{field}" if name else field

    # ── tasks ───────────────────────────────────────────────────────────────────────────────────────────────────

    def task_dirs(self) -> list[str]:
        """Every task dir of the suite, absolute and sorted (what `indices` index into)."""
        if not self._all_dirs:
            self._all_dirs = [str(d) for d in discover_task_dirs(Path(self.path))]
        return list(self._all_dirs)

    def selected_dirs(self) -> list[tuple[int, str]]:
        """The selected tasks as `(index, task dir)` pairs, in schedule order."""
        dirs = self.task_dirs()
        if self.indices is not None:
            return [(i, dirs[i]) for i in self.indices]
        if self.num_tasks is not None:
            if self.num_tasks > len(dirs):
                logger.warning("%s: num_tasks=%d but the suite has only %d tasks; using all of them",
                               self.path, self.num_tasks, len(dirs))
            return list(enumerate(dirs))[: self.num_tasks]
        return list(enumerate(dirs))

    def list_tasks(self, name: str) -> list[TaskRef]:
        """The selected tasks as `TaskRef`s.

        `TaskRef.index` is the task's position in the sorted suite (what `indices` selects); `metadata` holds
        `task_dir`, `task_name`, `instruction` and the task.toml `[metadata]` table (keys clashing with those three
        are left out).
        """
        refs = []
        for index, task_dir in self.selected_dirs():
            task = load_task(task_dir)
            meta: dict[str, Any] = {"task_dir": task_dir, "task_name": task.name, "instruction": task.instruction}
            for key, value in (task.config.metadata or {}).items():
                if key not in RESERVED_METADATA:
                    meta[key] = value
            refs.append(TaskRef(env=name, index=index, split="train", metadata=meta))
        return refs

    def dataset(self, name: str) -> datasets.Dataset:
        """A `datasets.Dataset` of the selected tasks, shaped like TRL's `HarborSpec.train_dataset`.

        Columns: `prompt` (a chat list holding one empty user message: the instruction comes from the environment
        when the episode starts, as in TRL), `task_index`, `env`, `task_dir`, `task_name`, `instruction`, and one
        column per task.toml `[metadata]` key.
        """
        from raygrpo.specs.dataset import tasks_to_dataset

        return tasks_to_dataset(self.list_tasks(name))

    def provider(self, *, name: str | None = None) -> HarborProvider:
        """The per-actor sandbox factory for this suite. Cheap: nothing is started until a rollout starts."""
        from raygrpo.envs.harbor import HarborProvider

        return HarborProvider(self, name=name)


# ── task dirs ───────────────────────────────────────────────────────────────────────────────────────────────────


def _base_dir(info: ValidationInfo) -> str | None:
    context = info.context if isinstance(info.context, dict) else {}
    base = context.get("base_dir")
    return os.fspath(base) if base else None


def discover_task_dirs(folder: Path) -> list[Path]:
    """The task dirs of a suite folder, sorted by name.

    `folder` is one task dir (it has `task.toml`), a folder with a `tasks/` subfolder, or a folder of task dirs. In
    the last two, every sub-folder not starting with `.` or `_` counts as a task dir (a broken one must fail loudly,
    not vanish from the suite).

    Raises:
        ValueError: No task dir was found (the message names the folder).
    """
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
    from harbor.models.task.verifier_mode import resolve_task_verifier_mode
    from harbor.utils.scripts import discover_script

    if not (task_dir / "task.toml").is_file():
        raise ValueError(f"task dir {task_dir} is missing task.toml")
    if not (task_dir / "instruction.md").is_file():
        raise ValueError(f"task dir {task_dir} is missing instruction.md")
    if discover_script(task_dir / "tests", "test") is None:
        raise ValueError(f"task dir {task_dir} is missing tests/test.sh")
    try:
        config = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    except Exception as exc:  # noqa: BLE001 - TOML syntax and pydantic errors alike
        raise ValueError(f"task dir {task_dir}: task.toml is invalid: {_toml_error(exc)}") from None
    if config.steps:
        raise ValueError(f"task dir {task_dir}: multi-step tasks ([[steps]] in task.toml) are not supported")
    try:
        task = load_task(str(task_dir))
    except Exception as exc:  # noqa: BLE001 - Harbor's own checks (missing files, unsafe paths)
        raise ValueError(f"task dir {task_dir}: {_first_line(exc)}") from None
    if resolve_task_verifier_mode(task.config).value != "shared":
        raise ValueError(f"task dir {task_dir}: a separate verifier environment ([verifier].environment) is not "
                         "supported; the verifier runs in the task's own sandbox")
    if task.paths.discovered_test_path_for(task.config.environment.os) is None:
        raise ValueError(f"task dir {task_dir} is missing tests/test.sh")
    if not task.paths.environment_dir.is_dir() and not task.config.environment.docker_image:
        raise ValueError(f"task dir {task_dir} is missing environment/ (or [environment].docker_image in task.toml)")


def _toml_error(exc: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3])
    return _first_line(exc)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def load_task(task_dir: str) -> Task:
    """Harbor's `Task` for a task dir (parses task.toml, reads the instruction, checks the tests exist)."""
    from harbor.models.task.task import Task

    return Task(task_dir=Path(task_dir))


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
