"""Grading a Harbor episode: `EpisodeGrading`, the `score` half of `HarborAdapter`, and the errors it raises.

`score` runs the task's verifier (a multi-step task's: the current step's) in the episode's sandbox, or, for a
separate verifier environment (`raygrpo.envs.harbor.separate`), in a sandbox of its own started for the verification
and stopped after it; it reduces the verifier's named rewards to one number (`raygrpo.envs.harbor.rewards`), sets a
verdict aside when the verifier's tooling was missing before the model acted (`VerifierError`), and keeps what the
verifier left behind (`raygrpo.envs.harbor.verify.VerifierEvidence`) whatever the outcome.

It is a mixin of `HarborAdapter` rather than a part of it so that the episode's life (`raygrpo.envs.harbor.adapter`:
its sandbox, the harness's calls, the steps, the stop) and its grading each read on their own; the grading only reads
the episode's state (its spec, task, sandbox, step) and owns the state of the verification under way.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raygrpo.core.errors import TaskError, VerifierError, describe
from raygrpo.core.scratch import process_scratch
from raygrpo.envs.base import EnvError, RewardMissingError
from raygrpo.envs.harbor.agent_processes import stop_agent_processes
from raygrpo.envs.harbor.rewards import reduce_rewards
from raygrpo.envs.harbor.sandbox import HarborSandbox
from raygrpo.envs.harbor.separate import collect_artifacts, place_artifacts, verifier_definition, verifier_task
from raygrpo.envs.harbor.steps import reset_verifier_dirs
from raygrpo.envs.harbor.tooling import package_check_command, probe_commands, probe_packages, read_probe
from raygrpo.envs.harbor.verify import (GATHER_TIMEOUT_S, VerifierEvidence, gather, missing_at_verify, run_verifier,
                                        verifier_user)

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from raygrpo.envs.harbor.context import SuiteContext
    from raygrpo.envs.harbor.steps import StepProgress
    from raygrpo.specs.harbor import HarborSpec

logger = logging.getLogger(__name__)


class HarborVerifierError(EnvError):
    """The task's verifier crashed (infrastructure: retried as `env_error`)."""


class HarborVerifierTimeout(TimeoutError):
    """The task's verifier ran past its deadline; the rollout ends unscored with status `timeout`."""


class EpisodeGrading:
    """The grading of one Harbor episode (`score`, and `verifier`: what the last verification left behind), mixed
    into `HarborAdapter`, which provides the episode's state annotated below and closes a verifier's sandbox still
    open when the episode is closed (`_close_verifier_sandbox`)."""

    # The episode's state, set by `HarborAdapter`.
    context: SuiteContext
    spec: HarborSpec
    harbor_task: Task | None
    sandbox: HarborSandbox | None
    timings: dict[str, float]
    _started: bool
    _dead: str | None
    _steps: StepProgress | None
    _tooling_missing: list[str]
    # Properties of `HarborAdapter`: how errors and logs name the episode, and the task's sandbox's Harbor
    # environment and trial paths.
    label: str
    env: BaseEnvironment | None
    _trial_paths: TrialPaths | None

    #: What the last verification left behind (None before `score`).
    _evidence: VerifierEvidence | None = None
    #: Whether the verification under way was cancelled (nothing is gathered from the sandbox then).
    _score_cancelled: bool = False
    #: The sessions of the processes the sandbox ran before the model acted (`HarborSpec.stop_agent_processes`; None when off).
    _baseline_sessions: set[int] | None = None
    #: The sandbox a separate verifier environment runs in, while a verification holds one.
    _verifier_sandbox: HarborSandbox | None = None
    #: Where the artifacts of the verification under way are kept on the host (removed after it).
    _artifacts_tmp: str | None = None

    async def score(self) -> float:
        """Run the task's verifier (for a multi-step task: the current step's) and reduce its rewards to one number.
        It runs in the task's sandbox, or, for a separate verifier environment, in a sandbox of its own started for
        it and stopped afterwards (`_start_verifier_sandbox`). What the verifier left behind (exit code, output tail,
        raw rewards, and for a failed verification its sandbox's `/logs`) is in `verifier` afterwards, however it
        ended.

        Raises:
            HarborVerifierTimeout: The verifier ran past `verifier_timeout_s` (or the task's own timeout).
            RewardMissingError: The verifier wrote no usable reward.
            HarborVerifierError: The verifier crashed.
            EnvError: The sandbox is dead or was never started.
        """
        if not self._started or self.env is None or self.harbor_task is None:
            raise EnvError(f"{self.label}: score() before start()")
        if self._dead is not None:
            raise EnvError(f"{self.label}: the sandbox is dead ({self._dead})")
        evidence = self._evidence = VerifierEvidence(tooling_missing=list(self._tooling_missing))
        reward: float | None = None
        began = time.perf_counter()
        try:
            try:
                reward = await self._score(evidence)
            except RewardMissingError as exc:
                await self._check_tooling(evidence, None, exc)
                raise
            await self._check_tooling(evidence, reward)
            return reward
        finally:
            self.timings["verify"] = time.perf_counter() - began
            verifier = self._verifier_sandbox  # a separate verifier's sandbox: the evidence is there
            try:
                if not self._score_cancelled:
                    keep = self.spec.keep_logs == "all" or (self.spec.keep_logs == "failed"
                                                            and not (reward or 0) >= 1.0)
                    env, paths = (verifier.env, verifier.trial.paths) if verifier is not None and verifier.ready \
                        else (self.env, self._trial_paths)
                    await gather(env, paths, evidence, keep_logs=keep, keep_logs_kib=self.spec.keep_logs_kib,
                                 label=self.label)
            finally:
                await self._close_verifier_sandbox()

    async def _check_tooling(self, evidence: VerifierEvidence, reward: float | None,
                             cause: BaseException | None = None) -> None:
        """The verdict stands unless the probe at start showed the verifier's tooling missing and the verifier then
        did not award full reward: then it is not the model's (`VerifierError`, status `verifier_error`). What the
        probe found counts only when the verifier lacked it too: a command when its shell also failed to find it
        while it ran (`raygrpo.envs.harbor.verify_missing`: a word the probe took for a command never sets a verdict
        aside), a Python package when it is still missing after it ran (test.sh's own `pip install` may have put it
        there)."""
        if not self._tooling_missing or (reward is not None and reward >= 1.0):
            return
        missing = list(self._tooling_missing)
        commands = probe_commands(missing)
        if commands:
            evidence.missing_at_verify = await missing_at_verify(self.env, self._trial_paths)
            unconfirmed = [c for c in commands if c not in evidence.missing_at_verify]
            missing = [m for m in missing if not set(probe_commands([m])) & set(unconfirmed)]
            if unconfirmed:
                logger.info("%s: the probe found %s missing before the model acted, but the verifier's shell did "
                            "not miss it: not held against the verdict", self.label, ", ".join(unconfirmed))
        packages = probe_packages(missing)
        if packages:
            provided = set(packages) - set(probe_packages(await self._packages_missing_now(packages)))
            missing = [m for m in missing if not set(probe_packages([m])) & provided]
            if provided:
                logger.info("%s: the probe found %s missing before the model acted, but it was there after the "
                            "verifier ran: not held against the verdict", self.label, ", ".join(sorted(provided)))
        if not missing:
            return
        verdict = f"reward {reward:g}" if reward is not None else "no reward"
        raise VerifierError(
            f"{self.label}: the verifier's tooling was missing before the model acted: "
            f"{', '.join(missing)}; its verdict ({verdict}) is not the model's") from cause

    async def _packages_missing_now(self, specs: list[str]) -> list[str]:
        """What of the package `specs` the sandbox's `python3` lacks now, checked as the probe checked them (as the
        task's verifier user), in `read_probe`'s phrases. When the check cannot run, every spec counts as missing:
        the probe showed them missing before the model acted, and only a check that finds them sets that aside."""
        everything = [f"the Python package `{spec}`" for spec in specs]
        if self.env is None or self.harbor_task is None:
            return everything
        try:
            with self.env.with_default_user(verifier_user(self.harbor_task,
                                                          self._steps.step if self._steps is not None else None)):
                result = await self.env.exec(package_check_command(specs), timeout_sec=int(GATHER_TIMEOUT_S))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the probe's finding stands without the check
            logger.warning("%s: could not check the verifier's Python packages again: %s", self.label, describe(exc))
            return everything
        found = read_probe(result.stdout or "")
        if result.return_code != 0 or "the command `python3`" in found:
            return everything
        return found

    async def _score(self, evidence: VerifierEvidence) -> float:
        from harbor.verifier.verifier import RewardFileEmptyError, RewardFileNotFoundError, VerifierOutputParseError
        from pydantic import ValidationError

        step = self._steps.step if self._steps is not None else None
        timeout = self.spec.verifier_timeout_s or (step.verifier.timeout_sec if step is not None else None) \
            or self.harbor_task.config.verifier.timeout_sec
        definition = verifier_definition(self.harbor_task, step)
        env, trial_paths = self.env, self._trial_paths
        try:
            if definition is None and self._baseline_sessions is not None:
                await stop_agent_processes(env, self._baseline_sessions, self.label)
            if definition is None and step is not None:
                # Right before a shared step verification, as Harbor's `_run_step_verifier` does (the first step's
                # too; a single-step trial does not): a `/tests/conftest.py` the model planted is gone.
                await reset_verifier_dirs(env, trial_paths)
            if definition is not None:
                env, trial_paths = await self._start_verifier_sandbox(definition, step)
            result = await asyncio.wait_for(
                run_verifier(env, self.harbor_task, trial_paths, evidence,
                             offline_tooling=self.spec.offline_tooling,
                             watch_missing=bool(probe_commands(self._tooling_missing)), step=step,
                             skip_tests_upload=definition is not None and definition.bundled_tests), timeout)
        except TimeoutError:
            raise HarborVerifierTimeout(f"{self.label}: the verifier did not finish within {timeout:g} s") from None
        except (RewardFileNotFoundError, RewardFileEmptyError, VerifierOutputParseError, ValidationError) as exc:
            raise RewardMissingError(f"{self.label}: the verifier wrote no usable reward: {describe(exc)}") from None
        except asyncio.CancelledError:
            self._score_cancelled = True
            raise
        except (EnvError, TaskError, VerifierError):
            raise
        except Exception as exc:  # noqa: BLE001 - uploading tests, running test.sh or reading results failed
            raise HarborVerifierError(f"{self.label}: the verifier crashed: {describe(exc)}") from exc
        rewards = dict(result.rewards or {})
        key = self.spec.reward_key
        if step is not None and self.spec.reward_reduce == "key" and key is not None and rewards and key not in rewards:
            # Harbor aggregates the steps' rewards first, a key a step lacks counting 0, and the aggregate is reduced
            # by `reward_key` (`episode_reward`): the step's reward under the key is that 0, and the episode goes on.
            logger.info("%s step %r: its rewards have no %r (%s): its step reward is 0.0, as Harbor's aggregation "
                        "counts it", self.label, step.name, key, ", ".join(sorted(rewards)))
            return 0.0
        return reduce_rewards(rewards, self.spec.reward_reduce, key, self.label)

    async def _start_verifier_sandbox(self, definition: Any, step: Any) -> tuple[BaseEnvironment, TrialPaths]:
        """Collect the declared artifacts from the task's sandbox, start the separate verifier's own sandbox
        (`raygrpo.envs.harbor.separate`; through the suite's gate, tracked like every sandbox) and place the
        artifacts in it; returns its environment and trial paths. The sandbox is closed after the verification.

        Raises:
            TaskError: The verifier's image does not build.
            HarborVerifierError: The verifier's sandbox did not start, or the artifacts could not be moved.
        """
        task = self.harbor_task
        agent_os = self.env.os
        self._artifacts_tmp = tempfile.mkdtemp(prefix="raygrpo-artifacts-", dir=process_scratch())
        try:
            artifacts_dir = await collect_artifacts(self.env, task, step, Path(self._artifacts_tmp))
        except Exception as exc:  # noqa: BLE001 - the task's sandbox could not hand its files over: infrastructure
            raise HarborVerifierError(f"{self.label}: could not collect the artifacts: {describe(exc)}") from exc
        if self._steps is None or self._steps.index + 1 >= len(self._steps.steps):
            # The last verification: the task's sandbox has no further use and is stopped first, as Harbor does
            # (its live slot is free for the verifier's; between steps both are alive).
            await self.sandbox.close()
            self._dead = "stopped before its separate verifier ran"
        sandbox = self._verifier_sandbox = HarborSandbox(self.context, self.sandbox.task_dir,
                                                         task=verifier_task(task, definition))
        began = time.perf_counter()
        try:
            await sandbox.start()
        except TimeoutError:
            raise HarborVerifierError(f"{self.label}: the verifier's sandbox did not start within start_timeout_s="
                                      f"{self.spec.start_timeout_s:g}") from None
        except (EnvError, TaskError):
            raise
        except Exception as exc:  # noqa: BLE001 - every backend fails its own way
            docker = self.context.docker
            broken = await docker.start_failed(sandbox.harbor_task, exc) if docker is not None else None
            if broken is not None:
                raise broken from exc
            cause = (docker.explain(exc) if docker is not None else None) or describe(exc)
            raise HarborVerifierError(f"{self.label}: the verifier's sandbox failed to start: {cause}") from exc
        finally:
            self.timings["verifier_start"] = time.perf_counter() - began
        try:
            await place_artifacts(sandbox.env, agent_os, task, step, artifacts_dir)
        except Exception as exc:  # noqa: BLE001 - uploading into the verifier's sandbox failed: infrastructure
            raise HarborVerifierError(f"{self.label}: could not place the artifacts in the verifier's sandbox: "
                                      f"{describe(exc)}") from exc
        return sandbox.env, sandbox.trial.paths

    async def _close_verifier_sandbox(self) -> None:
        """Close the separate verifier's sandbox, if one was started (`HarborSandbox.close`: never raises)."""
        sandbox, self._verifier_sandbox = self._verifier_sandbox, None
        folder, self._artifacts_tmp = self._artifacts_tmp, None
        try:
            if sandbox is not None:
                await sandbox.close()
        finally:
            if folder is not None:
                await asyncio.to_thread(shutil.rmtree, folder, True)

    @property
    def verifier(self) -> dict[str, Any] | None:
        """What the last verification left behind (`raygrpo.envs.harbor.verify.VerifierEvidence` as a dict); None
        before `score`."""
        return self._evidence.to_dict() if self._evidence is not None else None
