"""A Harbor suite's start-ahead settings: its warm pool (`envs.<name>.warm_pool`) and hedged starts
(`envs.<name>.hedge`). Pure data; `raygrpo.envs.harbor.warm` and `raygrpo.envs.harbor.starts` act on them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class WarmPoolSpec(BaseModel):
    """Sandboxes started before their rollouts ask, for the tasks the driver says come next.

    Each env pool actor keeps up to `size` sandboxes started (or starting) for the rollouts its queue and the
    training schedule say it gets next: the orchestrator tells it which tasks, before it dispatches them. A rollout of
    such a task adopts one once it passed a check (the task's healthcheck command, or `true`); one that fails the
    check is stopped and another used, or a new one started. Warm sandboxes hold live tickets like any other, so
    they count against the provider's `max_live`, and their starts go through the same gate
    (`max_concurrent_starts`, the provider's `create_rate_per_s`).

    Args:
        size (`int` or `"auto"`, *optional*, defaults to `"auto"`):
            Most warm sandboxes (ready or starting) per env pool actor. `"auto"`: sized by Little's law from what the
            actor measures, its rollouts' arrival rate times the 95th percentile of its start times (plus one), at
            most `max_size`; before anything is measured, as many as the tasks it was told are coming, at most
            `max_size`.
        max_size (`int`, *optional*, defaults to `32`):
            Upper bound of `"auto"` (ignored with a number for `size`).
        ttl_s (`float`, *optional*, defaults to `300.0`):
            A warm sandbox no rollout adopted within this many seconds of being ready is stopped; a task said to be
            coming that did not come within it is forgotten.
    """

    model_config = ConfigDict(extra="forbid")

    size: int | Literal["auto"] = "auto"
    max_size: int = Field(default=32, ge=1)
    ttl_s: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _positive_size(self) -> WarmPoolSpec:
        if isinstance(self.size, int) and self.size < 1:
            raise ValueError(f"size must be >= 1 or 'auto', got {self.size}")
        return self


class HedgeSpec(BaseModel):
    """A second start for a sandbox start that runs long: the first of the two to be ready is used, the other is
    stopped (even when it comes up after its rollout ended).

    A start is hedged once it has run, from when the gate let its create in, longer than the `percentile` of the
    suite's recent starts on this actor, kept between `floor_s` and `cap_s`. The second start goes through the gate
    like any other (it counts against the provider's `max_live`, waits for a slot and the create rate).

    Args:
        percentile (`float`, *optional*, defaults to `0.9`):
            Which percentile of recent start times sets the threshold. Keep it below the share of starts that are
            slow: with 5% of starts taking 30 s, the 95th percentile is 30 s itself and nothing is hedged in time.
        floor_s (`float`, *optional*, defaults to `5.0`):
            The threshold is never below this.
        cap_s (`float`, *optional*, defaults to `60.0`):
            The threshold is never above this; also the threshold until `min_samples` starts were measured.
        min_samples (`int`, *optional*, defaults to `10`):
            Starts measured before the percentile is trusted.
        window (`int`, *optional*, defaults to `200`):
            How many recent starts the percentile is taken over.
    """

    model_config = ConfigDict(extra="forbid")

    percentile: float = Field(default=0.9, gt=0, lt=1)
    floor_s: float = Field(default=5.0, ge=0)
    cap_s: float = Field(default=60.0, gt=0)
    min_samples: int = Field(default=10, ge=1)
    window: int = Field(default=200, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> HedgeSpec:
        if self.cap_s < self.floor_s:
            raise ValueError(f"cap_s ({self.cap_s}) must be >= floor_s ({self.floor_s})")
        return self
