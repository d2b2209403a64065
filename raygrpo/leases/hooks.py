"""Which backends' sandboxes are leased, and how each is labelled, given a lifetime and reaped.

In the style of Harbor's `EnvironmentFactory` (a registry of built-in types to `module:Class`, or a class by import
path, asked through classmethods): a backend takes part through classmethods of its environment class, the *lease
hook* (`LeaseHook`); `FakeProviderEnvironment` has one. Built-in Harbor types without a hook of their own can be given
one here (`BUILTIN_HOOKS`), and those that take a lifetime argument are listed in `BUILTIN_LIFETIME_KWARGS`.

Not leased: raygrpo's local bubblewrap backend and docker, whose sandboxes have owner-based reapers already
(`raygrpo.sandbox.orphans`), and import-path classes without a hook (in-process backends such as `NullEnvironment`:
nothing of theirs outlives the process). Every other built-in Harbor type is leased; without a hook its stale leases
are reported by the reaper and kept (or dropped once their lifetime is over), never silently lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from raygrpo.core.imports import ImportSpecError, load_object

#: Backends not leased: their sandboxes have owner-based reapers (local registry, docker labels).
OWNER_REAPED = frozenset({"local", "docker", "raygrpo.sandbox.local:LocalSandboxEnvironment"})
#: Built-in Harbor backend -> `module:Class` whose classmethods are its lease hook (none yet).
BUILTIN_HOOKS: dict[str, str] = {}


@dataclass(frozen=True)
class Lifetime:
    """A backend's constructor argument that bounds how long a sandbox lives at the provider.

    Args:
        kwarg: The argument's name.
        unit_s: Seconds per unit of the argument (60 for one in minutes).
        idle: The bound counts from the sandbox's last activity, not its create (Daytona's auto-stop): a sandbox
            left behind may then live up to twice the lifetime after its create (its rollout, then the idle time).
    """

    kwarg: str
    unit_s: float = 1.0
    idle: bool = False


#: Built-in Harbor backends without a hook that take a sandbox lifetime argument (names and units as in Harbor's
#: `harbor/environments/` sources). Daytona's auto-stop deletes too: its `auto_delete_interval_mins` defaults to 0,
#: "delete immediately on stop".
BUILTIN_LIFETIME_KWARGS: dict[str, Lifetime] = {
    "e2b": Lifetime("sandbox_timeout_secs"),
    "modal": Lifetime("sandbox_timeout_secs"),
    "daytona": Lifetime("auto_stop_interval_mins", 60.0, idle=True),
    "opensandbox": Lifetime("sandbox_timeout_sec"),
    "prime": Lifetime("timeout_minutes", 60.0),
    "vercel": Lifetime("sandbox_lifetime_seconds"),
    "sail": Lifetime("max_lifetime_seconds"),
    "tensorlake": Lifetime("timeout_secs"),
}


@runtime_checkable
class LeaseHook(Protocol):
    """A backend class's lease hook: classmethods (and one class attribute) the ledger uses.

    - `lease_lifetime_kwarg`: the constructor argument that sets a sandbox's lifetime in seconds (None: it has none).
    - `lease_kwargs(kwargs, labels)`: the constructor arguments with the lease's labels added to the sandbox's.
    - `lease_reach(kwargs)`: the non-secret arguments needed to reach the provider from another process (written
      into the lease; never credentials, which come from the environment).
    - `reap_lease(reach, lease_id, sandbox_id)`: stop every sandbox of the lease at the provider (found by its
      `io.raygrpo.lease` label, and by `sandbox_id` when known); return the ids stopped; raise when the provider
      could not be asked (the lease is then kept).
    """

    lease_lifetime_kwarg: ClassVar[str | None]

    @classmethod
    def lease_kwargs(cls, kwargs: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]: ...

    @classmethod
    def lease_reach(cls, kwargs: dict[str, Any]) -> dict[str, Any]: ...

    @classmethod
    def reap_lease(cls, reach: dict[str, Any], lease_id: str, sandbox_id: str | None) -> list[str]: ...


def _has_hook(cls: Any) -> bool:
    return all(callable(getattr(cls, name, None)) for name in ("lease_kwargs", "lease_reach", "reap_lease"))


@dataclass(frozen=True)
class LeasePolicy:
    """How one backend's sandboxes are leased.

    Args:
        backend: The backend (`environment_type` or import path).
        tracked: Whether its sandboxes get leases at all.
        hook: The class whose classmethods are its lease hook; None when it has none.
        lifetime_kwarg: The constructor argument that sets a sandbox's lifetime; None when it takes none.
        lifetime_unit_s: Seconds per unit of that argument.
        lifetime_idle: The lifetime counts from the sandbox's last activity (`Lifetime.idle`).
    """

    backend: str
    tracked: bool
    hook: type | None = None
    lifetime_kwarg: str | None = None
    lifetime_unit_s: float = 1.0
    lifetime_idle: bool = False


def hook_for(backend: str) -> type | None:
    """The lease hook of a backend named in a lease (a built-in name or an import path), or None when it has none
    (or its class no longer loads)."""
    spec = BUILTIN_HOOKS.get(backend) or (backend if ":" in backend else None)
    if spec is None:
        return None
    try:
        cls = load_object(spec)
    except ImportSpecError:
        return None
    return cls if _has_hook(cls) else None


def lease_policy(backend: str, environment_class: type | None = None) -> LeasePolicy:
    """How `backend`'s sandboxes are leased (see the module docstring).

    Args:
        backend: The spec's backend: an `environment_type`, `"local"`, or an import path.
        environment_class: The backend's class when it is given by import path (Harbor's module path), to look for
            its hook; None for built-in types (and for a class that does not load: not leased).
    """
    if backend in OWNER_REAPED:
        return LeasePolicy(backend, tracked=False)
    if ":" in backend:  # a class by import path: leased when it has a hook
        if environment_class is None or not _has_hook(environment_class):
            return LeasePolicy(backend, tracked=False)
        return LeasePolicy(backend, True, environment_class, getattr(environment_class, "lease_lifetime_kwarg", None))
    hook = hook_for(backend) if backend in BUILTIN_HOOKS else None
    lifetime = getattr(hook, "lease_lifetime_kwarg", None) if hook is not None else None
    found = Lifetime(lifetime) if lifetime is not None else BUILTIN_LIFETIME_KWARGS.get(backend)
    if found is None:
        return LeasePolicy(backend, True, hook)
    return LeasePolicy(backend, True, hook, found.kwarg, found.unit_s, found.idle)
