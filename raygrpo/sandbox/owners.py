"""Host-side bookkeeping of local sandboxes: owner labels, heartbeats, and what the OS says is alive.

Every local sandbox has a directory `<root>/<sandbox id>/` on the host (root: the `root` argument, else
`$RAYGRPO_SANDBOX_ROOT`, else `/tmp/raygrpo-sandboxes`). Besides the sandbox's own writable files (`fs/`) it holds:

- `owner.json`: who owns it: pid (and that pid's start time, so a reused pid is not mistaken for the owner),
  hostname, boot id, an owner id (the Ray actor name when there is one) and the creation time;
- `heartbeat`: a file whose mtime the owning process refreshes every `HEARTBEAT_INTERVAL_S` from one daemon thread
  per process (a thread, not an asyncio task, so that a busy event loop does not make its sandboxes look orphaned);
- `procs.json`: the host pids of the sandbox's `bwrap` monitor and of its PID-namespace init, with start times.

Processes that belong to sandboxes carry `RAYGRPO_SANDBOX_ID` / `RAYGRPO_SANDBOX_ROOT` in their environment; what
the OS says of them (alive or not, their processes and mounts) is `raygrpo.sandbox.os_probe`, independent of this
bookkeeping. Reaping orphans is `raygrpo.sandbox.orphans`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from raygrpo.sandbox.os_probe import DEFAULT_ROOT, ROOT_ENV, pid_alive, proc_start_time, process_env_marks

logger = logging.getLogger(__name__)

#: The run an env pool actor's sandboxes belong to (set by the driver; docker sandboxes are labelled with it).
RUN_ENV = "RAYGRPO_RUN_ID"
HEARTBEAT_INTERVAL_S = 2.0
#: A reaper renames an orphan's directory to this prefix + id + its pid to claim it (see `raygrpo.sandbox.orphans`).
CLAIM_PREFIX = ".reaping-"
#: Marks a stopped sandbox whose directory is kept for inspection (never reaped).
STOPPED_MARK = "stopped.json"
#: A run id as the driver makes it (`run-` and 12 hex digits): the name of a run's folder under the sandbox root
#: (`raygrpo.sandbox.run_folders`). A sandbox id never has this form (it ends in `-` and 8 hex digits).
RUN_ID = re.compile(r"^run-[0-9a-f]{12}$")


def claim_path(root: Path, sandbox_id: str) -> Path:
    """This process's claim on sandbox `sandbox_id` under `root`: the name its directory takes while this process makes
    it, removes it or reaps it (`CLAIM_PREFIX`, the id, `.`, this pid)."""
    return root / f"{CLAIM_PREFIX}{sandbox_id}.{os.getpid()}"


def is_run_folder(path: Path) -> bool:
    """Whether a directory under the sandbox root is a run's folder (not a sandbox's own directory)."""
    return bool(RUN_ID.match(path.name)) and not (path / "owner.json").exists()


def sandbox_root(root: str | os.PathLike | None = None) -> Path:
    """The directory that holds every sandbox's directory (created if missing)."""
    path = Path(root or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


HOSTNAME = socket.gethostname()
_BOOT = _boot_id()


def _default_owner_id() -> str | None:
    """The Ray actor name (or id) of this process when it is an actor; never imports Ray itself."""
    ray = sys.modules.get("ray")
    # Only inside a connected worker: asking a process that never called ray.init for its runtime context sets up
    # a half-connected global worker, and a later ray.init in that process then fails to reach its GCS and exits.
    if ray is None or not ray.is_initialized():
        return None
    try:
        ctx = ray.get_runtime_context()
        return ctx.get_actor_name() or ctx.get_actor_id()
    except Exception:  # noqa: BLE001 - not in a worker, or Ray not initialised
        return None


def owner_record(owner_id: str | None = None) -> dict:
    """Who owns a sandbox this process creates now: its pid and that pid's start time (so a reused pid is not
    mistaken for the owner), hostname, boot id, an owner id (`owner_id`, else the Ray actor name when this process
    is an actor) and the creation time. `owner_alive` judges a record."""
    return {
        "pid": os.getpid(),
        "pid_start": proc_start_time(os.getpid()),
        "hostname": HOSTNAME,
        "boot_id": _BOOT,
        "owner_id": owner_id or _default_owner_id(),
        "created": time.time(),
    }


# --------------------------------------------------------------------------------------------------------------
# Owner side: registration and the heartbeat thread
# --------------------------------------------------------------------------------------------------------------


class _Heartbeat:
    """One daemon thread per process that touches the heartbeat file of every sandbox this process owns."""

    def __init__(self) -> None:
        self._paths: set[Path] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, path: Path) -> None:
        with self._lock:
            if self._pid != os.getpid():  # forked child: the parent's thread is not ours
                self._paths, self._thread, self._pid = set(), None, os.getpid()
            self._paths.add(path)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="raygrpo-sandbox-heartbeat", daemon=True)
                self._thread.start()

    def discard(self, path: Path) -> None:
        with self._lock:
            self._paths.discard(path)

    def _run(self) -> None:
        while True:
            time.sleep(HEARTBEAT_INTERVAL_S)
            with self._lock:
                paths = list(self._paths)
            for path in paths:
                try:
                    os.utime(path)
                except FileNotFoundError:
                    # Reaped from under us (a reaper judged the sandbox orphaned): stop beating for it.
                    logger.warning("sandbox heartbeat file %s vanished; the sandbox was reaped", path)
                    self.discard(path)
                except OSError as e:  # noqa: PERF203
                    logger.warning("cannot refresh sandbox heartbeat %s: %s", path, e)


_heartbeat = _Heartbeat()


def keep_beating(path: Path) -> None:
    """Refresh `path`'s mtime every `HEARTBEAT_INTERVAL_S` from this process's one heartbeat thread (started on first
    use), until `stop_beating(path)` or the file vanishes."""
    _heartbeat.add(path)


def stop_beating(path: Path) -> None:
    """Stop refreshing `path` (see `keep_beating`)."""
    _heartbeat.discard(path)


@dataclass
class Registration:
    """The owner's handle on one sandbox directory: write labels, keep the heartbeat, release at stop.

    Args:
        root: the sandboxes' root directory.
        sandbox_id: the sandbox's id (its directory name).
        owner_id: a label for the owner (defaults to the Ray actor name when in an actor).
    """

    root: Path
    sandbox_id: str
    owner_id: str | None = None
    dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dir = self.root / self.sandbox_id

    def create(self) -> Path:
        """Create the directory with its owner label and heartbeat, and start beating.

        The directory is made under a claim name of this process (`CLAIM_PREFIX`), labelled, then renamed into
        place, so a sandbox directory never lacks its `owner.json`: an owner killed half-way leaves a claim that
        any reaper takes over once this process is gone, instead of a directory with no owner that a reaper must
        judge by its age.
        """
        if self.dir.exists():
            raise FileExistsError(self.dir)
        making = claim_path(self.root, self.sandbox_id)
        making.mkdir(parents=True)
        _write_json(making / "owner.json", owner_record(self.owner_id))
        (making / "heartbeat").touch()
        os.rename(making, self.dir)
        _heartbeat.add(self.dir / "heartbeat")
        return self.dir

    def record_processes(self, bwrap_pid: int, init_pid: int | None) -> None:
        _write_json(
            self.dir / "procs.json",
            {
                "bwrap_pid": bwrap_pid,
                "bwrap_start": proc_start_time(bwrap_pid),
                "init_pid": init_pid,
                "init_start": proc_start_time(init_pid) if init_pid else None,
            },
        )

    def release(self, *, remove: bool = True) -> None:
        """Stop beating; remove the directory, or mark it stopped (kept for inspection, never reaped).

        Removal first renames the directory to this process's claim (as a reaper does), so an owner killed while
        removing a large tree leaves a claim that reapers take over, not a half-removed directory without its
        `owner.json`."""
        _heartbeat.discard(self.dir / "heartbeat")
        if remove:
            claim = claim_path(self.root, self.sandbox_id)
            try:
                os.rename(self.dir, claim)
            except FileNotFoundError:
                return  # a reaper claimed it first, or it was never made
            remove_tree(claim)
        elif self.dir.exists():
            _write_json(self.dir / STOPPED_MARK, {"stopped": time.time()})


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def remove_tree(path: Path) -> None:
    def onexc(func, p, exc):  # noqa: ANN001
        if isinstance(exc, FileNotFoundError):
            return
        # A read-only directory (e.g. `chmod 500` inside the sandbox): make it writable and retry once.
        try:
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning("cannot remove %s: %s", p, e)

    if path.exists():
        shutil.rmtree(path, onexc=onexc)


# --------------------------------------------------------------------------------------------------------------
# Inspection
# --------------------------------------------------------------------------------------------------------------


@dataclass
class SandboxInfo:
    """One sandbox directory as seen on the host.

    Args:
        sandbox_id: directory name.
        dir: the directory.
        owner: the `owner.json` label (pid, hostname, boot_id, owner_id, created), or {} while it is being written.
        owner_alive: whether the owner process is alive (always True for another host's owner).
        heartbeat_age_s: seconds since the owner last refreshed the heartbeat.
        init_pid: host pid of the sandbox's PID-namespace init, when recorded and still that process.
        pids: host pids of every process that belongs to the sandbox (found through /proc).
    """

    sandbox_id: str
    dir: Path
    owner: dict
    owner_alive: bool
    heartbeat_age_s: float | None
    init_pid: int | None
    pids: list[int]


def owner_alive(owner: dict) -> bool:
    """Whether the owner of an `owner_record` is alive (always True for another host's owner)."""
    if owner.get("hostname") != HOSTNAME:
        return True  # another host sharing the root: a pid means nothing here, the heartbeat decides
    if owner.get("boot_id") and owner.get("boot_id") != _BOOT:
        return False  # left over from before a reboot
    return pid_alive(owner.get("pid"), owner.get("pid_start"))


def heartbeat_age(d: Path) -> float | None:
    try:
        return max(0.0, time.time() - (d / "heartbeat").stat().st_mtime)
    except OSError:
        return None


def live_sandboxes(root: str | os.PathLike | None = None) -> list[SandboxInfo]:
    """Every sandbox directory under `root` that has not been stopped, with its owner state and its processes.

    Orphans are included (with `owner_alive` False or a large `heartbeat_age_s`); directories being reaped and
    kept stopped ones are not.
    """
    base = sandbox_root(root)
    marks = process_env_marks()
    by_id: dict[str, list[int]] = {}
    for pid, (sroot, sid) in marks.items():
        if sroot in (str(base), None) and sid:  # None: a bwrap, marked by id alone (looked up by the ids below)
            by_id.setdefault(sid, []).append(pid)
    out: list[SandboxInfo] = []
    for entry in sorted(os.scandir(base), key=lambda e: e.name):
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        d = Path(entry.path)
        if (d / STOPPED_MARK).exists():
            continue
        owner = read_json(d / "owner.json") or {}
        procs = read_json(d / "procs.json") or {}
        init_pid = procs.get("init_pid")
        if init_pid and not pid_alive(init_pid, procs.get("init_start")):
            init_pid = None
        out.append(
            SandboxInfo(
                sandbox_id=entry.name,
                dir=d,
                owner=owner,
                owner_alive=owner_alive(owner) if owner else True,
                heartbeat_age_s=heartbeat_age(d),
                init_pid=init_pid,
                pids=sorted(by_id.get(entry.name, [])),
            )
        )
    return out


def kill_sandbox_processes(
    d: Path, sandbox_id: str, root: Path, timeout_s: float = 5.0, *, stragglers: bool = True
) -> None:
    """SIGKILL a sandbox's init (the kernel then kills its whole PID namespace), its monitor, and any straggler.

    Stragglers are found by the sandbox's environment marks, which means reading every process's environment on
    the machine (milliseconds with a few hundred processes); `stragglers=False` skips that search, for an owner
    that has seen the init reaped and no exec of its own still running, which leaves nothing of the sandbox alive.
    """
    procs = read_json(d / "procs.json") or {}
    targets: list[int] = []
    for pid_key, start_key in (("init_pid", "init_start"), ("bwrap_pid", "bwrap_start")):
        pid = procs.get(pid_key)
        if pid and pid_alive(pid, procs.get(start_key)):
            targets.append(pid)
    for pid, (sroot, sid) in process_env_marks().items() if stragglers else ():
        if sid == sandbox_id and sroot in (str(root), None):  # None: marked by id alone (bwrap)
            targets.append(pid)
    started = {pid: proc_start_time(pid) for pid in targets}
    for pid in targets:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    # Polled rather than `psutil.wait_procs`: a killed process whose parent is gone (a monitor that outlived its
    # owner) stays a zombie until init reaps it, and psutil waits out the whole time-out for such a zombie.
    deadline = time.monotonic() + timeout_s
    alive = [pid for pid, start in started.items() if start is not None]
    while alive:
        alive = [pid for pid in alive if proc_start_time(pid) == started[pid]]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if alive:
        logger.warning("sandbox %s: processes %s still alive %.1fs after SIGKILL", sandbox_id, alive, timeout_s)
