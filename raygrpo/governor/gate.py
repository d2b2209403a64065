"""Provisioning control in an env pool actor: the gate every sandbox start goes through.

Providers cap how fast sandboxes may be created and how many may live at once (e2b Pro: 5 creates/s, 100 live), and
refuse what goes beyond with HTTP 429. Every env pool actor starts its sandboxes through a `ProvisioningGate` of the
provider key:

    gate = gate_for("e2b", max_concurrent_starts=16, rate_per_s=5.0, max_live=100)
    ticket = await gate.acquire_live()      # held until the sandbox is stopped: gate.release_live(ticket)
    async with gate.start_slot(ticket):
        await env.start(...)                # the backend's create is called here, right after the slot opens

The gate bounds the starts in flight in this actor (a semaphore) and asks the key's governor (`raygrpo.governor`)
for a live ticket and a create slot, sleeping until the slot. It talks to the governor through a `GovernorClient`
(`raygrpo.governor.client`) made by whoever builds the gate: env pool actors pass `RayGovernorClient`, whose governor
is the named Ray actor that every actor on every node shares (`raygrpo.governor.actor`); without one, the gate asks
this process's own `Governor` of the key (`local_governor`). A create the provider refuses anyway goes to
`back_off`: the governor pauses and slows the schedule for everyone, and the refused start waits a jittered, growing
delay before it queues again. Everything here is plain asyncio.

The limits come from the run config's `providers.<key>` (`create_rate_per_s`, `max_live`, `rate_limit_backoff`); the
bound on starts per actor from `envs.<name>.max_concurrent_starts`. Waiting for the governor is not start time: a
start's own deadline (`envs.<name>.start_timeout_s`) counts from when the gate lets it in, and the wait itself is
unbounded by default (the schedule always moves; a governor that stays unreachable fails the start after
`unavailable_after_s`, and refusals fail it after `give_up_after_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from raygrpo.governor.client import GovernorClient, GovernorClientFactory, ProvisioningError
from raygrpo.governor.gate_counts import GateCounts
from raygrpo.governor.governor import BackoffSettings, RateLimitSignal, local_governor, reset_local_governors
from raygrpo.governor.create_schedule import DEFAULT_MARGIN_S, Reservation

__all__ = ["ProvisioningError", "ProvisioningGate", "gate_for", "gate_stats", "reset_gates"]

logger = logging.getLogger(__name__)


class ProvisioningGate:
    """Admits sandbox starts in one actor: at most `max_concurrent_starts` at once, creates at most `rate_per_s`, at
    most `max_live` sandboxes alive for `key` across the cluster.

    Use it as in the module docstring: `acquire_live()` before anything is created (its ticket is given back with
    `release_live` once the sandbox is stopped), then `async with gate.start_slot(ticket): await env.start(...)`,
    with the backend's create as the first thing in the block. A start first takes a concurrency slot, then (with a
    rate) a create slot from the governor of `key`, then sleeps until that slot; the concurrency slot is held until
    the block ends. With both a cap and a rate, `acquire_live` asks for the ticket and the create slot in one call
    (`admit`), and `start_slot(ticket)` uses that slot. A start cancelled while it waits gives its ticket and slot
    back. A create the provider refused goes to `back_off` (outside the block) and then through `start_slot` again.

    Args:
        max_concurrent_starts: Starts in flight at once in this actor; None for no bound.
        rate_per_s: Most creates in any 1 s window for `key`, summed over every actor; None for no rate limit.
        key: Provider key naming the shared governor (e.g. "e2b"); required with a rate or a live cap.
        governor: The governor to ask (required with a rate or a live cap): a `RayGovernorClient` of the cluster-wide
            one, or this process's `local_governor(key, ...)` (a bare `CreateSchedule` serves a rate alone).
        max_live: Most sandboxes alive (or being created) for `key` at once, summed over every actor; None for no cap.
        backoff: How a start the provider refused waits before it queues again.
        max_wait_s: Longest a start may wait for its create slot (from asking the governor to the slot) before it
            fails with `ProvisioningError`; None (the default, and what every run uses: no config field sets it) for
            no bound: the wait is not start time, and each call to the governor is bounded on its own.
        margin_s: Schedule margin this gate expects of its governor (see `raygrpo.governor.create_schedule`).
        history: Grant timestamps kept for `grant_times()`.
        renew_every_s: How often the live tickets this gate holds are renewed with the governor.
    """

    def __init__(
        self,
        max_concurrent_starts: int | None = None,
        rate_per_s: float | None = None,
        key: str | None = None,
        *,
        governor: GovernorClient | None = None,
        max_live: int | None = None,
        backoff: BackoffSettings | None = None,
        max_wait_s: float | None = None,
        margin_s: float = DEFAULT_MARGIN_S,
        history: int = 10_000,
        renew_every_s: float = 10.0,
    ) -> None:
        if max_concurrent_starts is not None and max_concurrent_starts < 1:
            raise ValueError(f"max_concurrent_starts must be >= 1 or None, got {max_concurrent_starts}")
        if rate_per_s is not None and not rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0 or None, got {rate_per_s}")
        if max_live is not None and max_live < 1:
            raise ValueError(f"max_live must be >= 1 or None, got {max_live}")
        governed = rate_per_s is not None or max_live is not None
        if governed and not key:
            raise ValueError("a rate limit or a live cap needs a provider key")
        if governed and governor is None:
            raise ValueError("a rate limit or a live cap needs a governor to ask")
        if not margin_s > 0:
            raise ValueError(f"margin_s must be > 0, got {margin_s}")
        self.key = key
        self.max_concurrent_starts = max_concurrent_starts
        self.rate_per_s = rate_per_s
        self.max_live = max_live
        self.backoff = backoff or BackoffSettings()
        self._governor = governor
        self._max_wait = max_wait_s
        self._margin = margin_s
        self._renew_every = renew_every_s
        self._sem = asyncio.Semaphore(max_concurrent_starts) if max_concurrent_starts else None
        self._grants: deque[float] = deque(maxlen=history)
        #: This gate's name with the governor (tickets of a holder that stops renewing are dropped).
        self.holder = uuid.uuid4().hex
        self._tickets: set[str] = set()
        #: Create slots asked for with a live ticket (`admit`), by ticket, until that ticket's first `start_slot`.
        self._admitted: dict[str, tuple[str, Reservation]] = {}
        self._renewer: asyncio.Task[None] | None = None
        self.counts = GateCounts()
        self._rate_warned = False

    # ── live tickets ──────────────────────────────────────────────────────────────────────────────────────────

    async def acquire_live(self, warm: bool = False) -> str | None:
        """Wait for a live ticket of `key` (None at once when there is no cap); give it back with `release_live`.
        `warm`: for a warm pool's start, which the governor serves after every rollout's own."""
        if self.max_live is None:
            return None
        governor = self._governor
        assert governor is not None
        ticket = uuid.uuid4().hex
        # With a rate too, the create slot is asked for in the same call, unless this actor's starts are queued on
        # its own bound (a slot asked for now could pass before the start gets in).
        rid = uuid.uuid4().hex if self.rate_per_s is not None and not (self._sem and self._sem.locked()) else None
        try:
            if rid is None:
                while not await governor.acquire_live(ticket, self.holder, warm):
                    pass
            else:
                while True:
                    granted, res = await governor.admit(ticket, self.holder, rid, warm)
                    if granted:
                        break
                if res is not None:
                    self._admitted[ticket] = (rid, res)
        except BaseException:
            governor.release_live(ticket)
            if rid is not None:
                governor.release(rid)
            raise
        self._tickets.add(ticket)
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew(), name=f"renew-live-{self.key}")
        return ticket

    def release_live(self, ticket: str | None) -> None:
        """Give a live ticket back (after its sandbox stopped, or its start failed). None and repeats are ignored."""
        if ticket is None or ticket not in self._tickets:
            return
        self._tickets.discard(ticket)
        assert self._governor is not None
        unused = self._admitted.pop(ticket, None)
        if unused is not None:  # the start never took the slot asked for with the ticket
            self._governor.release(unused[0])
        self._governor.release_live(ticket)

    async def ask_evict(self) -> bool:
        """Whether this gate's holder should stop one of its idle warm sandboxes: a rollout's own start somewhere
        waits for a live ticket (`LiveCap.ask_evict`). False without a cap, or when the governor stayed unreachable
        (asked again next time)."""
        if self.max_live is None:
            return False
        assert self._governor is not None
        try:
            return bool(await self._governor.ask_evict(self.holder))
        except ProvisioningError as exc:
            logger.warning("%s: could not ask the governor about idle warm sandboxes: %s", self.key, exc)
            return False

    async def _renew(self) -> None:
        while self._tickets:
            await asyncio.sleep(self._renew_every)
            if self._tickets:
                with contextlib.suppress(Exception):  # a governor that is gone takes them back from the next renewal
                    self._governor.renew_live(self.holder, list(self._tickets))  # type: ignore[union-attr]

    # ── create slots ──────────────────────────────────────────────────────────────────────────────────────────

    @contextlib.asynccontextmanager
    async def start_slot(self, ticket: str | None = None) -> AsyncIterator[None]:
        """Wait for a concurrency slot and (with a rate) this start's create slot; hold the former for the block.

        `ticket`: the start's live ticket; the create slot asked for with it (`acquire_live`) is used first. Without
        one, the oldest slot asked for with any ticket of this gate is (its own start will ask for another).
        """
        if ticket is None and self._admitted:
            ticket = next(iter(self._admitted))
        admitted_slot = self._admitted.pop(ticket, None) if ticket is not None else None
        asked = time.time()
        self.counts.waiting += 1
        admitted = False
        try:
            async with self._sem if self._sem is not None else contextlib.nullcontext():
                if self.rate_per_s is not None:
                    slot, admitted_slot = admitted_slot, None
                    await self._await_create_slot(slot)
                now = time.time()
                self.counts.waiting -= 1
                admitted = True
                self._grants.append(now)
                self.counts.admitted(now - asked)
                self.counts.starting += 1
                try:
                    yield
                finally:
                    self.counts.starting -= 1
        except asyncio.CancelledError:
            if not admitted:
                self.counts.cancelled += 1
            raise
        finally:
            if not admitted:
                self.counts.waiting -= 1
            if admitted_slot is not None:  # cancelled before its turn: the slot goes back
                assert self._governor is not None
                self._governor.release(admitted_slot[0])

    async def _await_create_slot(self, admitted: tuple[str, Reservation] | None = None) -> None:
        governor = self._governor
        assert governor is not None
        give_up = None if self._max_wait is None else time.time() + self._max_wait
        missed = False
        while True:
            rid, res = admitted if admitted is not None else (uuid.uuid4().hex, None)
            admitted = None
            try:
                if res is None or not (res.ready or res.cancelled):
                    res = await self._reserve(governor, rid, give_up, first=missed)
                if res.cancelled:  # released behind our back (e.g. taken for abandoned): queue again
                    continue
                slept_from = time.time()
                while (left := res.at - time.time()) > 0:
                    await asyncio.sleep(left)
            except BaseException:
                governor.release(rid)
                raise
            now = time.time()
            if now <= res.deadline:
                return
            self.counts.missed(now - res.at, on_arrival=slept_from > res.deadline)
            missed = True
            logger.debug("create slot of %r missed by %.3f s; queueing again, first", self.key, now - res.at)

    async def _reserve(self, governor: GovernorClient, rid: str, give_up: float | None,
                       first: bool = False) -> Reservation:
        while True:
            if give_up is not None and time.time() > give_up:
                raise ProvisioningError(
                    f"no create slot for {self.key!r} within this gate's max_wait_s={self._max_wait} s at "
                    f"{self.rate_per_s} creates/s (providers.{self.key}.create_rate_per_s): queue fewer starts "
                    "(envs.<name>.max_concurrent_starts, fewer env pool actors or rollouts per actor) or build the "
                    "gate with a longer max_wait_s (None: no bound)"
                )
            res = await governor.reserve(rid, first)
            if res.rate_per_s != self.rate_per_s and not self._rate_warned:
                self._rate_warned = True
                logger.warning(
                    "governor %r runs at %s creates/s (set by whoever created it), not the %s/s asked here",
                    self.key, res.rate_per_s, self.rate_per_s,
                )
            if res.ready or res.cancelled:
                return res

    async def back_off(self, signal: RateLimitSignal, attempt: int, refused_since: float) -> float:
        """The provider refused this start's create (`attempt` refusals in a row, the first at `refused_since`):
        tell the governor (it pauses the schedule for everyone until the provider's Retry-After, and slows it when
        refusals repeat), then wait a jittered, growing delay before queueing again.
        Returns the seconds waited.

        Raises:
            ProvisioningError: The start has been refused for `backoff.give_up_after_s`.
        """
        delay = self.backoff.delay(attempt, signal.retry_after_s)
        self.counts.refused += 1
        if time.time() + delay - refused_since > self.backoff.give_up_after_s:
            raise ProvisioningError(
                f"the provider of {self.key!r} refused this sandbox's create {attempt} time(s) over "
                f"{time.time() - refused_since:.0f} s (give_up_after_s={self.backoff.give_up_after_s:g}): "
                f"{signal.message}")
        logger.info("provider %r refused a create (%s, attempt %d): backing off %.2f s", self.key, signal.reason,
                    attempt, delay)
        if self._governor is not None:
            # Everyone pauses until the provider said it would take creates again; this start waits longer.
            pause = signal.retry_after_s if signal.retry_after_s is not None else self.backoff.initial_s
            with contextlib.suppress(Exception):  # the pause is advice; this start backs off either way
                self._governor.refused(signal.reason, pause)
        await asyncio.sleep(delay)
        self.counts.backoff_s += delay
        return delay

    def grant_times(self) -> list[float]:
        """Wall-clock times at which starts entered their slot (the most recent `history` of them)."""
        return list(self._grants)

    def stats(self) -> dict[str, Any]:
        """Its settings, its live tickets held and its counts (`GateCounts.as_stats`: `longest_wait_s` is the longest
        wait so far, not the `max_wait_s` bound)."""
        return {"key": self.key, "max_concurrent_starts": self.max_concurrent_starts, "rate_per_s": self.rate_per_s,
                "max_live": self.max_live, "live_tickets": len(self._tickets), **self.counts.as_stats()}


#: Gates by event loop, then provider key: one gate per (actor, key); gates hold loop-bound primitives.
_gates: dict[asyncio.AbstractEventLoop, dict[str | None, ProvisioningGate]] = {}


def gate_for(
    key: str | None,
    max_concurrent_starts: int | None = None,
    rate_per_s: float | None = None,
    *,
    max_live: int | None = None,
    backoff: BackoffSettings | None = None,
    governors: GovernorClientFactory | None = None,
    **kwargs: Any,
) -> ProvisioningGate:
    """This actor's gate for provider `key`, made on first use; call it on the actor's event loop.

    Several suites on one provider share the gate. Its cluster-wide limits come from the one `providers.<key>` entry,
    so they agree; its per-actor bound is the first suite's `max_concurrent_starts`, and a later call asking for
    other settings is logged as a warning.

    Args:
        key: Provider key.
        max_concurrent_starts: Starts in flight at once in this actor; None for no bound.
        rate_per_s: Creates per second for `key`, cluster-wide; None for no rate limit.
        max_live: Sandboxes alive at once for `key`, cluster-wide; None for no cap.
        backoff: How a start the provider refused waits before it queues again.
        governors: Makes the governor client of `key` when a rate or a cap is set (the env pool actor passes
            `RayGovernorClient`); None uses this process's `local_governor`.
        **kwargs: Further `ProvisioningGate` settings.
    """
    loop = asyncio.get_running_loop()
    for old in [lp for lp in _gates if lp.is_closed()]:
        del _gates[old]
    gates = _gates.setdefault(loop, {})
    gate = gates.get(key)
    if gate is None:
        governor = None
        if rate_per_s is not None or max_live is not None:
            margin = kwargs.get("margin_s", DEFAULT_MARGIN_S)
            governor = (governors or local_governor)(key, rate_per_s, max_live=max_live, margin_s=margin)
        gate = gates[key] = ProvisioningGate(max_concurrent_starts, rate_per_s, key, governor=governor,
                                             max_live=max_live, backoff=backoff, **kwargs)
    elif (gate.max_concurrent_starts, gate.rate_per_s, gate.max_live) != (max_concurrent_starts, rate_per_s, max_live):
        logger.warning(
            "provisioning gate %r already set to max_concurrent_starts=%s, rate_per_s=%s, max_live=%s; ignoring "
            "%s, %s, %s", key, gate.max_concurrent_starts, gate.rate_per_s, gate.max_live, max_concurrent_starts,
            rate_per_s, max_live,
        )
    return gate


def gate_stats() -> list[dict[str, Any]]:
    """The stats of every gate of the running event loop (an env pool actor's), one per provider key; none when
    called outside an event loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return []
    return [gate.stats() for gate in _gates.get(loop, {}).values()]


def reset_gates() -> None:
    """Forget every gate and in-process governor (tests)."""
    _gates.clear()
    reset_local_governors()
