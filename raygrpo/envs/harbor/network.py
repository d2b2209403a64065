"""A Harbor task's network modes, as raygrpo hands them to the sandbox backends.

Harbor's `[environment] network_mode` (default `public`; the older `allow_internet = false` means `no-network`) is
the sandbox's baseline; `[agent]` and `[verifier]` (and each step's `[steps.agent]` and `[steps.verifier]`, over the
task's) may each name a mode of their own for their phase. raygrpo runs the agent's and the verifier's commands in
one sandbox without switching its network between them, so:

- backends built through Harbor's factory get the baseline and both phases (`network_policy=`,
  `phase_network_policies=`), and Harbor's own check refuses, by name, what the backend cannot enforce (the local
  sandbox: `allowlist`, and a restricted phase in a public sandbox);
- on docker, where Harbor 0.25 enforces restricted modes only through an egress-control image that cannot be pulled
  here, raygrpo applies the one mode itself (`static_mode`): `no-network` as `network_mode: none`, `public` on a
  guarded bridge (`raygrpo.docker.guard`), and refuses the rest.

A refusal is a `TaskError` (`task_error`, not retried): the task cannot run on this backend as written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raygrpo.core.errors import TaskError

if TYPE_CHECKING:
    from harbor.models.task.config import NetworkMode, NetworkPolicy
    from harbor.models.task.task import Task


def task_network_policies(task: Task) -> tuple[NetworkPolicy, list[NetworkPolicy]]:
    """The task's baseline policy and its agent and verifier phases' (each the baseline unless the phase names one);
    for a multi-step task, every step's two phases, a step's `[steps.agent]` / `[steps.verifier] network_mode` over
    the task's, as Harbor's `_init_agent_environment` hands them to the backend (`_explicit_phase_policy`), so that
    a step's restricted phase is enforced or refused, never run with the baseline's wider network."""
    config = task.config
    baseline = config.environment.resolve_baseline()
    phases: list[NetworkPolicy] = []
    for step in config.steps or [None]:
        agent = step.agent.explicit_phase_policy() if step is not None else None
        verifier = step.verifier.explicit_phase_policy() if step is not None else None
        for policy in (agent or config.agent.explicit_phase_policy() or baseline,
                       verifier or config.verifier.explicit_phase_policy() or baseline):
            if policy not in phases:
                phases.append(policy)
    return baseline, phases


def static_mode(label: str, task: Task, backend: str) -> NetworkMode:
    """The one network mode a sandbox on `backend` keeps for its whole life: `no-network` or `public`.

    Raises:
        TaskError: the task asks for `allowlist`, or for different modes in its phases.
    """
    from harbor.models.task.config import NetworkMode

    baseline, phases = task_network_policies(task)
    modes = {policy.network_mode for policy in (baseline, *phases)}
    if NetworkMode.ALLOWLIST in modes:
        raise TaskError(f"{label} task {task.name}: network_mode 'allowlist' cannot be enforced on {backend} here "
                        "(Harbor's egress-control image is not available); refused rather than run with a wider "
                        "network")
    if len(modes) > 1:
        named = ", ".join(sorted(mode.value for mode in modes))
        raise TaskError(f"{label} task {task.name}: its environment, agent and verifier ask for different network "
                        f"modes ({named}), and a {backend} sandbox keeps one for its whole life; refused")
    return modes.pop()


def is_network_refusal(exc: BaseException) -> bool:
    """Whether `exc` is Harbor's refusal of a network policy the backend cannot enforce."""
    text = str(exc)
    return isinstance(exc, ValueError) and ("network_mode=" in text or "network policy" in text)
