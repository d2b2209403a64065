"""Harbor task sandboxes as raygrpo environments: `HarborProvider`, one per suite per actor, makes the
`HarborAdapter`s (`raygrpo.envs.harbor.adapter`: one episode, one sandbox) and holds what they share.

Built on Harbor's own API: the sandbox is a `BaseEnvironment` made by Harbor's `EnvironmentFactory` (a built-in
`environment_type`, or a class by import path; raygrpo's local bubblewrap sandbox by default), optionally wrapped by
raygrpo's fault injector, and graded by Harbor's `Verifier` (uploads `tests/`, runs `test.sh`, reads
`/logs/verifier/reward.json` or `reward.txt`). Harbor's async clients bind to the loop that creates them, so every
environment is created inside `start`, on the env pool actor's loop; nothing loop-bound is made or pickled earlier.

What an episode's outcomes are (start failures, verifier crashes and timeouts, missing rewards) is said in
`raygrpo.envs.harbor.adapter`; none of them is ever scored 0.0.

Remote sandboxes are leased (`raygrpo.envs.harbor.leases`, `raygrpo.leases.ledger`): for backends other than the
local bubblewrap backend and docker (whose sandboxes have owner-based reapers already, `raygrpo.sandbox.orphans`), an
intent record is written durably right before the create is sent, the sandbox carries the lease's label and a
lifetime derived from the rollout deadline, its id is added once known, and the record goes once the sandbox is
stopped; a failed stop keeps it for `raygrpo reap`.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raygrpo.envs.base import EnvError
from raygrpo.envs.harbor.adapter import HarborAdapter, HarborStartError, HarborVerifierError, HarborVerifierTimeout
from raygrpo.envs.harbor.docker import DockerSupport
from raygrpo.envs.harbor.leases import HarborLeases
from raygrpo.envs.harbor.network import is_network_refusal, task_network_policies
from raygrpo.envs.harbor.starts import SandboxStarts
from raygrpo.envs.harbor.tasks import discover_task_dirs, load_environment_class, load_task
from raygrpo.envs.harbor.trial import keep_fresh
from raygrpo.envs.harbor.verify import probe_tooling
from raygrpo.envs.harbor.warm import WarmPool
from raygrpo.envs.harbor.harness import load_harness
from raygrpo.envs.live import LiveAdapters
from raygrpo.core.errors import TaskError
from raygrpo.governor import BackoffSettings
from raygrpo.core.imports import is_file_spec, split_spec
from raygrpo.governor.client import GovernorClientFactory
from raygrpo.governor.gate import ProvisioningGate, gate_for
from raygrpo.envs.harbor.faults import wrap_environment
from raygrpo.sandbox.toolbox import ToolboxError, ensure_toolbox
from raygrpo.specs.harbor import HarborSpec
from raygrpo.specs.provider import ProviderSpec
from raygrpo.core.types import TaskRef

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

__all__ = ["HarborAdapter", "HarborProvider", "HarborStartError", "HarborVerifierError", "HarborVerifierTimeout"]

logger = logging.getLogger(__name__)


class HarborProvider:
    """Starts sandboxes for one Harbor suite on one event loop (the env pool actor's).

    Holds the harness class, a cache of parsed tasks, the provisioning gate (per-actor start concurrency and the
    cluster-wide create-rate limit, made lazily inside the loop) and the set of live adapters, so that `aclose()`
    can stop every sandbox still alive (shutdown, cancellation, Ctrl-C).

    Args:
        spec: The suite's spec (validated: absolute paths).
        name: The environment's name in the run config, for error messages and sandbox labels.
        limits: Its provider's limits (the run config's `providers.<spec.provider_key>`); None: no limits.
        governors: Makes the client of the provider's cluster-wide governor (the env pool actor passes
            `RayGovernorClient`); None enforces the limits within this process only.
        rollout_timeout_s: The run's `rollout.rollout_timeout_s`, part of the lifetime a leased sandbox gets at its
            provider (`raygrpo.envs.harbor.leases`); None assumes the default.
    """

    def __init__(self, spec: HarborSpec, *, name: str | None = None, limits: ProviderSpec | None = None,
                 governors: GovernorClientFactory | None = None, rollout_timeout_s: float | None = None) -> None:
        # Harbor's modules take a moment to import: pay for it when the actor starts, not in the first rollout.
        import harbor.environments.factory  # noqa: F401
        import harbor.verifier.factory  # noqa: F401

        self.spec = spec
        self.name = name
        self.limits = limits or ProviderSpec()
        self.governors = governors
        self.rollout_timeout_s = rollout_timeout_s
        self.harness_cls = load_harness(spec.harness)
        self._environment_import_path = _harbor_import_path(spec.environment_import_path)
        #: The lease ledger around this suite's sandboxes (a no-op for local and docker sandboxes).
        self.leases = HarborLeases(spec, self.label, self._environment_import_path, rollout_timeout_s)
        self._tasks: dict[str, Task] = {}
        self._tooling: dict[str, list[str]] = {}
        self._task_dirs: list[str] | None = None
        #: The episodes (adapters) not closed yet.
        self.episodes = LiveAdapters(self.label)
        self._closed = False
        #: raygrpo's additions to Harbor's docker backend (labels, an init, image reuse, build failures).
        self.docker = DockerSupport(self.label) if spec.environment_type == "docker" else None
        #: Every sandbox of the suite on this actor not closed yet: adapters', the warm pool's, hedges' losers.
        self.sandboxes = LiveAdapters(self.label)
        #: Starts sandboxes (hedged where the spec says), and measures them.
        self.starts = SandboxStarts(self, spec.hedge)
        #: Sandboxes started ahead for the tasks that come next (None without `warm_pool`).
        self.warm = WarmPool(self, self.starts, spec.warm_pool) if spec.warm_pool is not None else None
        if spec.backend == "local" and spec.environment_kwargs.get("toolbox", True):
            # Built once per machine; here, when the actor starts, rather than on the event loop of a first rollout.
            with contextlib.suppress(ToolboxError):  # then each start fails saying why (an env_error)
                ensure_toolbox()

    def __getstate__(self) -> dict[str, Any]:
        # Sandboxes, gates and adapters are loop-bound: a pickled provider carries only its configuration.
        return {"spec": self.spec, "name": self.name, "limits": self.limits, "governors": self.governors,
                "rollout_timeout_s": self.rollout_timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"], name=state["name"], limits=state["limits"], governors=state["governors"],
                      rollout_timeout_s=state.get("rollout_timeout_s"))

    # ── EnvProvider ──────────────────────────────────────────────────────────────────────────────────────────────

    def adapter(self) -> HarborAdapter:
        """A new, unstarted adapter (one episode, one sandbox)."""
        if self._closed:
            raise EnvError(f"{self.label}: the Harbor provider is closed")
        return HarborAdapter(self)

    def expect(self, tasks: list[TaskRef]) -> None:
        """Rollouts of these tasks come to this actor next: the warm pool starts sandboxes for them (nothing
        without a warm pool)."""
        if self.warm is not None and not self._closed:
            self.warm.expect([self.task_dir_of(t) for t in tasks])

    def stats(self) -> dict[str, Any]:
        """Its starts (hedges included) and its warm pool's figures."""
        out: dict[str, Any] = {"starts": self.starts.stats(), "open_sandboxes": self.sandboxes.open_count()}
        if self.warm is not None:
            out["warm_pool"] = self.warm.stats()
        return out

    async def aclose(self) -> None:
        """Stop every sandbox still alive (adapters', the warm pool's, hedges' losers) and wait for background stops
        of cancelled rollouts. Never raises; idempotent."""
        self._closed = True
        # Stops still running in the background (their rollouts were cancelled) must finish before the actor
        # reports it is shut down, or the sandboxes outlive it.
        await self.episodes.close_all(self.spec.stop_timeout_s + 5, "sandbox(es)")
        if self.warm is not None:
            await self.warm.aclose()
        await self.starts.aclose()
        await self.sandboxes.close_all(self.spec.stop_timeout_s + 5, "sandbox(es)")

    # ── used by adapters ─────────────────────────────────────────────────────────────────────────────────────────

    @property
    def label(self) -> str:
        """How errors name this suite: `envs.<name>.path (<folder>)`."""
        return f"{self.spec.field_path(self.name)} ({self.spec.path})"

    @property
    def live_sandboxes(self) -> int:
        """Sandboxes of this provider whose start began and that are not closed yet (warm ones included)."""
        return self.sandboxes.open_count()

    @property
    def gate(self) -> ProvisioningGate:
        """This actor's provisioning gate of the suite's provider (`raygrpo.governor.gate.gate_for`): start
        concurrency per actor, the provider's cluster-wide create rate and live cap, and the back-off of refused
        creates. Made on first use on the running loop; suites on the same provider share it (gates hold no resources
        to release)."""
        backoff = self.limits.rate_limit_backoff
        return gate_for(
            self.spec.provider_key,
            max_concurrent_starts=self.spec.max_concurrent_starts,
            rate_per_s=self.limits.create_rate_per_s,
            max_live=self.limits.max_live,
            backoff=BackoffSettings(backoff.initial_s, backoff.max_s, backoff.jitter, backoff.give_up_after_s),
            governors=self.governors,
        )

    def task(self, task_dir: str) -> Task:
        """Harbor's parsed task for a task dir (cached: every rollout of a task shares it, read-only)."""
        task = self._tasks.get(task_dir)
        if task is None:
            task = self._tasks[task_dir] = load_task(task_dir)
        return task

    def task_dir_of(self, ref: TaskRef) -> str:
        """The task dir a `TaskRef` points at: its `task_dir` metadata, else its index into the suite."""
        task_dir = ref.metadata.get("task_dir") if ref.metadata else None
        if isinstance(task_dir, str) and task_dir:
            return task_dir
        if self._task_dirs is None:
            self._task_dirs = [str(d) for d in discover_task_dirs(Path(self.spec.path))]
        dirs = self._task_dirs
        if not 0 <= ref.index < len(dirs):
            raise EnvError(f"{self.label}: task index {ref.index} is out of range (the suite has {len(dirs)} tasks)")
        return dirs[ref.index]

    async def create_environment(self, task: Task, trial_paths: TrialPaths, session_id: str) -> BaseEnvironment:
        """Build (not start) the task's sandbox through Harbor's `EnvironmentFactory`, with fault injection when
        the spec configures it (on docker, with raygrpo's compose file and the task's image once it is built; on a
        leased backend, with the lease's label and the sandbox's lifetime, the lease id being `session_id`)."""
        from harbor.environments.factory import EnvironmentFactory
        from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig

        kwargs = dict(self.spec.environment_kwargs)
        task_env_config = task.config.environment.model_copy(deep=True)
        network: dict[str, Any] = {}
        if self.docker is not None:
            task_env_config, kwargs = await self.docker.prepare(task, trial_paths.trial_dir, kwargs, session_id)
        else:
            baseline, phases = task_network_policies(task)
            network = {"network_policy": baseline, "phase_network_policies": phases}
        kwargs = self.leases.backend_kwargs(kwargs, task, session_id)
        config = TrialEnvironmentConfig(
            type=self.spec.environment_type,
            import_path=self._environment_import_path,
            delete=self.spec.stop_delete,
            kwargs=kwargs,
        )
        try:
            env = EnvironmentFactory.create_environment_from_config(
                config=config,
                environment_dir=task.paths.environment_dir,
                environment_name=task.short_name,
                session_id=session_id,
                trial_paths=trial_paths,
                task_env_config=task_env_config,
                logger=logger,
                **network,
            )
        except ValueError as exc:
            if is_network_refusal(exc):
                raise TaskError(f"{self.label} task {task.name}: {exc}") from None
            raise
        if self.spec.faults is not None:
            env = wrap_environment(env, self.spec.faults)
        try:
            mounted = env.capabilities.mounted
        except Exception:  # noqa: BLE001 - a backend that cannot say is taken to mount it
            mounted = True
        if mounted:
            keep_fresh(trial_paths.trial_dir)
        return env

    async def tooling_missing(self, task_dir: str, task: Task, env: BaseEnvironment) -> list[str]:
        """What the task's `test.sh` needs and its sandboxes lack, probed in `env` (a sandbox no model has acted in
        yet) the first time a task starts here; its later sandboxes start from the same image and reuse it."""
        found = self._tooling.get(task_dir)
        if found is None:
            found = self._tooling[task_dir] = await probe_tooling(env, task, offline_tooling=self.spec.offline_tooling)
            if found:
                logger.warning("%s task %s: its verifier needs what its sandbox lacks: %s; rollouts it does not award "
                               "full reward are verifier_error", self.label, task.name, ", ".join(found))
        return found

    def register(self, adapter: HarborAdapter) -> None:
        """Track a starting episode, so that `aclose()` stops its sandbox (refused once the provider is closed)."""
        if self._closed:
            raise EnvError(f"{self.label}: the Harbor provider is closed")
        self.episodes.add(adapter)


def _harbor_import_path(spec: str | None) -> str | None:
    """The `module:Class` path Harbor's factory can import for a backend selector.

    Harbor imports dotted module paths only; a file path (`"dir/file.py:Class"`) is loaded here with raygrpo's
    loader, which registers the module under a stable name in `sys.modules`, and that name is what Harbor gets.
    """
    if spec is None:
        return None
    target, attr = split_spec(spec)
    if not is_file_spec(target):
        return spec
    cls = load_environment_class(spec)
    return f"{cls.__module__}:{attr}"
