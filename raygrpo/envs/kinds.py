"""Spec kind -> how raygrpo resolves, lists and runs that kind of environment (as Harbor's `EnvironmentFactory`
maps an environment type to a backend class).

Each kind answers these questions about its specs:

- `resolve(spec, name, refused=None)`, on the driver before Ray starts: does what the spec names exist and load
  (task folders, harness and backend classes, environment classes, a server that answers)? It fails with a
  `ResolveError` naming the config field, and returns the spec's tasks when it could list them already (None when
  they can only be listed later: an `environment` is served on Ray first). Tasks that cannot be loaded or run fail
  it all at once, each named; given a `refused` list, they are added to it instead (`raygrpo check` judges them);
- `list_tasks(spec, name)`, on the driver: the tasks the spec selects;
- `limits(spec, providers)`, on the driver and in the actors: the sandbox provider the spec's sandboxes count against
  and its entry of the run config's `providers:` (None: no limits), which the driver hands to the provider's governor;
- `warm_depth(spec)`, on the driver: the most sandboxes an actor keeps warm for the spec (0: none), which sizes the
  orchestrator's hints of what comes next;
- `provider(spec, name, providers=..., governors=..., rollout_timeout_s=...)`, inside an env pool actor: the
  `EnvProvider` that makes its adapters (told its provider's limits, how to reach their governor, and the run's
  rollout deadline, which bounds a leased sandbox's lifetime).

A kind imports its own modules (and so openreward or harbor) when it is first asked something, so that a process
pays only for the kinds its run uses: an env pool actor of ORS environments never imports Harbor, nor one of Harbor
suites the openreward SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from raygrpo.core.errors import ResolveError
from raygrpo.envs.base import EnvProvider
from raygrpo.governor.client import GovernorClientFactory
from raygrpo.specs import HarborSpec, ORSSpec, ProviderSpec
from raygrpo.core.types import TaskRef

if TYPE_CHECKING:
    from raygrpo.envs.harbor.refusals import Refusal


class EnvKind(Protocol):
    """How raygrpo handles one kind of environment spec (see the module docstring)."""

    def resolve(self, spec: Any, name: str, refused: list[Refusal] | None = None) -> list[TaskRef] | None: ...

    def list_tasks(self, spec: Any, name: str) -> list[TaskRef]: ...

    def limits(self, spec: Any, providers: Mapping[str, ProviderSpec]) -> tuple[str, ProviderSpec] | None: ...

    def warm_depth(self, spec: Any) -> int: ...

    def provider(self, spec: Any, name: str, *, providers: Mapping[str, ProviderSpec] | None = None,
                 governors: GovernorClientFactory | None = None,
                 rollout_timeout_s: float | None = None) -> EnvProvider: ...


class ORSKind:
    """OpenReward Standard environments: a server by `url`, a `catalog` name, or an `environment` class served for
    the run."""

    def resolve(self, spec: ORSSpec, name: str, refused: list[Refusal] | None = None) -> list[TaskRef] | None:
        if spec.environment is not None:
            from raygrpo.envs.ors.server import environment_class

            environment_class(spec.environment, spec.field_path(name, "environment"))
            return None
        return self.list_tasks(spec, name)

    def list_tasks(self, spec: ORSSpec, name: str) -> list[TaskRef]:
        from raygrpo.envs.ors.listing import list_ors_tasks

        return list_ors_tasks(spec, name)

    def limits(self, spec: ORSSpec, providers: Mapping[str, ProviderSpec]) -> tuple[str, ProviderSpec] | None:
        """None: an ORS environment starts no sandboxes of its own (its server is its own provider)."""
        return None

    def warm_depth(self, spec: ORSSpec) -> int:
        """0: sessions open on demand, nothing is kept warm."""
        return 0

    def provider(self, spec: ORSSpec, name: str, *, providers: Mapping[str, ProviderSpec] | None = None,
                 governors: GovernorClientFactory | None = None,
                 rollout_timeout_s: float | None = None) -> EnvProvider:
        from raygrpo.envs.ors.adapter import ORSProvider

        return ORSProvider(spec, name=name)


class HarborKind:
    """Harbor task suites: a folder of task dirs, run in sandboxes of any Harbor backend."""

    def resolve(self, spec: HarborSpec, name: str, refused: list[Refusal] | None = None) -> list[TaskRef] | None:
        from raygrpo.envs.harbor.harness import load_harness
        from raygrpo.envs.harbor.tasks import load_environment_class

        try:
            load_harness(spec.harness)
        except ValueError as exc:
            raise ResolveError(f"{spec.field_path(name, 'harness')}: {exc}") from None
        if spec.import_path is not None:
            try:
                load_environment_class(spec.import_path)
            except ValueError as exc:
                raise ResolveError(f"{spec.field_path(name, 'import_path')}: {exc}") from None
        if refused is None:
            return self.list_tasks(spec, name)
        from raygrpo.envs.harbor.tasks import scan_harbor_tasks

        try:
            tasks, refusals = scan_harbor_tasks(spec, name)
        except ValueError as exc:
            raise self._error(spec, name, exc) from None
        refused.extend(refusals)
        return tasks

    def list_tasks(self, spec: HarborSpec, name: str) -> list[TaskRef]:
        from raygrpo.envs.harbor.tasks import list_harbor_tasks

        try:
            return list_harbor_tasks(spec, name)
        except ValueError as exc:
            raise self._error(spec, name, exc) from None

    @staticmethod
    def _error(spec: HarborSpec, name: str, exc: ValueError) -> ResolveError:
        field = "indices" if str(exc).startswith("`indices`") else "path"
        return ResolveError(f"{spec.field_path(name, field)}: {exc}")

    def limits(self, spec: HarborSpec, providers: Mapping[str, ProviderSpec]) -> tuple[str, ProviderSpec] | None:
        """The suite's provider (`provider_key`) and its `providers:` entry; None when it has none (no limits)."""
        entry = providers.get(spec.provider_key)
        return None if entry is None else (spec.provider_key, entry)

    def warm_depth(self, spec: HarborSpec) -> int:
        """The most sandboxes its warm pool holds per actor: `size`, or `max_size` for `auto`; 0 without one."""
        warm = spec.warm_pool
        if warm is None:
            return 0
        return warm.max_size if warm.size == "auto" else warm.size

    def provider(self, spec: HarborSpec, name: str, *, providers: Mapping[str, ProviderSpec] | None = None,
                 governors: GovernorClientFactory | None = None,
                 rollout_timeout_s: float | None = None) -> EnvProvider:
        from raygrpo.envs.harbor.provider import HarborProvider

        found = self.limits(spec, providers or {})
        return HarborProvider(spec, name=name, limits=found[1] if found else None, governors=governors,
                              rollout_timeout_s=rollout_timeout_s)


#: The kinds of environment raygrpo runs, by the specs' `kind`.
KINDS: dict[str, EnvKind] = {"ors": ORSKind(), "harbor": HarborKind()}


def kind_of(spec: Any) -> EnvKind:
    """The `EnvKind` that handles `spec` (by its `kind` field)."""
    try:
        return KINDS[spec.kind]
    except (AttributeError, KeyError):
        raise ValueError(f"no environment kind handles {type(spec).__name__} (known: {', '.join(KINDS)})") from None
