"""Separate verifier environments (`[verifier] environment_mode = "separate"`, the default of `harbor tasks init`):
the verifier runs in a sandbox of its own, as Harbor's `Trial._run_separate_verifier` runs it.

The verifier's sandbox is built from what Harbor's `resolve_verifier_environment_definition` names (the step's or
the task's `tests/` when it holds a Dockerfile: its tests are then baked into the image; else the task's own
`environment/`), with the verifier's environment config. The files the task declares as `artifacts` (the task's,
plus the step's for a multi-step task) are downloaded from the agent's sandbox into its trial dir and uploaded into
the verifier's sandbox at their original paths by Harbor's own `ArtifactHandler`.

The verifier's sandbox is a `HarborSandbox` like the agent's: it goes through the suite's provisioning gate (the
provider's limits count it), is tracked with the suite's live sandboxes (a sandbox left behind is a leaked env), and
on docker gets raygrpo's labels, init and image reuse (its image is named after its own folder's content).

Only the docker backend runs them: the local backend runs the host's own tools whatever the Dockerfile's `FROM`
says, so a verifier image of its own would not be the one the task's author wrote; `unsupported_shape` refuses such
tasks by name there.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.config import StepConfig
    from harbor.models.task.task import Task
    from harbor.models.task.verifier_mode import VerifierEnvironmentDefinition

logger = logging.getLogger(__name__)

#: The backends that run separate verifier environments.
SEPARATE_BACKENDS = ("docker",)
#: What other backends answer for a task with a separate verifier environment.
SEPARATE_REFUSAL = ("asks for a separate verifier environment ([verifier] environment_mode = \"separate\", the "
                    "default of `harbor tasks init`), which raygrpo runs on docker only (environment_type: docker): "
                    "the {backend} backend would not run the verifier's own image; or set environment_mode = "
                    "\"shared\" so that tests/test.sh runs in the task's own sandbox")


def uses_separate_verifier(config: Any) -> bool:
    """Whether any verification of a parsed task.toml (Harbor's `TaskConfig`) runs in a separate environment, as
    Harbor resolves each step's mode (a task without steps: the task's)."""
    from harbor.models.task.verifier_mode import (VerifierEnvironmentMode, resolve_step_verifier_mode,
                                                  resolve_task_verifier_mode)

    if config.steps:
        modes = [resolve_step_verifier_mode(config, step) for step in config.steps]
    else:
        modes = [resolve_task_verifier_mode(config)]
    return any(mode == VerifierEnvironmentMode.SEPARATE for mode in modes)


def verifier_definition(task: Task, step: StepConfig | None) -> VerifierEnvironmentDefinition | None:
    """Harbor's definition of the verifier's environment for `task` (or its `step`); None when it verifies in the
    task's own sandbox (shared mode)."""
    from harbor.models.task.verifier_mode import resolve_verifier_environment_definition

    return resolve_verifier_environment_definition(task.config, task.paths, step)


def verifier_task(task: Task, definition: VerifierEnvironmentDefinition) -> Task:
    """A view of `task` whose environment is the verifier's: `paths.environment_dir` is the definition's folder,
    `config.environment` its config, and its name `<task>-verifier` (sandbox and image names follow it). Everything
    else (tests, the task dir) is the task's."""
    from harbor.models.task.paths import TaskPaths
    from harbor.models.task.task import Task as HarborTask

    class VerifierPaths(TaskPaths):
        @property
        def environment_dir(self) -> Path:
            return definition.directory

    class VerifierTask(HarborTask):
        @property
        def short_name(self) -> str:
            return f"{task.short_name}-verifier"

    view = object.__new__(VerifierTask)
    view.__dict__.update(copy.copy(task.__dict__))
    view.paths = VerifierPaths(task.paths.task_dir)
    # Harbor starts a verifier's environment without the task's healthcheck (it checks the agent's sandbox).
    view.config = task.config.model_copy(update={"environment": definition.config.model_copy(
        update={"healthcheck": None})})
    view.name = f"{task.name}-verifier"
    return view


def _handler(task: Task) -> Any:
    from harbor.trial.artifact_handler import ArtifactHandler

    return ArtifactHandler(artifacts=list(task.config.artifacts), logger=logger)


async def collect_artifacts(agent_env: BaseEnvironment, task: Task, step: StepConfig | None, folder: Path) -> Path:
    """Download the task's declared artifacts (and the step's) from the agent's sandbox into `folder/artifacts`
    (Harbor's `ArtifactHandler.download_artifacts`: best effort, a missing one is left out); returns that folder.

    `folder` outlives the agent's sandbox (its trial dir goes when it is stopped, before the last verification)."""
    from harbor.models.trial.paths import EnvironmentPaths

    handler = _handler(task)
    handler.begin_collection()
    artifacts = None if step is None else list(step.artifacts)  # added to the task's own
    artifacts_dir = folder / "artifacts"
    await handler.download_artifacts(agent_env, artifacts_dir,
                                     source_artifacts_dir=EnvironmentPaths.for_os(agent_env.os).artifacts_dir,
                                     artifacts=artifacts)
    return artifacts_dir


async def place_artifacts(verifier_env: BaseEnvironment, agent_os: Any, task: Task, step: StepConfig | None,
                          artifacts_dir: Path) -> None:
    """Upload the collected artifacts into the verifier's sandbox at their original paths (Harbor's
    `ArtifactHandler.upload_artifacts`), after emptying its `/logs/verifier`."""
    from harbor.models.trial.paths import EnvironmentPaths

    target = EnvironmentPaths.for_os(verifier_env.os)
    await verifier_env.empty_dirs([target.verifier_dir], chmod=True)
    artifacts = None if step is None else list(step.artifacts)  # added to the task's own
    await _handler(task).upload_artifacts(verifier_env, artifacts_dir,
                                          source_artifacts_dir=EnvironmentPaths.for_os(agent_os).artifacts_dir,
                                          target_artifacts_dir=target.artifacts_dir, artifacts=artifacts)
