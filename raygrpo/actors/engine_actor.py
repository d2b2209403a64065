"""What every engine actor answers, transformers or vLLM: the calls of env pool actors (`generate`), of the learner
(`set_weights`) and of the driver (`ready`, `node_ip`, `stats`, `shutdown`), forwarded to the engine it hosts."""

from __future__ import annotations

from typing import Any

import ray

from raygrpo.core.types import SamplingParams, Turn
from raygrpo.policy.base import GenerationContext


class EngineActor:
    """What every engine actor answers (env pool actors, the learner and the driver call these); a subclass builds
    `self.engine` (an object with `generate`, `set_weights`, `policy_version`, `stats` and `close`)."""

    engine: Any

    async def ready(self) -> bool:
        """Returns once the model is loaded (the actor's constructor has run)."""
        return True

    async def node_ip(self) -> str:
        """The address of the node the engine runs on (the driver logs where each actor was placed)."""
        return ray.util.get_node_ip_address()

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext | None = None
    ) -> Turn:
        return await self.engine.generate(prompt_ids, sampling)

    async def wait_for_version(self, version: int) -> int:
        """Return the engine's policy version once it is at least `version` (the learner's pace: unbounded here;
        `raygrpo.policy.engine_client.EngineClient` bounds the generation that follows, not this wait)."""
        return await self.engine.wait_for_version(version)

    async def set_weights(self, state_dict: dict[str, Any], version: int, partial: bool = False) -> int:
        """Load the learner's weights as `version`; `partial`: `state_dict` holds only the weights that changed
        (a transformers engine's LoRA push, `raygrpo.train.lora`)."""
        if partial:
            await self.engine.set_weights(state_dict, version, partial=True)
        else:
            await self.engine.set_weights(state_dict, version)
        return self.engine.policy_version

    async def policy_version(self) -> int:
        return self.engine.policy_version

    async def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    async def shutdown(self) -> None:
        """Fail queued requests and stop the engine's thread (call before `ray.kill`, or let the kill do it)."""
        self.engine.close()
