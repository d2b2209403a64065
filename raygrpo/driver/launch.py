"""Starting and stopping what a run needs on Ray: embedded ORS servers, policy engines, env pool actors.

`RolloutRuntime` is a context manager: it brings everything up in `__enter__` and, whatever happened (an error,
Ctrl-C), shuts the env pool actors down (which closes every session), then the engines and the servers, in
`__exit__`. The env pool actors are started through the run's pools (`raygrpo.driver.pools`), which size themselves from
the orchestrator's demand; in training the learner owns the pools instead (`own_pools=False`) and gets the spawners. The final actor stats give the leak count. It starts from a resolved run: the config, and the tasks the
driver's resolve step listed (None for an `environment` that is listed once it is served here).
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import ray

from raygrpo.actors.ors_server import start_embedded_server
from raygrpo.actors.policy_engine import start_engines, stop_engines
from raygrpo.governor.actor import ensure_governor, forget_holders
from raygrpo.actors.vllm_server import start_vllm_server, stop_vllm_server
from raygrpo.config import RunConfig
from raygrpo.config.run import pool_bounds
from raygrpo.envs.kinds import kind_of
from raygrpo.driver.placement import actor_resources, autoscaler_capacities, check_fits, check_fits_together
from raygrpo.driver.pools import ActorSpawner, PoolGroup, PoolSet
from raygrpo.driver.node_tasks import on_every_node
from raygrpo.driver.runtime import in_ray_job, ray_info
from raygrpo.leases.reaper import LeaseWatch, reap_stale_leases
from raygrpo.leases.ledger import LEASE_DIR_ENV, LeaseLedger, lease_dir
from raygrpo.sandbox.node_reap import RunLeftovers, run_leftovers_here
from raygrpo.sandbox.orphans import OrphanReaper
from raygrpo.sandbox.owners import ROOT_ENV, RUN_ENV, sandbox_root
from raygrpo.specs import ORSSpec, ProviderSpec
from raygrpo.core.types import TaskRef
from raygrpo.agent.worker import WorkerSettings

logger = logging.getLogger(__name__)


class RolloutRuntime:
    """The Ray side of a run.

    Args:
        cfg: The validated run config.
        tasks_by_env: The environments to serve (`envs`, plus `eval_envs` for training), each with the tasks the
            resolve step listed, or None for an `environment` spec (listed here once its server is up).
        actor_prefix: Prefix of the env pool actors' names (they are named, so a cluster operator can find them).
        own_pools: Start the env pools here (`pools`); False leaves `spawners` for the process that dispatches
            (the learner), which then owns the actors and reports their final stats (`add_final_stats`).
        other_actors: The run's actors started after these (config field to one actor's resources, e.g. the
            learner's), counted when checking that a local Ray holds all of the run's actors at once.
    """

    def __init__(self, cfg: RunConfig, tasks_by_env: dict[str, list[TaskRef] | None],
                 actor_prefix: str = "raygrpo-envpool", own_pools: bool = True,
                 other_actors: dict[str, dict[str, float]] | None = None) -> None:
        unknown = sorted(set(tasks_by_env) - set(cfg.envs) - set(cfg.eval_envs))
        if unknown:
            raise ValueError(f"environments {unknown} are not in the run config")
        self.cfg = cfg
        self.actor_prefix = actor_prefix
        self.envs: dict[str, Any] = {name: {**cfg.envs, **cfg.eval_envs}[name] for name in tasks_by_env}
        self.tasks_by_env: dict[str, list[TaskRef] | None] = dict(tasks_by_env)
        self.servers: dict[str, Any] = {}
        #: The policy settings the actors use: `cfg.policy`, with the URL filled in when raygrpo serves vLLM.
        self.policy = cfg.policy
        self.vllm_server: Any = None
        self.engines: list[Any] = []
        self.own_pools = own_pools
        self.other_actors = dict(other_actors or {})
        #: How each pool's actors are started (what the learner needs to own the pools in training).
        self.spawners: list[ActorSpawner] = []
        #: The run's env pools, when started here: pass to `Orchestrator(pools=...)`.
        self.pools: PoolSet | None = None
        self.final_stats: list[dict[str, Any]] = []
        #: The pools' last snapshot after they closed: actors started, drained and lost per pool.
        self.pool_snapshot: dict[str, Any] = {}
        self.server_live_sessions: dict[str, int] = {}
        #: Labels this run's docker sandboxes; local ones live in a folder of the run on each node
        #: (`raygrpo.sandbox.run_folders`): leak counts see only the run's.
        self.run_id = f"run-{uuid.uuid4().hex[:12]}"
        #: The sandbox root every node uses, when one was set for the whole run (see `run_sandbox_base`); None: each
        #: node its own.
        self.sandbox_base: str | None = None
        #: The run's folder under the root on the driver's node (on a local Ray, the only node).
        self.sandbox_root = str(sandbox_root() / self.run_id)
        #: The lease ledger of remote sandboxes (`raygrpo.leases.ledger`); shared storage on a multi-node cluster.
        self.lease_dir = str(lease_dir())
        self.leaked_sandboxes: int = 0
        #: This run's leases still in the ledger after its end-of-run reap (`_reap_own_leases`).
        self.leaked_leases: int = 0
        #: What of the run each node still had alive after it, by node address (`raygrpo.sandbox.node_reap`).
        self.leftovers_by_node: dict[str, RunLeftovers] = {}
        self._reaper: OrphanReaper | None = None
        self._lease_watch: LeaseWatch | None = None

    @property
    def tasks(self) -> list[TaskRef]:
        """The tasks of the run's `envs` (not of `eval_envs`), in config order."""
        return [t for name in self.cfg.envs if name in self.tasks_by_env for t in self.tasks_by_env[name] or []]

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
        cfg = self.cfg
        info = ray_info()
        for name, spec in self.envs.items():
            if isinstance(spec, ORSSpec) and spec.environment:
                # Actors on other nodes reach it only through the node's own address.
                handle, url = start_embedded_server(spec, name, host="node" if info.joined else "127.0.0.1",
                                                   workdir=info.workdir)
                self.servers[name] = handle
                self.envs[name] = spec.served_at(url)
                logger.info("serving environment %s at %s", name, url)
        for name, tasks in self.tasks_by_env.items():
            if tasks is None:
                self.tasks_by_env[name] = kind_of(self.envs[name]).list_tasks(self.envs[name], name)
        self.start_governors()
        groups = self._pool_groups()
        #: Config field -> (one actor's resources, how many start with the run).
        actors = {g.field: (g.bundle, g.min_actors) for g in groups}
        if cfg.policy.engine_actors:
            actors["policy.engine_resources"] = (actor_resources(
                cfg.policy.engine_num_cpus, 1.0 if cfg.policy.device.startswith("cuda") else 0.0,
                resources=cfg.policy.engine_resources), cfg.policy.num_engines)
        if cfg.policy.kind == "vllm" and cfg.policy.serve is not None:
            serve = cfg.policy.serve
            actors["policy.serve"] = (actor_resources(serve.num_cpus, serve.num_gpus, resources=serve.resources), 1)
            if info.joined and serve.host not in ("0.0.0.0", "::"):
                logger.warning("policy.serve.host=%s: on a cluster only actors on the server's node reach it; set "
                               "0.0.0.0 to serve every node", serve.host)
        actors.update((field, (demand, 1)) for field, demand in self.other_actors.items())
        check_fits({field: demand for field, (demand, _) in actors.items()})
        if not info.joined and not autoscaler_capacities():
            cpus = cfg.ray.num_cpus or "the machine's cores"
            check_fits_together(actors, hint=f"set ray.num_cpus (the CPUs a local Ray advertises, now {cpus}) "
                                             "higher, or lower what the fields named ask for")
        if cfg.policy.kind == "vllm" and cfg.policy.serve is not None:
            self.vllm_server, url = start_vllm_server(cfg.policy.serve, cfg.model)
            name = cfg.policy.served_model_name or cfg.policy.serve.served_model_name or cfg.model
            self.policy = cfg.policy.model_copy(update={"url": url, "serve": None, "served_model_name": name})
            logger.info("vLLM server for %s at %s", cfg.model, url)
        self.engines = start_engines(self.policy, cfg.model, seed=cfg.seed)

        # What crashed runs left at remote providers (leases whose owner is stale), before this run's actors start.
        reap_stale_leases(self.lease_dir)
        self.sandbox_base = run_sandbox_base(info.joined)
        if self.sandbox_base is not None:
            self.sandbox_root = os.path.join(self.sandbox_base, self.run_id)
        self._reaper = OrphanReaper(self.sandbox_root)
        # This run's own: the sandboxes of an actor lost mid-run, stopped, and its live tickets dropped.
        self._lease_watch = LeaseWatch(self.lease_dir, self.run_id, on_holders_gone=forget_holders).start()
        job_env = dict((ray.get_runtime_context().runtime_env or {}).get("env_vars") or {})
        env_vars = {**job_env, RUN_ENV: self.run_id, LEASE_DIR_ENV: self.lease_dir}
        if self.sandbox_base is not None:
            env_vars[ROOT_ENV] = self.sandbox_base
        # Name, environments, K and index are set per actor by its group's spawner.
        template = WorkerSettings(name="", envs={}, policy=self.policy, model=cfg.model, sampling=cfg.sampling,
                                  rollout=cfg.rollout, max_concurrent_per_actor=1, engines=self.engines,
                                  workdir=info.workdir, providers=self.provider_limits())
        base = 0
        for group in groups:
            self.spawners.append(ActorSpawner(group, template, env_vars, index_base=base))
            base += group.max_actors
        if self.own_pools:
            self.pools = PoolSet.from_spawners(self.spawners)
            logger.info("starting %d env pool actor(s)", sum(g.min_actors for g in groups))
            self.pools.start()

    def provider_limits(self) -> dict[str, ProviderSpec]:
        """The `providers:` entries of the environments served here, by provider, as their env kinds name them: one
        entry for every suite on a provider."""
        limits: dict[str, ProviderSpec] = {}
        for spec in self.envs.values():
            found = kind_of(spec).limits(spec, self.cfg.providers)
            if found is not None:
                limits[found[0]] = found[1]
        return limits

    def start_governors(self) -> None:
        """Create the governor of each provider with a create rate or a live cap, once per provider, with the limits
        of its `providers:` entry: here, by the driver, so it outlives any one env pool actor (which would otherwise
        create it on its first start)."""
        for key, limits in self.provider_limits().items():
            if limits.governed:
                ensure_governor(key, limits.create_rate_per_s, max_live=limits.max_live)

    @property
    def actors(self) -> list[tuple[str, Any]]:
        """The live env pool actors of the pools started here, `(name, handle)`."""
        return self.pools.actors if self.pools is not None else []

    def add_final_stats(self, stats: list[dict[str, Any]]) -> None:
        """Final stats of env pool actors owned elsewhere (the learner's pools), for the leak count."""
        self.final_stats.extend(stats)

    def _pool_groups(self) -> list[PoolGroup]:
        """The run's env pool actor groups. Environments without `pool` share the default group (`workers:`); each
        one with `pool` gets a group of its own."""
        workers = self.cfg.workers
        shared = {name: spec for name, spec in self.envs.items() if spec.pool is None}
        groups = []
        if shared:
            low, high = pool_bounds(None, workers.min_env_actors, workers.max_env_actors, workers.num_env_actors)
            groups.append(PoolGroup("workers", self.actor_prefix, shared, workers.max_concurrent_per_actor,
                                    workers.actor_num_cpus, min_actors=low, max_actors=high,
                                    idle_timeout_s=workers.idle_timeout_s,
                                    actor_start_timeout_s=workers.actor_start_timeout_s,
                                    node_cooldown_s=workers.node_cooldown_s, heartbeat_s=workers.heartbeat_s,
                                    unreachable_after_s=workers.unreachable_after_s,
                                    max_live=self._live_cap(shared)))
        for name, spec in self.envs.items():
            pool = spec.pool
            if pool is not None:
                low, high = pool_bounds(pool.num_actors, pool.min_actors, pool.max_actors, workers.num_env_actors)
                groups.append(PoolGroup(
                    f"envs.{name}.pool", f"{self.actor_prefix}-{name}", {name: spec},
                    pool.max_concurrent_per_actor or workers.max_concurrent_per_actor,
                    workers.actor_num_cpus if pool.num_cpus is None else pool.num_cpus,
                    int(pool.memory) if pool.memory else None, pool.resources, min_actors=low, max_actors=high,
                    idle_timeout_s=pool.idle_timeout_s or workers.idle_timeout_s,
                    actor_start_timeout_s=workers.actor_start_timeout_s, node_cooldown_s=workers.node_cooldown_s,
                    heartbeat_s=workers.heartbeat_s, unreachable_after_s=workers.unreachable_after_s,
                    max_live=self._live_cap({name: spec})))
        return groups

    def _live_cap(self, envs: dict[str, Any]) -> int | None:
        """Most sandboxes the providers of `envs` let live at once (each provider's `max_live` once, summed); None
        when one of them has no cap."""
        caps: dict[str, int] = {}
        for spec in envs.values():
            found = kind_of(spec).limits(spec, self.cfg.providers)
            if found is None or found[1].max_live is None:
                return None
            caps[found[0]] = found[1].max_live
        return sum(caps.values()) or None

    def stop(self) -> None:
        """Shut down actors (closing every environment), then engines and embedded servers. Safe to call twice."""
        if self.pools is not None:
            self.final_stats.extend(self.pools.close())
            self.pool_snapshot = self.pools.snapshot()
            self.pools = None
        if self.engines:
            stop_engines(self.engines)
            self.engines = []
        if self.vllm_server is not None:
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
        if self._lease_watch is not None:
            self._lease_watch.close()
            self._lease_watch = None
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
            self.leftovers_by_node = self._leftovers()
            self.leaked_sandboxes = sum(found.count for found in self.leftovers_by_node.values())
            self._reap_own_leases()

    def _reap_own_leases(self) -> None:
        """Reap this run's leases whose owner is gone (an actor lost with its node, a stop that failed), and count
        what is left of them (`leaked_leases`): each may be a sandbox still alive at its provider (the reap could not
        reach it, nor is its lifetime there known to be over), a leak like any other."""
        reap_stale_leases(self.lease_dir, run=self.run_id)
        left = LeaseLedger(self.lease_dir).leases(self.run_id)
        self.leaked_leases = len(left)
        if left:
            logger.warning("%d sandbox(es) of this run may still be alive at their provider (leases kept in %s: %s); "
                           "`raygrpo reap --run %s` tries again", len(left), self.lease_dir,
                           ", ".join(f"{lease.id} ({lease.provider_key})" for lease in left[:10]), self.run_id)

    def _leftovers(self) -> dict[str, RunLeftovers]:
        """What of this run each node still has alive, its orphans reaped first: here on a local Ray (one machine),
        else by a task on every node of the cluster, where the actors' sandboxes ran."""
        if not ray_info().joined:
            found = run_leftovers_here(self.run_id, self.sandbox_base or sandbox_root())
            return {found.node: found}
        out: dict[str, RunLeftovers] = {}
        for answer in on_every_node(run_leftovers_here, self.run_id, self.sandbox_base, timeout_s=60.0):
            if answer.result is not None:
                out[answer.node] = answer.result
        return out

    @property
    def leaked_envs_by_node(self) -> dict[str, int]:
        """Sandboxes of this run still alive after it, by node address (nodes with none left out)."""
        return {node: found.count for node, found in sorted(self.leftovers_by_node.items()) if found.count}

    @property
    def leaked_envs(self) -> int:
        """Environments still alive after shutdown: the largest of the actors' own count (warm sandboxes included),
        the ORS servers' count of live sessions, and the sandboxes of this run still found on the nodes where they
        ran (`leaked_envs_by_node`): local ones through the OS, docker ones (compose projects labelled with the run)
        through docker; plus the remote sandboxes whose leases the end-of-run reap kept (`leaked_leases`)."""
        # An actor's open sandboxes include its rollouts' (live_envs) and those its warm pool still holds.
        actor_live = sum(max(int(s.get("live_envs") or 0), int(s.get("open_sandboxes") or 0))
                         for s in self.final_stats)
        return max(actor_live, sum(self.server_live_sessions.values()), self.leaked_sandboxes + self.leaked_leases)


def run_sandbox_base(joined: bool) -> str | None:
    """The sandbox root for every node of a run, or None for each node's own.

    A local Ray is one machine: the driver's root (`$RAYGRPO_SANDBOX_ROOT`, else the default). On a cluster, a root
    set for the whole run applies everywhere: the job's runtime_env `env_vars`, or the driver's own environment when
    it joined from outside a job; otherwise each node uses the `$RAYGRPO_SANDBOX_ROOT` its `ray start` had, or the
    default (a job's entrypoint inherits the head node's, which is no reason to impose it on the workers).
    """
    if not joined:
        return str(sandbox_root())
    job_env = dict((ray.get_runtime_context().runtime_env or {}).get("env_vars") or {})
    if job_env.get(ROOT_ENV):
        return job_env[ROOT_ENV]
    if not in_ray_job():
        return os.environ.get(ROOT_ENV) or None
    return None
