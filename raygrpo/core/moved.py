"""Old module paths, kept working: every module that moved keeps its old dotted name, with a `DeprecationWarning`.

Users' own files import raygrpo (policy scripts, harness classes, warm-up functions, custom backends) and configs name
it in `import_path:` strings (`raygrpo.sandbox.null:NullEnvironment`). When the package took its folders (DESIGN
section 3.1), each moved module's old name went into `MOVED`, and `MovedModuleFinder`, which the root package puts
first on `sys.meta_path`, answers an import of an old name with the module at its new one: the same module object,
so `isinstance` and pickling see one class. Nothing else may go in this table; a new move adds a row.

Two old modules became packages of their own name (`raygrpo.envs.harbor`, `raygrpo.envs.ors`): they are not rows
here, their packages export what the old modules did.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: Old dotted name -> new dotted name.
MOVED: dict[str, str] = {
    "raygrpo._compat": "raygrpo.core.compat",
    "raygrpo.actors.rate_limiter": "raygrpo.governor.actor",
    "raygrpo.aio": "raygrpo.core.aio",
    "raygrpo.chat": "raygrpo.agent.chat",
    "raygrpo.chat_tools": "raygrpo.agent.chat_tools",
    "raygrpo.check": "raygrpo.driver.check",
    "raygrpo.collect": "raygrpo.driver.collect",
    "raygrpo.environ": "raygrpo.core.environ",
    "raygrpo.envs.harbor_adapter": "raygrpo.envs.harbor.adapter",
    "raygrpo.envs.harbor_docker": "raygrpo.envs.harbor.docker",
    "raygrpo.envs.harbor_files": "raygrpo.envs.harbor.files",
    "raygrpo.envs.harbor_leases": "raygrpo.envs.harbor.leases",
    "raygrpo.envs.harbor_network": "raygrpo.envs.harbor.network",
    "raygrpo.envs.harbor_offline": "raygrpo.envs.harbor.offline",
    "raygrpo.envs.harbor_sandbox": "raygrpo.envs.harbor.sandbox",
    "raygrpo.envs.harbor_solution": "raygrpo.envs.harbor.solution",
    "raygrpo.envs.harbor_starts": "raygrpo.envs.harbor.starts",
    "raygrpo.envs.harbor_tasks": "raygrpo.envs.harbor.tasks",
    "raygrpo.envs.harbor_tooling": "raygrpo.envs.harbor.tooling",
    "raygrpo.envs.harbor_trial": "raygrpo.envs.harbor.trial",
    "raygrpo.envs.harbor_verify": "raygrpo.envs.harbor.verify",
    "raygrpo.envs.harbor_warm": "raygrpo.envs.harbor.warm",
    "raygrpo.envs.harness": "raygrpo.envs.harbor.harness",
    "raygrpo.envs.ors_client": "raygrpo.envs.ors.client",
    "raygrpo.envs.ors_listing": "raygrpo.envs.ors.listing",
    "raygrpo.envs.ors_server": "raygrpo.envs.ors.server",
    "raygrpo.envs.ors_tools": "raygrpo.envs.ors.tools",
    "raygrpo.envs.registry": "raygrpo.envs.kinds",
    "raygrpo.envs.rewards": "raygrpo.envs.harbor.rewards",
    "raygrpo.envs.shell_words": "raygrpo.envs.harbor.shell_words",
    "raygrpo.errors": "raygrpo.core.errors",
    "raygrpo.governor.live": "raygrpo.governor.live_cap",
    "raygrpo.governor.schedule": "raygrpo.governor.create_schedule",
    "raygrpo.imports": "raygrpo.core.imports",
    "raygrpo.launch": "raygrpo.driver.launch",
    "raygrpo.orchestrator": "raygrpo.driver.orchestrator",
    "raygrpo.outcome": "raygrpo.core.outcome",
    "raygrpo.placement": "raygrpo.driver.placement",
    "raygrpo.pools": "raygrpo.driver.pools",
    "raygrpo.pools.elastic": "raygrpo.driver.pools.elastic",
    "raygrpo.pools.group": "raygrpo.driver.pools.group",
    "raygrpo.pools.metrics": "raygrpo.driver.pools.ray_metrics",
    "raygrpo.pools.poolset": "raygrpo.driver.pools.poolset",
    "raygrpo.pools.slot": "raygrpo.driver.pools.slot",
    "raygrpo.progress": "raygrpo.driver.progress",
    "raygrpo.provisioning": "raygrpo.governor.gate",
    "raygrpo.resolve": "raygrpo.driver.resolve",
    "raygrpo.rollout": "raygrpo.agent.rollout",
    "raygrpo.runtime": "raygrpo.driver.runtime",
    "raygrpo.sandbox.docker_engine": "raygrpo.docker.engine",
    "raygrpo.sandbox.docker_guard": "raygrpo.docker.guard",
    "raygrpo.sandbox.docker_owner": "raygrpo.docker.owners",
    "raygrpo.sandbox.fake_provider": "raygrpo.testing.fake_provider",
    "raygrpo.sandbox.fake_provider.audit": "raygrpo.testing.fake_provider.audit",
    "raygrpo.sandbox.fake_provider.backend": "raygrpo.testing.fake_provider.backend",
    "raygrpo.sandbox.fake_provider.service": "raygrpo.testing.fake_provider.service",
    "raygrpo.sandbox.fake_provider.state": "raygrpo.testing.fake_provider.state",
    "raygrpo.sandbox.faults": "raygrpo.envs.harbor.faults",
    "raygrpo.sandbox.lease_hooks": "raygrpo.leases.hooks",
    "raygrpo.sandbox.lease_reaper": "raygrpo.leases.reaper",
    "raygrpo.sandbox.ledger": "raygrpo.leases.ledger",
    "raygrpo.sandbox.null": "raygrpo.testing.null",
    "raygrpo.sandbox.reaper": "raygrpo.sandbox.orphans",
    "raygrpo.sandbox.registry": "raygrpo.sandbox.owners",
    "raygrpo.sandbox.wheelhouse": "raygrpo.testing.wheelhouse",
    "raygrpo.scratch": "raygrpo.core.scratch",
    "raygrpo.session": "raygrpo.driver.session",
    "raygrpo.summary": "raygrpo.driver.summary",
    "raygrpo.toolcalls": "raygrpo.agent.toolcalls",
    "raygrpo.types": "raygrpo.core.types",
    "raygrpo.workdir": "raygrpo.core.workdir",
    "raygrpo.worker": "raygrpo.agent.worker",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the module at its new name (imported first, as any import would)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new
        self._real_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{self.old} moved to {self.new}; import it from there", DeprecationWarning, stacklevel=2)
        target = importlib.import_module(self.new)
        self._real_spec = target.__spec__
        return target

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the alias's spec on the module; the module keeps its own.
        module.__spec__ = self._real_spec
        sys.modules[self.old] = module


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old names in `MOVED` (and only those)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new))


def install() -> None:
    """Put the finder first on `sys.meta_path`, once per process."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
