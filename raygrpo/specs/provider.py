"""The limits of a sandbox provider (`providers.<name>` in the run config). Pure data.

A provider is whatever the Harbor suites' sandboxes count against: an account at e2b or Daytona, a docker host, the
local backend. Each Harbor suite names its provider (`envs.<name>.provider`, by default its backend's name: `local`,
`docker`, `e2b`, ... or the import path), and every suite that names the same one shares its one entry here, so two
suites can never disagree about a provider's limits. The driver hands the entry to the provider's governor once
(`raygrpo.governor`), which enforces it for every env pool actor on every node.

    providers:
      e2b: {create_rate_per_s: 5, max_live: 100}     # e2b Pro
    envs:
      swe: {kind: harbor, path: swe_tasks, environment_type: e2b}
      sql: {kind: harbor, path: sql_tasks, environment_type: e2b}   # same provider, same limits
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from raygrpo.specs.governor import BackoffSpec


class ProviderSpec(BaseModel):
    """One provider's limits, cluster-wide: every env pool actor on every node that starts sandboxes of a suite naming
    this provider draws from them. Unset limits do not apply; a provider with no entry at all has no limits.

    Args:
        create_rate_per_s (`float`, *optional*):
            Most sandbox creates in any 1 s window, summed over the cluster (e.g. 5 for e2b Pro). None: no rate limit.
        max_live (`int`, *optional*):
            Most sandboxes alive at once, summed over the cluster, counted from before the create is sent until the
            stop returns (e.g. 100 for e2b Pro). Warm sandboxes count too. None: no cap.
        rate_limit_backoff (`BackoffSpec`, *optional*):
            How a start the provider refused with "too many requests" waits before it queues again (see
            `raygrpo.specs.governor.BackoffSpec`). Refusals also pause and slow the governor's schedule for every
            actor until the provider stops refusing.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    create_rate_per_s: float | None = Field(default=None, gt=0)
    max_live: int | None = Field(default=None, ge=1)
    rate_limit_backoff: BackoffSpec = Field(default_factory=BackoffSpec)

    @property
    def governed(self) -> bool:
        """Whether a governor enforces anything for this provider (a create rate or a live cap is set)."""
        return self.create_rate_per_s is not None or self.max_live is not None
