"""The live-sandbox cap of a provider key: tickets held from before a sandbox's create until after its stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

#: Dead holders remembered (their late calls are refused).
GONE_KEPT = 10_000
#: Seconds a rollout's own start waits for a ticket before a holder of idle warm sandboxes is asked to stop one
#: (`LiveCap.ask_evict`), and between two such asks for the same start.
EVICT_AFTER_S = 0.5


@dataclass
class _Waiter:
    holder: str
    touched: float
    event: asyncio.Event
    cancelled: bool = False
    #: `acquire` calls waiting on it now (a waiter being asked about is never abandoned).
    active: int = 0
    #: A warm pool's start, ahead of any rollout: every rollout's own start goes before it.
    warm: bool = False
    #: When it was queued; when a holder was last asked to stop a warm sandbox for it.
    since: float = 0.0
    evict_asked: float = 0.0


class LiveCap:
    """The live-sandbox cap of one provider key: at most `max_live` tickets out at once, granted in request order,
    rollouts' own starts before warm pools' starts.

    A ticket is taken before a sandbox's create is sent and given back after its stop (or its failed start), so
    every sandbox that can exist at the provider holds one. Holders renew their tickets (`renew`); the tickets of a
    holder silent for `ticket_ttl_s` (its process died) are dropped, and a restarted governor, which lost its state,
    takes back the tickets its holders renew. A provider that refuses a create for its live limit lowers the cap in
    effect to what is live (`throttle`); it climbs back by one every `recover_after_s` without such an answer.

    A warm pool's start (`warm=True`) waits behind every rollout's own start, whatever the order they asked in: a
    guess about what comes next must not hold up a rollout that is here. Warm sandboxes already started hold their
    tickets until used, so holders of idle ones ask `ask_evict` now and then: once a rollout's start has waited
    `evict_after_s` with the cap reached, one asker is told to stop one (one per waiting start per `evict_after_s`).

    Args:
        key: Provider key.
        max_live: Most tickets out at once.
        max_hold_s: Longest an `acquire` call waits before it answers "not yet" (the caller asks again).
        ticket_ttl_s: Tickets of a holder that has not renewed for this long are dropped.
        abandon_after_s: A waiter nobody asked about for this long (no `acquire` call waiting on it) leaves the
            queue.
        recover_after_s: Quiet time before each step of the cap in effect back up.
        evict_after_s: How long a rollout's start waits before a holder of idle warm sandboxes is asked to stop one.
    """

    def __init__(self, key: str, max_live: int, *, max_hold_s: float = 30.0, ticket_ttl_s: float = 60.0,
                 abandon_after_s: float = 15.0, recover_after_s: float = 5.0,
                 evict_after_s: float = EVICT_AFTER_S) -> None:
        if max_live < 1:
            raise ValueError(f"max_live must be >= 1, got {max_live}")
        self.key = key
        self.max_live = max_live
        #: The cap in effect: `max_live` until the provider says otherwise.
        self.effective_max_live = max_live
        self._max_hold = max_hold_s
        self._ttl = ticket_ttl_s
        self._abandon_after = abandon_after_s
        self._recover_after = recover_after_s
        self._evict_after = evict_after_s
        self._live: dict[str, str] = {}  # ticket -> holder
        self._renewed: dict[str, float] = {}  # holder -> last renewal
        self._waiting: OrderedDict[str, _Waiter] = OrderedDict()
        self._last_throttle = 0.0
        self._last_step = 0.0
        self._last_sweep = 0.0
        self._peak = 0
        self._counts = {"granted": 0, "returned": 0, "expired": 0, "throttled": 0, "forgotten": 0,
                        "evictions_asked": 0}
        self._gone: dict[str, float] = {}  # holders known dead (the most recent GONE_KEPT)

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < 1.0:
            return
        self._last_sweep = now
        for holder in [h for h, t in self._renewed.items() if now - t > self._ttl]:
            del self._renewed[holder]
            dropped = [t for t, h in self._live.items() if h == holder]
            for ticket in dropped:
                del self._live[ticket]
            if dropped:
                self._counts["expired"] += len(dropped)
                logger.warning("live cap %r: dropped %d ticket(s) of holder %s, silent for %.0f s", self.key,
                               len(dropped), holder, self._ttl)
        for ticket, w in list(self._waiting.items()):
            if w.active == 0 and now - w.touched > self._abandon_after:
                del self._waiting[ticket]
        if (self.effective_max_live < self.max_live
                and now - max(self._last_throttle, self._last_step) >= self._recover_after):
            self._last_step = now
            self.effective_max_live += 1
        self._wake()

    def _queued(self) -> list[tuple[str, _Waiter]]:
        """The waiters in the order they are granted: rollouts' own starts, then warm ones, each in request order."""
        waiting = list(self._waiting.items())
        return [tw for tw in waiting if not tw[1].warm] + [tw for tw in waiting if tw[1].warm]

    def _wake(self) -> None:
        free = self.effective_max_live - len(self._live)
        for _, w in self._queued():
            if free <= 0:
                break
            w.event.set()
            free -= 1

    async def acquire(self, ticket: str, holder: str, warm: bool = False) -> bool:
        """Take `ticket` for `holder` when the cap allows (True), or answer False after `max_hold_s` (ask again) or
        once the ticket is released meanwhile (its caller gave up). `warm`: for a warm pool's start, which waits
        behind every rollout's own."""
        now = time.time()
        self._sweep(now)
        if holder in self._gone:
            return False
        self._renewed[holder] = now
        if ticket in self._live:
            return True
        give_up = now + self._max_hold
        w = self._waiting.get(ticket)
        while True:
            if w is None or (ticket not in self._waiting and not w.cancelled):  # new, or swept as abandoned
                w = self._waiting[ticket] = _Waiter(holder, time.time(), asyncio.Event(), warm=warm,
                                                    since=time.monotonic())
                self._wake()
            if w.cancelled:
                return False
            w.touched = time.time()
            if w.event.is_set():
                ahead = 0
                for other, _ in self._queued():
                    if other == ticket:
                        break
                    ahead += 1
                if len(self._live) + ahead < self.effective_max_live:
                    del self._waiting[ticket]
                    self._live[ticket] = holder
                    self._peak = max(self._peak, len(self._live))
                    self._counts["granted"] += 1
                    return True
                w.event.clear()
            left = give_up - time.time()
            if left <= 0:
                return False
            # Woken by a release, a renewal or a sweep (which any other call runs at most once a second).
            w.active += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.event.wait(), left)
            finally:
                w.active -= 1
                w.touched = time.time()

    def ask_evict(self, holder: str) -> bool:
        """Whether `holder`, which holds idle warm sandboxes, should stop one: a rollout's own start has waited
        `evict_after_s` with the cap reached, and nobody was asked for it in the last `evict_after_s`."""
        if holder in self._gone or len(self._live) < self.effective_max_live:
            return False
        now = time.monotonic()
        for _, w in self._waiting.items():
            if not w.warm and not w.cancelled and now - max(w.since, w.evict_asked) >= self._evict_after:
                w.evict_asked = now
                self._counts["evictions_asked"] += 1
                return True
        return False

    def release(self, ticket: str) -> bool:
        """Give `ticket` back (or leave the queue); True if it was known. Safe to call more than once."""
        w = self._waiting.pop(ticket, None)
        if w is not None:
            w.cancelled = True
            w.event.set()
        found = self._live.pop(ticket, None) is not None
        if found or w is not None:
            self._counts["returned"] += found
            self._wake()
        return found or w is not None

    def forget(self, holder: str) -> int:
        """`holder` is dead (its process is gone, its sandboxes reaped): drop its tickets, cancel what it still has
        queued (calls of a dead caller go on waiting here until their hold ends, and would be granted to nobody), and
        refuse its later calls. Returns the tickets dropped."""
        self._gone[holder] = time.time()
        while len(self._gone) > GONE_KEPT:
            self._gone.pop(next(iter(self._gone)))
        self._renewed.pop(holder, None)
        dropped = [t for t, h in self._live.items() if h == holder]
        for ticket in dropped:
            del self._live[ticket]
        for ticket, w in list(self._waiting.items()):
            if w.holder == holder:
                del self._waiting[ticket]
                w.cancelled = True
                w.event.set()
        self._counts["forgotten"] += len(dropped)
        self._wake()
        return len(dropped)

    def renew(self, holder: str, tickets: list[str]) -> None:
        """`holder` still holds `tickets`; a governor that lost them (it restarted) takes them back."""
        now = time.time()
        if holder in self._gone:
            return
        self._renewed[holder] = now
        for ticket in tickets:
            self._waiting.pop(ticket, None)
            self._live.setdefault(ticket, holder)
        self._sweep(now)

    def throttle(self) -> None:
        """The provider refused a create for its live limit: the cap in effect drops to what is live now, less the
        refused start's own ticket."""
        now = time.time()
        self._counts["throttled"] += 1
        self._last_throttle = now
        cap = max(1, len(self._live) - 1)
        if cap < self.effective_max_live:
            self.effective_max_live = cap
            logger.warning("live cap %r: the provider refused a create for its live limit; cap now %d", self.key,
                           cap)

    def stats(self) -> dict[str, Any]:
        return {"max_live": self.max_live, "effective_max_live": self.effective_max_live, "live": len(self._live),
                "peak_live": self._peak, "waiting_live": len(self._waiting), **{f"live_{k}": v for k, v in
                                                                                  self._counts.items()}}
