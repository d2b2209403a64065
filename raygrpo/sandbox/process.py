"""Process plumbing of the local sandbox: its init process, running commands inside it, and killing them.

`raygrpo.sandbox.local` owns the sandbox's lifecycle; the helpers here need no environment object. `InitProcess`
starts the sandbox's init under bwrap, learns its host pid and kills it. An exec is `nsenter` into the init's
namespaces (`nsenter_argv`), run in a process group of its own with its output in anonymous in-memory files
(`run_in_group`, `read_output`); a timeout kills the whole group (`kill_group`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import pwd
import shlex
import shutil
import signal
import tarfile
from pathlib import Path

from harbor.environments.base import transfer_tar_filter

from raygrpo.sandbox import owners as _reg
from raygrpo.sandbox.os_probe import proc_start_ticks

NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
# Tools run inside the sandbox, by absolute path (a task's ENV PATH may not include them); the sandbox's /usr is
# the host's, so the host's locations are the sandbox's.
BASH = "/bin/bash"
TOOL = {name: shutil.which(name) or f"/usr/bin/{name}" for name in ("env", "setpriv", "cat", "tar", "test", "sh")}


#: What the init runs once the sandbox is up, as PID 1 of its namespace (bwrap's `--as-pid-1`), as a container's
#: init is: the kernel never delivers a signal to it from inside that it does not handle, so a model's `kill -9 -1`
#: kills its own processes but not the sandbox (on docker too, the verifier then judges what is left), and the
#: `sleep` it waits on is started again. Bash's `wait` reaps every child, so the orphans the sandbox's processes
#: leave behind (reparented to it) are reaped as bwrap's own init reaped them (`sleep` alone would keep them as
#: zombies).
INIT_LOOP = "while :; do sleep infinity & wait; done"


class InitProcess:
    """A sandbox's init (PID 1 of its namespace: bash waiting on `sleep infinity`, `INIT_LOOP`) and the bwrap monitor
    that is its parent.

    `pid` is the init's host pid once known (None before; checked with its start time against reuse); `proc` is the
    bwrap monitor.
    """

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.info_task: asyncio.Future[bytes] | None = None
        self.pid: int | None = None
        self._start_ticks: int | None = None
        self._reg: _reg.Registration | None = None

    def alive(self) -> bool:
        """Whether the init is running and is still the process that was started (not a reused pid)."""
        return self._start_ticks is not None and proc_start_ticks(self.pid) == self._start_ticks

    async def start(self, bwrap: list[str], env: dict[str, str], log_path: Path, reg: _reg.Registration,
                    timeout_s: float) -> bool:
        """Start the init under `bwrap` and wait until it runs inside its finished mounts; False when bwrap
        failed (it has then exited). Its processes are recorded in `reg`.

        Two pipes come back from bwrap: `--info-fd` gives the init's host pid as soon as it is cloned (so a
        cancelled start can still kill it), and the init's first command writes `ready` on the other once the
        mounts are in place (an exec before that could see a half-built filesystem). bwrap's stdout is not a pipe:
        waiting for its exit must not depend on pipes held open by the sandbox.

        Raises:
            TimeoutError: the init did not come up within `timeout_s`.
        """
        self._reg = reg
        info_r, info_w = os.pipe()
        ready_r, ready_w = os.pipe()
        init = f"echo ready >&{ready_w}; exec {ready_w}>&-; {INIT_LOOP}"
        argv = bwrap + ["--info-fd", str(info_w), "--", BASH, "-c", init]  # dash: fds < 10
        with open(log_path, "wb") as log:
            try:
                self.proc = await asyncio.create_subprocess_exec(
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
        reg.record_processes(self.proc.pid, None)
        self.info_task = read_pipe(info_r)
        ready_task = read_pipe(ready_r, line=True)
        try:
            async with asyncio.timeout(timeout_s):
                info = await asyncio.shield(self.info_task)
                self.note(info)
                ready = await ready_task
        finally:
            ready_task.cancel()
        if ready.strip() != b"ready":
            await self.proc.wait()
            return False
        return True

    def note(self, info: bytes) -> None:
        """Record the init's host pid from bwrap's `--info-fd` JSON (empty when bwrap died first)."""
        if not info.strip() or self.pid is not None or self._reg is None:
            return
        self.pid = int(json.loads(info)["child-pid"])
        self._start_ticks = proc_start_ticks(self.pid)
        self._reg.record_processes(self.proc.pid if self.proc else 0, self.pid)

    def reaped(self) -> bool:
        """Whether the init is known, dead, and reaped by its bwrap monitor, which has exited: its PID namespace
        then holds no process (the kernel kills them all and the init's exit waits for them)."""
        return (
            self.pid is not None and self.proc is not None and self.proc.returncode is not None and not self.alive()
        )

    async def kill(self) -> asyncio.CancelledError | None:
        """Kill the init (and so every process of its PID namespace) and reap bwrap; runs to the end even when
        cancelled, and returns the cancellation it swallowed, for the caller to re-raise when done."""
        cancelled: asyncio.CancelledError | None = None
        info_task = self.info_task
        if self.pid is None and info_task is not None:
            # A start cut short: learn the init's pid before killing anything. Killing only the bwrap monitor
            # could race with the init arming its parent-death signal and leave it running.
            try:
                await asyncio.wait([info_task], timeout=2)
            except asyncio.CancelledError as e:
                cancelled = e
            if info_task.done() and not info_task.cancelled() and info_task.exception() is None:
                with contextlib.suppress(ValueError, KeyError):
                    self.note(info_task.result())
            else:
                info_task.cancel()
        # Killing the PID namespace's init makes the kernel kill every process in the namespace. Its parent, the
        # bwrap monitor, then reaps it and exits by itself: the monitor is killed only when it does not (killing it
        # first would orphan the init's zombie to the host's init, which may reap it late).
        proc = self.proc
        if self.pid and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        for grace in (3.0, 5.0):
            if proc is None or proc.returncode is not None:
                break
            if grace > 3.0 or not self.pid:
                # os.kill, not proc.kill(): Popen.kill() polls first and may reap behind asyncio's child watcher.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=grace)
            except asyncio.CancelledError as e:
                cancelled = e
            except asyncio.TimeoutError:
                continue
        return cancelled


#: The capabilities a sandbox's command keeps as root: Docker's default set less `CAP_MKNOD`. Never `CAP_SYS_ADMIN`
#: (mounts), `CAP_NET_ADMIN` (the namespace's firewall), `CAP_SYS_MODULE`, `CAP_SYS_PTRACE`, `CAP_SYS_RAWIO` or
#: `CAP_MKNOD` (a device node of the host's disk): an exec enters the sandbox's namespaces as the host's root, so the
#: bounding set is what keeps its root from being the host's.
KEPT_CAPS = ("chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap", "net_bind_service",
             "net_raw", "sys_chroot", "audit_write", "setfcap")
CAPS_PREFIX = [TOOL["setpriv"], "--bounding-set=-all," + ",".join(f"+{cap}" for cap in KEPT_CAPS), "--inh-caps=-all"]


def user_prefix(user: str | int | None) -> tuple[list[str], str] | None:
    """The `setpriv` prefix that runs as `user` with the sandbox's capability bounding set (`KEPT_CAPS`), and that
    user's home; None for a user name the host lacks."""
    if user is None or user in ("root", 0, "0"):
        return [*CAPS_PREFIX, "--"], "/root"
    try:
        pw = pwd.getpwuid(int(user)) if str(user).isdigit() else pwd.getpwnam(str(user))
        uid, gid, home = pw.pw_uid, pw.pw_gid, pw.pw_dir
    except KeyError:
        if not str(user).isdigit():
            return None
        uid = gid = int(user)
        home = "/home/user"
    if uid == 0:
        return [*CAPS_PREFIX, "--"], "/root"
    return [*CAPS_PREFIX, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"], home


def nsenter_argv(init_pid: int, *, prefix: list[str], workdir: str, argv: list[str]) -> list[str]:
    """The command line that runs `argv` in `workdir` inside the namespaces of the sandbox whose init is `init_pid`.

    nsenter cannot change to a directory of the sandbox, so `env --chdir` does, except for `bash -c <command>`
    (every `exec`), where bash's own `cd -P` does it on the command's first line: one program fewer per exec
    (~0.7 ms of CPU on these machines). The directory is the physical one (as `chdir` gives), `OLDPWD` stays
    unset, a missing directory exits 125 (as `env` does), and the command's line numbers are unchanged.
    """
    ns = [NSENTER, "-t", str(init_pid), "-m", "-p", "-i", "-u", "-n", "-r"]
    if os.geteuid() != 0:
        ns += ["-U", "--preserve-credentials"]
    if len(argv) == 3 and argv[:2] == [BASH, "-c"]:
        return ns + ["--", *prefix, BASH, "-c", f"cd -P -- {shlex.quote(workdir)} || exit 125; unset OLDPWD; {argv[2]}"]
    return ns + ["--", *prefix, TOOL["env"], f"--chdir={workdir}", *argv]


class ExecTimeout(TimeoutError):
    """`run_in_group` ran past its timeout; `stdout` / `stderr` hold what the command printed before it was killed."""

    def __init__(self, stdout: str | None, stderr: str | None):
        super().__init__("exec timed out")
        self.stdout = stdout
        self.stderr = stderr


async def run_in_group(
    argv: list[str],
    *,
    env: dict[str, str],
    timeout_sec: float | None,
    max_output: int,
    stdin_data: bytes | None = None,
    binary_stdout: bool = False,
) -> tuple[int, str | bytes | None, str | None]:
    """Run `argv` in its own process group; return its exit status (128 + N when killed by signal N, as a shell
    reports it), stdout (bytes, whole, when `binary_stdout`) and stderr (see `read_output`).

    The output goes to anonymous in-memory files (`memfd_create`), not pipes, which background processes would hold
    open, and not files on disk: nothing to remove afterwards, and no inode to allocate, which on an ext4 without a
    journal (as on the development machines) costs more the more files were deleted in the last half minute
    (the kernel skips their inodes one by one). Like Harbor's docker backend, which reads an exec's output into
    memory, it is held in memory; a background process that keeps writing keeps its file alive until it exits.

    Raises:
        ExecTimeout: it ran past `timeout_sec`; the whole group was killed (so it is, too, on any other error).
    """
    out_fd = os.memfd_create("raygrpo-exec-stdout", os.MFD_CLOEXEC)
    try:
        err_fd = os.memfd_create("raygrpo-exec-stderr", os.MFD_CLOEXEC)
    except BaseException:
        os.close(out_fd)
        raise
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin_data is not None else asyncio.subprocess.DEVNULL,
            stdout=out_fd,
            stderr=err_fd,
            env=env,
            start_new_session=True,  # its own process group, killed as a whole on timeout
        )
        try:
            async with asyncio.timeout(timeout_sec if timeout_sec else None):
                if stdin_data is not None:
                    await proc.communicate(stdin_data)
                else:
                    await proc.wait()
        except TimeoutError:
            await kill_group(proc)
            raise ExecTimeout(read_output(out_fd, max_output), read_output(err_fd, max_output)) from None
        except BaseException:
            await kill_group(proc)
            raise
        rc = proc.returncode if proc.returncode is not None else 0
        if rc < 0:
            rc = 128 - rc  # killed by a signal: report it as a shell would
        stdout = _read_all(out_fd) if binary_stdout else read_output(out_fd, max_output)
        return rc, stdout, read_output(err_fd, max_output)
    finally:
        os.close(out_fd)
        os.close(err_fd)


def _read_all(fd: int) -> bytes:
    """Everything written to the in-memory file `fd` so far, from its start (whatever its offset)."""
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def read_output(fd: int, max_bytes: int) -> str | None:
    """An exec's output (the in-memory file `fd`, read from its start) as text, cut at `max_bytes` (with a note);
    None when empty."""
    data = os.pread(fd, max_bytes + 1, 0)
    if not data:
        return None
    text = data[:max_bytes].decode(errors="replace")
    if len(data) > max_bytes:
        text += f"\n[raygrpo local sandbox: output cut at {max_bytes} bytes]"
    return text


def tar_of(items: list[tuple[Path, str]]) -> bytes:
    """An uncompressed tar of host paths, each under its archive name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for path, arcname in items:
            tf.add(path, arcname=arcname)
    return buf.getvalue()


def log_tail(path: Path, n: int = 2000) -> str:
    """The last `n` characters of a log file ("" when unreadable)."""
    try:
        return path.read_text(errors="replace").strip()[-n:]
    except OSError:
        return ""


def extract_tar(data: bytes, target: Path) -> None:
    """Unpack a tar (from the sandbox) into the host directory `target`, with Harbor's transfer filter."""
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(target, filter=transfer_tar_filter)


def read_pipe(fd: int, *, line: bool = False, nbytes: int = -1) -> asyncio.Future[bytes]:
    """A task reading a pipe to EOF (or one line, or up to `nbytes`) on the running loop; the fd is closed however
    the task ends."""
    pipe = os.fdopen(fd, "rb", 0)

    async def read() -> bytes:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        try:
            return await (reader.readline() if line else reader.read(nbytes))
        finally:
            transport.close()

    task = asyncio.ensure_future(read())
    task.add_done_callback(lambda _: pipe.close())  # also when cancelled before it ever ran
    return task


async def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group an exec runs in, and reap its leader (shielded from cancellation).

    The members are killed before the leader (`nsenter`, outside the sandbox): nsenter then reaps its child inside
    the sandbox as it exits. Killing them all at once would orphan that child to the host's init, whose late reaping
    keeps a PID of the sandbox's namespace allocated and can delay the sandbox's teardown by seconds.
    """
    pgid = proc.pid
    for pid in group_members(pgid):
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


def group_members(pgid: int) -> list[int]:
    """The pids of the processes in process group `pgid`, read from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    members.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                continue
    return members
