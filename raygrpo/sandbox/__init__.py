"""The local sandbox backend for Harbor tasks, and reaping its orphans.

Some names from neighbouring folders (fault injection, the lease ledger) are still exported here, where they were
before the package had folders. Test support is not: the null backend is `raygrpo.testing.null` (its import path
`raygrpo.testing.null.NULL_IMPORT_PATH`).

- `raygrpo.sandbox.local:LocalSandboxEnvironment`: a Harbor `BaseEnvironment` that runs each sandbox in its own
  Linux namespaces with bubblewrap (development and CI; **no security boundary for untrusted code**; no image
  builds: it applies a Dockerfile's `WORKDIR`, `ENV` and `COPY`, runs the `RUN` commands that make files and skips
  those that install software).
- `raygrpo.envs.harbor.faults`: `FaultConfig`, `FaultInjectingEnvironment`, `wrap_environment` (latency, start failures
  before/after creation, exec hangs, sandbox death), around any backend.
- `raygrpo.sandbox.owners`: owner labels and heartbeats of local sandboxes, and `live_sandboxes`;
  `raygrpo.sandbox.orphans`: `reap_orphans`, `OrphanReaper`; `raygrpo.sandbox.os_probe`: the OS-level leak checks
  `sandbox_processes` and `sandbox_mounts`.
- `raygrpo.leases.ledger`: the lease ledger of remote sandboxes (`LeaseLedger`, `Lease`), their backends' reap hooks
  (`raygrpo.leases.hooks`), and reaping stale owners' leases (`reap_leases`, what `raygrpo reap` runs).

Names are imported lazily, so that `from raygrpo.sandbox import reap_orphans` does not import Harbor.
"""

from __future__ import annotations

import importlib
from typing import Any

from raygrpo.specs.harbor import LOCAL_BACKEND as LOCAL_IMPORT_PATH

_EXPORTS = {
    "LocalSandboxEnvironment": "raygrpo.sandbox.local",
    "SandboxError": "raygrpo.sandbox.errors",
    "SandboxStartError": "raygrpo.sandbox.errors",
    "SandboxNotRunningError": "raygrpo.sandbox.errors",
    "SandboxExecTimeoutError": "raygrpo.sandbox.errors",
    "FaultConfig": "raygrpo.specs.faults",
    "FaultInjectingEnvironment": "raygrpo.envs.harbor.faults",
    "InjectedFault": "raygrpo.envs.harbor.faults",
    "InjectedStartFailure": "raygrpo.envs.harbor.faults",
    "InjectedPostStartFailure": "raygrpo.envs.harbor.faults",
    "InjectedExecTimeout": "raygrpo.envs.harbor.faults",
    "InjectedSandboxDeath": "raygrpo.envs.harbor.faults",
    "wrap_environment": "raygrpo.envs.harbor.faults",
    "DockerfileError": "raygrpo.sandbox.dockerfile",
    "parse_dockerfile": "raygrpo.sandbox.dockerfile",
    "reap_orphans": "raygrpo.sandbox.orphans",
    "OrphanReaper": "raygrpo.sandbox.orphans",
    "live_sandboxes": "raygrpo.sandbox.owners",
    "sandbox_processes": "raygrpo.sandbox.os_probe",
    "sandbox_mounts": "raygrpo.sandbox.os_probe",
    "sandbox_root": "raygrpo.sandbox.owners",
    "Lease": "raygrpo.leases.ledger",
    "LeaseLedger": "raygrpo.leases.ledger",
    "reap_leases": "raygrpo.leases.reaper",
}

__all__ = sorted([*_EXPORTS, "LOCAL_IMPORT_PATH"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raygrpo.sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
