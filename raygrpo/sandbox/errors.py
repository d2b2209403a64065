"""The local sandbox's own errors (`raygrpo.sandbox.local`), apart from its lifecycle and its commands, which both
raise them."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """Base class of the local sandbox's own errors."""


class SandboxStartError(SandboxError):
    """The sandbox could not be started (bwrap failed, or did not become ready in time)."""


class SandboxDefinitionError(SandboxStartError):
    """The task's environment cannot be laid out by the local sandbox (a `COPY` destination it cannot make
    writable): every start of the task fails alike, so the caller treats it as the task's fault, not the machine's."""


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
