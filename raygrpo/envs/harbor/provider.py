"""Harbor task sandboxes as raygrpo environments: `HarborProvider`, one per suite per actor, assembles the suite's
parts around what they share (`raygrpo.envs.harbor.context.SuiteContext`) and makes the `HarborAdapter`s
(`raygrpo.envs.harbor.adapter`: one episode, one sandbox).

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
from typing import Any

from raygrpo.core.types import TaskRef
from raygrpo.envs.base import EnvError
from raygrpo.envs.harbor.adapter import Episodes, HarborAdapter, HarborStartError
from raygrpo.envs.harbor.context import SuiteContext, SuiteTasks
from raygrpo.envs.harbor.docker import DockerSupport
from raygrpo.envs.harbor.environment import harbor_import_path
from raygrpo.envs.harbor.grading import HarborVerifierError, HarborVerifierTimeout
from raygrpo.envs.harbor.harness import load_harness
from raygrpo.envs.harbor.leases import HarborLeases
from raygrpo.envs.harbor.starts import SandboxStarts
from raygrpo.envs.harbor.warm import WarmPool
from raygrpo.envs.live import LiveAdapters
from raygrpo.governor.client import GovernorClientFactory
from raygrpo.governor.gate import ProvisioningGate
from raygrpo.sandbox.toolbox import ToolboxError, ensure_toolbox
from raygrpo.specs.harbor import HarborSpec
from raygrpo.specs.provider import ProviderSpec

__all__ = ["HarborAdapter", "HarborProvider", "HarborStartError", "HarborVerifierError", "HarborVerifierTimeout"]


class HarborProvider:
    """Starts sandboxes for one Harbor suite on one event loop (the env pool actor's).

    Assembles the suite's parts: its context (spec, label, lease ledger, docker support, task cache, the sandboxes
    not closed yet, and the provisioning gate: per-actor start concurrency and the cluster-wide create-rate limit,
    made lazily inside the loop), its starts, its warm pool and its episodes, so that `aclose()` can stop every
    sandbox still alive (shutdown, cancellation, Ctrl-C).

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
        label = f"{spec.field_path(name)} ({spec.path})"
        import_path = harbor_import_path(spec.environment_import_path)
        #: What the suite's parts share: spec, label, gate, leases, docker support, tasks, open sandboxes.
        self.context = SuiteContext(
            spec=spec,
            label=label,
            # The lease ledger around this suite's sandboxes (a no-op for local and docker sandboxes).
            leases=HarborLeases(spec, label, import_path, rollout_timeout_s),
            docker=DockerSupport(label) if spec.environment_type == "docker" else None,
            tasks=SuiteTasks(spec, label),
            sandboxes=LiveAdapters(label),
            import_path=import_path,
            limits=self.limits,
            governors=governors,
        )
        #: The episodes (adapters) not closed yet.
        self.episodes = Episodes(label)
        #: Starts sandboxes (hedged where the spec says), and measures them.
        self.starts = SandboxStarts(self.context, spec.hedge)
        #: Sandboxes started ahead for the tasks that come next (None without `warm_pool`).
        self.warm = WarmPool(self.context, self.starts, spec.warm_pool) if spec.warm_pool is not None else None
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
        if self.episodes.refusing:
            raise EnvError(f"{self.label}: the Harbor provider is closed")
        return HarborAdapter(self.context, harness_cls=self.harness_cls, starts=self.starts, warm=self.warm,
                             episodes=self.episodes)

    def expect(self, tasks: list[TaskRef]) -> None:
        """Rollouts of these tasks come to this actor next: the warm pool starts sandboxes for them (nothing
        without a warm pool)."""
        if self.warm is not None and not self.episodes.refusing:
            self.warm.expect([self.task_dir_of(t) for t in tasks])

    def stats(self) -> dict[str, Any]:
        """Its starts (hedges included) and its warm pool's figures."""
        out: dict[str, Any] = {"starts": self.starts.stats(), "open_sandboxes": self.live_sandboxes}
        if self.warm is not None:
            out["warm_pool"] = self.warm.stats()
        return out

    async def aclose(self) -> None:
        """Stop every sandbox still alive (adapters', the warm pool's, hedges' losers) and wait for background stops
        of cancelled rollouts. Never raises; idempotent."""
        # Stops still running in the background (their rollouts were cancelled) must finish before the actor
        # reports it is shut down, or the sandboxes outlive it.
        await self.episodes.close(self.spec.stop_timeout_s + 5)
        if self.warm is not None:
            await self.warm.aclose()
        await self.starts.aclose()
        await self.context.sandboxes.close_all(self.spec.stop_timeout_s + 5, "sandbox(es)")

    # ── what callers look at ─────────────────────────────────────────────────────────────────────────────────────

    @property
    def label(self) -> str:
        """How errors name this suite: `envs.<name>.path (<folder>)`."""
        return self.context.label

    @property
    def live_sandboxes(self) -> int:
        """Sandboxes of this provider whose start began and that are not closed yet (warm ones included)."""
        return self.context.sandboxes.open_count()

    @property
    def gate(self) -> ProvisioningGate:
        """This actor's provisioning gate of the suite's provider (see `SuiteContext.gate`)."""
        return self.context.gate

    def task_dir_of(self, ref: TaskRef) -> str:
        """The task dir a `TaskRef` points at: its `task_dir` metadata, else its index into the suite."""
        return self.context.tasks.task_dir_of(ref)
