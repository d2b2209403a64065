"""One pool of env pool actors, sized from its demand between a minimum and a maximum.

`tick(demand)` does all of a pool's bookkeeping, without blocking (every Ray call in it is fire-and-forget or a
zero-timeout wait), so the orchestrator can call it as often as it dispatches:

- actors that finished starting become `live`; one that failed to start is dropped (three failures in a row with
  no live actor, or none started within `actor_start_timeout_s`, fail the run);
- the target is the demand over K rollouts per actor, clamped to [min, max]: below it, actors are started;
- above it and above the minimum, an actor idle for `idle_timeout_s` is drained: it takes no more rollouts, its
  `shutdown` closes its environments, then it is killed, so its node goes idle and an autoscaler can release it;
- every few seconds each live actor is asked for its stats (live environments, environments opened) for metrics.

`lost(slot)` forgets an actor whose call raised `RayActorError` (it or its node died or was cut off) and kills it
for good, so a partitioned actor that comes back cannot run rollouts already retried elsewhere; the next tick
refills the pool on another node while one fits. The node of an actor that failed to start is kept out the same way
(`raygrpo.driver.pools.failed_node`: a dying node, or one whose disk or sandbox root is unusable, would fail its
replacement too), for `node_cooldown_s`; a node Ray has declared dead takes no actor anyway.

Every `heartbeat_s` each live actor is probed (`EnvPool.ping`; `raygrpo.driver.pools.reachability` says why); one
unanswered for `unreachable_after_s`, or whose probe raised, becomes `unreachable`: it takes no rollouts, those it
runs run again elsewhere, its node is cooled down and a replacement starts at once (the pool may briefly exceed
`max_actors`). It is never used again: if it answers once more it is retired (drained), since its rollouts already
run elsewhere; if Ray declares it dead it is lost as above. Ray never declares a stopped process (SIGSTOP) dead: one
silent for `unreachable_after_s + rollout_timeout_s` is killed (every rollout it held is past its own deadline by
then), so its calls fail and rollouts with no retry left settle as `env_error`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import Any

from raygrpo.driver.pools.failed_node import failed_start_node
from raygrpo.driver.pools.group import ActorSpawner
from raygrpo.driver.pools.reachability import HEARTBEAT_S, UNREACHABLE_AFTER_S
from raygrpo.driver.pools.slot import PoolSlot, SlotState
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.kinds import kind_of

logger = logging.getLogger(__name__)

#: Seconds between stats requests to each live actor.
STATS_INTERVAL_S = 5.0
#: The rollout deadline assumed for a pool of given actors (`PoolSet.of_actors`): the config's default.
ROLLOUT_TIMEOUT_S: float = RolloutConfig.model_fields["rollout_timeout_s"].default
#: A pool with no live actor gives up after this many start failures in a row.
MAX_START_FAILURES = 3
#: Seconds a lost or failed actor's node is kept out of new actors' placement by default (Ray declares a dead node
#: dead well within this).
NODE_COOLDOWN_S = 60.0


class PoolStartError(RuntimeError):
    """A pool has no live actor and cannot start one (failures, or no node to place it on in time)."""


class ElasticPool:
    """Env pool actors of one group, started and drained as demand changes.

    Args:
        name: The config field that sized the pool (`workers`, `envs.<name>.pool`).
        envs: The environments its actors serve (None: every one).
        max_concurrent_per_actor: Rollouts per actor at once (K).
        min_actors, max_actors: Size bounds (equal for a fixed pool).
        idle_timeout_s: Idle seconds before an actor above the target is drained.
        actor_start_timeout_s: With no live actor, the longest an actor may take to start.
        node_cooldown_s: Seconds new actors keep off the node of an actor that was lost or failed to start.
        heartbeat_s: Seconds between probes of each live actor.
        unreachable_after_s: An actor whose probe has gone unanswered this long is unreachable.
        max_live: Most sandboxes its providers let live at once (None: no cap): it grows to no more actors than
            those keep busy, `ceil(max_live / K)` (the others would only wait for live tickets).
        rollout_timeout_s: The run's `rollout.rollout_timeout_s`: an unreachable actor still silent this long after
            is killed (module docstring).
        spawner: Starts new actors; None for a pool of given actors that never starts or drains any.
        bundle: One actor's resources (for the autoscaler hint).
        slots: Actors that already exist.
    """

    def __init__(self, name: str, envs: Iterable[str] | None, max_concurrent_per_actor: int, min_actors: int,
                 max_actors: int, *, idle_timeout_s: float = 60.0, actor_start_timeout_s: float = 600.0,
                 node_cooldown_s: float = NODE_COOLDOWN_S, heartbeat_s: float = HEARTBEAT_S,
                 unreachable_after_s: float = UNREACHABLE_AFTER_S, max_live: int | None = None,
                 rollout_timeout_s: float = ROLLOUT_TIMEOUT_S, spawner: ActorSpawner | None = None,
                 bundle: dict[str, float] | None = None, slots: list[PoolSlot] | None = None) -> None:
        self.name = name
        self.envs = frozenset(envs) if envs is not None else None
        #: Environments whose sandboxes its actors keep warm, and the most warm sandboxes one actor holds.
        self.warm_envs: frozenset[str] = frozenset()
        self.warm_depth = 0
        self.max_concurrent_per_actor = max_concurrent_per_actor
        self.min_actors = min_actors
        self.max_actors = max_actors
        self.max_live = max_live
        self.idle_timeout_s = idle_timeout_s
        self.actor_start_timeout_s = actor_start_timeout_s
        self.node_cooldown_s = node_cooldown_s
        self.heartbeat_s = heartbeat_s
        self.unreachable_after_s = unreachable_after_s
        self.rollout_timeout_s = rollout_timeout_s
        self.spawner = spawner
        self.bundle = dict(bundle or {})
        self.slots: list[PoolSlot] = list(slots or [])
        self.target = len(self.slots) if spawner is None else min_actors
        self.retired: list[dict[str, Any]] = []  # final stats of the actors it drained
        self.started = self.drained = self.lost_count = self.start_failures = self.unreachable_count = 0
        #: Live, idle and busy seconds of the actors it no longer holds (see `PoolSlot`).
        self._gone = {"live_s": 0.0, "idle_s": 0.0, "busy_s": 0.0}
        self._failures_in_a_row = 0
        self._next_start = 0.0
        self._last_error = ""
        self._last_stats = 0.0
        #: Nodes of lost actors and of actors that failed to start, until when (monotonic s) new actors keep off.
        self._avoid: dict[str, float] = {}

    @classmethod
    def from_spawner(cls, spawner: ActorSpawner) -> ElasticPool:
        g = spawner.group
        pool = cls(g.field, g.envs, g.max_concurrent_per_actor, g.min_actors, g.max_actors,
                   idle_timeout_s=g.idle_timeout_s, actor_start_timeout_s=g.actor_start_timeout_s,
                   node_cooldown_s=g.node_cooldown_s, heartbeat_s=g.heartbeat_s,
                   unreachable_after_s=g.unreachable_after_s, max_live=g.max_live, spawner=spawner, bundle=g.bundle,
                   rollout_timeout_s=getattr(spawner.settings, "rollout", RolloutConfig()).rollout_timeout_s)
        depths = {n: kind_of(spec).warm_depth(spec) for n, spec in g.envs.items()}
        pool.warm_envs = frozenset(n for n, depth in depths.items() if depth > 0)
        pool.warm_depth = max(depths.values(), default=0)
        return pool

    # ------------------------------------------------------------------ views

    def serves(self, env: str) -> bool:
        return self.envs is None or env in self.envs

    def count(self, *states: SlotState) -> int:
        return sum(1 for s in self.slots if s.state in states)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.slots)

    @property
    def can_run(self) -> bool:
        """Whether it has, or can still get, an actor to run rollouts on."""
        return self.spawner is not None or self.count(SlotState.LIVE) > 0

    def wait_refs(self) -> list[Any]:
        """Refs whose completion changes the pool (a start or a drain finishing): worth waking up for."""
        return [s.ready_ref for s in self.slots if s.state is SlotState.STARTING] + \
               [s.stop_ref for s in self.slots if s.state is SlotState.DRAINING]

    def _seconds(self) -> dict[str, float]:
        out = dict(self._gone)
        for slot in self.slots:
            slot.account()
            for key in out:
                out[key] += getattr(slot, key)
        return out

    def snapshot(self) -> dict[str, Any]:
        seconds = self._seconds()
        capacity_s = self.max_concurrent_per_actor * seconds["live_s"]
        return {
            "actors": self.count(SlotState.LIVE), "starting": self.count(SlotState.STARTING),
            "draining": self.count(SlotState.DRAINING), "unreachable": self.count(SlotState.UNREACHABLE),
            "target": self.target, "min": self.min_actors,
            "max": self.max_actors, "in_flight": self.in_flight,
            "live_envs": sum(s.live_envs for s in self.slots if s.state is SlotState.LIVE),
            "envs_opened": sum(s.envs_opened for s in self.slots) + sum(int(r.get("envs_opened") or 0)
                                                                         for r in self.retired),
            "started": self.started, "drained": self.drained, "lost": self.lost_count,
            "went_unreachable": self.unreachable_count,
            "start_failures": self.start_failures,
            "actor_seconds": round(seconds["live_s"], 3), "idle_actor_seconds": round(seconds["idle_s"], 3),
            "utilization": round(seconds["busy_s"] / capacity_s, 4) if capacity_s else None,
        }

    def size_for(self, demand: int) -> int:
        """Actors for `demand` rollouts queued or in flight: K per actor, within [min, max], and no more than its
        providers' live cap keeps busy."""
        if self.max_live is not None:
            demand = min(demand, self.max_live)
        return max(self.min_actors, min(self.max_actors, math.ceil(demand / self.max_concurrent_per_actor)))

    # ------------------------------------------------------------------ bookkeeping

    def tick(self, demand: int) -> None:
        """Update the pool for `demand` rollouts queued or in flight (see the module docstring).

        Raises:
            PoolStartError: No live actor, and none can be started.
        """
        import ray

        now = time.monotonic()
        self._settle_starts(ray)
        self._settle_drains(ray)
        self._probe(ray, now)
        if self.spawner is None:
            return
        self.target = self.size_for(demand)
        active = self.count(SlotState.STARTING, SlotState.LIVE)
        while active < self.target and now >= self._next_start:
            self._start()
            active += 1
        self._drain_idle(now, active)
        self._check_start_timeout(now)
        if now - self._last_stats >= STATS_INTERVAL_S:
            self._last_stats = now
            self._ask_stats(ray)

    def _start(self) -> None:
        now = time.monotonic()
        self._avoid = {node: until for node, until in self._avoid.items() if until > now}
        name, handle = self.spawner.spawn(avoid_nodes=self._avoid.keys())
        slot = PoolSlot(handle=handle, name=name, max_concurrent_per_actor=self.max_concurrent_per_actor,
                        envs=self.envs, state=SlotState.STARTING, warm_envs=self.warm_envs,
                        warm_depth=self.warm_depth)
        slot.ready_ref = handle.ready.remote()
        self.slots.append(slot)
        self.started += 1
        logger.info("%s: starting env pool actor %s (target %d)", self.name, name, self.target)

    @staticmethod
    def _finished(ray: Any, by_ref: dict[Any, PoolSlot]) -> list[tuple[Any, PoolSlot]]:
        """The refs among `by_ref` that are done now (no waiting), with their slots."""
        if not by_ref:
            return []
        done, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        return [(ref, by_ref[ref]) for ref in done]

    def _settle_starts(self, ray: Any) -> None:
        starting = {s.ready_ref: s for s in self.slots if s.state is SlotState.STARTING}
        for ref, slot in self._finished(ray, starting):
            try:
                slot.node_id = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - a failed start is counted and retried, not raised here
                self.start_failures += 1
                self._failures_in_a_row += 1
                self._last_error = f"{type(exc).__name__}: {exc}"[:500]
                self._next_start = time.monotonic() + min(30.0, 2.0 ** self._failures_in_a_row)
                logger.warning("%s: env pool actor %s failed to start: %s", self.name, slot.name, self._last_error)
                self._cool_down(failed_start_node(slot.handle, exc), f"actor {slot.name} failed to start there")
                self._forget(slot, ray)
                if self._failures_in_a_row >= MAX_START_FAILURES and not self.count(SlotState.LIVE):
                    raise PoolStartError(f"{self.name}: {self._failures_in_a_row} env pool actors in a row failed "
                                         f"to start; the last: {self._last_error}") from exc
                continue
            self._failures_in_a_row = 0
            slot.ready_ref = None
            slot.enter(SlotState.LIVE)
            slot.reach.answered(time.monotonic())
            logger.info("%s: env pool actor %s is live", self.name, slot.name)

    def _drain_idle(self, now: float, active: int) -> None:
        keep = max(self.min_actors, self.target)
        idle = sorted((s for s in self.slots if s.state is SlotState.LIVE and s.in_flight == 0
                       and now - s.since >= self.idle_timeout_s), key=lambda s: s.since)
        for slot in idle[:max(0, active - keep)]:
            slot.enter(SlotState.DRAINING)
            slot.stop_ref = slot.handle.shutdown.remote()
            logger.info("%s: draining env pool actor %s (idle %.0f s, target %d)", self.name, slot.name,
                        self.idle_timeout_s, self.target)

    def _settle_drains(self, ray: Any) -> None:
        draining = {s.stop_ref: s for s in self.slots if s.state is SlotState.DRAINING}
        for ref, slot in self._finished(ray, draining):
            try:
                self.retired.append(ray.get(ref))
            except Exception as exc:  # noqa: BLE001 - it died while draining: its environments died with it
                logger.warning("%s: env pool actor %s died while draining: %s", self.name, slot.name, exc)
                self.retired.append({"name": slot.name, "live_envs": None})
            self.drained += 1
            self._forget(slot, ray)

    def _check_start_timeout(self, now: float) -> None:
        if self.count(SlotState.LIVE) or not self.target:
            return
        starting = [s for s in self.slots if s.state is SlotState.STARTING]
        if starting and now - min(s.since for s in starting) > self.actor_start_timeout_s:
            raise PoolStartError(
                f"{self.name}: no env pool actor started within {self.actor_start_timeout_s:.0f} s "
                f"(workers.actor_start_timeout_s); each asks for "
                f"{self.bundle or 'nothing'}: is there a node (or an autoscaler node type) with that free?")

    def _ask_stats(self, ray: Any) -> None:
        live = [s for s in self.slots if s.state is SlotState.LIVE]
        pending = {s.stats_ref: s for s in live if s.stats_ref is not None}
        for ref, slot in self._finished(ray, pending):
            slot.stats_ref = None
            try:
                stats = ray.get(ref)
            except Exception:  # noqa: BLE001 - a lost actor shows up through its rollouts
                continue
            slot.live_envs = int(stats.get("live_envs") or 0)
            slot.envs_opened = int(stats.get("envs_opened") or 0)
        for slot in live:
            if slot.stats_ref is None:
                slot.stats_ref = slot.handle.stats.remote()

    def _probe(self, ray: Any, now: float) -> None:
        """Read the answers of the probes in flight, mark actors silent too long unreachable, retire unreachable
        ones that answered again, and probe the live ones that are due (see the module docstring)."""
        from ray.exceptions import ActorDiedError

        watched = [s for s in self.slots if s.state in (SlotState.LIVE, SlotState.UNREACHABLE)]
        probes = {s.reach.probe_ref: s for s in watched if s.reach.probe_ref is not None}
        for ref, slot in self._finished(ray, probes):
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - a failed probe is an answer too: the actor is not reachable
                slot.reach.probe_ref = None
                if slot.state is SlotState.LIVE:
                    self._unreachable(slot, f"its probe failed: {type(exc).__name__}: {exc}"[:300])
                elif isinstance(exc, ActorDiedError):
                    self.lost(slot, exc)
                continue
            slot.reach.answered(now)
            if slot.state is SlotState.UNREACHABLE:
                logger.warning("%s: env pool actor %s answers again after %.1f s; retiring it (its rollouts ran "
                               "elsewhere)", self.name, slot.name, now - slot.since)
                slot.enter(SlotState.DRAINING)
                slot.stop_ref = slot.handle.shutdown.remote()
        for slot in watched:
            if slot.state is SlotState.LIVE and slot.reach.unreachable(now, self.unreachable_after_s):
                self._unreachable(slot, f"no answer for {slot.reach.silent_for(now):.1f} s "
                                        f"(workers.unreachable_after_s={self.unreachable_after_s:g})")
        give_up_s = self.unreachable_after_s + self.rollout_timeout_s
        for slot in watched:
            if slot.state is SlotState.UNREACHABLE and slot.reach.silent_for(now) > give_up_s:
                logger.warning("%s: env pool actor %s silent for %.0f s (workers.unreachable_after_s + rollout."
                               "rollout_timeout_s): killed, its rollouts settle as lost", self.name, slot.name,
                               slot.reach.silent_for(now))
                self._forget(slot, ray)
        for slot in watched:
            if slot.alive and slot.state is not SlotState.DRAINING and slot.reach.due(now, self.heartbeat_s):
                slot.reach.sent(slot.handle.ping.remote(), now)

    def _unreachable(self, slot: PoolSlot, why: str) -> None:
        """Stop using a silent actor: no more rollouts, not counted in the pool's size, its node cooled down."""
        logger.warning("%s: env pool actor %s is unreachable: %s; its %d rollout(s) in flight run again elsewhere",
                       self.name, slot.name, why, slot.in_flight)
        self.unreachable_count += 1
        slot.enter(SlotState.UNREACHABLE)
        self._cool_down(slot.node_id, f"actor {slot.name} went unreachable there")

    def lost(self, slot: PoolSlot, reason: object) -> None:
        """Forget an actor whose call raised `RayActorError`, and kill it for good (see the module docstring)."""
        if slot.state is SlotState.DEAD:
            return
        import ray

        logger.warning("%s: env pool actor %s lost: %s", self.name, slot.name, reason)
        self.lost_count += 1
        self._cool_down(slot.node_id, f"actor {slot.name} was lost there")
        self._forget(slot, ray)

    def _cool_down(self, node_id: str | None, why: str) -> None:
        """Keep new actors off a node for `node_cooldown_s` (while another node can take them)."""
        if not node_id or self.node_cooldown_s <= 0:
            return
        self._avoid[node_id] = time.monotonic() + self.node_cooldown_s
        logger.warning("%s: new actors keep off node %s for %.0f s (workers.node_cooldown_s): %s", self.name,
                       node_id[:12], self.node_cooldown_s, why)

    def _forget(self, slot: PoolSlot, ray: Any) -> None:
        slot.enter(SlotState.DEAD)
        if slot in self.slots:
            self.slots.remove(slot)
            for key in self._gone:
                self._gone[key] += getattr(slot, key)
        try:
            ray.kill(slot.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def close(self, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Shut every actor down (closing its environments) and kill it; returns the final stats of every actor the
        pool ever drained or closed (None `live_envs` where an actor could not say)."""
        import ray

        stats = list(self.retired)
        for slot in [s for s in self.slots if s.state is SlotState.STARTING]:
            stats.append({"name": slot.name, "live_envs": 0})  # no rollout reached it: it holds no environment
            self._forget(slot, ray)
        for slot in [s for s in self.slots if s.state is SlotState.UNREACHABLE]:
            stats.append({"name": slot.name, "live_envs": None})  # it cannot say; its node's reapers see to them
            self._forget(slot, ray)
        slots = [s for s in self.slots if s.alive]
        refs = [s.stop_ref if s.state is SlotState.DRAINING else s.handle.shutdown.remote() for s in slots]
        for slot, ref in zip(slots, refs):
            try:
                stats.append(ray.get(ref, timeout=timeout_s))
            except Exception as exc:  # noqa: BLE001
                logger.warning("env pool actor %s did not shut down cleanly: %s", slot.name, exc)
                stats.append({"name": slot.name, "live_envs": None})
            self._forget(slot, ray)
        self.retired = stats
        return stats
