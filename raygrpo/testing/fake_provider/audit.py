"""Reading the fake provider's call log back: the figures tests and benchmarks judge raygrpo by.

Counted from the provider's side only: a create is what the provider accepted (201), a sandbox is alive from its
create to its delete (204) or the end of its lifetime (`expire`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from raygrpo.governor.create_schedule import max_per_window


@dataclass
class Audit:
    """What the log says.

    Args:
        creates: Creates accepted.
        rejected: Creates answered 429 (`rejected_rate`, `rejected_live`: beyond which limit).
        deletes: Deletes of a live sandbox; `expired`: sandboxes whose lifetime ended first.
        max_creates_per_s: Most accepted creates in any sliding 1 s window.
        max_live: Most sandboxes alive at once.
        live: Sandboxes alive at the end of the log (leaks, once every client is done).
        create_times: When each accepted create was logged (`time.time()`).
    """

    creates: int
    rejected: int
    rejected_rate: int
    rejected_live: int
    deletes: int
    expired: int
    max_creates_per_s: int
    max_live: int
    live: int
    create_times: list[float]


def audit(log_path: str | Path) -> Audit:
    """Read a fake provider's call log."""
    lines = [json.loads(x) for x in Path(log_path).read_text().splitlines() if x.strip()]
    creates = [r for r in lines if r["op"] == "create" and r["status"] == 201]
    rejected = [r for r in lines if r["op"] == "create" and r["status"] == 429]
    alive: set[str] = set()
    peak = deletes = expired = 0
    for record in lines:
        op, status, sandbox_id = record["op"], record["status"], record.get("id")
        if op == "create" and status == 201:
            alive.add(sandbox_id)
            peak = max(peak, len(alive))
        elif op == "delete" and status == 204:
            alive.discard(sandbox_id)
            deletes += 1
        elif op == "expire":
            alive.discard(sandbox_id)
            expired += 1
    times = [r["t"] for r in creates]
    return Audit(
        creates=len(creates), rejected=len(rejected),
        rejected_rate=sum(1 for r in rejected if r.get("reason") == "rate"),
        rejected_live=sum(1 for r in rejected if r.get("reason") == "live"),
        deletes=deletes, expired=expired, max_creates_per_s=max_per_window(times), max_live=peak,
        live=len(alive), create_times=times,
    )
