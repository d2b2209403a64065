"""Where an environment's env pool actors run and what each reserves (`envs.<name>.pool`).

An environment without `pool` shares the run's default env pool actors (`workers:`), which ask for nothing but a
fraction of a CPU, so a one-machine run needs no custom resources. With `pool`, the environment gets actors of its
own that ask Ray for what it names: docker-backed Harbor suites the docker hosts' custom resource, remote-sandbox
(e2b) suites a light CPU share on client nodes, and an autoscaler adds the nodes that carry them.

    envs:
      swe:
        kind: harbor
        environment_type: docker
        pool: {num_actors: 4, max_concurrent_per_actor: 16, num_cpus: 1, memory: 2GiB, resources: {docker_host: 0.5}}

A pool is fixed (`num_actors`) or elastic (`min_actors` / `max_actors`): the orchestrator then starts actors as
rollouts queue up (K per actor) and drains those idle for `idle_timeout_s`, so an autoscaler can release their nodes
(see `raygrpo.driver.pools`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator, model_validator

from raygrpo.specs.moved_fields import refuse_moved_fields

#: Pool fields that were renamed (a config that sets one fails at load, naming the new one).
MOVED_FIELDS: dict[str, str] = {
    "max_concurrent": "is now `max_concurrent_per_actor` (one name with workers.max_concurrent_per_actor)",
}


class PoolSpec(BaseModel):
    """The env pool actors of one environment.

    Args:
        num_actors (`int`, *optional*):
            A fixed number of actors serving this environment alone (default: `workers.num_env_actors`, unless
            `min_actors` / `max_actors` make the pool elastic). Not together with those.
        min_actors (`int`, *optional*):
            Elastic pool: actors kept even when idle (default 0: an idle pool holds no actor, so its nodes can go).
        max_actors (`int`, *optional*):
            Elastic pool: most actors at once (default: the larger of `min_actors` and `workers.num_env_actors`).
        idle_timeout_s (`float`, *optional*):
            Elastic pool: an actor with nothing to run for this long is drained (default: `workers.idle_timeout_s`).
        max_concurrent_per_actor (`int`, *optional*):
            Rollouts, hence live environments, per actor at once (K; default: `workers.max_concurrent_per_actor`,
            the same quantity for the run's default actors).
        num_cpus (`float`, *optional*):
            CPUs Ray reserves per actor (default: `workers.actor_num_cpus`).
        memory (`ByteSize`, *optional*):
            Memory Ray reserves per actor, in bytes or with a unit (`"2GiB"`); the node must have it free.
        resources (`dict[str, float]`, *optional*, defaults to `{}`):
            Custom resources per actor, e.g. `{docker_host: 0.5}`: two actors per node that carries `docker_host: 1`.
            A resource that no node offers and no autoscaler can add fails the run at start, naming it.
    """

    model_config = ConfigDict(extra="forbid")

    num_actors: int | None = Field(None, ge=1)
    min_actors: int | None = Field(None, ge=0)
    max_actors: int | None = Field(None, ge=1)
    idle_timeout_s: float | None = Field(None, gt=0)
    max_concurrent_per_actor: int | None = Field(None, ge=1)
    num_cpus: float | None = Field(None, ge=0)
    memory: ByteSize | None = None
    resources: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_fields(cls, data: Any) -> Any:
        return refuse_moved_fields(data, MOVED_FIELDS)

    @field_validator("resources")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        for key, amount in value.items():
            if key in ("CPU", "GPU", "memory"):
                raise ValueError(f"`{key}` is not a custom resource: set num_cpus / memory instead")
            if amount <= 0:
                raise ValueError(f"resources.{key} must be positive, got {amount}")
        return value

    @model_validator(mode="after")
    def _sizes(self) -> PoolSpec:
        if self.num_actors is not None and (self.min_actors is not None or self.max_actors is not None):
            raise ValueError("set num_actors (a fixed pool) or min_actors / max_actors (an elastic one), not both")
        if self.min_actors is not None and self.max_actors is not None and self.min_actors > self.max_actors:
            raise ValueError(f"min_actors ({self.min_actors}) is larger than max_actors ({self.max_actors})")
        return self

    @property
    def elastic(self) -> bool:
        """Whether min_actors / max_actors were set."""
        return self.min_actors is not None or self.max_actors is not None
