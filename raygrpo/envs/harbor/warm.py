"""A suite's warm pool on one actor: sandboxes started ahead for the tasks that come next (`WarmPool`).

The driver says which tasks an actor gets next (`expect`, fed by the orchestrator's queue and, in training, by the
task schedule's look-ahead); the pool keeps up to its size of sandboxes started (or starting) for the earliest of
them. A rollout asks for its task (`take`): it gets a ready sandbox of that task that passed its check, waits for
one of that task still starting, or gets none and starts its own. A sandbox that fails its check is stopped and
the next one tried; one nobody took within `ttl_s` of being ready is stopped, and so is a task said to be coming
that did not come within `ttl_s` forgotten. Every sandbox of the pool holds a live ticket, so the governor counts
it, and is tracked by the suite's context until stopped, so leak accounting and the provider's `aclose` see it.

A rollout's own start comes before the pool's guesses: while one waits for a live ticket (the cap is reached), the
pool starts no more, its starts still waiting for a ticket give up (`ticket_for_warm`), and every `EVICT_AFTER_S`
the rollout's start still waits, one ready sandbox is stopped (of a task no longer said to be coming, else the one
ready longest), whose ticket goes back to the governor (`ticket_for_cold`). Across actors (and suites sharing a
provider key) the governor keeps that order: it grants warm starts' tickets after every rollout's own, and a pool
holding ready sandboxes under a live cap asks it every `ASK_EVICT_EVERY_S` whether a rollout's start elsewhere has
waited `EVICT_AFTER_S` (`ProvisioningGate.ask_evict`); one pool is told per wait, and stops one ready sandbox.

`auto` size: Little's law, L = λW. The sandboxes a pool must hold to hide the start are the rollouts that arrive
while one starts: the measured arrival rate of this suite's rollouts on the actor (over the last `RATE_WINDOW_S`)
times the start time, plus one, at most `max_size`. W is the `START_PERCENTILE` of recent starts, not their mean:
a pool sized by the mean starts each sandbox as far ahead as an average start takes, and every start longer than
that keeps its rollout waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from raygrpo.envs.harbor.sandbox import HarborSandbox, SandboxUnhealthy
from raygrpo.envs.harbor.starts import SandboxStarts
from raygrpo.core.errors import describe
from raygrpo.governor.live_cap import EVICT_AFTER_S

if TYPE_CHECKING:
    from raygrpo.envs.harbor.context import SuiteContext
    from raygrpo.specs.warm import WarmPoolSpec

logger = logging.getLogger(__name__)

#: Seconds of arrivals the `auto` size's rate is measured over.
RATE_WINDOW_S = 60.0
#: Seconds between asks to the governor, while the pool holds ready sandboxes under a live cap, whether a rollout's
#: start on another actor (or of another suite) waits for a ticket.
ASK_EVICT_EVERY_S = 1.0
#: Which percentile of recent start times the `auto` size plans for.
START_PERCENTILE = 0.95


class WarmStartYielded(Exception):
    """A warm pool's start gave up waiting for a live ticket: a rollout's own start waits for one too."""


class WarmPool:
    """Sandboxes of one suite started ahead of their rollouts.

    Args:
        context: The suite (its gate; its sandboxes are tracked there).
        starts: Starts the pool's sandboxes (and measures the start time `auto` uses).
        spec: Size and TTL.
    """

    def __init__(self, context: SuiteContext, starts: SandboxStarts, spec: WarmPoolSpec) -> None:
        self.context = context
        self.starts = starts
        self.spec = spec
        self._hints: deque[tuple[str, float]] = deque()  # (task dir, monotonic time told), oldest first
        self._ready: dict[str, deque[HarborSandbox]] = {}
        self._starting: dict[str, set[asyncio.Task]] = {}
        self._arrivals: deque[float] = deque()
        self._reaper: asyncio.Task | None = None
        self._watch: asyncio.Task | None = None
        self._closed = False
        #: Rollouts that got a warm sandbox; that found none; sandboxes stopped past their TTL, failing their
        #: check, failing to start, or to free a live ticket for a rollout's own start; starts that gave up waiting
        #: for a ticket for one; sandboxes the pool started.
        self.hits = self.misses = self.expired = self.unhealthy = self.failed = self.evicted = self.yielded = 0
        self.started = 0
        #: Rollouts' own starts waiting for a live ticket now (the pool starts none meanwhile).
        self._cold_waiting = 0
        #: Seconds warm sandboxes were ready and not taken, summed (closed ones only; `idle_s` adds the rest).
        self._idle_done_s = 0.0

    # ── what comes next ─────────────────────────────────────────────────────────────────────────────────────────

    def expect(self, task_dirs: list[str]) -> None:
        """Rollouts of these tasks will come to this actor (in this order, soon): start sandboxes for them."""
        if self._closed:
            return
        now = time.monotonic()
        self._hints.extend((d, now) for d in task_dirs)
        self._ensure_reaper()
        self._fill()

    @property
    def size(self) -> int:
        """How many sandboxes the pool holds at most now (ready plus starting)."""
        if self.spec.size != "auto":
            return int(self.spec.size)
        start_s = self.starts.percentile_s(START_PERCENTILE)
        now = time.monotonic()
        while self._arrivals and self._arrivals[0] < now - RATE_WINDOW_S:
            self._arrivals.popleft()
        if start_s is None or not self._arrivals:
            return min(self.spec.max_size, max(1, len(self._hints)))
        span = max(1.0, min(RATE_WINDOW_S, now - self._arrivals[0]))
        rate = len(self._arrivals) / span
        return min(self.spec.max_size, math.ceil(rate * start_s) + 1)

    # ── taking ──────────────────────────────────────────────────────────────────────────────────────────────────

    async def take(self, task_dir: str) -> HarborSandbox | None:
        """A started sandbox of `task_dir` that passed its check, now or once one still starting is up; None if the
        pool has none for it (the rollout starts its own). The sandbox is the caller's to close."""
        self._arrivals.append(time.monotonic())
        self._consume_hint(task_dir)
        try:
            while not self._closed:
                ready = self._ready.get(task_dir)
                if ready:
                    sandbox = ready.popleft()
                    self._idle_done_s += time.monotonic() - (sandbox.ready_at or time.monotonic())
                    try:
                        await sandbox.check()
                    except SandboxUnhealthy as exc:
                        self.unhealthy += 1
                        logger.warning("%s; stopped, another is used", describe(exc))
                        self._close_later(sandbox)
                        continue
                    except BaseException:
                        self._close_later(sandbox)
                        raise
                    self.hits += 1
                    return sandbox
                starting = self._starting.get(task_dir)
                if not starting:
                    break
                # Shielded: a rollout cancelled while it waits leaves the start to the pool.
                await asyncio.wait(set(starting), return_when=asyncio.FIRST_COMPLETED)
            self.misses += 1
            return None
        finally:
            self._fill()

    async def ticket_for_cold(self, acquire: Awaitable[str | None]) -> str | None:
        """The live ticket `acquire` waits for, for a rollout's own start: while it waits, the pool starts nothing
        and stops one ready sandbox every `EVICT_AFTER_S`, so that its ticket goes to this start."""
        waiting = asyncio.ensure_future(acquire)
        self._cold_waiting += 1
        try:
            while not (await asyncio.wait({waiting}, timeout=EVICT_AFTER_S))[0]:
                self._evict_one()
            return waiting.result()
        except BaseException:
            waiting.cancel()
            raise
        finally:
            self._cold_waiting -= 1
            if not self._cold_waiting:
                self._fill()

    async def ticket_for_warm(self, acquire: Awaitable[str | None]) -> str | None:
        """The live ticket `acquire` waits for, for one of the pool's starts, unless a rollout's own start waits for
        one too (looked at every `EVICT_AFTER_S`).

        Raises:
            WarmStartYielded: It gave up for that start.
        """
        waiting = asyncio.ensure_future(acquire)
        try:
            while not (await asyncio.wait({waiting}, timeout=EVICT_AFTER_S))[0]:
                if self._cold_waiting:
                    waiting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiting
                    if not waiting.cancelled():  # it got the ticket as it was cancelled: keep it
                        break
                    raise WarmStartYielded("a rollout's own start waits for a live ticket")
            return waiting.result()
        except BaseException:
            waiting.cancel()
            raise

    def _evict_one(self, whose: str = "here") -> None:
        told = {d for d, _ in self._hints}
        now = time.monotonic()
        ready = [(d in told, s.ready_at or now, d, s) for d, q in self._ready.items() for s in q]
        if not ready:
            return
        _, ready_at, task_dir, sandbox = min(ready, key=lambda r: r[:2])
        queue = self._ready[task_dir]
        queue.remove(sandbox)
        if not queue:
            del self._ready[task_dir]
        self.evicted += 1
        self._idle_done_s += now - ready_at
        logger.info("%s: a warm sandbox of %s stopped to free a live ticket for a rollout's own start (%s)",
                    self.context.label, task_dir, whose)
        self._close_later(sandbox)

    # ── keeping it full ─────────────────────────────────────────────────────────────────────────────────────────

    def _consume_hint(self, task_dir: str) -> None:
        for i, (hinted, _) in enumerate(self._hints):
            if hinted == task_dir:
                del self._hints[i]
                return

    def _held(self) -> int:
        return sum(len(q) for q in self._ready.values()) + sum(len(s) for s in self._starting.values())

    def _fill(self) -> None:
        """Start sandboxes for the earliest tasks said to be coming that have none yet, up to the size."""
        if self._closed or self._cold_waiting:
            return
        room = self.size - self._held()
        if room <= 0:
            return
        covered = Counter({d: len(q) for d, q in self._ready.items()})
        covered.update({d: len(s) for d, s in self._starting.items()})
        for task_dir, _ in list(self._hints):
            if room <= 0:
                break
            if covered[task_dir] > 0:
                covered[task_dir] -= 1
                continue
            self._start(task_dir)
            room -= 1

    def _start(self, task_dir: str) -> None:
        self.started += 1
        run = asyncio.get_running_loop().create_task(self._warm(task_dir), name=f"warm-{task_dir}")
        self._starting.setdefault(task_dir, set()).add(run)

    async def _warm(self, task_dir: str) -> None:
        sandbox: HarborSandbox | None = None
        try:
            sandbox, _ = await self.starts.start(task_dir, for_pool=True, tickets=self)
        except asyncio.CancelledError:
            raise
        except WarmStartYielded:
            self.yielded += 1
        except Exception as exc:  # noqa: BLE001 - a warm start that fails costs nothing but the start
            self.failed += 1
            logger.info("%s: a warm start failed: %s", self.context.label, describe(exc))
        finally:
            runs = self._starting.get(task_dir)
            current = asyncio.current_task()
            if runs is not None and current is not None:
                runs.discard(current)
                if not runs:
                    del self._starting[task_dir]
        if sandbox is not None:
            if self._closed:
                await sandbox.close()
                return
            self._ready.setdefault(task_dir, deque()).append(sandbox)
            self._ensure_watch()
        self._fill()

    def _ensure_watch(self) -> None:
        if self.context.gate.max_live is not None and (self._watch is None or self._watch.done()):
            self._watch = asyncio.get_running_loop().create_task(self._watch_cap(), name="warm-pool-cap")

    async def _watch_cap(self) -> None:
        """While the pool holds ready sandboxes: stop one whenever the governor says a rollout's own start elsewhere
        waits for the ticket it holds."""
        gate = self.context.gate
        while not self._closed and self._ready:
            await asyncio.sleep(ASK_EVICT_EVERY_S)
            if self._ready and not self._closed and await gate.ask_evict():
                self._evict_one("on another actor or suite")

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap(), name="warm-pool-ttl")

    async def _reap(self) -> None:
        """Stop sandboxes past their TTL and forget tasks that did not come, until the pool is empty and untold."""
        interval = min(5.0, self.spec.ttl_s / 4)
        while not self._closed and (self._hints or self._held()):
            await asyncio.sleep(interval)
            now = time.monotonic()
            while self._hints and self._hints[0][1] < now - self.spec.ttl_s:
                self._hints.popleft()
            for task_dir, ready in list(self._ready.items()):
                for sandbox in [s for s in ready if (s.ready_at or now) < now - self.spec.ttl_s]:
                    ready.remove(sandbox)
                    self.expired += 1
                    self._idle_done_s += now - (sandbox.ready_at or now)
                    self._close_later(sandbox)
                if not ready:
                    del self._ready[task_dir]
            self._fill()

    def _close_later(self, sandbox: HarborSandbox) -> None:
        closer = asyncio.get_running_loop().create_task(sandbox.close(), name=f"warm-stop-{sandbox.task_dir}")
        self.context.sandboxes.track_close(closer)

    # ── figures and shutdown ────────────────────────────────────────────────────────────────────────────────────

    @property
    def idle_s(self) -> float:
        """Seconds warm sandboxes sat ready and untaken, summed over all of them so far."""
        now = time.monotonic()
        waiting = sum(now - (s.ready_at or now) for q in self._ready.values() for s in q)
        return self._idle_done_s + waiting

    def stats(self) -> dict[str, float | int]:
        return {"hits": self.hits, "misses": self.misses, "expired": self.expired, "unhealthy": self.unhealthy,
                "failed": self.failed, "evicted": self.evicted, "yielded": self.yielded, "started": self.started,
                "ready": sum(len(q) for q in self._ready.values()),
                "starting": sum(len(s) for s in self._starting.values()), "size": self.size,
                "expected": len(self._hints), "idle_s": round(self.idle_s, 3)}

    async def aclose(self) -> None:
        """Stop every warm sandbox and cancel the starts still running (each closes what it made)."""
        self._closed = True
        self._hints.clear()
        for loop_task in (self._reaper, self._watch):
            if loop_task is not None:
                loop_task.cancel()
        runs = [t for s in self._starting.values() for t in s]
        for run in runs:
            run.cancel()
        if runs:
            with contextlib.suppress(BaseException):
                await asyncio.wait(runs)
        ready = [s for q in self._ready.values() for s in q]
        self._ready.clear()
        await asyncio.gather(*(s.close() for s in ready), return_exceptions=True)
