"""A Harbor `BaseEnvironment` that runs each sandbox in Linux namespaces on this machine (bubblewrap + nsenter).

**Development and CI backend. It is no security boundary for untrusted code, and it builds no images.**

Why it exists: Harbor's backends need a Docker daemon or a cloud provider, and development/CI machines here have
neither. This backend gives each rollout a container-like sandbox with only `bwrap` and `nsenter` (Debian packages
`bubblewrap` and `util-linux`), so Harbor task suites run locally through Harbor's own factory and verifier:

    EnvironmentFactory.create_environment_from_config(
        TrialEnvironmentConfig(import_path="raygrpo.sandbox.local:LocalSandboxEnvironment", kwargs={...}), ...)

What a sandbox is:

- Namespaces: mount, PID, IPC and UTS of its own. The network is the host's (so it reaches 127.0.0.1 services),
  except for tasks whose network policy is `no-network`, which get a private network namespace with only loopback.
- Filesystem: the host's `/usr`, `/etc`, `/opt`, `/var`, `/srv` (and `/bin`, `/lib*`, `/sbin`), read-only; fresh
  `/proc`, `/dev`, and tmpfs `/run`, `/dev/shm`, `/var/tmp`. Writable directories of its own (host directories under
  `<sandbox root>/<id>/fs/`) are bound over `/workdir`, `/app`, `/logs`, `/tests`, `/solution`, `/home/user`,
  `/root`, `/tmp`, the Dockerfile's `WORKDIR`, the task's `workdir` and every `COPY` destination. A destination
  inside a read-only host directory (say `/usr/src/app`) gets that directory replaced by a writable copy whose
  existing entries are bound back read-only. The host's `/root`, `/home` and anything else not listed are not
  visible.
- The Dockerfile: `WORKDIR`, `ENV` and `COPY`/`ADD` of local files are applied, everything else (notably `RUN`) is
  skipped and reported once per task; see `raygrpo.sandbox.dockerfile`. A task "runs unchanged" when its `RUN`
  steps only install what the host already has. A `docker_image` without a Dockerfile is not pulled: the sandbox is
  the host's files, and `environment/` is uploaded into the working directory as Harbor does for prebuilt images.
- Processes: `start()` launches one long-lived init (`bwrap --unshare-pid --die-with-parent ... sleep infinity`);
  each `exec` enters its namespaces with `nsenter` and runs `bash -c <command>` (as Harbor's docker backend does) in
  the working directory (`cwd`, else the task's `workdir`, else `WORKDIR`, else `/`) with the sandbox's environment
  (the Dockerfile's `ENV`, then Harbor's persistent and per-exec env). Files and background processes persist across
  execs, as in a container. Each exec runs in its own process group; when it times out the whole group is killed and
  `SandboxExecTimeoutError` (a `RuntimeError` whose message matches the docker backend's) is raised. `stop()` kills
  the init, and so, by the kernel, every process of the PID namespace (background and `setsid` ones too), then
  removes the host directory. If the owning process dies, even by SIGKILL, `--die-with-parent` takes its sandboxes
  with it; the directories left behind are removed by `raygrpo.sandbox.registry.reap_orphans`.
- Users: execs run as root. A requested `user` that exists in the host's `/etc/passwd` (or a numeric uid) is
  honoured with `setpriv`; an unknown user name (typically one a skipped `RUN useradd` would have created) falls
  back to root with a warning.
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
import io
import json
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode, TaskOS

from raygrpo.sandbox import dockerfile as _df
from raygrpo.sandbox import registry as _reg

_log = logging.getLogger(__name__)

BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
# Tools run inside the sandbox, by absolute path (a task's ENV PATH may not include them); the sandbox's /usr is
# the host's, so the host's locations are the sandbox's.
_TOOL = {name: shutil.which(name) or f"/usr/bin/{name}" for name in ("env", "setpriv", "cat", "tar", "test", "sh")}

#: Host directories a sandbox sees read-only.
EXPOSED_DIRS = ("usr", "etc", "opt", "var", "srv")
#: Top-level entries that are usually symlinks into /usr on merged-/usr systems.
LINK_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Directories every sandbox gets writable (Harbor's paths, the usual task dirs, the homes and /tmp).
STANDARD_WRITABLE = ("/workdir", "/app", "/logs", "/tests", "/solution", "/home/user", "/root", "/tmp")
_LOG_SUBDIRS = ("agent", "verifier", "artifacts")

_ID_SAFE = re.compile(r"[^A-Za-z0-9_-]+")


class SandboxError(RuntimeError):
    """Base class of the local sandbox's own errors."""


class SandboxStartError(SandboxError):
    """The sandbox could not be started (bwrap failed, or did not become ready in time)."""


class SandboxNotRunningError(SandboxError):
    """An operation on a sandbox that is not running: never started, stopped, or dead (its init is gone)."""


class SandboxExecTimeoutError(SandboxError):
    """An exec ran past its timeout; its whole process group was killed.

    The message matches Harbor's docker backend (`Command timed out after N seconds`). `stdout` / `stderr` hold
    what the command printed before it was killed.
    """

    def __init__(self, timeout_sec: float, stdout: str | None = None, stderr: str | None = None):
        super().__init__(f"Command timed out after {timeout_sec} seconds")
        self.timeout_sec = timeout_sec
        self.stdout = stdout
        self.stderr = stderr


@dataclass(frozen=True)
class _Mount:
    target: PurePosixPath
    kind: str  # "ro" | "rw" | "tmpfs" | "proc" | "dev" | "symlink"
    source: Path | None = None
    link: str | None = None
    optional: bool = False  # bind only if the source still exists (entries bound back into a shadow)


def _under(p: PurePosixPath, q: PurePosixPath) -> bool:
    """Whether `p` is `q` or below it (both normalized absolute paths; compared by parts: `q in p.parents` builds
    every parent path and costs a sandbox start milliseconds)."""
    qp = q.parts
    return p.parts[: len(qp)] == qp


def _norm(path: str | PurePosixPath, base: str | None = None) -> PurePosixPath:
    return _df._abs(str(path), base or "/")


class LocalSandboxEnvironment(BaseEnvironment):
    """Harbor environment backed by a local bubblewrap sandbox (development/CI; no security boundary; no builds).

    Load it through Harbor's factory with `import_path="raygrpo.sandbox.local:LocalSandboxEnvironment"`; extra
    keyword arguments come from `TrialEnvironmentConfig.kwargs`. See the module docstring for what a sandbox is.

    Args:
        environment_dir, environment_name, session_id, trial_paths, task_env_config, logger:
            as for every Harbor `BaseEnvironment` (passed by Harbor's factory).
        sandbox_root (`str`, *optional*):
            host directory that holds the sandboxes' directories; default `$RAYGRPO_SANDBOX_ROOT`, else
            `/tmp/raygrpo-sandboxes`. The reaper (`raygrpo.sandbox.registry.reap_orphans`) must be given the same.
        owner_id (`str`, *optional*):
            label recorded as the sandbox's owner (default: the Ray actor name when running in an actor).
        keep_dir (`bool`, defaults to `False`):
            keep the sandbox's host directory after `stop()` (for debugging); it is marked stopped and never
            reaped. `stop(delete=...)` does not control this: there is no image to delete, and callers that pass
            `delete=False` to keep docker images must not leave directories behind.
        writable_dirs (`list[str]`, *optional*):
            more sandbox directories to make writable, besides the standard ones.
        start_timeout_s (`float`, defaults to `30.0`):
            how long `start()` waits for the sandbox's init to come up.
        max_output_bytes (`int`, defaults to `16 MiB`):
            cap on the stdout and on the stderr an exec returns (the rest is cut, with a note).
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
        start_timeout_s: float = 30.0,
        max_output_bytes: int = 16 * 1024 * 1024,
        **kwargs: Any,
    ):
        # Set before BaseEnvironment.__init__, which calls _validate_definition.
        self._plan: _df.DockerfilePlan | None = None
        self._root = Path(sandbox_root or os.environ.get(_reg.ROOT_ENV) or _reg.DEFAULT_ROOT)
        self._owner_id = owner_id
        self._keep_dir = keep_dir
        self._extra_writable = list(writable_dirs or [])
        self._start_timeout_s = start_timeout_s
        self._max_output = max_output_bytes
        self._reg: _reg.Registration | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._info_task: asyncio.Future[bytes] | None = None
        self._init_pid: int | None = None
        self._init_start: int | None = None
        self._mount_table: list[_Mount] = []
        self._state = "new"  # new -> starting -> running -> stopped
        self._netns = False
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
        return EnvironmentCapabilities(disable_internet=True, mounted=True)

    @classmethod
    def preflight(cls) -> None:
        """Fail early (before any trial is queued) when bwrap or nsenter is missing."""
        missing = [tool for tool in (BWRAP, NSENTER) if not os.access(tool, os.X_OK)]
        if missing:
            raise SystemExit(
                f"raygrpo local sandbox needs {', '.join(missing)} (Debian: apt-get install bubblewrap util-linux)"
            )

    def _validate_definition(self) -> None:
        if self.task_env_config.os == TaskOS.WINDOWS:
            raise RuntimeError("the raygrpo local sandbox runs Linux tasks only")
        env_dir = Path(self.environment_dir)
        if not (env_dir / "Dockerfile").exists() and (env_dir / "docker-compose.yaml").exists():
            raise ValueError(
                f"{env_dir}: docker-compose environments (several containers) are not supported by the raygrpo "
                "local sandbox; give the task an environment/Dockerfile"
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
        return self._init_pid if self._state == "running" else None

    @property
    def workdir(self) -> str:
        """Where execs run by default: the task's `workdir`, else the Dockerfile's `WORKDIR`, else `/`."""
        return self.task_env_config.workdir or (self._plan.workdir if self._plan else None) or "/"

    def is_running(self) -> bool:
        """Whether the sandbox is started and its init still alive."""
        return self._state == "running" and _reg.pid_alive(self._init_pid, self._init_start)

    # ------------------------------------------------------------------ start / stop

    async def start(self, force_build: bool) -> None:
        """Create the sandbox: its host directory and writable dirs, the Dockerfile's files, and its init."""
        if self._state != "new":
            raise SandboxError(f"sandbox {self.sandbox_id or self.session_id} was already started")
        self._state = "starting"
        if self._plan is not None:
            _df.report_skipped(self._plan)
        elif self.task_env_config.docker_image:
            _log_once(
                f"image:{self.environment_dir}",
                "%s: docker_image %s is not pulled by the local sandbox; the sandbox sees the host's files",
                self.environment_dir,
                self.task_env_config.docker_image,
            )
        # No network when either the runtime policy (what Harbor's Trial passes) or the task itself asks for none:
        # callers that build environments without a policy still get what the task declares.
        self._netns = NetworkMode.NO_NETWORK in (
            self.network_policy.network_mode,
            getattr(self.task_env_config, "network_mode", None),
        )
        self.sandbox_id = f"{_ID_SAFE.sub('-', self.session_id)[:48].strip('-') or 'sbx'}-{uuid.uuid4().hex[:8]}"
        self._hostname = self.sandbox_id[:63]
        self._reg = _reg.Registration(self._root, self.sandbox_id, self._owner_id)
        prepare = asyncio.ensure_future(asyncio.to_thread(self._prepare_host_dir))
        try:
            await asyncio.shield(prepare)
            await self._launch()
        except BaseException:
            # A cancelled start must not leave the preparing thread writing into a directory being removed.
            with contextlib.suppress(BaseException):
                await prepare
            await self._teardown()
            raise
        self._state = "running"
        await self._upload_environment_dir_after_start()

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
        cancelled: asyncio.CancelledError | None = None
        info_task = self._info_task
        if self._init_pid is None and info_task is not None:
            # A start cut short: learn the init's pid before killing anything. Killing only the bwrap monitor
            # could race with the init arming its parent-death signal and leave it running.
            try:
                await asyncio.wait([info_task], timeout=2)
            except asyncio.CancelledError as e:
                cancelled = e
            if info_task.done() and not info_task.cancelled() and info_task.exception() is None:
                with contextlib.suppress(ValueError, KeyError):
                    self._note_init(info_task.result())
            else:
                info_task.cancel()
        # Killing the PID namespace's init makes the kernel kill every process in the namespace. Its parent, the
        # bwrap monitor, then reaps it and exits by itself: the monitor is killed only when it does not (killing it
        # first would orphan the init's zombie to the host's init, which may reap it late).
        proc = self._proc
        if self._init_pid and _reg.pid_alive(self._init_pid, self._init_start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._init_pid, signal.SIGKILL)
        for grace in (3.0, 5.0):
            if proc is None or proc.returncode is not None:
                break
            if grace > 3.0 or not self._init_pid:
                # os.kill, not proc.kill(): Popen.kill() polls first and may reap behind asyncio's child watcher.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=grace)
            except asyncio.CancelledError as e:
                cancelled = e
            except asyncio.TimeoutError:
                continue
        if self._reg is not None:
            # Double-check through /proc (by the sandbox's environment mark), then remove the directory.
            release = asyncio.ensure_future(asyncio.to_thread(self._release, self._reg))
            while not release.done():
                try:
                    await asyncio.shield(release)
                except asyncio.CancelledError as e:
                    cancelled = e
            release.result()
        if cancelled is not None:
            raise cancelled

    def _release(self, reg: _reg.Registration) -> None:
        if reg.dir.exists():
            _reg.kill_sandbox_processes(reg.dir, reg.sandbox_id, self._root, timeout_s=5.0)
        reg.release(remove=not self._keep_dir)

    # ------------------------------------------------------------------ host directory and mounts

    def _prepare_host_dir(self) -> None:
        assert self._reg is not None
        d = self._reg.create()
        fs = d / "fs"
        fs.mkdir()
        (d / "exec").mkdir()
        self._mount_table = self._layout(fs)
        for sub in _LOG_SUBDIRS:
            host = self._host_path(PurePosixPath("/logs") / sub)
            if host is not None:
                host.mkdir(parents=True, exist_ok=True)
                os.chmod(host, 0o777)
        for path in ("/tmp",):
            host = self._host_path(PurePosixPath(path))
            if host is not None:
                os.chmod(host, 0o1777)
        if self._plan is not None:
            for step in self._plan.copies:
                self._apply_copy(step)

    def _layout(self, fs: Path) -> list[_Mount]:
        """The sandbox's mount table, in the order bwrap applies it; creates the host side of writable mounts."""
        mounts: list[_Mount] = [_Mount(PurePosixPath("/"), "tmpfs")]
        for name in EXPOSED_DIRS:
            if os.path.isdir(f"/{name}"):
                mounts.append(_Mount(PurePosixPath(f"/{name}"), "ro", Path(f"/{name}")))
        for name in LINK_DIRS:
            p = f"/{name}"
            if os.path.islink(p):
                mounts.append(_Mount(PurePosixPath(p), "symlink", link=os.readlink(p)))
            elif os.path.isdir(p):
                mounts.append(_Mount(PurePosixPath(p), "ro", Path(p)))
        mounts += [
            _Mount(PurePosixPath("/sys"), "ro", Path("/sys")),
            _Mount(PurePosixPath("/proc"), "proc"),
            _Mount(PurePosixPath("/dev"), "dev"),
            _Mount(PurePosixPath("/dev/shm"), "tmpfs"),
            _Mount(PurePosixPath("/run"), "tmpfs"),
        ]
        if os.path.isdir("/var/tmp"):
            mounts.append(_Mount(PurePosixPath("/var/tmp"), "tmpfs"))

        user_mounts = [m for m in (self._host_mounts or []) if m.get("type") == "bind"]
        wanted: list[PurePosixPath] = [PurePosixPath(p) for p in STANDARD_WRITABLE]
        if self._plan is not None:
            wanted += self._plan.writable_dirs()
        if self.task_env_config.workdir:
            wanted.append(_norm(self.task_env_config.workdir))
        wanted += [_norm(p) for p in self._extra_writable]
        wanted += [_norm(m["target"]) for m in user_mounts]
        wanted = [self._resolve_links(p, mounts) for p in wanted]
        for p in wanted:
            if p.parts[1:2] and p.parts[1] in ("proc", "sys", "dev"):
                raise ValueError(f"cannot make {p} writable in the local sandbox")
        roots: list[PurePosixPath] = []
        for p in sorted(set(wanted), key=lambda q: (len(q.parts), str(q))):
            if p != PurePosixPath("/") and not any(_under(p, r) for r in roots):
                roots.append(p)

        def covering(p: PurePosixPath) -> _Mount:
            best = mounts[0]
            for m in mounts:
                if m.kind != "symlink" and _under(p, m.target) and len(m.target.parts) >= len(best.target.parts):
                    best = m
            return best

        def host_of(p: PurePosixPath) -> Path | None:
            m = covering(p)
            if m.source is None:
                return None
            return m.source.joinpath(*p.parts[len(m.target.parts) :])

        # Writable roots inside a read-only host tree need a shadow of their deepest existing ancestor: a writable
        # copy whose existing entries are bound back read-only. Shallow shadows first, so deeper ones stack on top.
        shadows: set[PurePosixPath] = set()
        for p in roots:
            if covering(p).kind not in ("ro",):
                continue
            a = p
            while a != PurePosixPath("/"):
                h = host_of(a)
                if h is not None and h.is_dir() and not h.is_symlink():
                    break
                a = a.parent
            if a == PurePosixPath("/"):
                raise ValueError(f"cannot make {p} writable in the local sandbox")
            shadows.add(a)
        for a in sorted(shadows, key=lambda q: (len(q.parts), str(q))):
            src = host_of(a)
            assert src is not None
            dst = fs.joinpath(*a.parts[1:])
            dst.mkdir(parents=True, exist_ok=True)
            children: list[_Mount] = []
            for entry in sorted(os.scandir(src), key=lambda e: e.name):
                target = dst / entry.name
                if entry.is_symlink():
                    if not target.is_symlink():
                        os.symlink(os.readlink(entry.path), target)
                elif entry.is_dir():
                    target.mkdir(exist_ok=True)
                    children.append(_Mount(a / entry.name, "ro", Path(entry.path), optional=True))
                elif entry.is_file():
                    target.touch(exist_ok=True)
                    children.append(_Mount(a / entry.name, "ro", Path(entry.path), optional=True))
            shutil.copymode(src, dst)
            mounts.append(_Mount(a, "rw", dst))
            mounts.extend(children)
        for p in roots:
            m = covering(p)
            if m.kind == "rw":
                host = host_of(p)
                assert host is not None
                host.mkdir(parents=True, exist_ok=True)
            elif m.kind == "tmpfs":
                host = fs.joinpath(*p.parts[1:])
                host.mkdir(parents=True, exist_ok=True)
                mounts.append(_Mount(p, "rw", host))
            else:
                raise ValueError(f"cannot make {p} writable in the local sandbox (under {m.target})")
        for m in user_mounts:
            target = _norm(m["target"])
            source = Path(m["source"]).absolute()
            if not source.exists():
                source.mkdir(parents=True, exist_ok=True)
            host = host_of(target)
            if host is not None and not host.exists():
                if source.is_dir():
                    host.mkdir(parents=True, exist_ok=True)
                else:
                    host.parent.mkdir(parents=True, exist_ok=True)
                    host.touch()
            mounts.append(_Mount(target, "ro" if m.get("read_only") else "rw", source))
        return mounts

    @staticmethod
    def _resolve_links(p: PurePosixPath, mounts: list[_Mount]) -> PurePosixPath:
        """Resolve a path through the host's top-level symlinks (`/lib/x` -> `/usr/lib/x`)."""
        if len(p.parts) > 1:
            for m in mounts:
                if m.kind == "symlink" and m.target == PurePosixPath("/", p.parts[1]):
                    link = PurePosixPath(m.link or "")
                    base = link if link.is_absolute() else PurePosixPath("/") / link
                    return _norm(base.joinpath(*p.parts[2:]))
        return p

    def _bwrap_argv(self) -> list[str]:
        argv = [BWRAP]
        for m in self._mount_table:
            t = str(m.target)
            if m.kind == "tmpfs":
                if t != "/":
                    argv += ["--tmpfs", t]
            elif m.kind == "ro":
                argv += ["--ro-bind-try" if m.optional else "--ro-bind", str(m.source), t]
            elif m.kind == "rw":
                argv += ["--bind", str(m.source), t]
            elif m.kind == "symlink":
                argv += ["--symlink", str(m.link), t]
            elif m.kind == "proc":
                argv += ["--proc", t]
            elif m.kind == "dev":
                argv += ["--dev", t]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", self._hostname]
        if self._netns:
            argv += ["--unshare-net"]
        if os.geteuid() != 0:
            argv += ["--unshare-user"]
        argv += ["--die-with-parent", "--new-session", "--chdir", "/"]
        return argv

    def _host_path(self, sandbox_path: str | PurePosixPath, *, writable_only: bool = True) -> Path | None:
        """The host path backing `sandbox_path`, or None when it is not in a writable host-backed mount.

        None too when a component under the mount is a symlink: the sandbox resolves it differently from the host,
        so such paths go through the sandbox itself.
        """
        p = self._resolve_links(_norm(sandbox_path, self.workdir), self._mount_table)
        best: _Mount | None = None
        for m in self._mount_table:
            if m.kind != "symlink" and _under(p, m.target):
                if best is None or len(m.target.parts) >= len(best.target.parts):
                    best = m
        if best is None or best.source is None or (writable_only and best.kind != "rw"):
            return None
        host = best.source
        for part in p.parts[len(best.target.parts) :]:
            host = host / part
            if host.is_symlink():
                return None
        return host

    def _apply_copy(self, step: _df.CopyStep) -> None:
        dest = self._host_path(step.dest)
        if dest is None:
            raise SandboxStartError(f"{self._plan.path if self._plan else ''}:{step.line}: cannot write {step.dest}")
        many = step.dest_is_dir or len(step.sources) + len(step.inline) > 1
        created: list[Path] = []
        for src in step.sources:
            if src.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
                created.append(dest)
            else:
                target = dest / src.name if (many or dest.is_dir()) else dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target)
                created.append(target)
        for name, content in step.inline:
            target = dest / name if (many or dest.is_dir()) else dest
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            created.append(target)
        if step.chmod is not None:
            for path in created:
                for sub in [path, *(path.rglob("*") if path.is_dir() else [])]:
                    if not sub.is_symlink():
                        os.chmod(sub, step.chmod)

    # ------------------------------------------------------------------ the init process

    async def _launch(self) -> None:
        """Start the sandbox's init and wait until it runs inside its finished mounts.

        Two pipes come back from bwrap: `--info-fd` gives the init's host pid as soon as it is cloned (so a
        cancelled start can still kill it), and the init's first command writes `ready` on the other once the
        mounts are in place (an exec before that could see a half-built filesystem). bwrap's stdout is not a pipe:
        waiting for its exit must not depend on pipes held open by the sandbox.
        """
        assert self._reg is not None
        d = self._reg.dir
        info_r, info_w = os.pipe()
        ready_r, ready_w = os.pipe()
        init = f"echo ready >&{ready_w}; exec {ready_w}>&-; exec sleep infinity"
        argv = self._bwrap_argv() + ["--info-fd", str(info_w), "--", "/bin/bash", "-c", init]  # dash: fds < 10
        env = {"PATH": _df.DEFAULT_PATH, "HOME": "/root", _reg.ID_ENV: self.sandbox_id, _reg.ROOT_ENV: str(self._root)}
        with open(d / "init.log", "wb") as log:
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=log,
                    env=env,
                    pass_fds=(info_w, ready_w),
                    start_new_session=True,
                )
            except BaseException:
                os.close(info_r)
                os.close(ready_r)
                raise
            finally:
                os.close(info_w)
                os.close(ready_w)
        self._reg.record_processes(self._proc.pid, None)
        self._info_task = _read_pipe(info_r)
        ready_task = _read_pipe(ready_r, line=True)
        try:
            async with asyncio.timeout(self._start_timeout_s):
                info = await asyncio.shield(self._info_task)
                self._note_init(info)
                ready = await ready_task
        except TimeoutError:
            raise SandboxStartError(
                f"sandbox {self.sandbox_id} did not come up within {self._start_timeout_s}s: {self._init_log()}"
            ) from None
        finally:
            ready_task.cancel()
        if ready.strip() != b"ready":
            await self._proc.wait()
            raise SandboxStartError(
                f"sandbox {self.sandbox_id} failed to start (bwrap exit {self._proc.returncode}): {self._init_log()}"
            )

    def _note_init(self, info: bytes) -> None:
        """Record the init's host pid from bwrap's `--info-fd` JSON (empty when bwrap died first)."""
        if not info.strip() or self._init_pid is not None or self._reg is None:
            return
        self._init_pid = int(json.loads(info)["child-pid"])
        self._init_start = _reg.proc_start_time(self._init_pid)
        self._reg.record_processes(self._proc.pid if self._proc else 0, self._init_pid)

    def _init_log(self) -> str:
        try:
            return (self._reg.dir / "init.log").read_text(errors="replace").strip()[-2000:] if self._reg else ""
        except OSError:
            return ""

    # ------------------------------------------------------------------ exec

    def _require_running(self) -> None:
        if self._state != "running":
            raise SandboxNotRunningError(f"sandbox {self.sandbox_id or self.session_id} is not running ({self._state})")
        if not _reg.pid_alive(self._init_pid, self._init_start):
            raise SandboxNotRunningError(f"sandbox {self.sandbox_id} is dead: its init process is gone")

    def _user_prefix(self, user: str | int | None) -> tuple[list[str], str]:
        """The `setpriv` prefix that runs as `user`, and that user's home."""
        if user is None or user in ("root", 0, "0"):
            return [], "/root"
        try:
            pw = pwd.getpwuid(int(user)) if str(user).isdigit() else pwd.getpwnam(str(user))
            uid, gid, home = pw.pw_uid, pw.pw_gid, pw.pw_dir
        except KeyError:
            if str(user).isdigit():
                uid = gid = int(user)
                home = "/home/user"
            else:
                _log_once(
                    f"user:{self.environment_dir}:{user}",
                    "%s: user %r does not exist on this host (a skipped RUN step may create it); the local sandbox "
                    "runs as root instead",
                    self.environment_dir,
                    user,
                )
                return [], "/root"
        if uid == 0:
            return [], "/root"
        return [_TOOL["setpriv"], f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"], home

    def _exec_env(self, env: dict[str, str] | None, home: str) -> dict[str, str]:
        out = {"PATH": _df.DEFAULT_PATH, "HOME": home, "HOSTNAME": self._hostname}
        if self._plan is not None:
            out.update(self._plan.env)
        out.update(self._merge_env(env) or {})
        out[_reg.ID_ENV] = self.sandbox_id
        out[_reg.ROOT_ENV] = str(self._root)
        return out

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `bash -c command` in the sandbox; kill its process group and raise at `timeout_sec`.

        Raises:
            SandboxExecTimeoutError: the command ran past `timeout_sec` (its processes were killed).
            SandboxNotRunningError: the sandbox is not running (never started, stopped, or dead).
        """
        return await self._run(["/bin/bash", "-c", command], cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)

    async def _run(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: float | None = None,
        user: str | int | None = None,
        stdin_data: bytes | None = None,
        binary_stdout: bool = False,
    ) -> Any:
        self._require_running()
        assert self._reg is not None
        prefix, home = self._user_prefix(self._resolve_user(user))
        workdir = str(_norm(cwd, self.workdir)) if cwd else self.workdir
        ns = [NSENTER, "-t", str(self._init_pid), "-m", "-p", "-i", "-u", "-r"]
        if self._netns:
            ns.append("-n")
        if os.geteuid() != 0:
            ns += ["-U", "--preserve-credentials"]
        full = ns + ["--", *prefix, _TOOL["env"], f"--chdir={workdir}", *argv]
        tag = uuid.uuid4().hex[:12]
        out_path = self._reg.dir / "exec" / f"{tag}.out"
        err_path = self._reg.dir / "exec" / f"{tag}.err"
        try:
            with open(out_path, "wb") as out_f, open(err_path, "wb") as err_f:
                proc = await asyncio.create_subprocess_exec(
                    *full,
                    stdin=asyncio.subprocess.PIPE if stdin_data is not None else asyncio.subprocess.DEVNULL,
                    stdout=out_f,
                    stderr=err_f,
                    env=self._exec_env(env, home),
                    start_new_session=True,  # its own process group, killed as a whole on timeout
                )
            try:
                async with asyncio.timeout(timeout_sec if timeout_sec else None):
                    if stdin_data is not None:
                        await proc.communicate(stdin_data)
                    else:
                        await proc.wait()
            except TimeoutError:
                await _kill_group(proc)
                raise SandboxExecTimeoutError(
                    timeout_sec or 0, self._read_output(out_path), self._read_output(err_path)
                ) from None
            except BaseException:
                await _kill_group(proc)
                raise
            rc = proc.returncode if proc.returncode is not None else 0
            if rc < 0:
                rc = 128 - rc  # killed by a signal: report it as a shell would
            if rc != 0 and not _reg.pid_alive(self._init_pid, self._init_start):
                raise SandboxNotRunningError(f"sandbox {self.sandbox_id} died during the exec (exit {rc})")
            if binary_stdout:
                return rc, out_path.read_bytes(), self._read_output(err_path)
            return ExecResult(stdout=self._read_output(out_path), stderr=self._read_output(err_path), return_code=rc)
        finally:
            for path in (out_path, err_path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def _read_output(self, path: Path) -> str | None:
        try:
            with open(path, "rb") as f:
                data = f.read(self._max_output + 1)
        except FileNotFoundError:
            return None
        if not data:
            return None
        text = data[: self._max_output].decode(errors="replace")
        if len(data) > self._max_output:
            text += f"\n[raygrpo local sandbox: output cut at {self._max_output} bytes]"
        return text

    # ------------------------------------------------------------------ file transfer

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a host file into the sandbox (into `target_path` when it is a directory or ends with `/`)."""
        self._require_running()
        source = Path(source_path)
        host = self._host_path(target_path)
        if host is not None:
            def copy() -> None:
                target = host / source.name if (target_path.endswith("/") or host.is_dir()) else host
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)

            await asyncio.to_thread(copy)
            return
        target = _norm(target_path, self.workdir)
        is_dir = target_path.endswith("/") or (await self._run([_TOOL["test"], "-d", str(target)])).return_code == 0
        parent, name = (target, source.name) if is_dir else (target.parent, target.name)
        await self._untar_into(parent, _tar_of([(source, name)]))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy the contents of a host directory into `target_dir` in the sandbox (created if missing)."""
        self._require_running()
        source = Path(source_dir)
        host = self._host_path(target_dir)
        if host is not None:
            await asyncio.to_thread(lambda: shutil.copytree(source, host, symlinks=True, dirs_exist_ok=True))
            return
        await self._untar_into(
            _norm(target_dir, self.workdir), _tar_of([(p, p.relative_to(source).as_posix()) for p in source.iterdir()])
        )

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a file from the sandbox to a host path (parent directories are created)."""
        self._require_running()
        target = Path(target_path)
        host = self._host_path(source_path, writable_only=False)
        target.parent.mkdir(parents=True, exist_ok=True)
        if host is not None and host.is_file():
            await asyncio.to_thread(shutil.copy2, host, target)
            return
        rc, data, err = await self._run(
            [_TOOL["cat"], "--", str(_norm(source_path, self.workdir))], binary_stdout=True
        )
        if rc != 0:
            raise FileNotFoundError(f"cannot download {source_path} from sandbox {self.sandbox_id}: {err}")
        await asyncio.to_thread(target.write_bytes, data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy the contents of a sandbox directory into a host directory (overwriting files)."""
        self._require_running()
        target = Path(target_dir)
        host = self._host_path(source_dir, writable_only=False)
        if host is not None and host.is_dir():
            await asyncio.to_thread(lambda: shutil.copytree(host, target, symlinks=True, dirs_exist_ok=True))
            return
        rc, data, err = await self._run(
            [_TOOL["tar"], "-cf", "-", "-C", str(_norm(source_dir, self.workdir)), "."], binary_stdout=True
        )
        if rc != 0:
            raise FileNotFoundError(f"cannot download {source_dir} from sandbox {self.sandbox_id}: {err}")

        def extract() -> None:
            target.mkdir(parents=True, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(data)) as tf:
                tf.extractall(target, filter=transfer_tar_filter)

        await asyncio.to_thread(extract)

    async def _untar_into(self, parent: PurePosixPath, data: bytes) -> None:
        result = await self._run(
            [_TOOL["sh"], "-c", f"mkdir -p {shlex.quote(str(parent))} && tar -xf - -C {shlex.quote(str(parent))}"],
            stdin_data=data,
        )
        if result.return_code != 0:
            raise RuntimeError(
                f"cannot write into {parent} in sandbox {self.sandbox_id} (only the sandbox's own directories are "
                f"writable; the host's are read-only): {result.stderr or result.stdout}"
            )


def _tar_of(items: list[tuple[Path, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path, arcname in items:
            tf.add(path, arcname=arcname)
    return buf.getvalue()


def _read_pipe(fd: int, *, line: bool = False) -> asyncio.Future[bytes]:
    """A task reading a pipe to EOF (or one line) on the running loop; the fd is closed however the task ends."""
    pipe = os.fdopen(fd, "rb", 0)

    async def read() -> bytes:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        try:
            return await (reader.readline() if line else reader.read())
        finally:
            transport.close()

    task = asyncio.ensure_future(read())
    task.add_done_callback(lambda _: pipe.close())  # also when cancelled before it ever ran
    return task


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group an exec runs in, and reap its leader (shielded from cancellation).

    The members are killed before the leader (`nsenter`, outside the sandbox): nsenter then reaps its child inside
    the sandbox as it exits. Killing them all at once would orphan that child to the host's init, whose late reaping
    keeps a PID of the sandbox's namespace allocated and can delay the sandbox's teardown by seconds.
    """
    pgid = proc.pid
    for pid in _group_members(pgid):
        if pid != pgid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=2)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)  # the leader if it is still there, and anything forked since
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=5)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    members.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return members


_logged_once: set[str] = set()


def _log_once(key: str, msg: str, *args: Any) -> None:
    if key in _logged_once:
        return
    _logged_once.add(key)
    _log.warning(msg, *args)


__all__ = [
    "LocalSandboxEnvironment",
    "SandboxError",
    "SandboxExecTimeoutError",
    "SandboxNotRunningError",
    "SandboxStartError",
]
