"""Starting and stopping what a run needs on Ray: embedded ORS servers, policy engines, env pool actors.

`RolloutRuntime` is a context manager: it brings everything up in `__enter__` and, whatever happened (an error,
Ctrl-C), shuts the env pool actors down (which closes every session), then the engines and the servers, in
`__exit__`. The final actor stats give the leak count.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from typing import Any

import ray

from raygrpo.config import RunConfig
from raygrpo.types import TaskRef

logger = logging.getLogger(__name__)


class RolloutRuntime:
    """The Ray side of a run.

    Args:
        cfg: The validated run config.
        actor_prefix: Prefix of the env pool actors' names (they are named, so a cluster operator can find them).
        include_eval: Also serve the config's `eval_envs` (for training); `tasks` then lists only `envs`' tasks.
    """

    def __init__(self, cfg: RunConfig, actor_prefix: str = "raygrpo-envpool", include_eval: bool = False) -> None:
        self.cfg = cfg
        self.actor_prefix = actor_prefix
        self.envs: dict[str, Any] = {**cfg.envs, **(cfg.eval_envs if include_eval else {})}
        self.servers: dict[str, Any] = {}
        #: The policy settings the actors use: `cfg.policy`, with the URL filled in when raygrpo serves vLLM.
        self.policy = cfg.policy
        self.vllm_server: Any = None
        self.engines: list[Any] = []
        self.actors: list[tuple[str, Any]] = []
        self.model_path: str = ""
        self.tasks: list[TaskRef] = []
        self.tasks_by_env: dict[str, list[TaskRef]] = {}
        self.final_stats: list[dict[str, Any]] = []
        self.server_live_sessions: dict[str, int] = {}
        # Sandboxes of this run (local backend) live under their own root: leak counts and the reaper see only them.
        self.sandbox_root = str(_base_sandbox_root() / f"run-{uuid.uuid4().hex[:12]}")
        self.leaked_sandboxes: int = 0
        self._reaper: _Reaper | None = None

    def __enter__(self) -> RolloutRuntime:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _start(self) -> None:
        from raygrpo.actors.env_pool import EnvPoolActor
        from raygrpo.actors.ors_server import start_embedded_server
        from raygrpo.actors.rate_limiter import ensure_rate_limiter
        from raygrpo.policy.factory import start_engines
        from raygrpo.policy.tiny import resolve_model_path
        from raygrpo.sandbox.registry import ROOT_ENV
        from raygrpo.specs.ors import ORSSpec

        cfg = self.cfg
        for name, spec in self.envs.items():
            if isinstance(spec, ORSSpec) and spec.environment:
                handle, url = start_embedded_server(spec, name, base_dir=cfg.base_dir)
                self.servers[name] = handle
                self.envs[name] = spec.served_at(url)
                logger.info("serving environment %s at %s", name, url)
        # Listing the tasks first makes an unreachable server fail the run before any actor starts.
        self.tasks_by_env = {name: spec.list_tasks(name) for name, spec in self.envs.items()}
        self.tasks = [t for name in cfg.envs for t in self.tasks_by_env[name]]
        for name, spec in self.envs.items():
            rate = getattr(spec, "create_rate_per_s", None)
            if rate:
                # Created here, by the driver, so the limiter outlives any one env pool actor.
                ensure_rate_limiter(spec.effective_rate_limit_key, rate)
        # Checked (and "tiny" built) here so a bad path fails before any actor starts; actors and engines resolve
        # `cfg.model` again on their own nodes, where a driver-local cache path might not exist.
        resolve_model_path(cfg.model)
        self.model_path = cfg.model
        if cfg.policy.kind == "vllm" and cfg.policy.serve is not None:
            from raygrpo.actors.vllm_server import start_vllm_server

            self.vllm_server, url = start_vllm_server(cfg.policy.serve, self.model_path)
            name = cfg.policy.served_model_name or cfg.policy.serve.served_model_name or self.model_path
            self.policy = cfg.policy.model_copy(update={"url": url, "serve": None, "served_model_name": name})
            logger.info("vLLM server for %s at %s", self.model_path, url)
        self.engines = start_engines(self.policy, self.model_path)

        self._reaper = _Reaper(self.sandbox_root)
        k = cfg.workers.max_concurrent_per_actor
        job_env = dict((ray.get_runtime_context().runtime_env or {}).get("env_vars") or {})
        for i in range(cfg.workers.num_env_actors):
            name = f"{self.actor_prefix}-{i}"
            handle = EnvPoolActor.options(
                name=name,
                num_cpus=cfg.workers.actor_num_cpus,
                max_concurrency=k + 16,
                runtime_env={"env_vars": {**job_env, ROOT_ENV: self.sandbox_root}},
            ).remote(
                name=name,
                envs=self.envs,
                policy=self.policy,
                model_path=self.model_path,
                sampling=cfg.sampling,
                rollout=cfg.rollout,
                max_concurrent=k,
                engines=self.engines,
                worker_index=i,
                base_dir=cfg.base_dir,
            )
            self.actors.append((name, handle))
        ray.get([h.ready.remote() for _, h in self.actors])

    def stop(self) -> None:
        """Shut down actors (closing every environment), then engines and embedded servers. Safe to call twice."""
        from raygrpo.policy.factory import stop_engines

        if self.actors:
            refs = [h.shutdown.remote() for _, h in self.actors]
            stats = []
            for (name, handle), ref in zip(self.actors, refs):
                try:
                    stats.append(ray.get(ref, timeout=60))
                except Exception as exc:  # noqa: BLE001
                    logger.warning("env pool actor %s did not shut down cleanly: %s", name, exc)
                    stats.append({"name": name, "live_envs": None})
                ray.kill(handle, no_restart=True)
            self.final_stats = stats
            self.actors = []
        if self.engines:
            stop_engines(self.engines)
            self.engines = []
        if self.vllm_server is not None:
            from raygrpo.actors.vllm_server import stop_vllm_server

            stop_vllm_server(self.vllm_server, timeout_s=60)
            self.vllm_server = None
        for name, handle in self.servers.items():
            try:
                self.server_live_sessions[name] = ray.get(handle.live_sessions.remote(), timeout=30)
                ray.get(handle.stop.remote(), timeout=30)
            except Exception as exc:  # noqa: BLE001
                logger.warning("embedded server %s did not stop cleanly: %s", name, exc)
            ray.kill(handle, no_restart=True)
        self.servers = {}
        if self._reaper is not None:
            self.leaked_sandboxes = self._reaper.close()
            self._reaper = None

    @property
    def leaked_envs(self) -> int:
        """Environments still alive after shutdown: the largest of the actors' own count, the ORS servers' count of
        live sessions, and the local sandboxes of this run still found on this machine (checked through the OS)."""
        actor_live = sum(int(s.get("live_envs") or 0) for s in self.final_stats)
        return max(actor_live, sum(self.server_live_sessions.values()), self.leaked_sandboxes)


def _base_sandbox_root():
    from raygrpo.sandbox.registry import sandbox_root

    return sandbox_root()


class _Reaper:
    """Stops orphaned local sandboxes of this run (their env pool actor died) every `interval_s`, on the driver.

    Env pool actors reap their own node too (sandbox dirs are node-local); this covers the driver's node when an
    actor there died. `close()` reaps once more and returns how many of the run's sandboxes are still alive.
    """

    def __init__(self, root: str, interval_s: float = 5.0) -> None:
        self.root = root
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="raygrpo-reaper", daemon=True)
        self._thread.start()

    def _loop(self, interval_s: float) -> None:
        from raygrpo.sandbox.registry import reap_orphans

        while not self._stop.wait(interval_s):
            if os.path.isdir(self.root):
                try:
                    reaped = reap_orphans(self.root)
                    if reaped:
                        logger.warning("reaped %d orphaned sandbox(es): %s", len(reaped), ", ".join(reaped))
                except Exception:  # noqa: BLE001 - the reaper must keep going
                    logger.warning("reaping orphaned sandboxes failed", exc_info=True)

    def close(self) -> int:
        from raygrpo.sandbox.registry import live_sandboxes, reap_orphans

        self._stop.set()
        self._thread.join(timeout=30)
        if not os.path.isdir(self.root):
            return 0
        reap_orphans(self.root)
        left = len(live_sandboxes(self.root))
        if left == 0:
            try:
                os.rmdir(self.root)
            except OSError:
                pass
        return left
