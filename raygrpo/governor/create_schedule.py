"""The create schedule of a provider key: slots at most `rate_per_s` a second, handed out in request order.

How the schedule keeps "never more than `rate` creates in any sliding 1 s window" although the create happens in
another process, after a sleep that wakes late (a few ms to tens of ms on a loaded machine):

- Slots are at least `interval = (1 + margin_s) / rate_per_s` apart, so any `rate + 1` slots span at least
  `1 + margin_s` seconds.
- A caller never creates before its slot (it sleeps until `at`, re-checking the wall clock), and it creates only if
  it woke by `deadline = at + 0.8 * margin_s`; a later wake gives the slot up and queues again, at the front
  (`reserve(..., first=True)`), so a missed slot costs its start about `max_lead_s`, not the whole queue. So any
  two creates `rate` slots apart are at least `1 + margin_s - 0.8 * margin_s > 1` s apart: no 1 s window holds
  `rate + 1`.
  The remaining `0.2 * margin_s` covers the synchronous code between the gate's check and the backend's create.
- The default `margin_s = 0.05` gives 1/1.05 = 95% of the rate when every wake is on time; a late wake costs one
  slot. Across nodes the schedule is in wall-clock time, so clock skew between nodes adds to the lateness.
- Slots go out in request order whichever actor asks, so actors interleave instead of bursting together.
- A slower rate in effect (the provider refused creates) only widens the spacing, so the bound above holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_MARGIN_S = 0.05
#: Fraction of the margin a wake may be late by; the rest covers the code between the check and the create.
LATE_FRACTION = 0.8


@dataclass(frozen=True)
class Reservation:
    """A create schedule's answer to `reserve` (through the governor).

    `ready`: the caller may create in `[at, deadline]` (wall-clock seconds). Not ready: the request is still queued
    with its slot kept; call `reserve` again with the same id. `cancelled`: the request was released meanwhile.
    """

    request_id: str
    at: float
    deadline: float
    ready: bool
    rate_per_s: float
    cancelled: bool = False


@dataclass
class _Queued:
    at: float
    touched: float
    active: int = 0
    cancelled: bool = False
    event: asyncio.Event | None = field(default=None, repr=False)


class CreateSchedule:
    """The create schedule of one provider key: slots handed out in request order, at most `rate_per_s` a second.

    Plain asyncio; the governor (`raygrpo.governor.Governor`) holds one, in the named Ray actor of its key or, in a
    process without Ray, in-process. A request is given its slot when it first arrives, but its answer is held back
    until the slot is at most `max_lead_s` ahead (callers re-ask after `max_hold_s`). So every slot a caller holds is
    near, which is what lets a restarted schedule (its governor restarted and lost its state) start safely: it leaves
    its first `max_lead_s + margin_s + 1` s empty, after any slot its previous incarnation can have handed out.

    Released slots (a caller cancelled, or gave up waiting) go to the next request if they are still at least
    `min_lead_s` ahead, so a cancelled start leaves no hole in a busy schedule; a request whose caller stopped
    asking (its process died) is released after `abandon_after_s`.

    The provider may allow less than `rate_per_s` (a lower tier, a limit lowered mid-run, another client on the same
    account). `throttle` is how its rate-limit answers reach the schedule: no slot before the pause ends, and, once
    rate answers refuse 30% of the last 10 slots' worth of time (at least 3; one now and then is a request that
    arrived late), the rate in effect drops by `decrease` (at most once per second: answers to creates sent before
    the drop say nothing new). Every `recover_after_s` without such an answer it climbs back by a tenth of `rate_per_s`.
    Queued requests are re-planned on the slower grid, after every slot already handed out.

    Args:
        key: Provider key (for logs and stats).
        rate_per_s: Most creates in any 1 s window.
        margin_s: Extra spacing, > 0: slots are `(1 + margin_s) / rate` apart, and a caller may create up to
            `0.8 * margin_s` after its slot (see the module docstring).
        max_lead_s: Furthest ahead a handed-out slot may be.
        max_hold_s: Longest a `reserve` call is held before it answers "still queued".
        min_lead_s: Nearest a new slot may be (time for the answer to reach the caller).
        abandon_after_s: A queued request nobody asked about for this long is released.
        recovering: This schedule replaces one that died: leave the first `max_lead_s + margin_s + 1` s empty.
        decrease: Factor applied to the rate in effect on a rate-limit answer.
        min_rate_fraction: The rate in effect never drops below this fraction of `rate_per_s`.
        recover_after_s: Quiet time (no rate-limit answer) before each step back up.
    """

    def __init__(
        self,
        key: str,
        rate_per_s: float,
        margin_s: float = DEFAULT_MARGIN_S,
        max_lead_s: float = 1.0,
        max_hold_s: float = 10.0,
        min_lead_s: float = 0.1,
        abandon_after_s: float = 15.0,
        recovering: bool = False,
        decrease: float = 0.7,
        min_rate_fraction: float = 0.05,
        recover_after_s: float = 5.0,
    ) -> None:
        if not rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        if not margin_s > 0 or min_lead_s < 0 or max_lead_s < min_lead_s or max_hold_s <= 0:
            # margin_s > 0: it is also the lateness a wake is allowed, and no wake is exactly on time.
            raise ValueError("need margin_s > 0, 0 <= min_lead_s <= max_lead_s and max_hold_s > 0")
        if not 0 < decrease < 1 or not 0 < min_rate_fraction <= 1:
            raise ValueError("need 0 < decrease < 1 and 0 < min_rate_fraction <= 1")
        self.key = key
        self.rate_per_s = float(rate_per_s)
        self.margin_s = margin_s
        self._max_lead = max_lead_s
        self._max_hold = max_hold_s
        self._min_lead = min_lead_s
        self._abandon_after = abandon_after_s
        self._decrease = decrease
        self._min_rate = self.rate_per_s * min_rate_fraction
        self._recover_after = recover_after_s
        #: The rate in effect: `rate_per_s` until the provider says otherwise.
        self.effective_rate_per_s = self.rate_per_s
        now = time.time()
        self._next_at = now + (max_lead_s + margin_s + 1.0 if recovering else 0.0)
        if recovering:
            logger.warning("create schedule %r restarted: no creates before %.2f s from now", key, self._next_at - now)
        self._not_before = 0.0
        self._last_handed = 0.0
        self._last_throttle = 0.0
        self._last_step = now
        self._refusals: deque[float] = deque()
        self._free: list[float] = []  # heap of released slot times
        self._queued: dict[str, _Queued] = {}
        self._delivered: dict[str, float] = {}
        self._last_sweep = 0.0
        self._counts = {"granted": 0, "released": 0, "reused": 0, "abandoned": 0, "throttled": 0}

    @property
    def interval_s(self) -> float:
        """Seconds between consecutive slots at the rate in effect."""
        return (1.0 + self.margin_s) / self.effective_rate_per_s

    def _take(self, now: float) -> float:
        self._recover(now)
        earliest = max(now + self._min_lead, self._not_before)
        while self._free and self._free[0] < earliest:
            heapq.heappop(self._free)
        if self._free:
            self._counts["reused"] += 1
            return heapq.heappop(self._free)
        at = max(self._next_at, earliest)
        self._next_at = at + self.interval_s
        return at

    def _take_first(self, now: float) -> float:
        """A slot for a request that goes before every queued one (it missed its own slot): it takes the earliest
        queued slot, each queued request the next one's, the last a new one. The set of slot times only grows by
        the new one, so the spacing holds, and no queued slot moves earlier (nobody needs waking)."""
        slot = self._take(now)
        earliest = max(now + self._min_lead, self._not_before)
        ahead = sorted((q for q in self._queued.values() if earliest <= q.at < slot), key=lambda q: q.at)
        if not ahead:
            return slot
        first = ahead[0].at
        for q, later in zip(ahead, ahead[1:]):
            q.at = later.at
        ahead[-1].at = slot
        return first

    def _give_back(self, at: float, now: float) -> None:
        if at >= max(now + self._min_lead, self._not_before):
            heapq.heappush(self._free, at)
            self._counts["released"] += 1

    def _recover(self, now: float) -> None:
        if self.effective_rate_per_s >= self.rate_per_s:
            return
        if now - max(self._last_throttle, self._last_step) >= self._recover_after:
            self._last_step = now
            self.effective_rate_per_s = min(self.rate_per_s, self.effective_rate_per_s + self.rate_per_s / 10)
            logger.info("create schedule %r: back up to %.2f creates/s", self.key, self.effective_rate_per_s)

    def throttle(self, pause_s: float, slower: bool = True) -> float:
        """The provider refused a create for its rate (`slower`) or another limit: no slot for `pause_s` seconds,
        and a slower rate when `slower`. Returns when the pause ends (wall clock)."""
        now = time.time()
        self._counts["throttled"] += 1
        self._not_before = max(self._not_before, now + max(0.0, pause_s))
        if slower:
            self._refusals.append(now)
        # A refusal now and then is a request that arrived late (network jitter); a provider that allows less than
        # the rate in effect refuses a good part of the slots: 30% of the last 10 slots' worth of time, and at least 3.
        window = max(2.0, 10.0 / self.effective_rate_per_s)
        while self._refusals and self._refusals[0] < now - window:
            self._refusals.popleft()
        enough = max(3, math.ceil(0.3 * self.effective_rate_per_s * window))
        if slower and len(self._refusals) >= enough and now - self._last_throttle >= 1.0:
            self.effective_rate_per_s = max(self._min_rate, self.effective_rate_per_s * self._decrease)
            self._last_throttle = now
            logger.warning("create schedule %r: the provider refused creates; down to %.2f creates/s", self.key,
                           self.effective_rate_per_s)
        self._replan(now)
        return self._not_before

    def _replan(self, now: float) -> None:
        """Queued requests get new slots on the current grid, after every slot handed out and after the pause."""
        self._free.clear()
        at = max(now + self._min_lead, self._not_before, self._last_handed + self.interval_s)
        for q in sorted(self._queued.values(), key=lambda q: q.at):
            q.at = at
            at += self.interval_s
            if q.event is not None:
                q.event.set()
        self._next_at = at

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < 0.5:
            return
        self._last_sweep = now
        for rid in [r for r, at in self._delivered.items() if at < now]:
            del self._delivered[rid]
        for rid, q in list(self._queued.items()):
            if q.active == 0 and now - q.touched > self._abandon_after:
                del self._queued[rid]
                self._counts["abandoned"] += 1
                self._give_back(q.at, now)

    async def reserve(self, request_id: str, first: bool = False) -> Reservation:
        """Queue `request_id` (or continue its wait); answer when its slot is near, or "still queued".

        `first`: a new request goes before every queued one (its caller woke too late for the slot it had)."""
        now = time.time()
        self._sweep(now)
        if request_id in self._delivered:  # a retried call: answer the same slot again
            return self._answer(request_id, self._delivered[request_id], ready=True)
        q = self._queued.get(request_id)
        if q is None:
            q = self._queued[request_id] = _Queued(self._take_first(now) if first else self._take(now), touched=now)
        hold_until = now + self._max_hold
        q.active += 1
        try:
            while not q.cancelled:
                now = time.time()
                wait = min(q.at - self._max_lead - now, hold_until - now)
                if wait <= 0.01:
                    break
                if q.event is None or q.event.is_set():
                    q.event = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(q.event.wait(), wait)
        finally:
            q.active -= 1
            q.touched = time.time()
        if q.cancelled:
            return self._answer(request_id, q.at, ready=False, cancelled=True)
        if q.at - self._max_lead > time.time() + 0.01:
            return self._answer(request_id, q.at, ready=False)
        self._queued.pop(request_id, None)
        self._delivered[request_id] = q.at
        self._last_handed = max(self._last_handed, q.at)
        self._counts["granted"] += 1
        return self._answer(request_id, q.at, ready=True)

    def _answer(self, request_id: str, at: float, ready: bool, cancelled: bool = False) -> Reservation:
        return Reservation(request_id, at, at + LATE_FRACTION * self.margin_s, ready, self.rate_per_s, cancelled)

    def release(self, request_id: str) -> bool:
        """Give `request_id`'s slot back (its caller gave up); True if it was known. Safe to call more than once."""
        now = time.time()
        q = self._queued.pop(request_id, None)
        if q is not None:
            q.cancelled = True
            if q.event is not None:
                q.event.set()
            self._give_back(q.at, now)
            return True
        at = self._delivered.pop(request_id, None)
        if at is not None:
            self._give_back(at, now)
            return True
        return False

    def stats(self) -> dict[str, Any]:
        now = time.time()
        return {
            "key": self.key,
            "rate_per_s": self.rate_per_s,
            "effective_rate_per_s": self.effective_rate_per_s,
            "interval_s": self.interval_s,
            "queued": len(self._queued),
            "free_slots": len(self._free),
            "next_slot_in_s": max(0.0, self._next_at - now),
            "paused_for_s": max(0.0, self._not_before - now),
            **self._counts,
        }


def max_per_window(times: list[float], window_s: float = 1.0) -> int:
    """Most of `times` in any half-open window `[t, t + window_s)` (the measure the rate limit bounds)."""
    ts = sorted(times)
    best = 0
    j = 0
    for i, t in enumerate(ts):
        while ts[j] <= t - window_s:
            j += 1
        best = max(best, i - j + 1)
    return best
