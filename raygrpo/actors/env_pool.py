"""The env pool actor: a thin Ray shell that gives a `RolloutWorker` an event loop and a place in the cluster.

Everything loop-bound (the openreward client, the policy's HTTP client) is created inside the actor, on its loop,
on first use; only plain specs and configs are pickled to it. Being an async actor, it runs up to
`max_concurrency` calls at once on one loop; the worker's semaphore bounds the rollouts.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import ray

from raygrpo.types import TaskRef, Trajectory

logger = logging.getLogger(__name__)


class EnvPool:
    """Hosts a pool of environment adapters and runs rollouts on them (the body of `EnvPoolActor`).

    Args:
        name: The actor's name, recorded in trajectories.
        envs: Environment specs by name (each has a `provider()` that builds its adapter factory on this loop).
        policy: The run's `PolicyConfig`.
        model_path: Folder of the tokenizer (and model) the run uses, or `"tiny"`.
        sampling: The run's `SamplingConfig`.
        rollout: The run's `RolloutConfig`.
        max_concurrent: Rollouts at once in this actor (K).
        engines: Policy engine actor handles, for the transformers engine.
        worker_index: This actor's index, used to spread actors over engines.
        base_dir: Folder that relative script paths resolve against.
    """

    def __init__(
        self,
        name: str,
        envs: dict[str, Any],
        policy: Any,
        model_path: str,
        sampling: Any,
        rollout: Any,
        max_concurrent: int,
        engines: list[Any] | None = None,
        worker_index: int = 0,
        base_dir: str | None = None,
    ) -> None:
        from raygrpo.runtime import apply_process_env

        apply_process_env()
        self._args = dict(
            name=name, envs=envs, policy=policy, model_path=model_path, sampling=sampling, rollout=rollout,
            max_concurrent=max_concurrent, engines=engines or [], worker_index=worker_index, base_dir=base_dir,
        )
        self._worker = None
        self._lock: asyncio.Lock | None = None
        self._reaper: asyncio.Task | None = None

    async def _ready(self):
        if self._worker is not None:
            return self._worker
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._worker is None:
                self._worker = await asyncio.to_thread(self._build)
                self._reaper = asyncio.get_running_loop().create_task(_reap_periodically())
        return self._worker

    def _build(self):
        from transformers import AutoTokenizer

        from raygrpo.chat import ChatRenderer
        from raygrpo.policy.factory import build_policy_client
        from raygrpo.policy.tiny import resolve_model_path
        from raygrpo.worker import RolloutWorker

        a = self._args
        # Resolved here, on the actor's node: "tiny" is built into this node's cache if it is not there yet.
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(a["model_path"]))
        policy = build_policy_client(
            a["policy"], tokenizer, engines=a["engines"], worker_index=a["worker_index"], base_dir=a["base_dir"],
            model_name=a["model_path"],
        )
        providers = {name: spec.provider(name=name) for name, spec in a["envs"].items()}
        return RolloutWorker(
            name=a["name"],
            providers=providers,
            policy=policy,
            renderer=ChatRenderer(tokenizer),
            sampling=a["sampling"].to_params(),
            rollout=a["rollout"],
            max_concurrent=a["max_concurrent"],
        )

    async def ready(self) -> str:
        """Build the worker now (tokenizer, policy client, providers) so the first rollout does not pay for it."""
        await self._ready()
        return self._args["name"]

    async def run(
        self, task: TaskRef, group_id: str = "", attempt: int = 0, sample: int = 0, min_version: int = 0
    ) -> Trajectory:
        worker = await self._ready()
        return await worker.run(task, group_id=group_id, attempt=attempt, sample=sample, min_version=min_version)

    async def stats(self) -> dict[str, Any]:
        if self._worker is None:
            return {"name": self._args["name"], "live_envs": 0, "peak_envs": 0, "envs_opened": 0, "running": 0}
        return self._worker.stats()

    async def pid(self) -> int:
        """The actor's process id (for fault-injection tests that kill it)."""
        return os.getpid()

    async def shutdown(self) -> dict[str, Any]:
        """Cancel running rollouts, close every environment and provider; returns the final stats."""
        if self._reaper is not None:
            self._reaper.cancel()
        if self._worker is None:
            return await self.stats()
        return await self._worker.aclose()


async def _reap_periodically(interval_s: float = 10.0) -> None:
    """Stop local sandboxes on this node whose owner died (another env pool actor, say); sandbox dirs are node-local,
    so each actor looks after its own node."""
    from raygrpo.sandbox.registry import reap_orphans, sandbox_root

    while True:
        await asyncio.sleep(interval_s)
        if sandbox_root().is_dir():
            try:
                await asyncio.to_thread(reap_orphans)
            except Exception:  # noqa: BLE001 - reaping must not take the actor down
                logger.warning("reaping orphaned sandboxes failed", exc_info=True)


EnvPoolActor = ray.remote(max_restarts=0)(EnvPool)
