"""Multi-step Harbor tasks (`[[steps]]` in task.toml), run as Harbor's `MultiStepTrial` runs them: the steps share one
sandbox and follow each other in order.

Before each step, the sandbox is prepared as Harbor prepares it: after a step whose verifier ran in the sandbox,
`/logs/verifier` and `/tests` are emptied (the next step must not see the previous step's tests or rewards); the
step's `workdir/` is uploaded into the working directory; its `workdir/setup.sh` runs there; its `healthcheck` (on
top of the task's own) must pass; the step's agent user (`step_agent_user`) is then the sandbox's default for the
step's agent phase. Right before each shared step verification, `/logs/verifier` and `/tests` are emptied again
(`reset_verifier_dirs`: what the model planted there is gone); the step's verifier then runs with the step's tests
merged over the task's shared `tests/` (Harbor's `Verifier` with `step_name`), the step's `[steps.verifier] env`
(over the task's), user and timeout.
A step whose rewards miss its `min_reward` ends the episode (Harbor's own `_min_reward_failure` decides), and the
episode's reward is what Harbor's aggregation gives (`multi_step_reward_strategy`: the per-key mean over the
verified steps, or the final step's rewards), computed by Harbor's own `Trial._select_multi_step_reward`.

Where raygrpo differs from Harbor, it says so rather than scoring: a step's `setup.sh` that exits non-zero is a
`TaskError` (Harbor ends the trial and aggregates what was verified; here the task is reported broken, never scored),
and a step's healthcheck that fails is an `EnvError` (retried), as the task's own healthcheck is.
"""

from __future__ import annotations

import logging
import shlex
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from raygrpo.core.errors import EnvError, TaskError, describe

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.config import StepConfig
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

logger = logging.getLogger(__name__)

#: Seconds a step's `setup.sh` may run (Harbor sets no deadline; the rollout's own still applies).
SETUP_TIMEOUT_S = 600


class StepSetupError(TaskError):
    """A step's `workdir/setup.sh` exited non-zero: the task is broken, the episode is not scored."""


class StepHealthcheckError(EnvError):
    """A step's healthcheck failed after its setup (retried as `env_error`, as the task's own healthcheck is)."""


def aggregate_rewards(task: Task, step_rewards: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The episode's rewards from its steps' rewards (None for a step not verified), by Harbor's own code:
    `harbor.trial.trial.Trial._select_multi_step_reward` (`multi_step_reward_strategy` `mean`, the default, or
    `final`), given the steps as Harbor's `StepResult`s."""
    from harbor.models.trial.result import StepResult
    from harbor.models.verifier.result import VerifierResult
    from harbor.trial.trial import Trial

    names = [s.name for s in task.config.steps or []]
    results = [StepResult(step_name=names[i] if i < len(names) else f"step-{i + 1}",
                          verifier_result=None if rewards is None else VerifierResult(rewards=rewards))
               for i, rewards in enumerate(step_rewards)]
    # Harbor's methods read only `self.task` and `self.result.step_results`.
    view = SimpleNamespace(task=task, result=SimpleNamespace(step_results=results))
    view._aggregate_step_rewards = lambda: Trial._aggregate_step_rewards(view)  # type: ignore[attr-defined]
    selected = Trial._select_multi_step_reward(view)  # type: ignore[arg-type]
    return None if selected is None else dict(selected.rewards or {})


def min_reward_failure(step: StepConfig, rewards: dict[str, Any] | None) -> str | None:
    """Why `step`'s rewards end the episode (Harbor's `MultiStepTrial._min_reward_failure`), or None when the step
    declares no `min_reward` or its rewards meet it."""
    from harbor.trial.multi_step import MultiStepTrial

    if step.min_reward is None:
        return None
    return MultiStepTrial._min_reward_failure(rewards, step.min_reward)


@dataclass
class StepProgress:
    """Where one episode of a multi-step task stands.

    Args:
        task: The task (Harbor's `Task`, with `config.steps`).
        index: The current step's position (0-based).
        rewards: Each finished step's raw rewards (None: verified without rewards), in order.
        stopped: Why the episode ended before its last step (a `min_reward` failure), when it did.
    """

    task: Task
    index: int = 0
    rewards: list[dict[str, Any] | None] = field(default_factory=list)
    stopped: str | None = None

    @property
    def steps(self) -> list[StepConfig]:
        return list(self.task.config.steps or [])

    @property
    def step(self) -> StepConfig:
        """The current step."""
        return self.steps[self.index]

    def instruction(self) -> str:
        """The current step's instruction (Harbor's `Task.step_instruction`: canary lines stripped)."""
        return self.task.step_instruction(self.step.name)

    def finish(self, rewards: dict[str, Any] | None) -> bool:
        """Record the current step's rewards; True when another step follows (the step met its `min_reward`, if
        any, and is not the last)."""
        self.rewards.append(dict(rewards) if rewards is not None else None)
        failure = min_reward_failure(self.step, rewards)
        if failure is not None:
            self.stopped = f"step {self.step.name!r}: {failure}"
            logger.info("%s: %s; the remaining steps are skipped", self.task.name, self.stopped)
            return False
        if self.index + 1 >= len(self.steps):
            return False
        self.index += 1
        return True

    def episode_rewards(self) -> dict[str, Any] | None:
        """The episode's rewards by the task's aggregation (`aggregate_rewards`)."""
        return aggregate_rewards(self.task, self.rewards)


def step_agent_user(task: Task, step: StepConfig) -> str | int | None:
    """The user `step`'s agent phase runs as (Harbor's `MultiStepTrial._step_agent_user`): the step's `[steps.agent]
    user`, else the task's `[agent] user`."""
    return step.agent.user if step.agent.user is not None else task.config.agent.user


async def reset_verifier_dirs(env: BaseEnvironment, trial_paths: TrialPaths) -> None:
    """Empty the sandbox's `/logs/verifier` and `/tests` (and the host copy of the former), as Harbor's
    `Trial._reset_shared_step_verifier_dirs` does before each shared step verification and before the step after
    one: what a model (or a previous step's verifier) left there, say a `/tests/conftest.py`, is gone."""
    from harbor.models.trial.paths import EnvironmentPaths

    paths = EnvironmentPaths.for_os(env.os)
    await env.empty_dirs([paths.verifier_dir], chmod=True)
    await env.empty_dirs([paths.tests_dir], chmod=False)
    _empty_host_dir(trial_paths.verifier_dir)


async def prepare_step(env: BaseEnvironment, task: Task, step: StepConfig, trial_paths: TrialPaths, *,
                       after_verifier: bool, label: str,
                       setup_sessions: Callable[[], Awaitable[set[int]]] | None = None) -> set[int]:
    """Make the sandbox ready for `step` (see the module docstring), as the step's agent user, and leave that user
    the sandbox's default for the step's agent phase (the model's commands, the oracle's `solve.sh`), as Harbor's
    `_run_agent_phase` runs it under `with_default_user(step user)`.

    Args:
        env: The episode's started sandbox.
        task: The task.
        step: The step about to start.
        trial_paths: The sandbox's trial dir (its host copy of `/logs/verifier` is emptied with the sandbox's).
        after_verifier: A previous step's verifier ran in this sandbox (its tests and outputs are removed first).
        label: How errors name the task.
        setup_sessions: Lists the sandbox's process sessions (`stop_agent_processes`' baseline); given, it is called
            before and after the step's `setup.sh`, and the sessions that appeared between are returned.

    Returns:
        The sessions the step's `setup.sh` started (empty without `setup_sessions` or a `setup.sh`): the task's
        infrastructure, which `stop_agent_processes` spares.

    Raises:
        StepSetupError: The step's `setup.sh` exited non-zero.
        StepHealthcheckError: The step's healthcheck failed.
        EnvError: Resetting the verifier's folders or uploading the step's workdir failed.
    """
    from harbor.environments.base import HealthcheckError

    name = f"{label} step {step.name!r}"
    started: set[int] = set()
    try:
        if after_verifier:
            await reset_verifier_dirs(env, trial_paths)
        user = step_agent_user(task, step)
        with env.with_default_user(user):
            done = await env.exec("pwd")
            workdir = (done.stdout or "/").strip() or "/"
            workdir_dir = task.paths.step_workdir_dir(step.name)
            if workdir_dir.exists():
                task.paths.validate_input_tree(workdir_dir)
                await env.upload_dir(source_dir=workdir_dir, target_dir=workdir)
            if task.paths.step_setup_path(step.name).exists():
                before = await setup_sessions() if setup_sessions is not None else set()
                script = f"{workdir.rstrip('/')}/setup.sh"
                result = await env.exec(f"bash {shlex.quote(script)}", timeout_sec=SETUP_TIMEOUT_S)
                if result.return_code != 0:
                    output = ((result.stdout or "") + (result.stderr or "")).strip()[-500:]
                    raise StepSetupError(f"{name}: setup.sh exited {result.return_code}: {output}")
                if setup_sessions is not None:
                    started = await setup_sessions() - before
            if step.healthcheck is not None:
                await env.run_healthcheck(step.healthcheck)
        env.default_user = user
        return started
    except (TaskError, EnvError):
        raise
    except HealthcheckError as exc:
        raise StepHealthcheckError(f"{name}: the step's healthcheck failed: {describe(exc)}") from exc
    except Exception as exc:  # noqa: BLE001 - the backend could not reset or place the files: infrastructure
        raise EnvError(f"{name}: could not prepare the sandbox for the step: {describe(exc)}") from exc


def _empty_host_dir(folder: Path) -> None:
    """Remove what is inside `folder` (a mounted sandbox folder emptied from inside needs nothing more)."""
    if not folder.is_dir():
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
