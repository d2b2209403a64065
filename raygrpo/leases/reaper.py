"""Reaping the leases of stale owners: stop at the provider whatever a crashed run left, never a live run's.

`reap_leases` goes through the ledger (`raygrpo.leases.ledger`): a lease whose owner is fresh is left alone; a lease
of a stale owner is claimed (an atomic rename, so concurrent reapers reap it once), its sandboxes are stopped through
its backend's reap hook (`raygrpo.leases.hooks`: for the fake provider, every sandbox labelled with the lease,
which covers a create whose answer never arrived, and its bound id), and its record goes. A lease that cannot be
reaped (its backend has no hook, or the provider did not answer) is reported with its provider key and sandbox id and
kept, unless its lifetime at the provider is over (then the provider has ended it: reported as expired and dropped).

`raygrpo reap` runs it from the command line; every run (`raygrpo.driver.launch.RolloutRuntime`) runs it at start-up, over
every run's leases before its actors start, and at its end over its own (`reap_stale_leases`); while it runs,
`LeaseWatch` reaps its own stale leases every few seconds (an actor lost with its node) and has the governor forget
the dead actor's live tickets.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from raygrpo.core.errors import describe
from raygrpo.leases.hooks import hook_for
from raygrpo.leases.ledger import STALE_AFTER_S, Lease, LeaseLedger

logger = logging.getLogger(__name__)


@dataclass
class ReapedLease:
    """What became of one stale lease.

    Args:
        lease: The lease.
        outcome: `"stopped"` (its sandboxes stopped, record removed), `"expired"` (its lifetime at the provider is
            over: record removed), `"kept"` (not reaped: record kept).
        stopped: Sandbox ids the provider stopped.
        reason: Why the owner was judged stale, and for a kept lease why it could not be reaped.
    """

    lease: Lease
    outcome: str
    stopped: list[str] = field(default_factory=list)
    reason: str = ""

    def describe(self) -> str:
        """One line for logs and `raygrpo reap`."""
        lease = self.lease
        backend = "" if lease.backend == lease.provider_key else f", backend {lease.backend}"
        where = (f"lease {lease.id} (run {lease.run}, provider key {lease.provider_key}{backend}, "
                 f"sandbox {lease.sandbox_id or 'id never known'})")
        if self.outcome == "stopped":
            what = ", ".join(self.stopped) if self.stopped else "nothing left at the provider"
            return f"stopped {where}: {what}; {self.reason}"
        if self.outcome == "expired":
            return f"dropped {where}: its lifetime at the provider is over; {self.reason}"
        return f"kept {where}: {self.reason}"


@dataclass
class ReapReport:
    """What one reap did.

    Args:
        reaped: Every stale lease looked at, with its outcome.
        untouched: Leases left alone because their owner is fresh.
        owners_forgotten: Records of stale owners without leases, removed.
    """

    reaped: list[ReapedLease] = field(default_factory=list)
    untouched: int = 0
    owners_forgotten: list[str] = field(default_factory=list)

    @property
    def kept(self) -> list[ReapedLease]:
        """Stale leases that could not be reaped (kept in the ledger)."""
        return [r for r in self.reaped if r.outcome == "kept"]

    @property
    def stopped_sandboxes(self) -> list[str]:
        """Every sandbox id stopped at a provider."""
        return [s for r in self.reaped for s in r.stopped]

    def to_dict(self) -> dict:
        """The report as JSON-ready data: each stale lease's outcome, stopped sandboxes and reason, and the counts."""
        return {
            "reaped": [{"lease": r.lease.id, "run": r.lease.run, "provider_key": r.lease.provider_key,
                        "backend": r.lease.backend, "sandbox_id": r.lease.sandbox_id, "outcome": r.outcome,
                        "stopped": r.stopped, "reason": r.reason} for r in self.reaped],
            "stopped_sandboxes": self.stopped_sandboxes,
            "kept": len(self.kept),
            "untouched": self.untouched,
        }

    def lines(self) -> list[str]:
        """A line per stale lease, then a summary line."""
        out = [r.describe() for r in self.reaped]
        done = sum(1 for r in self.reaped if r.outcome != "kept")
        out.append(f"{done} stale lease(s) reaped ({len(self.stopped_sandboxes)} sandbox(es) stopped), "
                   f"{len(self.kept)} kept, {self.untouched} of live owners untouched")
        return out


def _reap_one(ledger: LeaseLedger, lease: Lease, claimed: Path, reason: str) -> ReapedLease:
    hook = hook_for(lease.backend)
    expired = lease.expires is not None and time.time() > lease.expires
    if hook is None:
        if expired:
            claimed.unlink(missing_ok=True)
            return ReapedLease(lease, "expired", reason=f"owner {reason}; backend has no reap hook")
        ledger.unclaim(lease, claimed)
        return ReapedLease(lease, "kept", reason=f"owner {reason}; backend {lease.backend} has no reap hook: stop "
                                                f"its sandbox at the provider (label io.raygrpo.lease={lease.id})")
    try:
        stopped = hook.reap_lease(lease.reach, lease.id, lease.sandbox_id)
    except Exception as exc:  # noqa: BLE001 - every provider fails its own way; the lease is kept
        if expired:
            claimed.unlink(missing_ok=True)
            return ReapedLease(lease, "expired", reason=f"owner {reason}; the provider did not answer: "
                                                        f"{describe(exc)}")
        ledger.unclaim(lease, claimed)
        return ReapedLease(lease, "kept", reason=f"owner {reason}; the provider did not answer: {describe(exc)}")
    claimed.unlink(missing_ok=True)
    return ReapedLease(lease, "stopped", stopped=list(stopped), reason=f"owner {reason}")


def reap_leases(ledger: LeaseLedger | str | os.PathLike | None = None, run: str | None = None,
                stale_after_s: float = STALE_AFTER_S, budget_s: float | None = None) -> ReapReport:
    """Stop the sandboxes of every lease whose owner is stale, and drop their records (see the module docstring).

    Args:
        ledger: The ledger, or its directory (default: `$RAYGRPO_LEASE_DIR`, else `~/.raygrpo/leases`).
        run: Only this run's leases (all runs' when None).
        stale_after_s: An owner whose heartbeat is older than this is stale (on its own host, a dead owner process
            is stale at once).
        budget_s: Stop starting new reaps after this long (what is left waits for the next reap); None: no limit.

    Safe to run while other runs use the ledger, and from several processes at once.
    """
    if not isinstance(ledger, LeaseLedger):
        ledger = LeaseLedger(ledger)
    report = ReapReport()
    began = time.monotonic()
    states: dict[str, tuple[bool, str]] = {}
    for lease, claimed in ledger.abandoned_claims():
        if run is None or lease.run == run:
            report.reaped.append(_reap_one(ledger, lease, claimed, "gone (its reaper died)"))
        else:
            ledger.unclaim(lease, claimed)
    for lease in ledger.leases(run):
        if lease.owner not in states:
            state = ledger.owner_state(lease.owner, stale_after_s)
            states[lease.owner] = (state.stale, state.reason)
        stale, reason = states[lease.owner]
        if not stale:
            report.untouched += 1
            continue
        if budget_s is not None and time.monotonic() - began > budget_s:
            report.reaped.append(ReapedLease(lease, "kept", reason=f"owner {reason}; the reap's {budget_s:g} s "
                                                                  "budget is spent"))
            continue
        claimed = ledger.claim(lease)
        if claimed is None:
            continue  # another reaper, or the owner's own stop, got there first
        report.reaped.append(_reap_one(ledger, lease, claimed, reason))
    report.owners_forgotten = ledger.forget_stale_owners(stale_after_s)
    return report


def reap_stale_leases(ledger_dir: str | os.PathLike | None = None, run: str | None = None,
                      stale_after_s: float = STALE_AFTER_S, budget_s: float = 60.0) -> ReapReport | None:
    """`reap_leases`, logged (a warning for each stale lease reaped or kept), for a run's start-up (every run's
    stale leases, before its actors start) and its end (its own, once its actors are gone). Never raises; None when
    there is no ledger or the reap failed.

    Args:
        ledger_dir: The ledger directory (default: `$RAYGRPO_LEASE_DIR`, else `~/.raygrpo/leases`).
        run: Only this run's leases (every run's when None).
        stale_after_s: See `reap_leases`.
        budget_s: Longest time spent reaping before the run goes on (`raygrpo reap` gets the rest).
    """
    ledger = LeaseLedger(ledger_dir)
    if not ledger.root.is_dir():
        return None
    try:
        report = reap_leases(ledger, run=run, stale_after_s=stale_after_s, budget_s=budget_s)
    except Exception:  # noqa: BLE001 - a run must not fail for what an earlier one left
        logger.warning("reaping stale leases in %s failed", ledger.root, exc_info=True)
        return None
    for reaped in report.reaped:
        logger.warning("lease ledger %s: %s", ledger.root, reaped.describe())
    if report.reaped:
        logger.warning("lease ledger %s: %s", ledger.root, report.lines()[-1])
    else:
        logger.info("lease ledger %s: no stale lease%s (%d of live owners)", ledger.root,
                    f" of run {run}" if run else "", report.untouched)
    return report


#: Has the governor of a provider key forget dead holders of live tickets: `(provider_key, holders)`.
HoldersGone = Callable[[str, list[str]], None]


class LeaseWatch:
    """Reaps a run's stale leases while the run goes on: the sandboxes of an env pool actor that died (its node was
    lost, it was OOM-killed) are stopped within about `every_s` of its owner going stale, instead of living on at the
    provider (and counting against its live limit) until their lifetime ends or the run is over. Their governor
    forgets the dead actor's gate (`on_holders_gone`): the live tickets it held, and the requests it still had queued
    there (which the governor would otherwise grant to nobody until their time-outs). Runs in a thread of its own.

    Args:
        ledger_dir: The ledger directory.
        run: The run whose leases are watched.
        on_holders_gone: Called with a provider key and the live-ticket holders of its reaped leases (a failure is
            logged).
        every_s: Seconds between reaps.
        stale_after_s: See `reap_leases` (on this host, a dead owner process is stale at once).
    """

    def __init__(self, ledger_dir: str | os.PathLike, run: str, on_holders_gone: HoldersGone | None = None,
                 every_s: float = 10.0, stale_after_s: float = STALE_AFTER_S) -> None:
        self.ledger_dir = ledger_dir
        self.run = run
        self.on_holders_gone = on_holders_gone
        self.every_s = every_s
        self.stale_after_s = stale_after_s
        #: Stale leases reaped so far, by outcome.
        self.outcomes: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"lease-watch-{run}", daemon=True)

    def start(self) -> LeaseWatch:
        self._thread.start()
        return self

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop watching (a reap in progress finishes first, within `timeout_s`)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            if not Path(self.ledger_dir).is_dir():
                continue
            try:
                self.reap_once()
            except Exception:  # noqa: BLE001 - the next round tries again; the run goes on
                logger.warning("reaping the stale leases of run %s failed", self.run, exc_info=True)

    def reap_once(self) -> ReapReport:
        """One reap of the run's stale leases; their live-ticket holders are forgotten by their governors."""
        report = reap_leases(self.ledger_dir, run=self.run, stale_after_s=self.stale_after_s,
                             budget_s=self.every_s)
        gone: dict[str, set[str]] = {}
        for reaped in report.reaped:
            self.outcomes[reaped.outcome] = self.outcomes.get(reaped.outcome, 0) + 1
            if reaped.lease.live_holder:  # a kept lease's owner is as dead as a reaped one's
                gone.setdefault(reaped.lease.provider_key, set()).add(reaped.lease.live_holder)
        if report.reaped:
            logger.warning("lease watch of run %s: %s", self.run, report.lines()[-1])
        for key, holders in gone.items():
            if self.on_holders_gone is not None:
                try:
                    self.on_holders_gone(key, sorted(holders))
                except Exception:  # noqa: BLE001 - the governor drops them when their renewals stop
                    logger.warning("could not tell governor %r of %d dead holder(s)", key, len(holders),
                                   exc_info=True)
        return report
