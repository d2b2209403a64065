"""A Harbor `BaseEnvironment` that runs each sandbox in Linux namespaces on this machine (bubblewrap + nsenter).

**Development and CI backend. It is no security boundary for untrusted code, and it builds no images.**

Why it exists: Harbor's backends need a Docker daemon or a cloud provider, and development/CI machines here have
neither. This backend gives each rollout a container-like sandbox with only `bwrap` and `nsenter` (Debian packages
`bubblewrap` and `util-linux`), so Harbor task suites run locally through Harbor's own factory and verifier:

    EnvironmentFactory.create_environment_from_config(
        TrialEnvironmentConfig(import_path="raygrpo.sandbox.local:LocalSandboxEnvironment", kwargs={...}), ...)

What a sandbox is:

- Namespaces: mount, PID, IPC, UTS and network of its own. The network never reaches the host's services: a task
  whose network mode is `no-network` gets loopback only, a `public` one (Harbor's default) outbound access through
  slirp4netns with a firewall that rejects the host's addresses, and `allowlist` is refused
  (`raygrpo.sandbox.network`). The verifier's and the oracle's commands run under the same rule.
- Filesystem: the host's `/usr`, `/etc`, `/opt`, `/var`, `/srv` (and `/bin`, `/lib*`, `/sbin`), read-only; fresh
  `/proc`, `/dev`, and tmpfs `/run`, `/dev/shm`, `/var/tmp`. Writable directories of its own (host directories under
  `<sandbox root>/<id>/fs/`) are bound over `/workdir`, `/app`, `/logs`, `/tests`, `/solution`, `/home/user`,
  `/root`, `/tmp`, the Dockerfile's `WORKDIR`, the task's `workdir` and every `COPY` destination. A destination
  inside a read-only host directory (say `/usr/src/app`) gets that directory replaced by a writable copy whose
  existing entries are bound back read-only. The host's `/root`, `/home` and anything else not listed are not
  visible, nor its secrets in those trees, the sandbox root and the task's folders (`raygrpo.sandbox.hidden`).
- The Dockerfile: `WORKDIR`, `ENV` and `COPY`/`ADD` of local files are applied (a file copied into `/` is bound
  there on its own); of `RUN`, the commands that make files and folders run at start, those that install software
  are skipped; the `ENTRYPOINT` is started in the background after them, with Harbor's `sh -c "sleep infinity"` as
  its arguments, as on Harbor's docker backend (`raygrpo.sandbox.entrypoint`); everything else is skipped and
  reported once per task; see `raygrpo.sandbox.dockerfile` and `raygrpo.sandbox.run_steps`. A task "runs
  unchanged" when what its `RUN` steps install is on the host or in the verifier toolbox. A `docker_image` without a
  Dockerfile is not pulled: the sandbox is the host's files, and `environment/` is uploaded into the working
  directory as Harbor does for prebuilt images.
- Processes: `start()` launches one long-lived init (`bwrap --unshare-pid --as-pid-1 ...`: PID 1, see `INIT_LOOP`);
  each `exec` enters its namespaces with `nsenter` and runs `bash -c <command>` (as Harbor's docker backend does) in
  the working directory (`cwd`, else the task's `workdir`, else `WORKDIR`, else `/`) with the sandbox's environment
  (the Dockerfile's `ENV`, then Harbor's persistent and per-exec env). Files and background processes persist across
  execs, as in a container. Each exec runs in its own process group; when it times out the whole group is killed and
  `SandboxExecTimeoutError` (a `RuntimeError` whose message matches the docker backend's) is raised. `stop()` kills
  the init, and so, by the kernel, every process of the PID namespace (background and `setsid` ones too), then
  removes the host directory. If the owning process dies, even by SIGKILL, `--die-with-parent` takes its sandboxes
  with it; the directories left behind are removed by `raygrpo.sandbox.orphans.reap_orphans`.
- Tools: the verifier toolbox (`raygrpo.sandbox.toolbox`: `python`, `python3`, pytest, pytest-json-ctrf in a venv
  built once per machine) comes first on `PATH`, so test scripts find what task images usually bake in rather than
  whatever the host has (`toolbox=False` turns it off).
- Users: execs run as root, without the capabilities that would make it the host's root (no mounts, device nodes,
  firewall changes, kernel modules or tracing: `raygrpo.sandbox.process.KEPT_CAPS`). A requested `user` that exists
  in the host's `/etc/passwd` (or a numeric uid) is honoured with `setpriv`; an unknown user name (typically one a
  skipped `RUN useradd` would have created) falls back to root with a warning.
- Files: uploads and downloads go straight through the host directories behind the sandbox's writable paths, else
  through `tar` and `cat` in the sandbox (`raygrpo.sandbox.transfer`).
- Output: `stdout` and `stderr` come back separately (as e2b does; Harbor's docker backend merges stderr into
  stdout), each capped at `max_output_bytes`.
- Resources (`cpus`, `memory_mb`, ...) are not enforced. GPUs are not supported.
- Host user: made for root (as on these machines). As another user bwrap and nsenter go through an unprivileged
  user namespace (`--unshare-user`, `nsenter -U`); that path is not exercised by the tests.

Caveat: the owning thread matters. `--die-with-parent` uses the kernel's parent-death signal, which fires when the
*thread* that spawned bwrap exits. Start sandboxes from a long-lived event loop thread (a Ray actor's loop, or a
dedicated loop thread like TRL's `HarborEnv`), never from a short-lived worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode, TaskOS

from raygrpo.core.aio import run_to_end
from raygrpo.sandbox import dockerfile as _df
from raygrpo.sandbox import hidden as _hidden
from raygrpo.sandbox import layout as _lay
from raygrpo.sandbox import network as _net
from raygrpo.sandbox import process as _proc
from raygrpo.sandbox import owners as _reg
from raygrpo.sandbox import toolbox as _toolbox
from raygrpo.sandbox.commands import SandboxCommands, log_once
from raygrpo.sandbox.entrypoint import start_entrypoint
from raygrpo.sandbox.errors import (
    SandboxDefinitionError,
    SandboxError,
    SandboxExecTimeoutError,  # noqa: F401 (re-exported)
    SandboxNotRunningError,  # noqa: F401 (re-exported)
    SandboxStartError,
)
from raygrpo.sandbox.layout import BWRAP, EXPOSED_DIRS, LINK_DIRS, STANDARD_WRITABLE  # noqa: F401 (re-exported)
from raygrpo.sandbox.os_probe import DEFAULT_ROOT, ID_ENV, ROOT_ENV
from raygrpo.sandbox.process import NSENTER
from raygrpo.sandbox.transfer import HostFileTransfer
from raygrpo.specs.harbor import LOCAL_RENAMED_KWARGS

_ID_SAFE = re.compile(r"[^A-Za-z0-9_-]+")


class LocalSandboxEnvironment(SandboxCommands, HostFileTransfer, BaseEnvironment):
    """Harbor environment backed by a local bubblewrap sandbox (development/CI; no security boundary; no builds).

    Load it through Harbor's factory with `import_path="raygrpo.sandbox.local:LocalSandboxEnvironment"`; extra
    keyword arguments come from `TrialEnvironmentConfig.kwargs`. See the module docstring for what a sandbox is.

    Args:
        environment_dir, environment_name, session_id, trial_paths, task_env_config, logger:
            as for every Harbor `BaseEnvironment` (passed by Harbor's factory).
        sandbox_root (`str`, *optional*):
            host directory that holds the sandboxes' directories; default `$RAYGRPO_SANDBOX_ROOT`, else
            `/tmp/raygrpo-sandboxes`. The reaper (`raygrpo.sandbox.orphans.reap_orphans`) must be given the same.
        owner_id (`str`, *optional*):
            label recorded as the sandbox's owner (default: the Ray actor name when running in an actor).
        keep_dir (`bool`, defaults to `False`):
            keep the sandbox's host directory after `stop()` (for debugging); it is marked stopped and never
            reaped. `stop(delete=...)` does not control this: there is no image to delete, and callers that pass
            `delete=False` to keep docker images must not leave directories behind.
        writable_dirs (`list[str]`, *optional*):
            more sandbox directories to make writable, besides the standard ones.
        init_timeout_s (`float`, defaults to `30.0`):
            how long `start()` waits for the sandbox's init to come up, and how long each Dockerfile `RUN` step run
            at start may take. Not the environment's start deadline (`envs.<name>.start_timeout_s`, which bounds the
            whole start, this included); it was called `start_timeout_s` before, a name now refused.
        max_output_bytes (`int`, defaults to `16 MiB`):
            cap on the stdout and on the stderr an exec returns (the rest is cut, with a note).
        toolbox (`bool`, defaults to `True`):
            put the verifier toolbox (`raygrpo.sandbox.toolbox`: a venv with `python`, `python3`, pytest and
            pytest-json-ctrf, built once per machine) first on the sandbox's `PATH`, bound read-only; False leaves
            the sandbox with the host's own tools only.
        hidden_paths (`list[str]`, *optional*):
            more host folders the sandbox must not see (`raygrpo.sandbox.hidden.sandbox_hidden`: a run's output
            folder under `/srv`, say).
        **kwargs: the remaining `BaseEnvironment` arguments (`persistent_env`, `mounts`, `auto_mounts`,
            `auto_mounting`, `network_policy`, `override_*`, ...). Bind mounts are honoured; `stream` is not
            supported.
    """

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: Any,
        task_env_config: Any,
        logger: logging.Logger | None = None,
        *,
        sandbox_root: str | os.PathLike | None = None,
        owner_id: str | None = None,
        keep_dir: bool = False,
        writable_dirs: list[str] | None = None,
        init_timeout_s: float = 30.0,
        max_output_bytes: int = 16 * 1024 * 1024,
        toolbox: bool = True,
        hidden_paths: list[str] | None = None,
        **kwargs: Any,
    ):
        renamed = [f"`{key}` {now}" for key, now in LOCAL_RENAMED_KWARGS.items() if key in kwargs]
        if renamed:  # a config that sets one fails at load already (`HarborSpec`); this is for other callers
            raise TypeError(f"LocalSandboxEnvironment: {'; '.join(renamed)}")
        # Set before BaseEnvironment.__init__, which calls _validate_definition.
        self._plan: _df.DockerfilePlan | None = None
        self._root = Path(sandbox_root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
        self._owner_id = owner_id
        self._keep_dir = keep_dir
        self._extra_writable = list(writable_dirs or [])
        self._init_timeout_s = init_timeout_s
        self._max_output = max_output_bytes
        self._extra_hidden = list(hidden_paths or [])
        try:
            self._toolbox = _toolbox.ensure_toolbox() if toolbox else None
        except _toolbox.ToolboxError as e:
            raise SandboxStartError(str(e)) from None
        self._reg: _reg.Registration | None = None
        self._init = _proc.InitProcess()
        self._execs_running = 0
        self._mount_table: list[_lay.Mount] = []
        self._state = "new"  # new -> starting -> running -> stopped
        self._outbound: _net.OutboundNetwork | None = None
        self._hostname = ""
        self.sandbox_id = ""
        super().__init__(
            environment_dir=environment_dir,
            environment_name=environment_name,
            session_id=session_id,
            trial_paths=trial_paths,
            task_env_config=task_env_config,
            logger=logger,
            **kwargs,
        )

    # ------------------------------------------------------------------ Harbor's class-level contract

    @staticmethod
    def type() -> str:
        return "raygrpo-local"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # No allowlist: Harbor's own check then refuses such a task by name.
        return EnvironmentCapabilities(disable_internet=True, mounted=True)

    @classmethod
    def preflight(cls) -> None:
        """Fail early (before any trial is queued) when bwrap, nsenter or the outbound network's tools are missing."""
        missing = [tool for tool in (BWRAP, NSENTER) if not os.access(tool, os.X_OK)] + _net.missing_tools()
        if missing:
            raise SystemExit(
                f"raygrpo local sandbox needs {', '.join(missing)} (Debian: apt-get install bubblewrap util-linux "
                "slirp4netns iptables)"
            )

    @property
    def outbound(self) -> bool:
        """Whether the sandbox gets outbound access: neither the runtime policy (what Harbor's Trial or raygrpo
        passes) nor the task itself asks for `no-network`."""
        return NetworkMode.NO_NETWORK not in (
            self.network_policy.network_mode,
            getattr(self.task_env_config, "network_mode", None),
        )

    def _validate_definition(self) -> None:
        if self.task_env_config.os == TaskOS.WINDOWS:
            raise RuntimeError("the raygrpo local sandbox runs Linux tasks only")
        if getattr(self.task_env_config, "network_mode", None) == NetworkMode.ALLOWLIST:
            # Harbor's own check covers callers that pass the task's policy; this one, callers that pass none.
            raise ValueError(f"network_mode='allowlist' is not supported by {self.type()} environment: "
                             "slirp4netns cannot filter by host name; refused rather than run with a wider network")
        env_dir = Path(self.environment_dir)
        if (env_dir / "docker-compose.yaml").exists():
            # Refused at load too (`raygrpo.envs.harbor.tasks.check_task_dir`): sidecars would not be there, and the
            # task would fail later as an unexplained healthcheck or verifier error.
            raise ValueError(
                f"{env_dir}: compose services are not run by the local backend: environment/docker-compose.yaml "
                "starts containers beside the sandbox; run the task with environment_type: docker"
            )
        self._plan = _df.load_plan(env_dir)  # raises DockerfileError naming the file and line
        for mount in getattr(self, "_host_mounts", None) or []:
            if mount.get("type") != "bind":
                raise ValueError(f"the raygrpo local sandbox supports bind mounts only, got {mount!r}")

    # ------------------------------------------------------------------ properties

    @property
    def host_dir(self) -> Path | None:
        """The sandbox's directory on the host (None before `start`)."""
        return self._reg.dir if self._reg else None

    @property
    def init_pid(self) -> int | None:
        """Host pid of the sandbox's PID-namespace init (None when not running)."""
        return self._init.pid if self._state == "running" else None

    @property
    def workdir(self) -> str:
        """Where execs run by default: the task's `workdir`, else the Dockerfile's `WORKDIR`, else `/`."""
        return self.task_env_config.workdir or (self._plan.workdir if self._plan else None) or "/"

    def is_running(self) -> bool:
        """Whether the sandbox is started and its init still alive."""
        return self._state == "running" and self._init.alive()

    # ------------------------------------------------------------------ start / stop

    async def start(self, force_build: bool) -> None:
        """Create the sandbox: its host directory and writable dirs, the Dockerfile's files, and its init."""
        if self._state != "new":
            raise SandboxError(f"sandbox {self.sandbox_id or self.session_id} was already started")
        self._state = "starting"
        if self._plan is not None:
            _df.report_skipped(self._plan)
        elif self.task_env_config.docker_image:
            log_once(
                f"image:{self.environment_dir}",
                "%s: docker_image %s is not pulled by the local sandbox; the sandbox sees the host's files",
                self.environment_dir,
                self.task_env_config.docker_image,
            )
        self.sandbox_id = f"{_ID_SAFE.sub('-', self.session_id)[:48].strip('-') or 'sbx'}-{uuid.uuid4().hex[:8]}"
        self._hostname = self.sandbox_id[:63]
        self._reg = _reg.Registration(self._root, self.sandbox_id, self._owner_id)
        prepare = asyncio.ensure_future(asyncio.to_thread(self._prepare_host_dir))
        try:
            await asyncio.shield(prepare)
            await self._launch()
            if self.outbound:
                self._outbound = _net.OutboundNetwork()
                await self._outbound.start(self._init.pid, self._reg.dir / "network.log", self._mark_env())
        except BaseException:
            # A cancelled start must not leave the preparing thread writing into a directory being removed.
            with contextlib.suppress(BaseException):
                await prepare
            await self._teardown()
            raise
        self._state = "running"
        await self._upload_environment_dir_after_start()
        await self._run_dockerfile_steps()
        if self._plan is not None and self._plan.entrypoint:
            await start_entrypoint(self, self._plan, self._init_timeout_s)

    async def _run_dockerfile_steps(self) -> None:
        """Run the Dockerfile's `RUN` commands that make files (`raygrpo.sandbox.run_steps`), in order, as root; a
        failing one is reported once per task and the sandbox starts anyway, as the host's files are all it has."""
        for step in self._plan.runs if self._plan is not None else ():
            result = await self.exec(step.command, cwd=step.workdir, env=step.env, user="root",
                                     timeout_sec=int(self._init_timeout_s))
            if result.return_code != 0:
                _df.report_run_failure(self._plan, step, result.return_code,
                                       (result.stdout or "") + (result.stderr or ""))

    async def stop(self, delete: bool = True) -> None:
        """Kill every process of the sandbox and remove its host directory (unless `keep_dir`). Idempotent.

        `delete` is accepted for Harbor's interface and ignored: there is no image to delete.
        """
        if self._state in ("new", "stopped"):
            self._state = "stopped"
            return
        await self._teardown()

    async def _teardown(self) -> None:
        """Kill the sandbox and remove its directory; runs to the end even when cancelled, then re-raises."""
        self._state = "stopped"
        cancelled = await self._init.kill()
        if self._outbound is not None:
            cancelled = await run_to_end(self._outbound.stop()) or cancelled
        if self._reg is not None:
            # Double-check through /proc (by the sandbox's environment mark, unless the init's namespace is known
            # to be empty and no exec's nsenter, which lives outside it, is still running), then remove the dir.
            stragglers = not self._init.reaped() or self._execs_running > 0
            cancelled = await run_to_end(asyncio.to_thread(self._release, self._reg, stragglers)) or cancelled
        if cancelled is not None:
            raise cancelled

    def _release(self, reg: _reg.Registration, stragglers: bool) -> None:
        if reg.dir.exists():
            _reg.kill_sandbox_processes(reg.dir, reg.sandbox_id, self._root, timeout_s=5.0, stragglers=stragglers)
        reg.release(remove=not self._keep_dir)

    # ------------------------------------------------------------------ host directory and mounts

    def _prepare_host_dir(self) -> None:
        assert self._reg is not None
        try:
            self._mount_table = _lay.prepare_host_dir(
                self._reg.create(),
                plan=self._plan,
                task_workdir=self.task_env_config.workdir,
                extra_writable=self._extra_writable,
                host_mounts=self._host_mounts,
                workdir=self.workdir,
                hidden=_hidden.sandbox_hidden(self._root, self.environment_dir, self.trial_paths, self._extra_hidden),
            )
        except ValueError as e:  # a CopyError, or a destination that cannot be made writable: the task's, every time
            raise SandboxDefinitionError(str(e)) from None
        if self._toolbox is not None:
            self._mount_table.append(_lay.Mount(PurePosixPath(str(self._toolbox)), "ro", self._toolbox))

    def _host_parts(self, sandbox_path: str | PurePosixPath, *,
                    writable_only: bool = True) -> tuple[Path, tuple[str, ...]] | None:
        """The host mount source holding `sandbox_path` and the path below it (`raygrpo.sandbox.layout.host_parts`),
        or None."""
        return _lay.host_parts(self._mount_table, sandbox_path, self.workdir, writable_only=writable_only)

    # ------------------------------------------------------------------ the init process

    async def _launch(self) -> None:
        """Start the sandbox's init (see `raygrpo.sandbox.process.InitProcess.start`)."""
        assert self._reg is not None
        bwrap = _lay.bwrap_argv(self._mount_table, hostname=self._hostname)
        # Marked by id alone: bwrap's pid 1 inside keeps this environment, and must not tell where sandboxes live.
        env = {"PATH": _df.DEFAULT_PATH, "HOME": "/root", ID_ENV: self.sandbox_id}
        try:
            ready = await self._init.start(bwrap, env, self._reg.dir / "init.log", self._reg, self._init_timeout_s)
        except TimeoutError:
            raise SandboxStartError(
                f"sandbox {self.sandbox_id} did not come up within init_timeout_s={self._init_timeout_s:g}: "
                f"{self._init_log()}"
            ) from None
        if not ready:
            rc = self._init.proc.returncode if self._init.proc else None
            raise SandboxStartError(f"sandbox {self.sandbox_id} failed to start (bwrap exit {rc}): {self._init_log()}")

    def _mark_env(self) -> dict[str, str]:
        """The environment variables that mark a process as this sandbox's (`raygrpo.sandbox.owners`)."""
        return {ID_ENV: self.sandbox_id, ROOT_ENV: str(self._root)}

    def _init_log(self) -> str:
        return _proc.log_tail(self._reg.dir / "init.log") if self._reg else ""


__all__ = [
    "LocalSandboxEnvironment",
    "SandboxError",
    "SandboxExecTimeoutError",
    "SandboxNotRunningError",
    "SandboxStartError",
]
