"""The env pool actor: a thin Ray shell that gives a `RolloutWorker` an event loop and a place in the cluster.

Everything loop-bound (the openreward client, the policy's HTTP client) is created inside the actor, on its loop,
on first use; only the `WorkerSettings` are pickled to it. Being an async actor, it runs up to `max_concurrency`
calls at once on one loop; the worker's semaphore bounds the rollouts. It wires the worker to the cluster: sandbox
starts ask their providers' cluster-wide governors (`raygrpo.governor.actor`), and a reaper thread stops
sandboxes on this node whose owner died. Its local sandboxes go to the run's folder under its node's sandbox root,
which it marks as in use while it lives (`raygrpo.sandbox.run_folders`); at start-up a thread reaps the local
sandboxes crashed runs left under its node's root (`raygrpo.sandbox.run_folders.reap_base`; docker ones go with the
reaper thread's passes), so a node that lost a run's actors is cleaned by the next run that uses it. Where its environments lease remote sandboxes (`raygrpo.leases.ledger`), the
actor's process is their owner: its heartbeat starts with the worker's providers and its record goes at shutdown,
once every sandbox is stopped. On a cluster it maps the config's paths into its node's copy of the job's
working_dir (`raygrpo.core.workdir`) and records its node in every trajectory.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

import ray

from raygrpo.actors.heap import freeze_heap
from raygrpo.governor.actor import RayGovernorClient
from raygrpo.core.environ import apply_process_env
from raygrpo.leases.ledger import disown_all
from raygrpo.sandbox.orphans import OrphanReaper
from raygrpo.sandbox.os_probe import ROOT_ENV
from raygrpo.sandbox.owners import RUN_ENV
from raygrpo.sandbox.run_folders import RunFolder, base_root, reap_base
from raygrpo.core.scratch import remove_process_scratch, use_as_tempdir
from raygrpo.core.types import RolloutCall, Status, TaskRef, Trajectory
from raygrpo.core.workdir import relocate
from raygrpo.agent.worker import RolloutWorker, WorkerSettings

logger = logging.getLogger(__name__)


class EnvPool:
    """Hosts a pool of environment adapters and runs rollouts on them (the body of `EnvPoolActor`).

    Args:
        settings: What this actor runs (environments, policy, tokenizer, limits, K).
    """

    def __init__(self, settings: WorkerSettings) -> None:
        apply_process_env()
        # What libraries leave in the temp dir (Harbor's docker compose folders) goes with this process's scratch
        # folder, which the next actor's sweep removes if this one is killed.
        use_as_tempdir()
        self._driver_workdir = settings.workdir
        self.settings = relocate(settings, settings.workdir)
        if self.settings is not settings:
            logger.info("%s: config paths under %s mapped to %s", settings.name, settings.workdir, os.getcwd())
        self.node = ray.util.get_node_ip_address()
        self._worker: RolloutWorker | None = None
        self._lock: asyncio.Lock | None = None
        #: Trajectories of `run_many` calls still running, by (group, sample, attempt): see `finished_in_flight`.
        self._done: dict[tuple[str, int, int], Trajectory] = {}
        self._reaper: OrphanReaper | None = None
        self._startup_thread: threading.Thread | None = None
        self._run_folder = self._enter_run_folder()

    def _enter_run_folder(self) -> RunFolder | None:
        """Mark the run's folder under this node's sandbox root as in use and point this process's sandboxes into
        it (`$RAYGRPO_SANDBOX_ROOT`); start the reap of what crashed runs left under that root, in a thread (the
        actor's start does not wait for it). None outside a run (no `$RAYGRPO_RUN_ID`): the root is used as it is."""
        run = os.environ.get(RUN_ENV)
        if not run:
            return None
        base = str(base_root())
        folder = RunFolder(base, run)
        os.environ[ROOT_ENV] = str(folder.enter())
        self._startup_thread = threading.Thread(target=self._reap_at_start, args=(base,), name="raygrpo-startup-reap",
                                                daemon=True)
        self._startup_thread.start()
        return folder

    @staticmethod
    def _reap_at_start(base: str) -> None:
        """Reap what crashed runs left under `base` (each thing removed is logged as a warning)."""
        try:
            reap_base(base, stale_after_s=60.0)
        except Exception:  # noqa: BLE001 - the actor serves its run whatever earlier runs left
            logger.warning("start-up reap of %s failed", base, exc_info=True)

    async def _ready(self) -> RolloutWorker:
        if self._worker is not None:
            return self._worker
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._worker is None:
                self._worker = await asyncio.to_thread(RolloutWorker.build, self.settings, governors=RayGovernorClient)
                freeze_heap()
                # Sandbox dirs are node-local: each actor looks after the sandboxes of its own node.
                self._reaper = OrphanReaper(interval_s=10.0)
        return self._worker

    async def ready(self) -> str:
        """Build the worker now (tokenizer, policy client, providers) so the first rollout does not pay for it;
        returns the id of the node it runs on (a pool keeps the replacement of a lost actor off that node)."""
        await self._ready()
        return ray.get_runtime_context().get_node_id()

    async def run(
        self, task: TaskRef, group_id: str = "", attempt: int = 0, sample: int = 0, min_version: int = 0,
        policy: str | None = None, seed_key: str = "",
    ) -> Trajectory:
        """One rollout of `task` (see `RolloutWorker.run`; `policy` names a built-in acting policy to use instead of
        the run's, `seed_key` what its sampling seeds derive from)."""
        worker = await self._ready()
        traj = await worker.run(relocate(task, self._driver_workdir), group_id=group_id, attempt=attempt,
                                sample=sample, min_version=min_version, policy=policy, seed_key=seed_key)
        traj.task, traj.node = task, self.node  # the driver's paths, as it sent them
        return traj

    async def run_many(self, calls: list[RolloutCall]) -> list[Trajectory]:
        """Several rollouts in one Ray call (the orchestrator sends a group's rollouts together: one call's cost for
        all of them), run at once; returns their trajectories, in order, once every one has ended. A rollout that
        raised comes back as an `ENV_ERROR` trajectory naming the exception (a cancelled one as `CANCELLED`), so one
        failure does not take the others' results with it."""
        async def one(c: RolloutCall) -> Trajectory:
            traj = await self.run(c.task, c.group_id, c.attempt, c.sample, c.min_version, c.policy, c.seed_key)
            self._done[(c.group_id, c.sample, c.attempt)] = traj
            return traj

        try:
            results = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
        finally:
            for c in calls:
                self._done.pop((c.group_id, c.sample, c.attempt), None)
        return [r if isinstance(r, Trajectory) else self._failed(c, r) for c, r in zip(calls, results)]

    async def finished_in_flight(self) -> list[Trajectory]:
        """The rollouts that `run_many` calls still running have already finished: an interrupted run asks for them
        before it cancels the calls (a call carries a whole group and is cancelled whole), so as not to lose them."""
        return list(self._done.values())

    def _failed(self, call: RolloutCall, exc: BaseException) -> Trajectory:
        if isinstance(exc, asyncio.CancelledError):
            status, error = Status.CANCELLED, "cancelled"
        else:
            logger.warning("%s: rollout of %s/%s raised: %s", self.settings.name, call.task.env, call.task.index, exc)
            status, error = Status.ENV_ERROR, f"{type(exc).__name__}: {exc}"[:500]
        return Trajectory(task=call.task, status=status, error=error, group_id=call.group_id, sample=call.sample,
                          attempt=call.attempt, worker=self.settings.name, node=self.node)

    async def prewarm(self, tasks: list[TaskRef]) -> None:
        """Rollouts of these tasks come to this actor next: warm pools start their sandboxes (`RolloutWorker.prewarm`)."""
        worker = await self._ready()
        worker.prewarm([relocate(t, self._driver_workdir) for t in tasks])

    async def stats(self) -> dict[str, Any]:
        if self._worker is None:
            return {"name": self.settings.name, "live_envs": 0, "peak_envs": 0, "envs_opened": 0, "running": 0}
        return self._worker.stats()

    async def ping(self) -> bool:
        """Answers at once: the driver's probe of whether this actor is still reachable
        (`raygrpo.driver.pools.reachability`)."""
        return True

    async def pid(self) -> int:
        """The actor's process id (for fault-injection tests that kill it)."""
        return os.getpid()

    async def node_ip(self) -> str:
        """The address of the node it runs on."""
        return self.node

    async def shutdown(self) -> dict[str, Any]:
        """Cancel running rollouts, close every environment and provider, remove the actor's scratch folder (the
        kill that follows runs no exit handler), and leave the run's folder (removed when nothing else is in it);
        returns the final stats. A start-up reap still going is given up to 30 s to finish first (the kill would
        leave its claims for the next reaper)."""
        if self._startup_thread is not None:
            await asyncio.to_thread(self._startup_thread.join, 30.0)
        if self._reaper is not None:
            await asyncio.to_thread(self._reaper.close)
        if self._worker is None:
            stats = await self.stats()
        else:
            stats = await self._worker.aclose()
            await asyncio.to_thread(disown_all)
            await asyncio.to_thread(remove_process_scratch)
        if self._run_folder is not None:
            await asyncio.to_thread(self._run_folder.leave)
        return stats


EnvPoolActor = ray.remote(max_restarts=0)(EnvPool)
