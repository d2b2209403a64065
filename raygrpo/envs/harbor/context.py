"""What the parts of one Harbor suite on one env pool actor share: `SuiteContext`, and its task cache `SuiteTasks`.

`HarborProvider` (`raygrpo.envs.harbor.provider`) makes one context per suite and hands it to the parts it
assembles: the sandboxes (`raygrpo.envs.harbor.sandbox`), their starts (`raygrpo.envs.harbor.starts`), the warm
pool (`raygrpo.envs.harbor.warm`) and the episodes (`raygrpo.envs.harbor.adapter`). The context is frozen and holds
no part: a part gets the others it works with as arguments, so none of them reaches back into the provider.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from raygrpo.envs.base import EnvError
from raygrpo.envs.harbor.tasks import discover_task_dirs, load_task
from raygrpo.envs.harbor.verify import probe_tooling
from raygrpo.envs.live import LiveAdapters
from raygrpo.governor import BackoffSettings
from raygrpo.governor.client import GovernorClientFactory
from raygrpo.governor.gate import ProvisioningGate, gate_for
from raygrpo.specs.harbor import HarborSpec
from raygrpo.specs.provider import ProviderSpec

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.task import Task

    from raygrpo.core.types import TaskRef
    from raygrpo.envs.harbor.docker import DockerSupport
    from raygrpo.envs.harbor.leases import HarborLeases

logger = logging.getLogger(__name__)


class SuiteTasks:
    """The suite's tasks as this actor knows them: Harbor's parsed tasks, the suite's task dirs, and what each
    task's verifier needs that its sandboxes lack. All cached: every rollout of a task shares them, read-only.

    Args:
        spec: The suite's spec (its folder, `offline_tooling`).
        label: How errors and logs name the suite.
    """

    def __init__(self, spec: HarborSpec, label: str) -> None:
        self.spec = spec
        self.label = label
        self._tasks: dict[str, Task] = {}
        self._tooling: dict[str, dict[str, list[str]]] = {}
        self._task_dirs: list[str] | None = None

    def task(self, task_dir: str) -> Task:
        """Harbor's parsed task for a task dir."""
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

    async def tooling_missing(self, task_dir: str, task: Task, env: BaseEnvironment) -> dict[str, list[str]]:
        """What the task's `test.sh` needs and its sandboxes lack, by step name (`""` for a task without steps; each
        step's own `test.sh`, else the shared one), probed in `env` (a sandbox no model has acted in yet) the first
        time a task starts here; its later sandboxes start from the same image and reuse it."""
        found = self._tooling.get(task_dir)
        if found is None:
            found = {}
            for step in task.config.steps or [None]:
                name = step.name if step is not None else ""
                found[name] = await probe_tooling(env, task, offline_tooling=self.spec.offline_tooling, step=step)
                if found[name]:
                    where = f" step {name!r}" if name else ""
                    logger.warning("%s task %s%s: its verifier needs what its sandbox lacks: %s; a rollout it does "
                                   "not award full reward is verifier_error when the verifier also lacked it while "
                                   "it ran (a command its shell did not find, a package still missing after it), "
                                   "else its verdict stands", self.label, task.name, where, ", ".join(found[name]))
            self._tooling[task_dir] = found
        return found


@dataclass(frozen=True)
class SuiteContext:
    """One suite on one actor, as its sandboxes, starts, warm pool and episodes see it.

    Args:
        spec: The suite's spec (validated: absolute paths).
        label: How errors and logs name the suite: `envs.<name>.path (<folder>)`.
        leases: The lease ledger around the suite's sandboxes (a no-op for local and docker sandboxes).
        docker: raygrpo's additions to Harbor's docker backend (labels, an init, image reuse, build failures); None
            on other backends.
        tasks: The suite's parsed tasks and task dirs.
        sandboxes: Every sandbox of the suite on this actor not closed yet: episodes', the warm pool's, hedges'
            losers; the provider's `aclose` stops what is left.
        import_path: The backend's `module:Class` as Harbor's factory imports it; None for a built-in
            `environment_type`.
        limits: The suite's provider's limits (the run config's `providers.<spec.provider_key>`).
        governors: Makes the client of the provider's cluster-wide governor (the env pool actor passes
            `RayGovernorClient`); None enforces the limits within this process only.
    """

    spec: HarborSpec
    label: str
    leases: HarborLeases
    docker: DockerSupport | None
    tasks: SuiteTasks
    sandboxes: LiveAdapters = field(repr=False)
    import_path: str | None = None
    limits: ProviderSpec = field(default_factory=ProviderSpec)
    governors: GovernorClientFactory | None = None

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
