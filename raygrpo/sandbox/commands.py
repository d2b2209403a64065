"""Harbor's `exec` for the local sandbox (`raygrpo.sandbox.local`): each command enters the sandbox's namespaces with
`nsenter` and runs as `bash -c` in its own process group, with the sandbox's environment, as the requested user.
Separate from the sandbox's lifecycle, which it only reads.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from harbor.environments.base import ExecResult

from raygrpo.sandbox import layout as _lay
from raygrpo.sandbox import process as _proc
from raygrpo.sandbox.os_probe import ID_ENV, ROOT_ENV
from raygrpo.sandbox.dockerfile import DEFAULT_PATH
from raygrpo.sandbox.errors import SandboxExecTimeoutError, SandboxNotRunningError

# Its warnings are the local sandbox's, under that logger's name.
_log = logging.getLogger("raygrpo.sandbox.local")


class SandboxCommands:
    """`exec` and the commands behind Harbor's file transfer (`_run`) for a sandbox whose init's namespaces they enter.

    A mixin of `raygrpo.sandbox.local.LocalSandboxEnvironment` (placed before `BaseEnvironment`), which provides what
    these methods use: `_state`, `_init`, `_reg`, `_hostname`, `_plan`, `_toolbox`, `_root`, `_max_output`,
    `_execs_running`, `sandbox_id`, `session_id`, `environment_dir`, `workdir`, and Harbor's `_resolve_user` and
    `_merge_env`.
    """

    def _require_running(self) -> None:
        if self._state != "running":
            raise SandboxNotRunningError(f"sandbox {self.sandbox_id or self.session_id} is not running ({self._state})")
        if not self._init.alive():
            raise SandboxNotRunningError(f"sandbox {self.sandbox_id} is dead: its init process is gone")

    def _user_prefix(self, user: str | int | None) -> tuple[list[str], str]:
        """The `setpriv` prefix that runs as `user`, and that user's home (root's for a user the host lacks)."""
        found = _proc.user_prefix(user)
        if found is None:
            log_once(
                f"user:{self.environment_dir}:{user}",
                "%s: user %r does not exist on this host (a skipped RUN step may create it); the local sandbox "
                "runs as root instead",
                self.environment_dir,
                user,
            )
            return [*_proc.CAPS_PREFIX, "--"], "/root"
        return found

    def _exec_env(self, env: dict[str, str] | None, home: str) -> dict[str, str]:
        out = {"PATH": DEFAULT_PATH, "HOME": home, "HOSTNAME": self._hostname}
        if self._plan is not None:
            out.update(self._plan.env)
        if self._toolbox is not None:
            out["PATH"] = f"{self._toolbox / 'bin'}:{out['PATH']}"
        out.update(self._merge_env(env) or {})
        out[ID_ENV] = self.sandbox_id
        out[ROOT_ENV] = str(self._root)
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
        return await self._run([_proc.BASH, "-c", command], cwd=cwd, env=env, timeout_sec=timeout_sec, user=user)

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
        workdir = str(_lay.norm(cwd, self.workdir)) if cwd else self.workdir
        # `nsenter`, on the host, carries both marks (`_exec_env`: a stop finds it by them); what runs inside does
        # not learn the sandbox root's host path (`env -u`, so not even in its `/proc/<pid>/environ`).
        prefix = [*prefix, _proc.TOOL["env"], "-u", ROOT_ENV]
        full = _proc.nsenter_argv(self._init.pid, prefix=prefix, workdir=workdir, argv=argv)
        self._execs_running += 1
        try:
            rc, stdout, stderr = await _proc.run_in_group(
                full,
                env=self._exec_env(env, home),
                timeout_sec=timeout_sec,
                max_output=self._max_output,
                stdin_data=stdin_data,
                binary_stdout=binary_stdout,
            )
        except _proc.ExecTimeout as e:
            raise SandboxExecTimeoutError(timeout_sec or 0, e.stdout, e.stderr) from None
        finally:
            self._execs_running -= 1
        # A stop that began during the exec kills the init, whose namespace's processes die (and their nsenter
        # returns) before the init itself is seen dead: a failed exec of a stopping sandbox is its stop.
        stopping = self._state == "stopped"
        if rc != 0 and (stopping or not self._init.alive() or await self._could_not_enter(stderr)):
            raise SandboxNotRunningError(f"sandbox {self.sandbox_id} died during the exec (exit {rc})")
        if binary_stdout:
            return rc, stdout, stderr
        return ExecResult(stdout=stdout, stderr=stderr, return_code=rc)

    async def _could_not_enter(self, stderr: Any) -> bool:
        """Whether nsenter failed to enter the sandbox because its init is dying.

        A SIGKILLed init gives up its namespaces before it shows as dead in /proc, so an exec in that window fails
        inside nsenter while the init still looks alive; give it a moment to finish dying.
        """
        text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else (stderr or "")
        if not any(line.startswith(("nsenter: cannot open", "nsenter: reassociate")) for line in text.splitlines()):
            return False
        for _ in range(50):
            if not self._init.alive():
                return True
            await asyncio.sleep(0.02)
        return False


_logged_once: set[str] = set()


def log_once(key: str, msg: str, *args: Any) -> None:
    """A warning logged once per `key` in this process (per task folder and user, not per sandbox)."""
    if key in _logged_once:
        return
    _logged_once.add(key)
    _log.warning(msg, *args)
