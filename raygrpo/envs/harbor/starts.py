"""Starting a suite's sandboxes on one actor: measured, and hedged when one runs long (`SandboxStarts`).

Every sandbox start of a suite goes through here, whoever asked (a rollout, the warm pool), so the start times it
measures are the suite's on this actor: the hedge threshold is a percentile of them and so is the start time the
warm pool's `auto` size uses. A hedged start is a second `HarborSandbox` started beside the first once the first has run past
the threshold since the gate let its create in; the first of the two to be ready is the start's, and the other is
left to finish starting in the background and then stopped, so a create that answers after its rollout ended
still gets its stop. Both go through the gate like every start, within its limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
from collections import deque
from typing import TYPE_CHECKING

from raygrpo.envs.harbor.sandbox import HarborSandbox, TicketYielder

if TYPE_CHECKING:
    from raygrpo.envs.harbor.context import SuiteContext
    from raygrpo.specs.warm import HedgeSpec

logger = logging.getLogger(__name__)


class SandboxStarts:
    """Starts sandboxes of one suite, measures them, and hedges those that run long.

    Args:
        context: The suite whose sandboxes it starts (they are tracked there).
        hedge: When and how to hedge (None: never).
    """

    def __init__(self, context: SuiteContext, hedge: HedgeSpec | None) -> None:
        self.context = context
        self.hedge = hedge
        self._seconds: deque[float] = deque(maxlen=hedge.window if hedge is not None else 200)
        self._losers: set[asyncio.Task] = set()
        #: Starts asked for; second starts made; how many of those were ready first.
        self.starts = 0
        self.hedged = 0
        self.hedge_wins = 0

    # ── figures ──────────────────────────────────────────────────────────────────────────────────────────────────

    def record(self, sandbox: HarborSandbox) -> None:
        """Remember how long a sandbox that came up took (from its admission to ready)."""
        if sandbox.startup_s is not None:
            self._seconds.append(sandbox.startup_s)

    @property
    def mean_s(self) -> float | None:
        """Mean start time of recent starts (None before any)."""
        return statistics.fmean(self._seconds) if self._seconds else None

    def percentile_s(self, q: float) -> float | None:
        """The `q` percentile of recent start times (None before any)."""
        if not self._seconds:
            return None
        ordered = sorted(self._seconds)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def threshold_s(self) -> float:
        """How long a start runs before it is hedged: the configured percentile of recent starts, within the floor
        and cap (the cap until `min_samples` starts were measured)."""
        hedge = self.hedge
        assert hedge is not None
        if len(self._seconds) < hedge.min_samples:
            return hedge.cap_s
        return min(hedge.cap_s, max(hedge.floor_s, self.percentile_s(hedge.percentile)))

    def stats(self) -> dict[str, float | int | None]:
        return {"starts": self.starts, "hedged": self.hedged, "hedge_wins": self.hedge_wins,
                "start_mean_s": self.mean_s, "hedge_losers_running": len(self._losers)}

    # ── starting ─────────────────────────────────────────────────────────────────────────────────────────────────

    async def start(self, task_dir: str, for_pool: bool = False, *,
                    tickets: TicketYielder | None = None) -> tuple[HarborSandbox, bool]:
        """A started sandbox of `task_dir`, and whether it came from a second (hedged) start (`for_pool`: a warm
        pool's; `tickets`: the suite's warm pool, if it has one; see `HarborSandbox`).

        On failure or cancellation, every sandbox this made is closed (a loser still starting is closed once its
        start ends). A hedged start fails only when both starts failed; it raises the first one's error.
        """
        self.starts += 1
        first = HarborSandbox(self.context, task_dir, for_pool, tickets=tickets)
        if self.hedge is None:
            try:
                await first.start()
            except BaseException:
                await first.close()
                raise
            self.record(first)
            return first, False
        return await self._hedged(first, task_dir)

    async def _hedged(self, first: HarborSandbox, task_dir: str) -> tuple[HarborSandbox, bool]:
        loop = asyncio.get_running_loop()
        runs = {loop.create_task(first.start(), name=f"start-{task_dir}"): first}
        second: HarborSandbox | None = None
        try:
            first_run = next(iter(runs))
            admitted = loop.create_task(first.admitted.wait())
            try:
                await asyncio.wait({first_run, admitted}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                admitted.cancel()
            if not first_run.done():
                await asyncio.wait({first_run}, timeout=self.threshold_s())
            if not first_run.done():
                second = HarborSandbox(self.context, task_dir, first.for_pool, tickets=first.tickets)
                self.hedged += 1
                runs[loop.create_task(second.start(), name=f"hedge-{task_dir}")] = second
                logger.info("%s: a start ran past %.1f s; hedged with a second", first.label, self.threshold_s())
            pending = set(runs)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                winners = [t for t in done if not t.cancelled() and t.exception() is None]
                if winners:
                    won = runs[winners[0]]
                    for task, sandbox in runs.items():
                        if sandbox is not won:
                            self._retire(task, sandbox)
                    self.record(won)
                    if won is second:
                        self.hedge_wins += 1
                    return won, won is second
            raise first_run.exception()  # both failed (or the only one did)
        except BaseException:
            for task, sandbox in runs.items():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait({task})
                await sandbox.close()
            raise

    def _retire(self, task: asyncio.Task, sandbox: HarborSandbox) -> None:
        """Stop the losing start's sandbox once its start ends (now, if it already failed)."""
        async def finish_then_close() -> None:
            try:
                with contextlib.suppress(BaseException):
                    await task
                    self.record(sandbox)  # a slow start is what the threshold must see
            finally:
                await sandbox.close()
        closer = asyncio.get_running_loop().create_task(finish_then_close(), name=f"retire-{sandbox.task_dir}")
        self._losers.add(task)
        task.add_done_callback(self._losers.discard)
        self.context.sandboxes.track_close(closer)

    async def aclose(self) -> None:
        """Cancel losing starts still running (their sandboxes are then closed by their retirement)."""
        for task in list(self._losers):
            task.cancel()
