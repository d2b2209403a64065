"""What a provisioning gate counts: its starts waiting, admitted, late for their slot, refused, and how long they
waited. An env pool actor reports these per provider key in its stats (`gate_stats`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GateCounts:
    """The running counts of one `ProvisioningGate`.

    Args:
        waiting: Starts waiting for their concurrency or create slot now.
        starting: Starts inside their slot now (the backend's create and start running).
        granted: Starts let in so far.
        wait_total_s: Seconds those starts waited for their slots, summed.
        longest_wait_s: The longest any of them waited.
        late_wakes: Create slots missed because the start woke past the slot's margin (it queued again, first).
        late_on_arrival: Of those, the slot's deadline had passed before the wait for it began (the governor's
            answer, or the start's own steps since `admit`, came too late).
        late_total_s: How late the missed slots were, summed.
        late_max_s: The latest miss.
        cancelled: Starts cancelled while they waited.
        refused: Creates the provider refused ("too many requests").
        backoff_s: Seconds refused starts backed off, summed.
    """

    waiting: int = 0
    starting: int = 0
    granted: int = 0
    wait_total_s: float = 0.0
    longest_wait_s: float = 0.0
    late_wakes: int = 0
    late_on_arrival: int = 0
    late_total_s: float = 0.0
    late_max_s: float = 0.0
    cancelled: int = 0
    refused: int = 0
    backoff_s: float = 0.0

    def admitted(self, waited_s: float) -> None:
        """A start got its slot after `waited_s` seconds."""
        self.granted += 1
        self.wait_total_s += waited_s
        self.longest_wait_s = max(self.longest_wait_s, waited_s)

    def missed(self, late_s: float, on_arrival: bool) -> None:
        """A start woke `late_s` seconds after its create slot, past its margin (`on_arrival`: the slot's deadline
        had passed before the wait began)."""
        self.late_wakes += 1
        self.late_on_arrival += on_arrival
        self.late_total_s += late_s
        self.late_max_s = max(self.late_max_s, late_s)

    def as_stats(self) -> dict[str, Any]:
        """The counts as a gate's stats report them (means instead of sums)."""
        return {
            "waiting": self.waiting,
            "starting": self.starting,
            "granted": self.granted,
            "mean_wait_s": self.wait_total_s / self.granted if self.granted else 0.0,
            "longest_wait_s": self.longest_wait_s,
            "late_wakes": self.late_wakes,
            "late_on_arrival": self.late_on_arrival,
            "late_mean_s": self.late_total_s / self.late_wakes if self.late_wakes else 0.0,
            "late_max_s": self.late_max_s,
            "cancelled": self.cancelled,
            "refused": self.refused,
            "backoff_s": self.backoff_s,
        }
