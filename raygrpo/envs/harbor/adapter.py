"""One episode of a Harbor task: `HarborAdapter` gets its sandbox (warm, cold or hedged), drives it through the
harness, grades it with Harbor's `Verifier` and stops it; and the errors it raises.

Outcomes, as the agent loop (`raygrpo.agent.rollout`) reports them:

- the sandbox fails to start, its healthcheck fails, or it dies mid-episode: `EnvError` -> `env_error` (retried);
- the task's image does not build (docker: a Dockerfile step fails) or an image it names cannot be pulled (a compose
  sidecar's): `TaskError` -> `task_error`, not retried, with the daemon's own line;
- the verifier crashes (cannot upload the tests, cannot read the results back, ...): `EnvError` -> `env_error`;
- the verifier runs past its deadline: `TimeoutError` (`HarborVerifierTimeout`) -> `timeout`, not retried;
- the verifier writes no usable reward (no file, an empty or unparsable one, a missing `reward_key`):
  `RewardMissingError` -> `task_error`, not retried;
- a separate verifier environment's image does not build: `TaskError` -> `task_error`; its sandbox does not start,
  or the declared artifacts cannot be moved into it: `HarborVerifierError` -> `env_error` (retried);
- a multi-step task's step `setup.sh` fails: `TaskError` -> `task_error`; its healthcheck fails: `EnvError`.

The oracle policy runs the task's reference solution through `run_solution` (as Harbor's oracle agent does); a
missing `solution/solve.sh` is a `TaskError`, a solution past the task's `[agent] timeout_sec` a `TimeoutError`
(`timeout`), a sandbox that cannot run it an `EnvError`; a solution that exits non-zero is left to the verifier.

None of them is ever scored 0.0. Whatever the outcome, what the verifier left behind (exit code, output tail, raw
rewards, and for failed verifications the sandbox's `/logs`) is the adapter's `verifier` (`raygrpo.envs.harbor.verify`)
and goes into the trajectory. Every sandbox that was started is stopped in `close()`, which is idempotent,
never raises, and finishes in the background when its rollout is cancelled; the provider's `aclose()` stops what is
still alive and waits for those background stops (`Episodes`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raygrpo.envs.base import EnvError, RewardMissingError, refuse_call
from raygrpo.envs.harbor.sandbox import HarborSandbox
from raygrpo.envs.harbor.separate import (collect_artifacts, place_artifacts, uses_separate_verifier,
                                          verifier_definition, verifier_task)
from raygrpo.envs.harbor.solution import run_solution
from raygrpo.envs.harbor.steps import StepProgress, prepare_step
from raygrpo.envs.harbor.tooling import probe_commands
from raygrpo.envs.harbor.verify import VerifierEvidence, gather, missing_at_verify, run_verifier
from raygrpo.envs.live import LiveAdapter, LiveAdapters
from raygrpo.envs.harbor.rewards import reduce_rewards
from raygrpo.core.errors import TaskError, VerifierError, describe
from raygrpo.core.scratch import process_scratch
from raygrpo.core.types import Observation, TaskRef, ToolResult

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from raygrpo.envs.harbor.context import SuiteContext
    from raygrpo.envs.harbor.starts import SandboxStarts
    from raygrpo.envs.harbor.warm import WarmPool
    from raygrpo.envs.harbor.harness import Harness

logger = logging.getLogger(__name__)


class HarborStartError(EnvError):
    """The sandbox could not be created or started, or its healthcheck failed (retried as `env_error`)."""


class HarborVerifierError(EnvError):
    """The task's verifier crashed (infrastructure: retried as `env_error`)."""


class HarborVerifierTimeout(TimeoutError):
    """The task's verifier ran past its deadline; the rollout ends unscored with status `timeout`."""


class Episodes(LiveAdapters):
    """A suite's episodes (adapters) on one actor not closed yet; once closed, it refuses new ones.

    Args:
        label: How errors and logs name the suite.
    """

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self._refusing = False

    @property
    def refusing(self) -> bool:
        """Whether the suite was closed (no new episode may start)."""
        return self._refusing

    def register(self, adapter: HarborAdapter) -> None:
        """Track a starting episode, so that `close` stops its sandbox (refused once closed)."""
        if self._refusing:
            raise EnvError(f"{self.label}: the Harbor provider is closed")
        self.add(adapter)

    async def close(self, timeout_s: float) -> None:
        """Refuse new episodes, close those still open, and wait (up to `timeout_s`) for the stops still running in
        the background (their rollouts were cancelled)."""
        self._refusing = True
        await self.close_all(timeout_s, "sandbox(es)")


class HarborAdapter(LiveAdapter):
    """One episode of one Harbor task: a sandbox started in `start`, driven through the harness, graded by the
    task's verifier in `score`, stopped in `close`.

    `timings` records seconds per phase of this episode: of its sandbox's start when it started one (`create`,
    `governor_wait`, `backoff`, `start`, `healthcheck`), the wait for a warm one (`warm_wait`), then `exec` (summed
    over calls), `verify`, `stop`; for summaries, benchmarks and debugging.

    Args:
        context: The suite the episode's task is of (spec, tasks, docker support).
        harness_cls: The suite's harness (the tools the model sees), made once per episode.
        starts: Starts the episode's sandbox when the warm pool holds none.
        warm: The suite's warm pool (None without `warm_pool`).
        episodes: The suite's episodes not closed yet; this one joins them when it starts.
    """

    def __init__(self, context: SuiteContext, *, harness_cls: type[Harness], starts: SandboxStarts,
                 warm: WarmPool | None, episodes: Episodes) -> None:
        super().__init__(episodes)
        spec = context.spec
        self.context = context
        self.starts = starts
        self.warm = warm
        self.episodes = episodes
        self.spec = spec
        self.harness = harness_cls(exec_timeout_s=spec.exec_timeout_s, max_output_chars=spec.max_output_chars)
        self.task: TaskRef | None = None
        self.harbor_task: Task | None = None
        #: The episode's sandbox, once it has one (started for it, or adopted from the warm pool).
        self.sandbox: HarborSandbox | None = None
        #: How it got it: `"cold"` (started for it), `"hedged"` (a second start won), `"warm"` (the warm pool's).
        self.provenance: str | None = None
        self.timings: dict[str, float] = {}
        self._tool_names: set[str] = set()
        self._dead: str | None = None
        self._evidence: VerifierEvidence | None = None
        self._score_cancelled = False
        self._tooling_missing: list[str] = []
        #: Where a multi-step task's episode stands (None for a task without `[[steps]]`).
        self._steps: StepProgress | None = None
        #: The sandbox a separate verifier environment runs in, while a verification holds one.
        self._verifier_sandbox: HarborSandbox | None = None
        #: Where the artifacts of the verification under way are kept on the host (removed after it).
        self._artifacts_tmp: str | None = None

    # ── state ─────────────────────────────────────────────────────────────────────────────────────────────────────

    @property
    def label(self) -> str:
        # The run's name of the task (its folder's when tasks of the suite share a `[task] name`), else Harbor's.
        known = self.task.metadata.get("task_name") if self.task is not None else None
        name = known or (self.harbor_task.name if self.harbor_task is not None else None)
        name = f" task {name}" if name else ""
        return f"{self.context.label}{name}"

    @property
    def multi_step(self) -> bool:
        """Whether this episode's task has `[[steps]]` (`raygrpo.envs.base.SteppedAdapter`; known after `start`)."""
        return self._steps is not None

    @property
    def env(self) -> BaseEnvironment | None:
        """The sandbox's Harbor environment (None before it has one)."""
        return self.sandbox.env if self.sandbox is not None else None

    @property
    def session_id(self) -> str | None:
        return self.sandbox.session_id if self.sandbox is not None else None

    @property
    def _trial_paths(self) -> TrialPaths | None:
        trial = self.sandbox.trial if self.sandbox is not None else None
        return trial.paths if trial is not None else None

    @property
    def _trial_dir(self) -> str | None:
        trial = self.sandbox.trial if self.sandbox is not None else None
        return trial.path if trial is not None else None

    # ── EnvAdapter ────────────────────────────────────────────────────────────────────────────────────────────────

    async def start(self, task: TaskRef) -> Observation:
        """Get the task's sandbox, started and prepared (`HarborSandbox.start`: created, started, healthchecked,
        `/logs/verifier` made), run the harness's set-up in it, and return the instruction with the harness's tools.

        The sandbox is the warm pool's where it holds one of the task that passes its check, else one started now
        (hedged when the spec says so). The sandbox start runs inside the suite's provisioning gate (per-actor
        concurrency, cluster-wide create rate); `start_timeout_s` counts from when the gate lets it in, so waiting
        for a slot never fails a start. On any failure the adapter must still be closed (`close` is safe after a
        failed or cancelled start).

        Raises:
            HarborStartError: Creating or starting the sandbox failed, the healthcheck failed, or the deadline
                passed.
            TaskError: The task's image does not build (docker: a Dockerfile step failed).
        """
        if self._started or self._closed:
            raise HarborStartError(f"{self.label}: start() may be called once, on a new adapter")
        self._started = True
        self.task = task
        self.episodes.register(self)
        try:
            return await self._start(task)
        except (EnvError, TaskError):
            raise
        except TimeoutError:
            self._dead = f"did not start within start_timeout_s={self.spec.start_timeout_s:g}"
            raise HarborStartError(f"{self.label}: the sandbox {self._dead}") from None
        except Exception as exc:  # noqa: BLE001 - every backend fails its own way; all are start failures
            docker = self.context.docker
            self._dead = (docker.explain(exc) if docker is not None else None) or describe(exc)
            broken = await docker.start_failed(self.harbor_task, exc) if docker is not None else None
            if broken is not None:
                raise broken from exc
            raise HarborStartError(f"{self.label}: the sandbox failed to start: {self._dead}") from exc

    async def _start(self, task: TaskRef) -> Observation:
        clock = time.perf_counter
        tasks = self.context.tasks
        task_dir = tasks.task_dir_of(task)
        harbor_task = self.harbor_task = tasks.task(task_dir)
        sandbox = None
        if self.warm is not None:
            began = clock()
            sandbox = await self.warm.take(task_dir)
            self.timings["warm_wait"] = clock() - began
        if sandbox is not None:
            self.sandbox, self.provenance = sandbox, "warm"
            deadline = asyncio.get_running_loop().time() + self.spec.start_timeout_s
        else:
            sandbox, hedged = await self.starts.start(task_dir, tickets=self.warm)
            self.sandbox, self.provenance = sandbox, "hedged" if hedged else "cold"
            self.timings.update(sandbox.timings)
            deadline = sandbox.deadline
        env = sandbox.env
        async with asyncio.timeout_at(deadline):
            setup = getattr(self.harness, "setup", None)
            if setup is not None:
                await setup(env)
            # A separate verifier brings its own tooling: the task's sandbox is not probed for it.
            if self.spec.probe_verifier and not uses_separate_verifier(harbor_task.config):
                self._tooling_missing = await tasks.tooling_missing(task_dir, harbor_task, env)
            instruction = harbor_task.instruction
            if harbor_task.has_steps:
                self._steps = StepProgress(harbor_task)
                await prepare_step(env, harbor_task, self._steps.step, self._trial_paths, after_verifier=False,
                                   label=self.label)
                instruction = self._steps.instruction()
        self.timings["exec"] = 0.0
        tools = copy.deepcopy(list(self.harness.tools))
        self._tool_names = {t["function"]["name"] for t in tools}
        return Observation(messages=[{"role": "user", "content": instruction}], tools=tools)

    async def next_step(self) -> Observation | None:
        """After `score`: the next step's instruction as a new user turn, the sandbox prepared for it
        (`raygrpo.envs.harbor.steps.prepare_step`), or None when the episode is over (no `[[steps]]`, the last step
        was scored, or the step's rewards missed its `min_reward`).

        Raises:
            TaskError: The next step's `setup.sh` failed (`StepSetupError`).
            EnvError: The sandbox is dead, or could not be prepared (its healthcheck failed, an upload failed).
        """
        if self._steps is None or self._evidence is None:
            return None
        if not self._steps.finish(self._evidence.rewards):
            return None
        if self._dead is not None:
            raise EnvError(f"{self.label}: the sandbox is dead ({self._dead})")
        began = time.perf_counter()
        try:
            await prepare_step(self.env, self.harbor_task, self._steps.step, self._trial_paths, after_verifier=True,
                               label=self.label)
        finally:
            self.timings["step_setup"] = self.timings.get("step_setup", 0.0) + time.perf_counter() - began
        return Observation(messages=[{"role": "user", "content": self._steps.instruction()}], tools=[])

    def episode_reward(self) -> float | None:
        """The episode's reward: for a multi-step task, its steps' rewards aggregated as Harbor aggregates them
        (`raygrpo.envs.harbor.steps.aggregate_rewards`), reduced as a single step's are; None when nothing was
        scored."""
        if self._steps is None:
            return None
        rewards = self._steps.episode_rewards()
        if rewards is None:
            return None
        return reduce_rewards(rewards, self.spec.reward_reduce, self.spec.reward_key, self.label)

    @property
    def steps_stopped(self) -> str | None:
        """Why a multi-step episode ended before its last step (a `min_reward` missed), when it did."""
        return self._steps.stopped if self._steps is not None else None

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one harness tool call in the sandbox.

        Unknown tools and non-object arguments are refused without touching the sandbox; a command that times out
        comes back as an error result (the episode goes on).

        Raises:
            EnvError: The sandbox is dead (an exec failed for another reason than a timeout), or the adapter is not
                started / already closed.
        """
        if self._closed:
            raise EnvError(f"{self.label}: call() after close()")
        if not self._started or self.env is None:
            raise EnvError(f"{self.label}: call() before start()")
        if self._dead is not None:
            raise EnvError(f"{self.label}: the sandbox is dead ({self._dead})")
        refused = refuse_call(name, arguments, self._tool_names)
        if refused is not None:
            return refused
        began = time.perf_counter()
        try:
            return await self.harness.call(self.env, name, arguments)
        except EnvError as exc:
            self._dead = str(exc)
            raise EnvError(f"{self.label}: {exc}") from exc
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a harness that breaks leaves the sandbox in an unknown state
            self._dead = describe(exc)
            raise EnvError(f"{self.label}: tool {name!r} failed: {self._dead}") from exc
        finally:
            self.timings["exec"] = self.timings.get("exec", 0.0) + time.perf_counter() - began

    async def answer(self, text: str) -> None:
        """A final plain answer ends the episode; the verifier (`score`) judges the sandbox, not the text."""
        return None

    async def run_solution(self) -> ToolResult:
        """Run the task's reference solution in the sandbox, as Harbor's oracle agent does (see
        `raygrpo.envs.harbor.solution.run_solution`, which says what it returns and raises).

        Raises:
            TaskError: The task has no runnable `solution/solve.sh`.
            HarborSolutionTimeout (`raygrpo.envs.harbor.solution`): `solve.sh` ran past the task's `[agent] timeout_sec`.
            EnvError: The sandbox is dead, or uploading or running the solution failed (infrastructure: retried).
        """
        if not self._started or self.env is None or self.harbor_task is None:
            raise EnvError(f"{self.label}: run_solution() before start()")
        if self._dead is not None:
            raise EnvError(f"{self.label}: the sandbox is dead ({self._dead})")
        began = time.perf_counter()
        try:
            step = self._steps.step if self._steps is not None else None
            return await run_solution(self.env, self.harbor_task, self.label, step)
        except EnvError as exc:
            self._dead = str(exc)
            raise
        finally:
            self.timings["solution"] = time.perf_counter() - began

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
        did not award full reward: then it is not the model's (`VerifierError`, status `verifier_error`). A missing
        command counts only when the verifier's shell also failed to find it while it ran
        (`raygrpo.envs.harbor.verify_missing`): a word the probe took for a command never sets a verdict aside."""
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
        if not missing:
            return
        verdict = f"reward {reward:g}" if reward is not None else "no reward"
        raise VerifierError(
            f"{self.label}: the verifier's tooling was missing before the model acted: "
            f"{', '.join(missing)}; its verdict ({verdict}) is not the model's") from cause

    async def _score(self, evidence: VerifierEvidence) -> float:
        from harbor.verifier.verifier import RewardFileEmptyError, RewardFileNotFoundError, VerifierOutputParseError
        from pydantic import ValidationError

        step = self._steps.step if self._steps is not None else None
        timeout = self.spec.verifier_timeout_s or (step.verifier.timeout_sec if step is not None else None) \
            or self.harbor_task.config.verifier.timeout_sec
        definition = verifier_definition(self.harbor_task, step)
        env, trial_paths = self.env, self._trial_paths
        try:
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
        except (EnvError, TaskError):
            raise
        except Exception as exc:  # noqa: BLE001 - uploading tests, running test.sh or reading results failed
            raise HarborVerifierError(f"{self.label}: the verifier crashed: {describe(exc)}") from exc
        return reduce_rewards(dict(result.rewards or {}), self.spec.reward_reduce, self.spec.reward_key, self.label)

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

    def _holds_resources(self) -> bool:
        return self.sandbox is not None or self._verifier_sandbox is not None or self._artifacts_tmp is not None

    async def _release(self) -> None:
        """Close the episode's sandbox (see `HarborSandbox.close`: the stop, the lease, the live ticket, the host
        files)."""
        began = time.perf_counter()
        try:
            await self._close_verifier_sandbox()
            if self.sandbox is not None:
                await self.sandbox.close()
        finally:
            if self.sandbox is not None:
                self.timings["stop"] = self.sandbox.timings.get("stop", time.perf_counter() - began)
