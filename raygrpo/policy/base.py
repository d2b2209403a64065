"""The policy protocol: token ids in, token ids and log-probabilities out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from raygrpo.types import TaskRef, Turn


class PolicyError(RuntimeError):
    """The policy could not generate (server down, request rejected). An infrastructure failure: retryable."""


@dataclass
class SamplingParams:
    """Sampling settings for one generation.

    Args:
        max_tokens: Most tokens to generate in this turn.
        temperature: Sampling temperature; 0 means greedy.
        top_p: Nucleus sampling mass.
        seed: Optional seed for reproducible sampling.
        min_version: Generate with weights of at least this policy version. Engines that track versions (the
            transformers engine) hold the request until they have them; in async training this lets a rollout start
            its environment early (a sandbox boots) while its first turn waits for the learner's next weights.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    min_version: int = 0


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
