"""A pool of concurrent rollouts on one event loop: what an env pool actor runs.

Plain asyncio, no Ray, so it can be tested on its own. It owns one `EnvProvider` per environment (clients are
bound to the loop that first uses them), runs up to `max_concurrent_per_actor` rollouts at once, counts the
environments alive, and on `aclose` cancels whatever still runs and closes every provider. `WorkerSettings` is
everything the driver hands an env pool actor to build one (`RolloutWorker.build`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from raygrpo.agent.chat import ChatRenderer
from raygrpo.agent.chat_template import load_tokenizer
from raygrpo.config.policy import PolicyConfig, SamplingConfig
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.base import EnvProvider
from raygrpo.envs.kinds import kind_of
from raygrpo.policy.acting import ActingPolicy, acting_policy
from raygrpo.policy.base import PolicyClient, SamplingParams
from raygrpo.policy.factory import build_policy_client
from raygrpo.policy.tiny import resolve_model_path
from raygrpo.governor.client import GovernorClientFactory
from raygrpo.governor.gate import gate_stats
from raygrpo.agent.rollout import run_rollout
from raygrpo.core.types import TaskRef, Trajectory

logger = logging.getLogger(__name__)


@dataclass
class WorkerSettings:
    """Everything one env pool actor needs to run a run's rollouts: built by the driver, pickled to the actor.

    Args:
        name: The actor's name, recorded in trajectories and logs.
        envs: Environment specs by name (an `environment` spec already replaced by its served copy).
        policy: Who writes the assistant turns (with the URL filled in when raygrpo serves vLLM).
        model: Model folder of the run's tokenizer, or `"tiny"` (built on the actor's node if missing).
        sampling: Sampling settings.
        rollout: Limits of each rollout.
        max_concurrent_per_actor: Rollouts (hence live environments) at once in this actor (K). The driver sets it
            from the actor's pool, and dispatches to the actor by that same value.
        providers: The limits of the sandbox providers its environments name (the run config's `providers:`).
        engines: Engine actor handles (transformers or vLLM; where `policy.engine_actors`).
        worker_index: This actor's index; actors are spread round-robin over the engines.
        workdir: The driver's working_dir on a cluster: the actor maps config paths under it into its own node's copy
            (`raygrpo.core.workdir`). None for a local run.
    """

    name: str
    envs: dict[str, Any]
    policy: PolicyConfig
    model: str
    sampling: SamplingConfig
    rollout: RolloutConfig
    max_concurrent_per_actor: int
    engines: list[Any] = field(default_factory=list)
    worker_index: int = 0
    workdir: str | None = None
    providers: dict[str, Any] = field(default_factory=dict)


class RolloutWorker:
    """Runs rollouts of several environments concurrently, bounded by `max_concurrent_per_actor`.

    Args:
        name: Name shown in trajectories and logs (the actor's name).
        providers: Environment name (as in the run config) to the provider that makes its adapters.
        policy: The policy client every rollout generates with (or the acting policy of `kind: oracle | noop`).
        renderer: Chat renderer of the run's tokenizer; None when the policy writes no text.
        sampling: Sampling settings.
        rollout: Rollout limits.
        max_concurrent_per_actor: Most rollouts (hence environments) alive at once in this worker (K).
    """

    def __init__(
        self,
        name: str,
        providers: dict[str, EnvProvider],
        policy: PolicyClient | ActingPolicy,
        renderer: ChatRenderer | None,
        sampling: SamplingParams,
        rollout: RolloutConfig,
        max_concurrent_per_actor: int,
    ) -> None:
        self.name = name
        self.providers = providers
        self.policy = policy
        self._acting: dict[str, ActingPolicy] = {}
        self.renderer = renderer
        self.sampling = sampling
        self.rollout = rollout
        self._slots = asyncio.Semaphore(max_concurrent_per_actor)
        self._tasks: set[asyncio.Task] = set()
        self.live_envs = 0
        self.peak_envs = 0
        self.envs_opened = 0
        self.closed = False

    @classmethod
    def build(cls, settings: WorkerSettings, *, governors: GovernorClientFactory | None = None) -> RolloutWorker:
        """A worker for `settings`: loads the tokenizer, builds the policy client and one provider per environment.

        Blocking (the tokenizer loads from disk): actors call it in a thread. Providers make nothing loop-bound
        until their first rollout. A policy that writes no text (`oracle`, `noop`) needs no tokenizer: none is
        loaded.

        Args:
            settings: What the driver says this worker runs.
            governors: Makes the clients of the providers' cluster-wide governors (see `raygrpo.governor.client`).
        """
        tokenizer = None
        if not settings.policy.acts:
            tokenizer = load_tokenizer(resolve_model_path(settings.model))  # without transformers where it can
        policy = build_policy_client(settings.policy, tokenizer, engines=settings.engines,
                                     worker_index=settings.worker_index, model_name=settings.model)
        providers = {name: kind_of(spec).provider(spec, name, providers=settings.providers, governors=governors,
                                                  rollout_timeout_s=settings.rollout.rollout_timeout_s)
                     for name, spec in settings.envs.items()}
        return cls(
            name=settings.name,
            providers=providers,
            policy=policy,
            renderer=(ChatRenderer(tokenizer, settings.rollout.chat_template_kwargs)
                      if tokenizer is not None else None),
            sampling=settings.sampling.to_params(),
            rollout=settings.rollout,
            max_concurrent_per_actor=settings.max_concurrent_per_actor,
        )

    def _opened(self) -> None:
        self.live_envs += 1
        self.envs_opened += 1
        self.peak_envs = max(self.peak_envs, self.live_envs)

    def _closed(self) -> None:
        self.live_envs -= 1

    def acting(self, kind: str) -> ActingPolicy:
        """The built-in acting policy `kind` (`oracle`, `noop`), made on first use."""
        policy = self._acting.get(kind)
        if policy is None:
            policy = self._acting[kind] = acting_policy(kind)
        return policy

    async def run(
        self, task: TaskRef, group_id: str = "", attempt: int = 0, sample: int = 0, min_version: int = 0,
        policy: str | None = None, seed_key: str = "",
    ) -> Trajectory:
        """Roll out `task` once (waiting for a free slot first) and return its trajectory.

        `min_version`: generate with policy weights of at least this version (`SamplingParams.min_version`).
        `policy`: run this rollout with a built-in acting policy (`"oracle"`, `"noop"`) instead of the worker's own
        (how `raygrpo check` runs both on the same actors).
        `seed_key`: names the rollout's group the same in every run of a config (`RolloutRequest.seed_key`); with
        `sampling.seed` set, each turn's seed derives from it, the sample and the attempt (a retry samples anew).
        Empty: the group id, random in a rollout run, so no two runs would sample alike.
        """
        if self.closed:
            raise RuntimeError(f"worker {self.name} is shut down")
        chosen = self.acting(policy) if policy is not None else self.policy
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
                    chosen,
                    self.renderer,
                    dataclasses.replace(self.sampling, min_version=min_version) if min_version else self.sampling,
                    self.rollout,
                    on_env_open=opened,
                    on_env_close=closed,
                    sample_key=f"{seed_key or group_id}/{sample}/{attempt}",
                )
        finally:
            if current is not None:
                self._tasks.discard(current)
        traj.group_id, traj.sample, traj.attempt, traj.worker = group_id, sample, attempt, self.name
        traj.env_span = (span[0], span[1]) if span[0] else None
        if traj.status.is_infra_failure:
            logger.info("%s: %s/%s attempt %d failed: %s", self.name, task.env, task.index, attempt, traj.error)
        return traj

    def prewarm(self, tasks: list[TaskRef]) -> None:
        """Rollouts of these tasks come to this worker next (the driver's queue and schedule say so): providers with
        a warm pool start their sandboxes ahead (`HarborProvider.expect`); the others ignore it."""
        by_env: dict[str, list[TaskRef]] = {}
        for task in tasks:
            by_env.setdefault(task.env, []).append(task)
        for env, env_tasks in by_env.items():
            expect = getattr(self.providers.get(env), "expect", None)
            if expect is not None and not self.closed:
                expect(env_tasks)

    def stats(self) -> dict[str, Any]:
        """Rollouts and environments of this worker now; `open_sandboxes` counts every sandbox its providers hold
        (a warm pool's too), `providers` their own figures (starts, hedges, warm pool)."""
        providers = {name: p.stats() for name, p in self.providers.items() if hasattr(p, "stats")}
        return {
            "name": self.name,
            "live_envs": self.live_envs,
            "peak_envs": self.peak_envs,
            "envs_opened": self.envs_opened,
            "running": len(self._tasks),
            "open_sandboxes": sum(int(p.get("open_sandboxes", 0)) for p in providers.values()),
            "providers": providers,
            "gates": gate_stats(),
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
