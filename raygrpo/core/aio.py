"""Small asyncio helpers shared by the layers: finishing clean-up work that a cancellation must not cut short."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def run_to_end(aw: Awaitable[Any], timeout_s: float | None = None) -> asyncio.CancelledError | None:
    """Await `aw` to its end even when the caller is cancelled meanwhile, and return the cancellation swallowed on
    the way (None if there was none), for the caller to re-raise once its own clean-up is done.

    Stopping a sandbox or deleting a session must finish even when the rollout that owns it is cancelled: a
    cancellation that cut it short would leak the resource.

    Args:
        aw: The clean-up to run (a coroutine, task or future).
        timeout_s: Stop waiting after this many seconds (the clean-up goes on in the background) and raise
            `TimeoutError`; None waits for as long as it takes.

    Raises:
        Whatever `aw` raises; `TimeoutError` past `timeout_s`.
    """
    task = asyncio.ensure_future(aw)
    cancelled: asyncio.CancelledError | None = None
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    while not task.done():
        left = None if deadline is None else deadline - loop.time()
        if left is not None and left <= 0:
            raise TimeoutError(f"did not finish within {timeout_s:g} s")
        try:
            await asyncio.wait_for(asyncio.shield(task), left)
        except asyncio.CancelledError as exc:
            if task.done():  # the clean-up itself was cancelled
                raise
            cancelled = exc
        except TimeoutError:
            if not task.done():
                raise TimeoutError(f"did not finish within {timeout_s:g} s") from None
    task.result()
    return cancelled
