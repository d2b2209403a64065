"""The lease ledger: a durable record of every remote sandbox, from before its create call is sent until it is stopped.

A crashed run (a `kill -9`'d driver, a lost node) leaves sandboxes billing at a remote provider, and a create whose
answer never arrived leaves one whose id nobody learnt. Local bubblewrap sandboxes and docker sandboxes have owner-based
reapers of their own (`raygrpo.sandbox.orphans`); every other backend's sandboxes are leased here:

- before the create call is sent, an *intent* record is written (to a temporary file, fsync'd, renamed into place):
  the provider key, the run, the owner, the backend and the non-secret arguments that reach its provider again (the
  fake provider's `url`), the rollout's deadline, when the provider ends the sandbox on its own (its lifetime, when
  one was set), and the lease id, which the sandbox carries as its label `io.raygrpo.lease` (so even a sandbox whose
  create never answered is a listing away);
- the sandbox id is added once the create answered (`bind`);
- the record goes once the sandbox is stopped (`remove`); a failed stop keeps it, for the reaper.

An owner is a process that writes leases (each env pool actor process; any process that starts sandboxes in-process).
It keeps a heartbeat file fresh from one daemon thread (`raygrpo.sandbox.owners.keep_beating`, every 2 s). It is
*stale* when its heartbeat is older than `stale_after_s` (default 30 s) or, on the same host, its process is dead (the
registry's `owner_alive`: pid and start time), or its record is gone (a clean exit removes it). Only the leases of
stale owners are ever reaped (`raygrpo.leases.reaper`), so a concurrent run is never touched.

Layout of the ledger directory (`$RAYGRPO_LEASE_DIR`, else `~/.raygrpo/leases`; on a multi-node cluster it must be
storage every node shares, e.g. the PVC of `cluster/kuberay`, or a node's reaper cannot see the others' leases):

    <dir>/<lease id>.json                 one lease (`Lease`)
    <dir>/owners/<owner id>/owner.json    who the owner is (pid, its start time, host, boot id)
    <dir>/owners/<owner id>/heartbeat     its mtime is the owner's last heartbeat
    <dir>/.claim-<lease id>@<host>@<pid>  a lease being reaped (claimed by an atomic rename)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from raygrpo.sandbox.os_probe import pid_alive
from raygrpo.sandbox.owners import (
    HOSTNAME,
    RUN_ENV,
    heartbeat_age,
    keep_beating,
    owner_alive,
    owner_record,
    read_json,
    stop_beating,
)

logger = logging.getLogger(__name__)

LEASE_DIR_ENV = "RAYGRPO_LEASE_DIR"
DEFAULT_LEASE_DIR = "~/.raygrpo/leases"
#: The label every leased sandbox carries; its value is the lease id.
LEASE_LABEL = "io.raygrpo.lease"
#: An owner whose heartbeat is older than this is stale (keep it well above the 2 s heartbeat).
STALE_AFTER_S = 30.0
#: A claim whose claimer cannot be judged by its pid (another host) is taken over after this long.
CLAIM_TIMEOUT_S = 600.0
OWNERS = "owners"
CLAIM_PREFIX = ".claim-"
#: Separates a claim's lease id, host and pid (never part of a `safe_id`).
CLAIM_SEP = "@"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def lease_dir(path: str | os.PathLike | None = None) -> Path:
    """The ledger directory: `path`, else `$RAYGRPO_LEASE_DIR`, else `~/.raygrpo/leases` (not created here)."""
    return Path(os.path.expanduser(os.fspath(path or os.environ.get(LEASE_DIR_ENV) or DEFAULT_LEASE_DIR))).absolute()


def safe_id(text: str) -> str:
    """`text` as a file name: characters other than letters, digits, `_`, `.` and `-` become `_`."""
    cleaned = _UNSAFE.sub("_", text)[:200].lstrip(".")
    return cleaned or uuid.uuid4().hex


@dataclass
class Lease:
    """One sandbox's lease.

    Args:
        id: The lease id (a file name); the sandbox carries it as its label `io.raygrpo.lease`.
        provider_key: The provider key whose limits the sandbox counts against (the spec's rate-limit key).
        backend: The Harbor backend: an `environment_type` or a `module:Class` import path.
        reach: The non-secret backend arguments needed to reach the provider again (e.g. the fake provider's `url`).
        owner: The id of the owner whose heartbeat keeps the lease.
        run: The run's id (`$RAYGRPO_RUN_ID`), None outside a run.
        deadline: Wall-clock time by which the rollout holding the sandbox is over, stop included.
        expires: Wall-clock time by which the provider ends the sandbox on its own (its lifetime), None when it has
            no lifetime.
        sandbox_id: The provider's id of the sandbox, once its create answered.
        created: When the intent was written (wall clock).
        host: The owner's host name.
        live_holder: Who holds the sandbox's live ticket with the governor (`raygrpo.governor`: the owner's gate),
            None without a live cap. Whoever reaps a stale lease has the governor forget that holder (its tickets, and
            the requests it still had queued), so a lost node's sandboxes stop counting against the cap.
    """

    id: str
    provider_key: str
    backend: str
    reach: dict[str, Any]
    owner: str
    run: str | None
    deadline: float
    expires: float | None = None
    sandbox_id: str | None = None
    created: float = field(default_factory=time.time)
    host: str = HOSTNAME
    live_holder: str | None = None

    @property
    def labels(self) -> dict[str, str]:
        """The labels the sandbox carries: `{io.raygrpo.lease: <id>}`."""
        return {LEASE_LABEL: self.id}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Lease:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class OwnerState:
    """What the ledger says about an owner.

    Args:
        owner: The owner id.
        stale: Whether its leases may be reaped.
        reason: Why (`"alive"`, `"pid 123 on host-a is dead"`, `"heartbeat 41 s old"`, `"no owner record"`).
        record: Its `owner.json` (pid, pid_start, hostname, boot_id, owner_id, created), {} when there is none.
    """

    owner: str
    stale: bool
    reason: str
    record: dict[str, Any]


def _write(path: Path, data: dict[str, Any], durable: bool) -> None:
    """Write `data` as JSON to `path` atomically (a temporary file renamed into place); `durable` fsyncs the file
    before the rename and the directory after it."""
    tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(data).encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


#: (ledger root, pid) -> this process's owner id in that ledger.
_owned: dict[tuple[str, int], str] = {}
_owned_lock = threading.Lock()


def disown_all() -> None:
    """This process stops owning leases in every ledger it owns leases in (see `LeaseLedger.disown`): what a clean
    exit calls once its sandboxes are stopped."""
    for root, _ in [key for key in _owned if key[1] == os.getpid()]:
        LeaseLedger(root).disown()


class LeaseLedger:
    """The lease ledger in one directory (see the module docstring).

    Args:
        root: The ledger directory (default: `$RAYGRPO_LEASE_DIR`, else `~/.raygrpo/leases`). Created on first write.
    """

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = lease_dir(root)
        self.owners = self.root / OWNERS

    def __repr__(self) -> str:
        return f"LeaseLedger({str(self.root)!r})"

    # ── the owner's side ─────────────────────────────────────────────────────────────────────────────────────────

    def own(self) -> str:
        """Make this process an owner in this ledger (once per process; again when a reaper removed its record)
        and return its owner id: writes its record and keeps its heartbeat fresh from the process's one heartbeat
        thread. Cheap when already an owner (one `stat`)."""
        key = (str(self.root), os.getpid())
        owner = _owned.get(key)
        if owner is not None and (self.owners / owner / "heartbeat").exists():
            return owner
        with _owned_lock:
            owner = _owned.get(key)
            if owner is None:
                owner = _owned[key] = safe_id(f"{HOSTNAME}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            d = self.owners / owner
            if not (d / "heartbeat").exists():
                d.mkdir(parents=True, exist_ok=True)
                (d / "heartbeat").touch()  # first: a record without a heartbeat reads as stale
                _write(d / "owner.json", owner_record(owner), durable=True)
                keep_beating(d / "heartbeat")
                logger.debug("lease owner %s in %s", owner, self.root)
        return owner

    def disown(self) -> None:
        """This process stops owning leases here (a clean exit): its heartbeat stops and its record goes, so any
        lease it still holds (a failed stop) is reapable at once."""
        with _owned_lock:
            owner = _owned.pop((str(self.root), os.getpid()), None)
        if owner is not None:
            stop_beating(self.owners / owner / "heartbeat")
            shutil.rmtree(self.owners / owner, ignore_errors=True)

    def intent(self, lease_id: str, *, provider_key: str, backend: str, deadline: float,
               reach: dict[str, Any] | None = None, expires: float | None = None, run: str | None = None,
               live_holder: str | None = None) -> Lease:
        """Write (durably) the intent record of a sandbox about to be created; call it before the create is sent.
        Writing it again for the same id (a retried create) replaces it.

        Args:
            lease_id: The lease id (made file-safe); the sandbox must carry it as its `io.raygrpo.lease` label.
            provider_key: The provider key whose limits the sandbox counts against.
            backend: The Harbor backend (`environment_type` or import path), which selects the reap hook.
            deadline: Wall-clock time by which the rollout is over.
            reach: The non-secret backend arguments that reach the provider again.
            expires: Wall-clock time by which the provider ends the sandbox on its own, if it was given a lifetime.
            run: The run id (default: `$RAYGRPO_RUN_ID`).
            live_holder: Who holds the sandbox's live ticket with the governor, if anyone.

        Raises:
            OSError: The record could not be written (the create must then not be sent).
        """
        owner = self.own()
        lease = Lease(id=safe_id(lease_id), provider_key=provider_key, backend=backend, reach=dict(reach or {}),
                      owner=owner, run=run if run is not None else os.environ.get(RUN_ENV), deadline=deadline,
                      expires=expires, live_holder=live_holder)
        _write(self.path(lease.id), lease.to_dict(), durable=True)
        return lease

    def bind(self, lease: Lease, sandbox_id: str, expires: float | None = None) -> None:
        """Add the sandbox id (and, when given, a later `expires`) to a lease once the create answered. Not fsync'd:
        the intent already is, and the sandbox's label finds it without its id."""
        lease.sandbox_id = sandbox_id
        if expires is not None:
            lease.expires = expires
        _write(self.path(lease.id), lease.to_dict(), durable=False)

    def remove(self, lease: Lease | str) -> None:
        """Drop a lease (its sandbox is stopped)."""
        self.path(lease if isinstance(lease, str) else lease.id).unlink(missing_ok=True)

    def path(self, lease_id: str) -> Path:
        """The record file of a lease."""
        return self.root / f"{lease_id}.json"

    # ── the reaper's side ────────────────────────────────────────────────────────────────────────────────────────

    def leases(self, run: str | None = None) -> list[Lease]:
        """Every lease in the ledger (those being reaped excepted), oldest first; only run `run`'s when given."""
        if not self.root.is_dir():
            return []
        out: list[Lease] = []
        for entry in os.scandir(self.root):
            if entry.name.startswith(".") or not entry.name.endswith(".json"):
                continue
            lease = self._read(Path(entry.path))
            if lease is not None and (run is None or lease.run == run):
                out.append(lease)
        return sorted(out, key=lambda x: x.created)

    def _read(self, path: Path) -> Lease | None:
        data = read_json(path)
        if data is None:
            return None
        try:
            return Lease.from_dict(data)
        except TypeError:
            logger.warning("lease ledger %s: %s is not a lease record; left alone", self.root, path.name)
            return None

    def owner_state(self, owner: str, stale_after_s: float = STALE_AFTER_S) -> OwnerState:
        """Whether an owner is stale: its record is gone, its process on this host is dead, or its heartbeat is
        older than `stale_after_s`."""
        d = self.owners / owner
        record = read_json(d / "owner.json")
        if record is None:
            try:
                age = time.time() - d.stat().st_mtime
            except OSError:
                return OwnerState(owner, True, "no owner record", {})
            # Being written right now, or its writer died half-way: judge by the directory's age.
            return OwnerState(owner, age > stale_after_s, f"owner record missing for {age:.0f} s", {})
        if not owner_alive(record):
            return OwnerState(owner, True, f"pid {record.get('pid')} on {record.get('hostname')} is dead", record)
        age = heartbeat_age(d)
        if age is None:
            return OwnerState(owner, True, "no heartbeat file", record)
        if age > stale_after_s:
            return OwnerState(owner, True, f"heartbeat {age:.0f} s old", record)
        return OwnerState(owner, False, "alive", record)

    def claim(self, lease: Lease) -> Path | None:
        """Claim a lease for reaping by renaming its record (atomic: one reaper wins); None when another reaper (or
        the owner's stop) got there first."""
        claimed = self._claim_path(lease.id)
        try:
            os.rename(self.path(lease.id), claimed)
        except OSError:
            return None
        return claimed

    def _claim_path(self, lease_id: str) -> Path:
        return self.root / f"{CLAIM_PREFIX}{lease_id}{CLAIM_SEP}{safe_id(HOSTNAME)}{CLAIM_SEP}{os.getpid()}"

    def unclaim(self, lease: Lease, claimed: Path) -> None:
        """Put a claimed lease back (it could not be reaped now)."""
        with contextlib.suppress(OSError):
            os.rename(claimed, self.path(lease.id))

    def abandoned_claims(self) -> list[tuple[Lease, Path]]:
        """Claims whose reaper died before finishing (its pid dead on this host, or the claim older than
        `CLAIM_TIMEOUT_S`), each with its lease, re-claimed by this process."""
        if not self.root.is_dir():
            return []
        out: list[tuple[Lease, Path]] = []
        for entry in os.scandir(self.root):
            if not entry.name.startswith(CLAIM_PREFIX):
                continue
            _, host, pid = (entry.name[len(CLAIM_PREFIX):].split(CLAIM_SEP) + ["", "", ""])[:3]
            try:
                age = time.time() - entry.stat().st_mtime
            except OSError:
                continue
            alive = pid.isdigit() and host == safe_id(HOSTNAME) and pid_alive(int(pid))
            if alive or (host != safe_id(HOSTNAME) and age < CLAIM_TIMEOUT_S):
                continue
            lease = self._read(Path(entry.path))
            if lease is None:
                continue
            mine = self._claim_path(lease.id)
            try:
                os.rename(entry.path, mine)
            except OSError:
                continue
            out.append((lease, mine))
        return out

    def forget_stale_owners(self, stale_after_s: float = STALE_AFTER_S) -> list[str]:
        """Remove the records of stale owners that hold no lease any more; returns their ids."""
        if not self.owners.is_dir():
            return []
        holding = {lease.owner for lease in self.leases()}
        gone: list[str] = []
        for entry in os.scandir(self.owners):
            if entry.name in holding or not entry.is_dir(follow_symlinks=False):
                continue
            if self.owner_state(entry.name, stale_after_s).stale:
                shutil.rmtree(entry.path, ignore_errors=True)
                gone.append(entry.name)
        return gone
