"""A pool of concurrent rollouts on one event loop: what an env pool actor runs.

Plain asyncio, no Ray, so it can be tested on its own. It owns one `EnvProvider` per environment (clients are
bound to the loop that first uses them), runs up to `max_concurrent` rollouts at once, counts the environments
alive, and on `aclose` cancels whatever still runs and closes every provider.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from raygrpo.chat import ChatRenderer
from raygrpo.envs.base import EnvProvider
from raygrpo.policy.base import PolicyClient, SamplingParams
from raygrpo.rollout import RolloutConfig, run_rollout
from raygrpo.types import Status, TaskRef, Trajectory

logger = logging.getLogger(__name__)


class RolloutWorker:
    """Runs rollouts of several environments concurrently, bounded by `max_concurrent`.

    Args:
        name: Name shown in trajectories and logs (the actor's name).
        providers: Environment name (as in the run config) to the provider that makes its adapters.
        policy: The policy client every rollout generates with.
        renderer: Chat renderer of the run's tokenizer.
        sampling: Sampling settings.
        rollout: Rollout limits.
        max_concurrent: Most rollouts (hence environments) alive at once in this worker.
    """

    def __init__(
        self,
        name: str,
        providers: dict[str, EnvProvider],
        policy: PolicyClient,
        renderer: ChatRenderer,
        sampling: SamplingParams,
        rollout: RolloutConfig,
        max_concurrent: int,
    ) -> None:
        self.name = name
        self.providers = providers
        self.policy = policy
        self.renderer = renderer
        self.sampling = sampling
        self.rollout = rollout
        self._slots = asyncio.Semaphore(max_concurrent)
        self._tasks: set[asyncio.Task] = set()
        self.live_envs = 0
        self.peak_envs = 0
        self.envs_opened = 0
        self.closed = False

    def _opened(self) -> None:
        self.live_envs += 1
        self.envs_opened += 1
        self.peak_envs = max(self.peak_envs, self.live_envs)

    def _closed(self) -> None:
        self.live_envs -= 1

    async def run(
        self, task: TaskRef, group_id: str = "", attempt: int = 0, sample: int = 0, min_version: int = 0
    ) -> Trajectory:
        """Roll out `task` once (waiting for a free slot first) and return its trajectory.

        `min_version`: generate with policy weights of at least this version (`SamplingParams.min_version`).
        """
        if self.closed:
            raise RuntimeError(f"worker {self.name} is shut down")
        provider = self.providers.get(task.env)
        if provider is None:
            raise KeyError(f"worker {self.name} has no environment named {task.env!r}")
        current = asyncio.current_task()
        if current is not None:
            self._tasks.add(current)
        span: list[float] = [0.0, 0.0]

        def opened() -> None:
            span[0] = time.time()
            self._opened()

        def closed() -> None:
            span[1] = time.time()
            self._closed()

        try:
            async with self._slots:
                traj = await run_rollout(
                    task,
                    provider.adapter(),
                    self.policy,
                    self.renderer,
                    dataclasses.replace(self.sampling, min_version=min_version) if min_version else self.sampling,
                    self.rollout,
                    on_env_open=opened,
                    on_env_close=closed,
                    sample_key=f"{group_id}/{sample}/{attempt}",
                )
        finally:
            if current is not None:
                self._tasks.discard(current)
        traj.group_id, traj.sample, traj.attempt, traj.worker = group_id, sample, attempt, self.name
        traj.env_span = (span[0], span[1]) if span[0] else None
        if traj.status is Status.ENV_ERROR or traj.status is Status.POLICY_ERROR:
            logger.info("%s: %s/%s attempt %d failed: %s", self.name, task.env, task.index, attempt, traj.error)
        return traj

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "live_envs": self.live_envs,
            "peak_envs": self.peak_envs,
            "envs_opened": self.envs_opened,
            "running": len(self._tasks),
        }

    async def aclose(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Cancel running rollouts (each closes its environment on the way out), then close the providers."""
        self.closed = True
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for name, provider in self.providers.items():
            try:
                await asyncio.wait_for(provider.aclose(), timeout=timeout_s)
            except Exception:  # noqa: BLE001
                logger.warning("%s: closing provider %s failed", self.name, name, exc_info=True)
        return self.stats()
