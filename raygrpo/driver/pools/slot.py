"""One env pool actor as the orchestrator sees it: its handle, what it serves, its rollouts in flight, its state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from raygrpo.driver.pools.reachability import Reachability


class SlotState(str, Enum):
    """Where an env pool actor is in its life: `starting` (created, building its worker), `live` (takes rollouts),
    `unreachable` (silent for `workers.unreachable_after_s`: takes none, its rollouts run again elsewhere; retired if
    it answers again), `draining` (takes none; shutting down), `dead` (drained, lost or failed to start)."""

    STARTING = "starting"
    LIVE = "live"
    UNREACHABLE = "unreachable"
    DRAINING = "draining"
    DEAD = "dead"


@dataclass(eq=False)
class PoolSlot:
    """An env pool actor in a pool.

    Args:
        handle: The actor handle.
        name: The actor's name.
        max_concurrent_per_actor: Rollouts it runs at once (K): its pool's, which the actor was created with.
        envs: The environments it serves (None: every one).
        state: Its state; a slot created for an existing actor is `live`.
        warm_envs: The environments it keeps a warm pool for (it is told which of their tasks come next).
        warm_depth: The most sandboxes its warm pool holds.
    """

    handle: Any
    name: str
    max_concurrent_per_actor: int
    envs: frozenset[str] | None = None
    state: SlotState = SlotState.LIVE
    warm_envs: frozenset[str] = frozenset()
    warm_depth: int = 0
    in_flight: int = 0
    #: When it last changed state or last became idle (monotonic seconds).
    since: float = field(default_factory=time.monotonic)
    #: The id of the node it runs on, once its start is settled (None until then, or for an actor given as is).
    node_id: str | None = None
    ready_ref: Any = None
    stop_ref: Any = None
    stats_ref: Any = None
    #: From the actor's last stats: environments alive now, and opened since it started.
    live_envs: int = 0
    envs_opened: int = 0
    #: Its probes: when it last answered, the probe in flight (`raygrpo.driver.pools.reachability`).
    reach: Reachability = field(default_factory=Reachability)
    #: Seconds it was live (or draining), of those with nothing in flight, and rollout-seconds it ran.
    live_s: float = 0.0
    idle_s: float = 0.0
    busy_s: float = 0.0
    _mark: float = field(default_factory=time.monotonic, repr=False)

    @property
    def alive(self) -> bool:
        return self.state is not SlotState.DEAD

    def takes(self, env: str) -> bool:
        """Whether it can take one more rollout of `env` now."""
        return (self.state is SlotState.LIVE and self.in_flight < self.max_concurrent_per_actor
                and (self.envs is None or env in self.envs))

    def warms(self, env: str) -> bool:
        """Whether it is live and keeps sandboxes of `env` warm."""
        return self.state is SlotState.LIVE and env in self.warm_envs

    @property
    def tell_limit(self) -> int:
        """How many queued rollouts it is told of at most (that were not dispatched yet): enough to fill its warm
        pool, and at least K."""
        return max(self.max_concurrent_per_actor, self.warm_depth)

    def account(self) -> None:
        """Add the time since the last change to `live_s`, `idle_s` and `busy_s`."""
        now = time.monotonic()
        if self.state in (SlotState.LIVE, SlotState.DRAINING):
            dt = now - self._mark
            self.live_s += dt
            self.busy_s += self.in_flight * dt
            if self.in_flight == 0:
                self.idle_s += dt
        self._mark = now

    @property
    def room(self) -> int:
        """Rollouts it can take now (0 unless live)."""
        return max(0, self.max_concurrent_per_actor - self.in_flight) if self.state is SlotState.LIVE else 0

    def take(self, n: int = 1) -> None:
        self.account()
        self.in_flight += n

    def release(self, n: int = 1) -> None:
        self.account()
        self.in_flight = max(0, self.in_flight - n)
        if self.in_flight == 0:
            self.since = time.monotonic()

    def enter(self, state: SlotState) -> None:
        self.account()
        self.state, self.since = state, time.monotonic()
