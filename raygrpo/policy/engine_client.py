"""The `PolicyClient` of a transformers engine that runs in another process (an actor of
`raygrpo.actors.policy_engine`), used inside env pool actors.

It only needs the handle's `generate.remote(...)`, which returns an awaitable: this module imports no Ray. Any failure
to reach or use the engine becomes a `PolicyError` (an infrastructure failure the orchestrator may retry), never a
crash of the rollout.
"""

from __future__ import annotations

import asyncio
from typing import Any

from raygrpo.core.errors import PolicyError, describe
from raygrpo.policy.base import GenerationContext, SamplingParams
from raygrpo.core.types import Turn


class EngineClient:
    """`PolicyClient` over a `PolicyEngineActor` handle, for use inside env pool actors.

    The policy version is that of the last turn received (the engine's weights at the time it generated).

    Args:
        handle: The engine actor's handle.
        timeout_s: Deadline of one generation (`policy.request_timeout_s`); past it the call fails with
            `PolicyError`, so an engine that hangs (a stopped process Ray still counts alive) is an infrastructure
            failure, retried, never a rollout cut off as the model's. A turn that must wait for newer weights
            (`SamplingParams.min_version`) waits for them first (`wait_for_version`, the learner's pace, bounded
            by the rollout's deadline), and its deadline starts once they are there.
    """

    def __init__(self, handle: Any, timeout_s: float | None = None):
        self.handle = handle
        self.timeout_s = timeout_s
        self._policy_version = 0

    @property
    def policy_version(self) -> int:
        return self._policy_version

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext | None = None
    ) -> Turn:
        # The context (task metadata, messages) is not sent: a model reads only tokens.
        try:
            if sampling.min_version > self._policy_version:
                self._policy_version = await self.handle.wait_for_version.remote(sampling.min_version)
            ref = self.handle.generate.remote(list(prompt_ids), sampling)
            turn = await (asyncio.wait_for(ref, self.timeout_s) if self.timeout_s else ref)
        except TimeoutError as exc:
            raise PolicyError(f"policy engine {self._name()} did not answer within policy.request_timeout_s="
                              f"{self.timeout_s:g} s") from exc
        except Exception as exc:  # noqa: BLE001 - RayActorError, ActorUnavailableError, RayTaskError(...) alike
            raise PolicyError(f"policy engine {self._name()} failed: {describe(exc)}") from exc
        self._policy_version = turn.policy_version
        return turn

    def _name(self) -> str:
        try:
            return self.handle._actor_id.hex()[:12]
        except Exception:  # noqa: BLE001
            return repr(self.handle)
