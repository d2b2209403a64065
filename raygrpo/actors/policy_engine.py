"""The transformers engine as a Ray actor, and the `PolicyClient` that env pool actors use to reach it.

`PolicyEngineActor` is a thin async actor around `TransformersEngine`: its methods share the actor's event loop, so
concurrent `generate` calls from many env pool actors are batched together by the engine. `EngineClient` wraps an
actor handle in the `PolicyClient` protocol; any failure to reach or use the actor becomes a `PolicyError` (an
infrastructure failure the orchestrator may retry), never a crash of the rollout.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from raygrpo.policy.base import GenerationContext, PolicyError, SamplingParams
from raygrpo.types import Turn

logger = logging.getLogger(__name__)


class PolicyEngineActor:
    """Serves a `TransformersEngine` from a Ray actor (create it with `start_policy_engine(...)`).

    Args:
        model_path: Model directory or `"tiny"`.
        **engine_kwargs: `TransformersEngine`'s keyword arguments (`device`, `max_batch_size`, `batch_wait_s`, `seed`,
            `dtype`, `num_threads`).
    """

    def __init__(self, model_path: str, **engine_kwargs: Any):
        from raygrpo.policy.transformers_engine import TransformersEngine

        self.engine = TransformersEngine(model_path, **engine_kwargs)

    async def ready(self) -> bool:
        """Returns once the model is loaded (the actor's constructor has run)."""
        return True

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext | None = None
    ) -> Turn:
        return await self.engine.generate(prompt_ids, sampling)

    async def set_weights(self, state_dict: dict[str, Any], version: int) -> int:
        await self.engine.set_weights(state_dict, version)
        return self.engine.policy_version

    async def logprobs_of(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
        return await self.engine.logprobs_of(prompt_ids, completion_ids, temperature)

    async def policy_version(self) -> int:
        return self.engine.policy_version

    async def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    async def shutdown(self) -> None:
        """Fail queued requests and stop the worker thread (call before `ray.kill`, or let the kill do it)."""
        self.engine.close()


def start_policy_engine(
    model_path: str,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    name: str | None = None,
    **engine_kwargs: Any,
):
    """Create a `PolicyEngineActor` and return its handle; it loads the model in the background (await `ready`).

    Args:
        model_path: Model directory or `"tiny"` (resolved on the actor's node).
        num_cpus: CPUs reserved for the actor; also its torch thread count (rounded, at least 1) unless
            `num_threads` is given.
        num_gpus: GPUs reserved for the actor (pass `device="cuda"` with it).
        name: Optional actor name.
        **engine_kwargs: `device`, `max_batch_size`, `batch_wait_s`, `seed`, `dtype`, `num_threads`.
    """
    import ray

    engine_kwargs.setdefault("num_threads", max(1, int(round(num_cpus))))
    options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_concurrency": 1000}
    if name is not None:
        options["name"] = name
    return ray.remote(PolicyEngineActor).options(**options).remote(model_path, **engine_kwargs)


class EngineClient:
    """`PolicyClient` over a `PolicyEngineActor` handle, for use inside env pool actors.

    The policy version is that of the last turn received (the engine's weights at the time it generated).

    Args:
        handle: The engine actor's handle.
        timeout_s: Optional deadline per generation; past it the call fails with `PolicyError`.
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
            ref = self.handle.generate.remote(list(prompt_ids), sampling)
            turn = await (asyncio.wait_for(ref, self.timeout_s) if self.timeout_s else ref)
        except asyncio.TimeoutError as exc:
            raise PolicyError(f"policy engine {self._name()} did not answer within {self.timeout_s}s") from exc
        except Exception as exc:  # noqa: BLE001 - RayActorError, ActorUnavailableError, RayTaskError(...) alike
            raise PolicyError(f"policy engine {self._name()} failed: {type(exc).__name__}: {_short(exc)}") from exc
        self._policy_version = turn.policy_version
        return turn

    def _name(self) -> str:
        try:
            return self.handle._actor_id.hex()[:12]
        except Exception:  # noqa: BLE001
            return repr(self.handle)


def _short(exc: BaseException, limit: int = 500) -> str:
    text = str(exc).strip().splitlines()
    line = text[-1] if text else ""
    return line[:limit]
