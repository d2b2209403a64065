"""A run's env pools together: where a rollout of an environment can go, and what they all need from the cluster.

Every orchestrator of a run (in training: the one that feeds the learner and the one that evaluates) shares one
`PoolSet`, so an actor's rollouts in flight are counted once and one pool is not sized twice. Each orchestrator
reports its queue under its own key; a pool's demand is its rollouts in flight plus every queue's rollouts for its
environments, and at least what the caller said it will ask for next (`expect`: async training keeps its look-ahead
outstanding, so its pools do not drain between steps). Calls from several threads are serialised by one lock.

After every tick the sum of all pools' targets goes to the autoscaler as one `request_resources` bundle list (one
bundle per wanted actor), so a burst gets its nodes at once; it is cleared when the set closes.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Iterable
from typing import Any

from raygrpo.driver.pools.elastic import ElasticPool
from raygrpo.driver.pools.group import ActorSpawner
from raygrpo.driver.pools.ray_metrics import PoolMetrics
from raygrpo.driver.pools.slot import PoolSlot, SlotState

logger = logging.getLogger(__name__)


class PoolSet:
    """The env pools of a run (see the module docstring).

    Args:
        pools: The pools; environments served by several pools go to the least busy actor among them.
        hint_autoscaler: Send the pools' targets to `ray.autoscaler.sdk.request_resources` (when any is elastic).
    """

    def __init__(self, pools: list[ElasticPool], *, hint_autoscaler: bool = True) -> None:
        self.pools = pools
        self.lock = threading.RLock()
        self.metrics = PoolMetrics()
        self._queued: dict[Any, dict[str, int]] = {}
        self._expected: dict[str, int] = {}
        self._hint = hint_autoscaler and any(p.spawner is not None and p.min_actors != p.max_actors for p in pools)
        self._hinted: list[dict[str, float]] | None = None

    @classmethod
    def of_actors(cls, actors: list[tuple[str, Any]], max_concurrent_per_actor: int,
                  envs: Iterable[str] | None = None) -> PoolSet:
        """One fixed pool of actors that already exist, `(name, handle)`, never started nor drained by it (tests, and
        benchmarks that time a given set of actors).

        Args:
            actors: The actors.
            max_concurrent_per_actor: The K the actors were created with (`WorkerSettings.max_concurrent_per_actor`).
            envs: The environments they serve (None: every one).
        """
        envs = frozenset(envs) if envs is not None else None
        slots = [PoolSlot(handle=handle, name=name, max_concurrent_per_actor=max_concurrent_per_actor, envs=envs)
                 for name, handle in actors]
        return cls([ElasticPool("workers", envs, max_concurrent_per_actor, len(slots), len(slots), slots=slots)])

    @classmethod
    def from_spawners(cls, spawners: Iterable[ActorSpawner]) -> PoolSet:
        """The pools of a run's actor groups, none started yet (`start`)."""
        return cls([ElasticPool.from_spawner(s) for s in spawners])

    # ------------------------------------------------------------------ where rollouts go

    def serves(self, env: str) -> bool:
        return any(p.serves(env) for p in self.pools)

    def can_run(self, env: str) -> bool:
        """Whether some pool serving `env` has, or can still get, an actor."""
        return any(p.serves(env) and p.can_run for p in self.pools)

    def free_slot(self, env: str, prefer: str | None = None) -> PoolSlot | None:
        """The least busy live actor with room for a rollout of `env`, if any; the actor named `prefer` when it has
        room (the one told the rollout comes: its warm pool holds a sandbox for it)."""
        free = [s for p in self.pools for s in p.slots if s.takes(env)]
        if prefer is not None:
            for slot in free:
                if slot.name == prefer:
                    return slot
        return min(free, key=lambda s: s.in_flight) if free else None

    def room(self, env: str) -> int:
        """How many rollouts of `env` the live actors can take now, in all."""
        return sum(s.room for p in self.pools for s in p.slots if s.takes(env))

    def share(self, env: str, slot: PoolSlot, n: int) -> int:
        """How many of `n` rollouts of `env`, given one at a time to the least busy actor with room (`free_slot`),
        `slot` would get."""
        load = [[s.in_flight, i, s.room, s is slot] for i, s in enumerate(s for p in self.pools for s in p.slots
                                                                           if s.takes(env))]
        heapq.heapify(load)
        got = 0
        for _ in range(n):
            if not load:
                break
            least = heapq.heappop(load)
            got += least[3]
            least[0], least[2] = least[0] + 1, least[2] - 1
            if least[2]:
                heapq.heappush(load, least)
        return got

    def keeps_warm(self) -> bool:
        """Whether any pool's actors keep a warm pool."""
        return any(p.warm_envs for p in self.pools)

    def warm_slots(self, env: str) -> list[PoolSlot]:
        """Live actors that keep a warm pool for `env`."""
        return [s for p in self.pools for s in p.slots if s.warms(env)]

    def has_room(self) -> bool:
        return any(s.room for p in self.pools for s in p.slots)

    def lost(self, slot: PoolSlot, reason: object) -> None:
        with self.lock:
            for pool in self.pools:
                if slot in pool.slots:
                    pool.lost(slot, reason)
                    return
            slot.enter(SlotState.DEAD)

    def wait_refs(self) -> list[Any]:
        with self.lock:
            return [ref for p in self.pools for ref in p.wait_refs()]

    @property
    def actors(self) -> list[tuple[str, Any]]:
        """The live actors, `(name, handle)`."""
        return [(s.name, s.handle) for p in self.pools for s in p.slots if s.state is SlotState.LIVE]

    # ------------------------------------------------------------------ sizing

    def expect(self, per_env: dict[str, int]) -> None:
        """Rollouts per environment the caller will keep asking for: no pool is sized below them."""
        with self.lock:
            self._expected = dict(per_env)

    def report(self, source: Any, queued_by_env: dict[str, int]) -> None:
        """Set `source`'s queued rollouts per environment (an empty dict when it has none)."""
        with self.lock:
            if queued_by_env:
                self._queued[source] = dict(queued_by_env)
            else:
                self._queued.pop(source, None)

    def _for_pool(self, pool: ElasticPool, per_env: dict[str, int]) -> int:
        return sum(n for env, n in per_env.items() if pool.envs is None or env in pool.envs)

    def queued(self) -> dict[str, int]:
        """Rollouts queued for each pool (by pool name)."""
        with self.lock:
            return {p.name: sum(self._for_pool(p, q) for q in self._queued.values()) for p in self.pools}

    def tick(self) -> None:
        """Size every pool for its demand now, start and drain actors, and update the autoscaler hint and metrics.

        Raises:
            PoolStartError: A pool has no live actor and cannot start one.
        """
        with self.lock:
            queued = self.queued()
            for pool in self.pools:
                demand = max(pool.in_flight + queued[pool.name], self._for_pool(pool, self._expected))
                pool.tick(demand)
            self._update_hint()
            if self.metrics.enabled:  # a snapshot walks every slot: only for a reader
                self.metrics.record_pools(self.snapshot(), queued)

    def _update_hint(self) -> None:
        if not self._hint:
            return
        bundles = [dict(p.bundle) for p in self.pools if p.spawner is not None and p.bundle for _ in range(p.target)]
        if bundles != self._hinted:
            self._request(bundles)

    def _request(self, bundles: list[dict[str, float]]) -> None:
        try:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=bundles)
            self._hinted = bundles
            logger.debug("asked the autoscaler for %d env pool actor bundle(s)", len(bundles))
        except Exception as exc:  # noqa: BLE001 - a hint only: pending actors still ask for their nodes
            logger.warning("request_resources failed: %s", exc)
            self._hint = False

    # ------------------------------------------------------------------ life

    def start(self) -> None:
        """Start every pool's minimum and wait until those actors are live, so a run that cannot place its
        actors fails at start.

        Raises:
            PoolStartError: A pool's actors cannot start.
        """
        import ray

        self.tick()
        while True:
            refs = self.wait_refs()
            if not refs:
                break
            ray.wait(refs, num_returns=1, timeout=1.0)
            self.tick()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per pool: actors live / starting / draining, target, bounds, rollouts in flight, live environments,
        environments opened, actors started / drained / lost / failed to start, actor-seconds live and idle, and
        utilization (rollout-seconds run over K × actor-seconds live)."""
        with self.lock:
            return {p.name: p.snapshot() for p in self.pools}

    def close(self, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Shut every actor down and clear the autoscaler hint; returns the final stats of every actor the pools
        drained or closed."""
        with self.lock:
            stats = [s for p in self.pools for s in p.close(timeout_s)]
            if self._hinted:
                self._request([])
            return stats
