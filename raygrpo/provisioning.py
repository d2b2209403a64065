"""Provisioning control: how many sandbox starts run at once in an actor, and how fast creates go cluster-wide.

Providers cap how fast sandboxes may be created (e2b: 5 creates/s on its Pro tier) and fail the creates beyond
that. Every env pool actor starts its sandboxes through a `ProvisioningGate`:

    gate = gate_for("e2b", max_concurrent_starts=16, rate_per_s=5.0)
    async with gate.start_slot():
        await env.start(...)          # the backend's create is called here, right after the slot opens

The gate bounds the starts in flight in this actor (a semaphore) and, when a rate is set, takes a reservation from
the limiter of the provider key and sleeps until the reserved time. The limiter client is passed in by whoever builds
the gate: env pool actors pass a factory of clients of the named Ray actor that every actor on every node shares
(`raygrpo.actors.rate_limiter`); without one, the gate uses this process's `CreateRateLimiter` of the key. Everything
here is plain asyncio.

Waiting for a slot is not start time: a start's own deadline (`HarborSpec.start_timeout_s`) counts from when the gate
lets it in, and the wait itself is unbounded by default (the schedule always moves at the rate; a limiter that stays
unreachable fails the start after `unavailable_after_s`).

How the schedule keeps "never more than `rate` creates in any sliding 1 s window" although the create happens in
another process, after a sleep that wakes late (a few ms to tens of ms on a loaded machine):

- Slots lie on one grid, `interval = (1 + margin_s) / rate_per_s` apart, so any `rate + 1` slots span at least
  `1 + margin_s` seconds.
- A caller never creates before its slot (it sleeps until `at`, re-checking the wall clock), and it creates only if
  it woke by `deadline = at + 0.8 * margin_s`; a later wake gives the slot up and queues again. So any two creates
  `rate` slots apart are at least `1 + margin_s - 0.8 * margin_s > 1` s apart: no 1 s window holds `rate + 1`.
  The remaining `0.2 * margin_s` covers the synchronous code between the gate's check and the backend's create.
- The default `margin_s = 0.05` gives 1/1.05 = 95% of the rate when every wake is on time; a late wake costs one
  slot. Across nodes the schedule is in wall-clock time, so clock skew between nodes adds to the lateness.
- Slots go out in request order whichever actor asks, so actors interleave instead of bursting together.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

logger = logging.getLogger(__name__)

DEFAULT_MARGIN_S = 0.05
#: Fraction of the margin a wake may be late by; the rest covers the code between the check and the create.
LATE_FRACTION = 0.8


class ProvisioningError(RuntimeError):
    """A start could not get its create slot: the limiter is gone for too long, or the wait exceeded its bound."""


@dataclass(frozen=True)
class Reservation:
    """A limiter's answer to `reserve`.

    `ready`: the caller may create in `[at, deadline]` (wall-clock seconds). Not ready: the request is still queued
    with its slot kept; call `reserve` again with the same id. `cancelled`: the request was released meanwhile.
    """

    request_id: str
    at: float
    deadline: float
    ready: bool
    rate_per_s: float
    cancelled: bool = False


class RateLimiterClient(Protocol):
    """What a gate needs from a limiter: `reserve` (awaited, may answer "still queued") and `release`."""

    async def reserve(self, request_id: str) -> Reservation: ...

    def release(self, request_id: str) -> Any: ...


#: Makes the limiter client of a provider key: `factory(key, rate_per_s, margin_s=...)`.
LimiterFactory = Callable[..., RateLimiterClient]


@dataclass
class _Queued:
    index: int
    touched: float
    active: int = 0
    cancelled: bool = False
    event: asyncio.Event | None = field(default=None, repr=False)


class CreateRateLimiter:
    """The create schedule of one provider key: grid slots, handed out in request order.

    Plain asyncio; it is the body of the named Ray actor and, in a process without Ray, the limiter itself.
    A request is given its slot when it first arrives, but its answer is held back until the slot is at most
    `max_lead_s` ahead (callers re-ask after `max_hold_s`). So every slot a caller holds is near, which is what lets a
    restarted limiter (which has lost its state) start safely: it leaves its first `max_lead_s + margin_s + 1` s
    empty, after any slot its previous incarnation can have handed out.

    Released slots (a caller cancelled, or gave up waiting) go to the next request if they are still at least
    `min_lead_s` ahead, so a cancelled start leaves no hole in a busy schedule; a request whose caller stopped
    asking (its process died) is released after `abandon_after_s`.

    Args:
        key: Provider key (for logs and stats).
        rate_per_s: Most creates in any 1 s window.
        margin_s: Extra spacing, > 0: slots are `(1 + margin_s) / rate_per_s` apart, and a caller may create up to
            `0.8 * margin_s` after its slot (see the module docstring).
        max_lead_s: Furthest ahead a handed-out slot may be.
        max_hold_s: Longest a `reserve` call is held before it answers "still queued".
        min_lead_s: Nearest a new slot may be (time for the answer to reach the caller).
        abandon_after_s: A queued request nobody asked about for this long is released.
        recovering: This limiter replaces one that died: leave the first `max_lead_s + margin_s + 1` s empty.
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
    ) -> None:
        if not rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        if not margin_s > 0 or min_lead_s < 0 or max_lead_s < min_lead_s or max_hold_s <= 0:
            # margin_s > 0: it is also the lateness a wake is allowed, and no wake is exactly on time.
            raise ValueError("need margin_s > 0, 0 <= min_lead_s <= max_lead_s and max_hold_s > 0")
        self.key = key
        self.rate_per_s = float(rate_per_s)
        self.margin_s = margin_s
        self.interval_s = (1.0 + margin_s) / self.rate_per_s
        self._max_lead = max_lead_s
        self._max_hold = max_hold_s
        self._min_lead = min_lead_s
        self._abandon_after = abandon_after_s
        now = time.time()
        self._origin = now + (max_lead_s + margin_s + 1.0 if recovering else 0.0)
        if recovering:
            logger.warning("rate limiter %r restarted: no creates before %.2f s from now", key, self._origin - now)
        self._next = 0
        self._free: list[int] = []  # heap of released slot indices
        self._queued: dict[str, _Queued] = {}
        self._delivered: dict[str, int] = {}
        self._last_sweep = 0.0
        self._counts = {"granted": 0, "released": 0, "reused": 0, "abandoned": 0}

    def slot_time(self, index: int) -> float:
        return self._origin + index * self.interval_s

    def _take(self, now: float) -> int:
        earliest = now + self._min_lead
        while self._free and self.slot_time(self._free[0]) < earliest:
            heapq.heappop(self._free)
        if self._free:
            self._counts["reused"] += 1
            return heapq.heappop(self._free)
        index = max(self._next, math.ceil((earliest - self._origin) / self.interval_s))
        self._next = index + 1
        return index

    def _give_back(self, index: int, now: float) -> None:
        if self.slot_time(index) >= now + self._min_lead:
            heapq.heappush(self._free, index)
            self._counts["released"] += 1

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < 0.5:
            return
        self._last_sweep = now
        for rid in [r for r, i in self._delivered.items() if self.slot_time(i) < now]:
            del self._delivered[rid]
        for rid, q in list(self._queued.items()):
            if q.active == 0 and now - q.touched > self._abandon_after:
                del self._queued[rid]
                self._counts["abandoned"] += 1
                self._give_back(q.index, now)

    async def reserve(self, request_id: str) -> Reservation:
        """Queue `request_id` (or continue its wait); answer when its slot is near, or "still queued"."""
        now = time.time()
        self._sweep(now)
        if request_id in self._delivered:  # a retried call: answer the same slot again
            return self._answer(request_id, self._delivered[request_id], ready=True)
        q = self._queued.get(request_id)
        if q is None:
            q = self._queued[request_id] = _Queued(self._take(now), touched=now)
        at = self.slot_time(q.index)
        hold = at - self._max_lead - now
        if hold > 0 and not q.cancelled:
            if q.event is None:
                q.event = asyncio.Event()
            q.active += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(q.event.wait(), min(hold, self._max_hold))
            finally:
                q.active -= 1
                q.touched = time.time()
        if q.cancelled:
            return self._answer(request_id, q.index, ready=False, cancelled=True)
        if at - self._max_lead > time.time() + 0.01:
            return self._answer(request_id, q.index, ready=False)
        self._queued.pop(request_id, None)
        self._delivered[request_id] = q.index
        self._counts["granted"] += 1
        return self._answer(request_id, q.index, ready=True)

    def _answer(self, request_id: str, index: int, ready: bool, cancelled: bool = False) -> Reservation:
        at = self.slot_time(index)
        return Reservation(request_id, at, at + LATE_FRACTION * self.margin_s, ready, self.rate_per_s, cancelled)

    def release(self, request_id: str) -> bool:
        """Give `request_id`'s slot back (its caller gave up); True if it was known. Safe to call more than once."""
        now = time.time()
        q = self._queued.pop(request_id, None)
        if q is not None:
            q.cancelled = True
            if q.event is not None:
                q.event.set()
            self._give_back(q.index, now)
            return True
        index = self._delivered.pop(request_id, None)
        if index is not None:
            self._give_back(index, now)
            return True
        return False

    def stats(self) -> dict[str, Any]:
        now = time.time()
        return {
            "key": self.key,
            "rate_per_s": self.rate_per_s,
            "interval_s": self.interval_s,
            "queued": len(self._queued),
            "free_slots": len(self._free),
            "next_slot_in_s": max(0.0, self.slot_time(self._next) - now),
            **self._counts,
        }


#: In-process limiters (used when Ray is not running), one per provider key.
_local_limiters: dict[str, CreateRateLimiter] = {}


def local_limiter(key: str, rate_per_s: float, **kwargs: Any) -> CreateRateLimiter:
    """The process-wide in-process limiter of `key`, created on first use (later arguments are ignored)."""
    limiter = _local_limiters.get(key)
    if limiter is None:
        limiter = _local_limiters[key] = CreateRateLimiter(key, rate_per_s, **kwargs)
    return limiter


class ProvisioningGate:
    """Admits sandbox starts in one actor: at most `max_concurrent_starts` at once, creates at most `rate_per_s`.

    Use `async with gate.start_slot(): await env.start(...)`, with the backend's create as the first thing in the
    block. A start first takes a concurrency slot, then (with a rate) a create slot from the limiter of `key`, then
    sleeps until that slot; the concurrency slot is held until the block ends. A start cancelled while it waits
    releases its create slot to the limiter.

    Args:
        max_concurrent_starts: Starts in flight at once in this actor; None for no bound.
        rate_per_s: Most creates in any 1 s window for `key`, summed over every actor; None for no rate limit.
        key: Provider key naming the shared limiter (e.g. "e2b"); required with a rate.
        limiter: The limiter to reserve from (required with a rate): a client of the cluster-wide limiter, or this
            process's `local_limiter(key, rate_per_s)`.
        max_wait_s: Longest a start may wait for its create slot (from asking the limiter to the slot) before it
            fails with `ProvisioningError`; None (the default) for no bound: the wait is not start time, and each
            call to the limiter is bounded on its own.
        margin_s: Schedule margin this gate expects of its limiter (see the module docstring).
        history: Grant timestamps kept for `grant_times()`.
    """

    def __init__(
        self,
        max_concurrent_starts: int | None = None,
        rate_per_s: float | None = None,
        key: str | None = None,
        *,
        limiter: RateLimiterClient | None = None,
        max_wait_s: float | None = None,
        margin_s: float = DEFAULT_MARGIN_S,
        history: int = 10_000,
    ) -> None:
        if max_concurrent_starts is not None and max_concurrent_starts < 1:
            raise ValueError(f"max_concurrent_starts must be >= 1 or None, got {max_concurrent_starts}")
        if rate_per_s is not None and not rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0 or None, got {rate_per_s}")
        if rate_per_s is not None and not key:
            raise ValueError("a rate limit needs a provider key")
        if rate_per_s is not None and limiter is None:
            raise ValueError("a rate limit needs a limiter to reserve from")
        if not margin_s > 0:
            raise ValueError(f"margin_s must be > 0, got {margin_s}")
        self.key = key
        self.max_concurrent_starts = max_concurrent_starts
        self.rate_per_s = rate_per_s
        self._limiter = limiter
        self._max_wait = max_wait_s
        self._margin = margin_s
        self._sem = asyncio.Semaphore(max_concurrent_starts) if max_concurrent_starts else None
        self._grants: deque[float] = deque(maxlen=history)
        self._waiting = 0
        self._starting = 0
        self._granted = 0
        self._wait_total = 0.0
        self._wait_max = 0.0
        self._late = 0
        self._cancelled = 0
        self._rate_warned = False

    @contextlib.asynccontextmanager
    async def start_slot(self) -> AsyncIterator[None]:
        """Wait for a concurrency slot and (with a rate) this start's create slot; hold the former for the block."""
        asked = time.time()
        self._waiting += 1
        admitted = False
        try:
            async with self._sem if self._sem is not None else contextlib.nullcontext():
                if self.rate_per_s is not None:
                    await self._await_create_slot()
                now = time.time()
                self._waiting -= 1
                admitted = True
                self._grants.append(now)
                self._granted += 1
                self._wait_total += now - asked
                self._wait_max = max(self._wait_max, now - asked)
                self._starting += 1
                try:
                    yield
                finally:
                    self._starting -= 1
        except asyncio.CancelledError:
            if not admitted:
                self._cancelled += 1
            raise
        finally:
            if not admitted:
                self._waiting -= 1

    async def _await_create_slot(self) -> None:
        limiter = self._limiter
        assert limiter is not None
        give_up = None if self._max_wait is None else time.time() + self._max_wait
        while True:
            rid = uuid.uuid4().hex
            try:
                res = await self._reserve(limiter, rid, give_up)
                if res.cancelled:  # released behind our back (e.g. taken for abandoned): queue again
                    continue
                while (left := res.at - time.time()) > 0:
                    await asyncio.sleep(left)
            except BaseException:
                limiter.release(rid)
                raise
            if time.time() <= res.deadline:
                return
            self._late += 1
            logger.debug("create slot of %r missed by %.3f s; queueing again", self.key, time.time() - res.at)

    async def _reserve(self, limiter: RateLimiterClient, rid: str, give_up: float | None) -> Reservation:
        while True:
            if give_up is not None and time.time() > give_up:
                raise ProvisioningError(
                    f"no create slot for {self.key!r} within max_wait_s={self._max_wait} s "
                    f"(rate {self.rate_per_s}/s); lower the starts queued or raise max_wait_s"
                )
            res = await limiter.reserve(rid)
            if res.rate_per_s != self.rate_per_s and not self._rate_warned:
                self._rate_warned = True
                logger.warning(
                    "rate limiter %r runs at %s/s (set by whoever created it), not the %s/s asked here",
                    self.key, res.rate_per_s, self.rate_per_s,
                )
            if res.ready or res.cancelled:
                return res

    def grant_times(self) -> list[float]:
        """Wall-clock times at which starts entered their slot (the most recent `history` of them)."""
        return list(self._grants)

    def stats(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "max_concurrent_starts": self.max_concurrent_starts,
            "rate_per_s": self.rate_per_s,
            "waiting": self._waiting,
            "starting": self._starting,
            "granted": self._granted,
            "mean_wait_s": self._wait_total / self._granted if self._granted else 0.0,
            "max_wait_s": self._wait_max,
            "late_wakes": self._late,
            "cancelled": self._cancelled,
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


#: Gates by event loop, then provider key: one gate per (actor, key); gates hold loop-bound primitives.
_gates: dict[asyncio.AbstractEventLoop, dict[str | None, ProvisioningGate]] = {}


def gate_for(
    key: str | None,
    max_concurrent_starts: int | None = None,
    rate_per_s: float | None = None,
    *,
    limiters: LimiterFactory | None = None,
    **kwargs: Any,
) -> ProvisioningGate:
    """This actor's gate for provider `key`, made on first use; call it on the actor's event loop.

    Several suites on one provider share the gate, hence its limits: the first call's settings hold, and a later
    call asking for different ones is logged as a warning.

    Args:
        key: Provider key.
        max_concurrent_starts: Starts in flight at once in this actor; None for no bound.
        rate_per_s: Creates per second for `key`, cluster-wide; None for no rate limit.
        limiters: Makes the limiter client of `key` when a rate is set (the env pool actor passes the cluster-wide
            limiter's); None uses this process's `local_limiter`.
        **kwargs: Further `ProvisioningGate` settings.
    """
    loop = asyncio.get_running_loop()
    for old in [lp for lp in _gates if lp.is_closed()]:
        del _gates[old]
    gates = _gates.setdefault(loop, {})
    gate = gates.get(key)
    if gate is None:
        limiter = None
        if rate_per_s is not None:
            margin = kwargs.get("margin_s", DEFAULT_MARGIN_S)
            limiter = (limiters or local_limiter)(key, rate_per_s, margin_s=margin)
        gate = gates[key] = ProvisioningGate(max_concurrent_starts, rate_per_s, key, limiter=limiter, **kwargs)
    elif (gate.max_concurrent_starts, gate.rate_per_s) != (max_concurrent_starts, rate_per_s):
        logger.warning(
            "provisioning gate %r already set to max_concurrent_starts=%s, rate_per_s=%s; ignoring %s, %s",
            key, gate.max_concurrent_starts, gate.rate_per_s, max_concurrent_starts, rate_per_s,
        )
    return gate


def reset_gates() -> None:
    """Forget every gate and in-process limiter (tests)."""
    _gates.clear()
    _local_limiters.clear()
