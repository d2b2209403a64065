"""The policy protocol: token ids in, token ids and log-probabilities out; and per-request seeds."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from raygrpo.core.errors import PolicyError
from raygrpo.core.types import SamplingParams, TaskRef, Turn

__all__ = ["GenerationContext", "PolicyClient", "PolicyError", "SamplingParams", "request_seed"]


@dataclass
class GenerationContext:
    """What the agent loop knows about the episode. Real models ignore it; a scripted policy reads it.

    Args:
        task: The task being rolled out.
        messages: The conversation so far (decoded), tool results included.
        turn: Index of the turn about to be generated (0 for the first).
    """

    task: TaskRef
    messages: list[dict[str, Any]] = field(default_factory=list)
    turn: int = 0


@runtime_checkable
class PolicyClient(Protocol):
    """Generates one assistant turn from the full token context of the episode."""

    @property
    def policy_version(self) -> int: ...

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, context: GenerationContext | None = None
    ) -> Turn: ...


def request_seed(base_seed: int | None, *keys: object) -> int | None:
    """A seed for one request, derived from a run's base seed and keys naming the request (task, sample, turn).

    Deterministic across processes (no `hash()` randomisation); None when `base_seed` is None. The result fits
    in 63 bits, which vLLM and `torch.Generator.manual_seed` both accept.
    """
    if base_seed is None:
        return None
    text = "\x1f".join(str(k) for k in (base_seed, *keys))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1
