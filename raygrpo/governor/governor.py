"""The governor of a provider key: its create schedule, its live-sandbox cap, and what to do with its rate-limit
answers.

Providers limit a sandbox account two ways (e2b Pro: 5 creates/s and 100 live; Daytona: 600 creates/min) and
answer anything beyond with HTTP 429. Every env pool actor on every node that creates sandboxes on one provider key
goes through one `Governor` (the named Ray actor `GovernorActor` of `raygrpo.governor.actor`, or this process's own
without Ray, `local_governor`); its limits are the run config's `providers.<key>`:

- **create rate**: `CreateSchedule` (`schedule.py`), the schedule of create slots;
- **live cap**: `LiveCap`, tickets held from before a sandbox's create is sent until after it is stopped, so the
  sandboxes alive (or being created) never exceed `max_live`, summed over the cluster;
- **rate-limit answers**: a create the provider refused anyway (its limits are lower than configured, or another
  client shares the account) pauses the schedule for everyone and lowers the rate (or the cap) in effect, which
  climb back once the provider stops refusing. The refused start waits a jittered, growing back-off
  (`BackoffSettings`) and queues again for a slot: retries go out at the schedule's pace, never in a burst.

Time spent waiting for the governor is never start time: a start's deadline counts from its create slot.
"""

from __future__ import annotations

import time
from typing import Any

from raygrpo.governor.live_cap import LiveCap
from raygrpo.governor.refusals import BackoffSettings, RateLimitSignal, rate_limit_signal
from raygrpo.governor.create_schedule import CreateSchedule, Reservation

__all__ = ["BackoffSettings", "Governor", "RateLimitSignal", "local_governor", "rate_limit_signal",
           "reset_local_governors"]


class Governor:
    """The limits of one provider key, cluster-wide: a create schedule, a live cap, or both (see the module
    docstring). The body of the named Ray actor of the key (`GovernorActor`); without Ray, this process's own
    (`local_governor`), which a gate asks directly (it is a `GovernorClient`).

    Args:
        key: Provider key.
        rate_per_s: Most creates in any 1 s window; None for no rate limit.
        max_live: Most sandboxes alive (or being created) at once; None for no cap.
        recovering: This governor replaces one that died (the schedule leaves a pause, see `CreateSchedule`).
        **schedule_kwargs: `CreateSchedule` settings.
    """

    def __init__(self, key: str, rate_per_s: float | None = None, max_live: int | None = None, *,
                 recovering: bool = False, **schedule_kwargs: Any) -> None:
        self.key = key
        self.rate_per_s = rate_per_s
        self.max_live = max_live
        self.schedule = (CreateSchedule(key, rate_per_s, recovering=recovering, **schedule_kwargs)
                         if rate_per_s else None)
        self.live = LiveCap(key, max_live) if max_live else None
        self._refusals = {"rate": 0, "live": 0}

    async def reserve(self, request_id: str, first: bool = False) -> Reservation:
        """A create slot (see `CreateSchedule.reserve`; `first`: before every queued request); ready at once
        when there is no rate limit."""
        if self.schedule is None:
            now = time.time()
            return Reservation(request_id, now, now + 3600.0, True, 0.0)
        return await self.schedule.reserve(request_id, first)

    def release(self, request_id: str) -> bool:
        return self.schedule.release(request_id) if self.schedule is not None else False

    async def acquire_live(self, ticket: str, holder: str, warm: bool = False) -> bool:
        """A live ticket (see `LiveCap.acquire`; `warm`: for a warm pool's start); True at once without a cap."""
        return True if self.live is None else await self.live.acquire(ticket, holder, warm)

    async def ask_evict(self, holder: str) -> bool:
        """Whether `holder` should stop one of its idle warm sandboxes for a rollout's start (`LiveCap.ask_evict`)."""
        return self.live.ask_evict(holder) if self.live is not None else False

    def release_live(self, ticket: str) -> bool:
        return self.live.release(ticket) if self.live is not None else False

    def release_lives(self, tickets: list[str]) -> int:
        """Give several live tickets back at once (a client's releases, batched); returns how many were known."""
        return sum(self.release_live(ticket) for ticket in tickets)

    async def admit(self, ticket: str, holder: str, request_id: str,
                    warm: bool = False) -> tuple[bool, Reservation | None]:
        """A start's first two questions in one round trip: a live ticket (`acquire_live`), then, once it is held
        and there is a rate limit, `request_id`'s create slot (`reserve`; it may answer "still queued").
        Returns `(False, None)` when the ticket is not granted yet (ask again)."""
        if not await self.acquire_live(ticket, holder, warm):
            return False, None
        if self.schedule is None:
            return True, None
        return True, await self.schedule.reserve(request_id)

    def forget_holders(self, holders: list[str]) -> int:
        """These holders are dead (their actor is gone and its sandboxes reaped): drop their live tickets and queued
        requests (see `LiveCap.forget`). Returns the tickets dropped."""
        return sum(self.live.forget(h) for h in holders) if self.live is not None else 0

    def renew_live(self, holder: str, tickets: list[str]) -> None:
        if self.live is not None:
            self.live.renew(holder, tickets)

    def refused(self, reason: str, pause_s: float) -> dict[str, Any]:
        """The provider refused a create (`reason` "rate" or "live"): pause the schedule for `pause_s` and lower
        the limit it named. Returns the stats after."""
        self._refusals["live" if reason == "live" else "rate"] += 1
        if reason == "live" and self.live is not None:
            self.live.throttle()
            if self.schedule is not None:
                self.schedule.throttle(pause_s, slower=False)
        elif self.schedule is not None:
            self.schedule.throttle(pause_s, slower=True)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "rate_per_s": self.rate_per_s, "max_live": self.max_live,
                               "refused_rate": self._refusals["rate"], "refused_live": self._refusals["live"]}
        if self.schedule is not None:
            out.update(self.schedule.stats())
        if self.live is not None:
            out.update(self.live.stats())
        return out


#: In-process governors (used when Ray is not running), one per provider key.
_local: dict[str, Governor] = {}


def local_governor(key: str, rate_per_s: float | None = None, max_live: int | None = None,
                   **kwargs: Any) -> Governor:
    """The process-wide in-process governor of `key`, made on first use (later arguments are ignored)."""
    gov = _local.get(key)
    if gov is None:
        gov = _local[key] = Governor(key, rate_per_s, max_live, **kwargs)
    return gov


def reset_local_governors() -> None:
    """Forget every in-process governor (tests)."""
    _local.clear()
