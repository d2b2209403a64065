"""The numbers a platform engineer watches, as Ray metrics: Ray's dashboard and its Prometheus endpoint show them.

    raygrpo_pool_actors{pool, state}         env pool actors live / starting / draining
    raygrpo_pool_target{pool}                actors the pool is sized for now
    raygrpo_queue_depth{pool}                rollouts waiting for room on the pool's actors
    raygrpo_live_sandboxes{pool}             environments (sandboxes, sessions) alive on its actors
    raygrpo_env_starts_total{pool}           environments started (rate: starts per second)
    raygrpo_actor_losses_total{pool}         actors lost (died, their node died or was cut off)
    raygrpo_rollout_attempts_total{status}   rollout attempts that ended, by status (failures by status)

The same numbers go to the run's metrics file (`PoolSet.snapshot`). Metrics are only recorded in a process
connected to Ray; elsewhere (unit tests) they are skipped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class PoolMetrics:
    """Ray metrics of a run's env pools and rollout attempts (names above)."""

    def __init__(self) -> None:
        self._on = False
        self._opened: dict[str, int] = {}
        self._lost: dict[str, int] = {}
        try:
            import ray
            from ray.util.metrics import Counter, Gauge

            if not ray.is_initialized():
                return
            self.actors = Gauge("raygrpo_pool_actors", "env pool actors by state", ("pool", "state"))
            self.target = Gauge("raygrpo_pool_target", "env pool actors the pool is sized for", ("pool",))
            self.queue = Gauge("raygrpo_queue_depth", "rollouts waiting for an env pool actor", ("pool",))
            self.live = Gauge("raygrpo_live_sandboxes", "environments alive on the pool's actors", ("pool",))
            self.starts = Counter("raygrpo_env_starts_total", "environments started", ("pool",))
            self.losses = Counter("raygrpo_actor_losses_total", "env pool actors lost", ("pool",))
            self.attempts = Counter("raygrpo_rollout_attempts_total", "rollout attempts by status", ("status",))
            self._on = True
        except Exception as exc:  # noqa: BLE001 - metrics are an aid, never a reason to fail a run
            logger.debug("Ray metrics off: %s", exc)

    @property
    def enabled(self) -> bool:
        """Whether metrics are recorded (this process is connected to Ray)."""
        return self._on

    def record_pools(self, snapshots: dict[str, dict[str, Any]], queued: dict[str, int]) -> None:
        if not self._on:
            return
        for pool, snap in snapshots.items():
            tags = {"pool": pool}
            for state in ("actors", "starting", "draining"):
                self.actors.set(snap[state], tags={"pool": pool, "state": "live" if state == "actors" else state})
            self.target.set(snap["target"], tags=tags)
            self.queue.set(queued.get(pool, 0), tags=tags)
            self.live.set(snap["live_envs"], tags=tags)
            opened, lost = snap["envs_opened"], snap["lost"]
            if opened > self._opened.get(pool, 0):
                self.starts.inc(opened - self._opened.get(pool, 0), tags=tags)
                self._opened[pool] = opened
            if lost > self._lost.get(pool, 0):
                self.losses.inc(lost - self._lost.get(pool, 0), tags=tags)
                self._lost[pool] = lost

    def record_attempt(self, status: str) -> None:
        if self._on:
            self.attempts.inc(1, tags={"status": status})


class PoolMetricsLog:
    """The same figures as JSON lines in the run's metrics file, at most one line every `interval_s` seconds:

        {"kind": "pools", "t": 12.5, "queued": 310, "in_flight": 128, "attempts_by_status": {"ok": 40},
         "pools": {"workers": {"actors": 4, "starting": 2, "draining": 0, "target": 6, ...}}}

    Args:
        path: The metrics file (appended to).
        interval_s: Least seconds between two lines (`write(force=True)` writes anyway).
    """

    def __init__(self, path: str | os.PathLike[str], interval_s: float = 5.0) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self._t0 = time.monotonic()
        self._last = -math.inf

    def write(self, snapshot: dict[str, dict[str, Any]], *, queued: int, in_flight: int,
              by_status: dict[str, int], force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval_s:
            return
        self._last = now
        line = {"kind": "pools", "t": round(now - self._t0, 3), "queued": queued, "in_flight": in_flight,
                "attempts_by_status": dict(sorted(by_status.items())), "pools": snapshot}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
