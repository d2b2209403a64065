"""Bookkeeping every provider needs: the adapters it started and has not closed, and closes still running.

A rollout that is cancelled while closing its environment lets the close go on in the background (a session delete,
a sandbox stop). `LiveAdapters` keeps strong references to both the open adapters and those background closes, so
that a provider's `aclose` can close what callers forgot and wait for what is still closing before its client (and
with it, the actor) goes away.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Any

logger = logging.getLogger(__name__)


class LiveAdapters:
    """The open adapters of one provider and their background closes.

    Args:
        label: How log lines name the provider.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self._adapters: set[Any] = set()
        self._closing: set[asyncio.Task] = set()

    def add(self, adapter: Any) -> None:
        self._adapters.add(adapter)

    def discard(self, adapter: Any) -> None:
        self._adapters.discard(adapter)

    def track_close(self, task: asyncio.Task) -> None:
        """Keep a background close alive until it is done; `close_all` waits for it."""
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def open_count(self) -> int:
        """Adapters that started and are not closed yet."""
        return sum(1 for a in list(self._adapters) if a.started and not a.closed)

    async def close_all(self, timeout_s: float, what: str = "environment(s)") -> None:
        """Close every adapter still open, then wait (up to `timeout_s`) for closes running in the background."""
        open_adapters = [a for a in list(self._adapters) if not a.closed]
        if open_adapters:
            logger.info("%s: closing %d open %s", self.label, len(open_adapters), what)
            await asyncio.gather(*(a.close() for a in open_adapters), return_exceptions=True)
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=timeout_s)


class LiveAdapter(ABC):
    """The start-once, close-once state of one episode's adapter, and a close that outlives its caller.

    Subclasses implement `_holds_resources` (is there anything to release: a session, a sandbox, host files) and
    `_release` (release it; never raises, bounded by the adapter's own deadline).

    Args:
        live: The provider's `LiveAdapters`, which tracks this adapter until its release is done.
    """

    def __init__(self, live: LiveAdapters) -> None:
        self._live = live
        self._started = False
        self._closed = False
        self._close_task: asyncio.Task | None = None

    @property
    def started(self) -> bool:
        return self._started

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Release what the episode holds. Never raises; idempotent; safe after a failed or cancelled `start`.

        If the caller is cancelled while closing, the release goes on in the background (the provider's `aclose`
        waits for it) and the cancellation propagates.
        """
        if self._close_task is None:
            self._closed = True
            if not self._holds_resources():
                self._live.discard(self)
                return
            self._close_task = asyncio.get_running_loop().create_task(self._release_then_forget())
            self._live.track_close(self._close_task)
        await asyncio.shield(self._close_task)

    async def _release_then_forget(self) -> None:
        try:
            await self._release()
        finally:
            self._live.discard(self)

    @abstractmethod
    def _holds_resources(self) -> bool:
        """Whether there is anything to release (a session, a sandbox, host files)."""

    @abstractmethod
    async def _release(self) -> None:
        """Release it; never raises, bounded by the adapter's own deadline."""
