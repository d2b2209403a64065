"""The back-off settings of a provider's governor (`providers.<name>.rate_limit_backoff`, see
`raygrpo.specs.provider`). Pure data."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class BackoffSpec(BaseModel):
    """How a sandbox start the provider refused ("too many requests", HTTP 429) waits before it asks again.

    A refusal is not a failure of the rollout: the start waits, then queues again for a create slot from the
    provider's governor, which has meanwhile paused and slowed its schedule for every actor. So retries go out at
    the schedule's pace, never in a burst, and count against no rollout's retries.

    Args:
        initial_s (`float`, *optional*, defaults to `1.0`):
            Wait after a start's first refusal; it doubles with each refusal in a row, up to `max_s`. A Retry-After
            from the provider is waited at least.
        max_s (`float`, *optional*, defaults to `30.0`):
            Longest single wait.
        jitter (`float`, *optional*, defaults to `0.5`):
            Each wait is stretched by a random factor in `[1, 1 + jitter]`, so refused starts come back apart.
        give_up_after_s (`float`, *optional*, defaults to `600.0`):
            A start refused over this long fails (`env_error`, naming the provider's answer).
    """

    model_config = ConfigDict(extra="forbid")

    initial_s: float = Field(default=1.0, gt=0)
    max_s: float = Field(default=30.0, gt=0)
    jitter: float = Field(default=0.5, ge=0, le=10)
    give_up_after_s: float = Field(default=600.0, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> BackoffSpec:
        if self.max_s < self.initial_s:
            raise ValueError(f"max_s ({self.max_s}) must be >= initial_s ({self.initial_s})")
        return self
