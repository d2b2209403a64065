"""What the OS says of local sandboxes, independently of raygrpo's bookkeeping: whether a process is alive (and still
the same process), which live processes belong to sandboxes, and which mounts bind their files.

A sandbox's processes carry `ID_ENV` / `ROOT_ENV` in their environment (set by `raygrpo.sandbox.local`);
`sandbox_processes` and `sandbox_mounts` find them, and their mounts, through psutil and every process's
`/proc/<pid>/mountinfo` (mounts in other namespaces included). That is how tests and `leaked_envs` check that nothing
is left, and how the bookkeeping (`raygrpo.sandbox.owners`) tells a live owner from a dead one.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

#: Where sandboxes' directories are when neither a `root` argument nor `ROOT_ENV` says otherwise.
DEFAULT_ROOT = "/tmp/raygrpo-sandboxes"
#: The environment variables that mark a process as a sandbox's: its sandboxes' root, and its sandbox's id.
ROOT_ENV = "RAYGRPO_SANDBOX_ROOT"
ID_ENV = "RAYGRPO_SANDBOX_ID"

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_start_time(pid: int | None) -> float | None:
    """The start time of `pid` in seconds since boot, or None when no such process is alive (a zombie counts as
    dead).

    Counted from boot, not from the epoch: an epoch start time is derived from the kernel's boot time, which moves
    whenever the wall clock is stepped (NTP on a fresh VM), so two readings of one process could differ and a live
    owner would look replaced. With the boot id (`raygrpo.sandbox.owners`) this names one process exactly."""
    ticks = proc_start_ticks(pid)
    return None if ticks is None else ticks / _CLOCK_TICKS


def proc_start_ticks(pid: int | None) -> int | None:
    """The start time of `pid` in clock ticks since boot, read straight from `/proc/<pid>/stat` (a quarter of what
    psutil costs, for checks made on every exec), or None when no such process is alive
    (a zombie counts as dead)."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # the command name, in parentheses, may hold anything
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def pid_alive(pid: int | None, start_time: float | None = None) -> bool:
    """Whether `pid` is alive and (when `start_time` is given) still the same process."""
    st = proc_start_time(pid)
    if st is None:
        return False
    return start_time is None or st == start_time


def process_env_marks() -> dict[int, tuple[str | None, str | None]]:
    """pid -> (sandbox root, sandbox id) for every live process whose environment carries the sandbox marks."""
    out: dict[int, tuple[str | None, str | None]] = {}
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if ID_ENV not in env or proc.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        out[proc.pid] = (env.get(ROOT_ENV), env[ID_ENV])
    return out


def sandbox_processes(root: str | os.PathLike | None = None, sandbox_id: str | None = None) -> list[int]:
    """Host pids of live processes that belong to sandboxes under `root` (or to one sandbox), found via /proc.

    A sandbox's bwrap is marked by its id alone (the root's host path is kept from the sandbox), so it counts where
    that id is asked for or its directory is under `root`."""
    root_s = str(Path(root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT))
    return sorted(
        pid
        for pid, (sroot, sid) in process_env_marks().items()
        if (sandbox_id is None or sid == sandbox_id)
        and (sroot == root_s or (sroot is None and sid and (sid == sandbox_id or os.path.lexists(f"{root_s}/{sid}"))))
    )


def sandbox_mounts(root: str | os.PathLike | None = None) -> list[str]:
    """Mount table lines (from every process's /proc/<pid>/mountinfo) that bind anything from under `root`.

    Sandboxes mount in their own mount namespaces, so this reads every process's `/proc/<pid>/mountinfo` (psutil only
    sees this process's mount namespace); once every sandbox process is gone their namespaces, and so their mounts,
    are gone too.
    """
    root_s = os.path.realpath(str(Path(root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)))
    seen: set[str] = set()
    lines: list[str] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ns = os.readlink(f"/proc/{entry.name}/ns/mnt")
            if ns in seen:
                continue
            seen.add(ns)
            with open(f"/proc/{entry.name}/mountinfo") as f:
                for line in f:
                    fields = line.split()
                    # field 4 is the root of the mount within its filesystem, field 5 the mount point.
                    if len(fields) > 4 and (fields[3].startswith(root_s) or fields[4].startswith(root_s)):
                        lines.append(f"{entry.name}: {line.strip()}")
        except OSError:
            continue
    return lines
