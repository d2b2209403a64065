"""A group of env pool actors that serve the same environments and ask for the same resources, and starting one.

The spawner is plain data plus a method, so it pickles: in `raygrpo rollout` the driver starts the actors, in
`raygrpo train` the learner does (its orchestrator owns the pools), and either way each actor gets the same settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from raygrpo.driver.placement import actor_resources
from raygrpo.driver.pools.reachability import HEARTBEAT_S, UNREACHABLE_AFTER_S
from raygrpo.agent.worker import WorkerSettings

#: The label Ray gives every node: its id.
NODE_ID_LABEL = "ray.io/node-id"


@dataclass
class PoolGroup:
    """Env pool actors that serve the same environments and ask for the same resources.

    Args:
        field: The config field that sized it (`workers`, or `envs.<name>.pool`), for errors and metrics.
        prefix: Prefix of its actors' names.
        envs: The environments its actors serve.
        max_concurrent_per_actor: Rollouts per actor at once (K): the one value its actors are created with
            (`WorkerSettings.max_concurrent_per_actor`) and the driver dispatches by (`PoolSlot`).
        num_cpus, memory, resources: What each actor reserves.
        min_actors, max_actors: Its size bounds; equal for a fixed pool.
        idle_timeout_s: An actor idle this long is drained (elastic pools only).
        actor_start_timeout_s: With no live actor, the longest its actors may take to start.
        node_cooldown_s: Seconds its new actors keep off the node of an actor that was lost or failed to start.
        heartbeat_s: Seconds between the driver's probes of each of its live actors.
        unreachable_after_s: One of its actors whose probe has gone unanswered this long is unreachable (its
            rollouts run again elsewhere).
        max_live: Most sandboxes the providers of its environments let live at once (the sum of their
            `providers.<p>.max_live`); None when one of them has no cap. An elastic pool grows no further than that
            can keep busy.
    """

    field: str
    prefix: str
    envs: dict[str, Any]
    max_concurrent_per_actor: int
    num_cpus: float
    memory: int | None = None
    resources: dict[str, float] = dataclasses.field(default_factory=dict)
    min_actors: int = 1
    max_actors: int = 1
    idle_timeout_s: float = 60.0
    actor_start_timeout_s: float = 600.0
    node_cooldown_s: float = 60.0
    heartbeat_s: float = HEARTBEAT_S
    unreachable_after_s: float = UNREACHABLE_AFTER_S
    max_live: int | None = None

    @property
    def elastic(self) -> bool:
        return self.min_actors != self.max_actors

    @property
    def bundle(self) -> dict[str, float]:
        """One actor's resources as Ray counts them."""
        return actor_resources(self.num_cpus, memory=self.memory, resources=self.resources)


@dataclass
class ActorSpawner:
    """Starts the env pool actors of one group.

    Args:
        group: The group.
        settings: The settings every actor of the run shares; `name`, `envs`, `max_concurrent_per_actor` and
            `worker_index`
            are set per actor.
        env_vars: Environment variables of the actors' processes (the job's, plus the run's sandbox root and id).
        index_base: First `worker_index` of this group (actors are spread round-robin over the engines by it).
    """

    group: PoolGroup
    settings: WorkerSettings
    env_vars: dict[str, str] = field(default_factory=dict)
    index_base: int = 0
    #: The next actor's number in the group (names are never reused within a run).
    next_index: int = 0

    def spawn(self, avoid_nodes: Collection[str] = ()) -> tuple[str, Any]:
        """Create one more actor of the group (Ray places it when a node has its resources); returns its name and
        handle. Names are never reused within a run.

        `avoid_nodes` (node ids) are kept out of its placement while another node can take it: a node whose actor
        was just lost may be dead while Ray still counts it alive (~12 s by default), and an actor placed there
        fails again after that long. Where no other node fits, it goes on one of them all the same."""
        from raygrpo.actors.env_pool import EnvPoolActor

        i, self.next_index = self.next_index, self.next_index + 1
        name = f"{self.group.prefix}-{i}"
        settings = dataclasses.replace(self.settings, name=name, envs=self.group.envs,
                                       max_concurrent_per_actor=self.group.max_concurrent_per_actor,
                                       worker_index=self.index_base + i)
        placement: dict[str, Any] = {}
        if avoid_nodes:
            placement = {"label_selector": {NODE_ID_LABEL: f"!in({','.join(sorted(avoid_nodes))})"},
                         "fallback_strategy": [{"label_selector": {}}]}
        handle = EnvPoolActor.options(
            name=name,
            num_cpus=self.group.num_cpus,
            memory=self.group.memory,
            resources=self.group.resources or None,
            max_concurrency=self.group.max_concurrent_per_actor + 16,
            scheduling_strategy="SPREAD",  # a pool's actors on as many nodes as carry its resources
            runtime_env={"env_vars": dict(self.env_vars)},
            **placement,
        ).remote(settings)
        return name, handle
