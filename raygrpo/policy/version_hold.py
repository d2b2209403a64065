"""Holding `generate` calls until an engine has new enough weights (`SamplingParams.min_version`).

Both engine kinds (`raygrpo.policy.transformers_engine`, `raygrpo.policy.vllm_engine`) hold a request whose
`min_version` is above their weights' version until a weight update reaches it; in async training this lets a rollout
start its environment early while its first turn waits for the learner's next weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from raygrpo.core.errors import PolicyError


class VersionHold:
    """Futures waiting for a policy version, released by `release()` after each weight update.

    Args:
        current: Returns the engine's current policy version.
        name: The engine's name in the error a held caller gets when the engine closes.
    """

    def __init__(self, current: Callable[[], int], name: str):
        self._current = current
        self._name = name
        self._held: list[tuple[int, asyncio.Future]] = []

    async def wait_for(self, version: int) -> None:
        """Return once the engine's weights are at least `version` (at once if they already are)."""
        if self._current() >= version:
            return
        held = asyncio.get_running_loop().create_future()
        self._held.append((version, held))
        await held

    def release(self, closed: bool = False) -> None:
        """Let go the held calls the current weights satisfy; fail them all when `closed`."""
        still = []
        for version, held in self._held:
            if held.done():
                continue
            if closed:
                held.set_exception(PolicyError(f"the {self._name} was closed"))
            elif self._current() >= version:
                held.set_result(None)
            else:
                still.append((version, held))
        self._held = still
