"""The Harbor environment spec: a local folder of Harbor task dirs, run in sandboxes of any Harbor backend.

Pure data. Loading a config validates the fields and makes relative paths (`path`, a file-path `harness` or
`import_path`) absolute against the folder given as `base_dir` in the pydantic validation context (the config file's
folder), else the working directory. What the paths name (the task dirs, the harness and backend classes) is checked
by the driver's resolve step before Ray starts (`raygrpo.envs.kinds`), and the spec travels to the env pool
actors as it is: strings and numbers only, never a sandbox, a loop or a secret value.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from raygrpo.core.imports import ImportSpecError, is_file_spec, resolve_file, split_spec
from raygrpo.specs.base import EnvSpecBase, base_dir_of, refuse_moved_fields
from raygrpo.specs.faults import FaultConfig
from raygrpo.specs.selection import check_indices
from raygrpo.specs.warm import HedgeSpec, WarmPoolSpec

#: The backend used when neither `environment_type` nor `import_path` is set: raygrpo's bwrap sandbox.
LOCAL_BACKEND = "raygrpo.sandbox.local:LocalSandboxEnvironment"
#: Keyword arguments of the local backend that were renamed, and what each is now: `environment_kwargs` that set one
#: fail at load saying so (and the backend's constructor refuses them).
LOCAL_RENAMED_KWARGS: dict[str, str] = {
    "start_timeout_s": "in environment_kwargs is now `init_timeout_s` (how long the local sandbox's init may take to "
                       "come up); the environment's start deadline is `start_timeout_s`, outside environment_kwargs",
}
#: Backends whose `stop(delete=True)` removes the built image (`docker compose down --rmi local`): raygrpo stops
#: them with `delete=False`, which still removes containers, networks and the sandbox, but keeps the image for the
#: next rollout of the task. Every other backend gets `delete=True` (for cloud sandboxes such as Daytona,
#: `delete=False` keeps the sandbox itself alive and billing).
IMAGE_REUSE_BACKENDS = frozenset({"docker", "podman"})
#: Backends whose remote image builds have been seen to drop the files a Dockerfile `COPY`s from the build context
#: (TRL's HarborEnv re-uploads them for e2b): raygrpo uploads those files again after such a sandbox starts.
REUPLOAD_BACKENDS = frozenset({"e2b"})


class HarborSpec(EnvSpecBase):
    """A local Harbor task suite as a source of tasks for raygrpo.

    Each task is a Harbor task dir (`instruction.md`, `task.toml`, `environment/`, `tests/test.sh`, optionally
    `solution/`). Task selection mirrors TRL's `HarborSpec`: every task dir (sorted by name), the first `num_tasks`,
    or explicit `indices` into the sorted list. The sandbox backend is any Harbor `BaseEnvironment`: a built-in
    `environment_type` (docker, e2b, daytona, modal, ...), a custom class by `import_path`, or by default raygrpo's
    local bubblewrap sandbox (`raygrpo.sandbox.local:LocalSandboxEnvironment`, for development and CI; no security
    boundary).

    Deadlines have one owner each, the sandbox: `start_timeout_s` (the start), `exec_timeout_s` (each command),
    `verifier_timeout_s` (scoring), `stop_timeout_s` (the stop). Time spent waiting for a start slot
    (`max_concurrent_starts`, the provider's `create_rate_per_s` and `max_live`, its refusals) counts against none of
    them.

    The provider's cluster-wide limits are not set here but in the run config's `providers:` section, once for every
    suite that names the provider (`provider`; see `raygrpo.specs.provider.ProviderSpec`).

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
            `raygrpo.envs.harbor.harness.BaseHarness`).
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
            Deadline for creating and starting the sandbox plus the task's healthcheck, counted from when the start
            gets its slot (waiting for `max_concurrent_starts` or the provider's `create_rate_per_s` does not count).
            A start that misses it fails as `env_error` (retried).
        exec_timeout_s (`float`, *optional*, defaults to `30.0`):
            Deadline of one tool command in the sandbox; past it the command is stopped and the model is told (the
            episode goes on).
        verifier_timeout_s (`float`, *optional*):
            Deadline of the task's verifier (`tests/test.sh`); None uses the task's `[verifier] timeout_sec`
            (Harbor's default 600). A verifier that misses it leaves the rollout unscored with status `timeout`
            (not retried).
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
        probe_verifier (`bool`, *optional*, defaults to `True`):
            When a task first starts, before any model acts in it, check that what `tests/test.sh` runs (its
            commands, the Python packages its tests need, what it downloads) is in the sandbox. Where something is
            missing, a rollout the verifier does not award full reward is `verifier_error` (unscored, retried),
            not a 0.0: the verifier could not have judged it. What is missing is in `verifier.tooling_missing`.
        offline_tooling (`bool`, *optional*, defaults to `False`):
            Serve Harbor's download-at-test-time verifier template from what the sandbox already has, for sandboxes
            that cannot download: during the verifier phase only, `apt-get`, `curl` of the uv installer,
            `$HOME/.local/bin/env`, `uvx --with SPEC ... pytest` and `uv run` are shims first on `test.sh`'s `PATH`
            (`raygrpo.envs.harbor.offline`; task files are not rewritten). The packages asked for must be in the
            sandbox's `python3` (the local backend's toolbox, or the image's); one that is not is a
            `verifier_error` naming it.
        stop_agent_processes (`bool`, *optional*, defaults to `False`):
            Before each verification in the model's own sandbox (Harbor's shared verifier), kill every process
            started since the sandbox was ready for the episode: the model's commands and whatever they left running,
            detached daemons included, so that none can rewrite the reward file or the tests while `test.sh` runs
            (`raygrpo.envs.harbor.agent_processes`). The init, a Dockerfile's `ENTRYPOINT` services and the harness's
            set-up are spared. Off by default, as in Harbor: many tasks ask the model to start a service that their
            tests then query, which this would stop. Tasks with a separate verifier environment need none: their
            verifier runs elsewhere.
        keep_logs (`Literal["failed", "all", "none"]`, *optional*, defaults to `"failed"`):
            Which rollouts keep the sandbox's `/logs` (the verifier's output, `ctrf.json`, what `test.sh` wrote) in
            the run folder, under `verifier_logs/`: those whose verification did not award a reward of at least 1.0
            (`"failed"`: a wrong answer, or a verifier that broke), every one, or none. Every trajectory carries
            `verifier: {exit_code, output_tail, rewards}` whatever this says.
        keep_logs_kib (`int`, *optional*, defaults to `256`):
            Most KiB of `/logs` kept per rollout; longer files keep their end, and files past the budget are listed
            but not kept.
        faults (`FaultConfig`, *optional*):
            Fault and latency injection around the backend (start latency, start failures, exec hangs, sandbox
            death), for benchmarks and reliability tests.
        max_concurrent_starts (`int`, *optional*):
            Most sandbox starts in flight at once per env pool actor. None: no per-actor limit. Suites on one
            provider share an actor's gate of that provider, so they must all give the same value (None included);
            different values are refused at load.
        provider (`str`, *optional*):
            The provider its sandboxes count against: the entry of the run config's `providers:` section whose limits
            (`create_rate_per_s`, `max_live`, `rate_limit_backoff`) apply, shared with every suite that names the same
            provider, through one governor. None: the backend's name (`"local"`, `"docker"`, `"e2b"`, ... or the
            import path), so suites on one backend share it. A provider with no `providers:` entry has no limits
            (no create rate, no live cap, the default back-off: what unset limits always meant); an entry that no
            suite names fails at load, so a misspelt name on either side is caught there.
        warm_pool (`WarmPoolSpec`, *optional*):
            Keep sandboxes started ahead for the tasks that come next (`{size: N | auto, ttl_s: s}`, see
            `raygrpo.specs.warm.WarmPoolSpec`). None: every sandbox is started when its rollout asks.
        hedge (`HedgeSpec`, *optional*):
            Give a start that runs past a percentile of recent starts a second start in parallel; the first ready
            is used, the other stopped (see `raygrpo.specs.warm.HedgeSpec`). None: no hedging.
    """

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
    probe_verifier: bool = True
    offline_tooling: bool = False
    stop_agent_processes: bool = False
    keep_logs: Literal["failed", "all", "none"] = "failed"
    keep_logs_kib: int = Field(default=256, ge=1)
    faults: FaultConfig | None = None
    max_concurrent_starts: int | None = Field(default=None, ge=1)
    provider: str | None = None
    warm_pool: WarmPoolSpec | None = None
    hedge: HedgeSpec | None = None

    # ── validation (fields only: what they name is resolved by the driver) ─────────────────────────────────────

    @field_validator("path")
    @classmethod
    def _absolute_path(cls, value: str, info: ValidationInfo) -> str:
        if not value.strip():
            raise ValueError("`path` must name a folder of Harbor task dirs")
        return resolve_file(value.strip(), base_dir_of(info))

    @field_validator("provider")
    @classmethod
    def _named_provider(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("`provider` names an entry of `providers:`; leave it unset for the backend's name")
        return value.strip() if value is not None else None

    @field_validator("indices")
    @classmethod
    def _check_indices(cls, value: list[int] | None) -> list[int] | None:
        return check_indices(value)

    @field_validator("harness", "import_path")
    @classmethod
    def _absolute_file_spec(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A `path/file.py:Class` selector with its file made absolute; names and dotted paths unchanged."""
        if value is None:
            return None
        value = value.strip()
        if ":" not in value:
            if info.field_name == "import_path":
                raise ValueError(f"expected 'package.module:Class' or 'path/to/file.py:Class', got {value!r}")
            return value  # a built-in harness name, checked when the run resolves
        try:
            target, attr = split_spec(value)
        except ImportSpecError as exc:
            raise ValueError(str(exc)) from None
        return f"{resolve_file(target, base_dir_of(info))}:{attr}" if is_file_spec(target) else value

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
        return self

    @model_validator(mode="after")
    def _refuse_renamed_local_kwargs(self) -> HarborSpec:
        if self.environment_import_path == LOCAL_BACKEND:
            refuse_moved_fields(self.environment_kwargs, LOCAL_RENAMED_KWARGS)
        return self

    # ── derived settings ──────────────────────────────────────────────────────────────────────────────────────────

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
    def provider_key(self) -> str:
        """The provider its sandboxes count against (`provider`, else the backend's name): the key of its
        `providers:` entry, its governor and its leases."""
        return self.provider or self.backend

    def describe(self) -> str:
        """One line for logs and progress displays."""
        return f"Harbor {self.path} (backend {self.backend}, harness {self.harness})"

    def field_path(self, name: str | None, field: str = "path") -> str:
        """`envs.<name>.<field>` for error messages (`field` defaults to `path`)."""
        return super().field_path(name, field)
