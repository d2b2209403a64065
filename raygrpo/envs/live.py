"""Bookkeeping every provider needs: the adapters it started and has not closed, and closes still running.

A rollout that is cancelled while closing its environment lets the close go on in the background (a session delete,
a sandbox stop). `LiveAdapters` keeps strong references to both the open adapters and those background closes, so
that a provider's `aclose` can close what callers forgot and wait for what is still closing before its client (and
with it, the actor) goes away.
"""

from __future__ import annotations

import asyncio
import logging
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
