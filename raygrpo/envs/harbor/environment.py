"""Building (not starting) a task's sandbox through Harbor's `EnvironmentFactory`: `create_environment`.

What raygrpo adds on the way: on docker, its compose file and the task's image once built
(`raygrpo.envs.harbor.docker`); elsewhere, the task's network policies (`raygrpo.envs.harbor.network`); on a leased
backend, the lease's label and the sandbox's lifetime (`raygrpo.envs.harbor.leases`); the fault injector where the
spec configures one (`raygrpo.envs.harbor.faults`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from raygrpo.core.errors import TaskError
from raygrpo.core.imports import is_file_spec, split_spec
from raygrpo.envs.harbor.faults import wrap_environment
from raygrpo.envs.harbor.network import is_network_refusal, task_network_policies
from raygrpo.envs.harbor.tasks import load_environment_class, unset_variables
from raygrpo.envs.harbor.trial import keep_fresh

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from raygrpo.envs.harbor.context import SuiteContext

logger = logging.getLogger("raygrpo.envs.harbor.provider")  # the logger Harbor's backends were always given


async def create_environment(context: SuiteContext, task: Task, trial_paths: TrialPaths,
                             session_id: str) -> BaseEnvironment:
    """Build (not start) the task's sandbox through Harbor's `EnvironmentFactory`, with fault injection when the
    spec configures it (on docker, with raygrpo's compose file and the task's image once it is built; on a leased
    backend, with the lease's label and the sandbox's lifetime, the lease id being `session_id`).

    Raises:
        TaskError: The task cannot run as it is, on any attempt: a host variable its environment tables name is not
            set in this process (`raygrpo.envs.harbor.tasks.unset_variables`: checked before the sandbox exists, so
            that a `[verifier.env]` one fails before the episode, not after it), the backend refuses its network
            policy, or it cannot give it what it asks for (GPUs, a TPU) or read its Dockerfile (the local backend).
    """
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig

    spec = context.spec
    unset = unset_variables(task.config)
    if unset is not None:
        raise TaskError(f"{context.label} task {task.name}: {unset}")
    kwargs = dict(spec.environment_kwargs)
    task_env_config = task.config.environment.model_copy(deep=True)
    network: dict[str, Any] = {}
    if context.docker is not None:
        task_env_config, kwargs = await context.docker.prepare(task, trial_paths.trial_dir, kwargs, session_id)
    else:
        baseline, phases = task_network_policies(task)
        network = {"network_policy": baseline, "phase_network_policies": phases}
    kwargs = context.leases.backend_kwargs(kwargs, task, session_id)
    config = TrialEnvironmentConfig(
        type=spec.environment_type,
        import_path=context.import_path,
        delete=spec.stop_delete,
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
    except (ValueError, RuntimeError) as exc:
        if is_network_refusal(exc) or _is_task_refusal(exc, task_env_config):
            raise TaskError(f"{context.label} task {task.name}: {exc}") from None
        raise
    if spec.faults is not None:
        env = wrap_environment(env, spec.faults)
    try:
        mounted = env.capabilities.mounted
    except Exception:  # noqa: BLE001 - a backend that cannot say is taken to mount it
        mounted = True
    if mounted:
        keep_fresh(trial_paths.trial_dir)
    return env


def _is_task_refusal(exc: BaseException, task_env_config: Any) -> bool:
    """Whether `exc`, raised while the backend was built, refuses the task itself: its Dockerfile cannot be read
    (the local backend), or it asks for accelerators the backend does not allocate (Harbor's own check in
    `BaseEnvironment.__init__`: `Task requires 1 GPU(s) but ... does not support GPU allocation`)."""
    from raygrpo.sandbox.dockerfile import DockerfileError

    if isinstance(exc, DockerfileError):
        return True
    asks = bool(task_env_config.gpus) or task_env_config.tpu is not None
    return asks and isinstance(exc, RuntimeError) and str(exc).startswith("Task requires")


def harbor_import_path(spec: str | None) -> str | None:
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
