"""One episode of a Harbor task: `HarborAdapter` gets its sandbox (warm, cold or hedged), drives it through the
harness, grades it with Harbor's `Verifier` (`raygrpo.envs.harbor.grading`) and stops it; and the errors it raises
(the verifier's are `raygrpo.envs.harbor.grading`'s).

Outcomes, as the agent loop (`raygrpo.agent.rollout`) reports them:

- the sandbox fails to start, its healthcheck fails, or it dies mid-episode: `EnvError` -> `env_error` (retried);
- the task's image does not build or an image it names cannot be pulled: `TaskError` -> `task_error`, not retried;
- the task cannot run as it is, whatever the attempt (a host variable its env tables name is unset in the actor,
  the backend gives none of the GPUs or TPU it asks for, the local backend cannot read its Dockerfile or lay out a
  `COPY`; most are refused at load, `raygrpo.envs.harbor.tasks.check_task_dir`): `TaskError` -> `task_error`;
- the verifier crashes (cannot upload the tests, cannot read the results back, ...): `EnvError` -> `env_error`;
- the verifier runs past its deadline: `TimeoutError` (`HarborVerifierTimeout`) -> `timeout`, not retried;
- the verifier writes no usable reward (no file, an unparsable one, a missing `reward_key`, for a multi-step task
  in its steps' aggregate): `RewardMissingError` -> `task_error`, not retried;
- a separate verifier environment's image does not build: `task_error`; its sandbox does not start, or the
  artifacts cannot be moved into it: `HarborVerifierError` -> `env_error` (retried);
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
import time
from typing import TYPE_CHECKING, Any

from raygrpo.envs.base import EnvError, refuse_call
from raygrpo.envs.harbor.grading import EpisodeGrading
from raygrpo.envs.harbor.sandbox import StartDeadline
from raygrpo.envs.harbor.agent_processes import baseline_sessions
from raygrpo.envs.harbor.separate import uses_separate_verifier
from raygrpo.envs.harbor.solution import run_solution
from raygrpo.envs.harbor.steps import StepProgress, prepare_step
from raygrpo.envs.live import LiveAdapter, LiveAdapters
from raygrpo.envs.harbor.rewards import reduce_rewards
from raygrpo.core.errors import TaskError, describe
from raygrpo.sandbox.errors import SandboxDefinitionError
from raygrpo.core.types import Observation, TaskRef, ToolResult

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from raygrpo.envs.harbor.context import SuiteContext
    from raygrpo.envs.harbor.sandbox import HarborSandbox
    from raygrpo.envs.harbor.starts import SandboxStarts
    from raygrpo.envs.harbor.warm import WarmPool
    from raygrpo.envs.harbor.harness import Harness


class HarborStartError(EnvError):
    """The sandbox could not be created or started, or its healthcheck failed (retried as `env_error`)."""


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


class HarborAdapter(EpisodeGrading, LiveAdapter):
    """One episode of one Harbor task: a sandbox started in `start`, driven through the harness, graded by the
    task's verifier in `score` (`raygrpo.envs.harbor.grading.EpisodeGrading`), stopped in `close`.

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
        #: What the verifier's tooling lacks at start, by step name (`""` without steps): `_tooling_missing`.
        self._tooling: dict[str, list[str]] = {}
        #: Loop time by which the set-up after the sandbox's start must be done (None until it began).
        self._start_deadline: float | None = None
        #: Where a multi-step task's episode stands (None for a task without `[[steps]]`).
        self._steps: StepProgress | None = None

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
    def model_call_s(self) -> float:
        """How long a tool call may run by the model's doing: the harness's command deadline with its grace
        (`raygrpo.envs.base.ModelTimedCalls`)."""
        from raygrpo.envs.harbor.harness import EXEC_GRACE_S
        return float(getattr(self.harness, "exec_timeout_s", self.spec.exec_timeout_s)) + EXEC_GRACE_S

    @property
    def agent_timeout_s(self) -> float | None:
        """The current step's `[agent] timeout_sec`, else the task's (None if neither, or before `start`): the agent
        loop stops the model's turns there and has the episode verified, as Harbor does (`agent.limits.agent_phase`)."""
        if self.harbor_task is None:
            return None
        step = self._steps.step if self._steps is not None else None
        if step is not None and step.agent.timeout_sec is not None:
            return float(step.agent.timeout_sec)
        timeout = self.harbor_task.config.agent.timeout_sec
        return float(timeout) if timeout is not None else None

    @property
    def _tooling_missing(self) -> list[str]:
        """What the current step's (or the task's) verifier tooling lacked before the model acted."""
        return self._tooling.get(self._steps.step.name if self._steps is not None else "", [])

    @property
    def env(self) -> BaseEnvironment | None:
        """The sandbox's Harbor environment (None before it has one)."""
        return self.sandbox.env if self.sandbox is not None else None

    @property
    def session_id(self) -> str | None:
        return self.sandbox.session_id if self.sandbox is not None else None

    @property
    def _trial_paths(self) -> TrialPaths | None:
        return getattr(self.sandbox and self.sandbox.trial, "paths", None)

    @property
    def _trial_dir(self) -> str | None:
        return getattr(self.sandbox and self.sandbox.trial, "path", None)

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
        except TimeoutError as exc:
            deadline = self._start_deadline  # the set-up's, after the sandbox's own start
            if isinstance(exc, StartDeadline) or (deadline is not None
                                                  and asyncio.get_running_loop().time() >= deadline):
                self._dead = f"did not start within start_timeout_s={self.spec.start_timeout_s:g}"
                raise HarborStartError(f"{self.label}: the sandbox {self._dead}") from None
            # The backend's client gave up on a request of its own (not raygrpo's deadline): say so.
            self._dead = f"the backend's own request timed out ({describe(exc)})"
            raise HarborStartError(f"{self.label}: the sandbox failed to start: {self._dead}") from exc
        except SandboxDefinitionError as exc:  # the local backend cannot lay the task out: the same every time
            self._dead = describe(exc)
            raise TaskError(f"{self.label}: the sandbox cannot be set up for the task: {self._dead}") from None
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
        self._start_deadline = deadline
        async with asyncio.timeout_at(deadline):
            setup = getattr(self.harness, "setup", None)
            if setup is not None:
                await setup(env)
            # A separate verifier brings its own tooling: the task's sandbox is not probed for it.
            if self.spec.probe_verifier and not uses_separate_verifier(harbor_task.config):
                self._tooling = await tasks.tooling_missing(task_dir, harbor_task, env)
            if self.spec.stop_agent_processes:
                self._baseline_sessions = await baseline_sessions(env, self.label)
            instruction = harbor_task.instruction
            if harbor_task.has_steps:
                self._steps = StepProgress(harbor_task)
                await self._prepare_step(after_verifier=False)
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
            await self._prepare_step(after_verifier=True)
        finally:
            self.timings["step_setup"] = self.timings.get("step_setup", 0.0) + time.perf_counter() - began
        return Observation(messages=[{"role": "user", "content": self._steps.instruction()}], tools=[])

    async def _prepare_step(self, *, after_verifier: bool) -> None:
        """Prepare the sandbox for the current step (`prepare_step`); with `stop_agent_processes`, the sessions the
        step's `setup.sh` started join the baseline: the task's infrastructure (a service its tests query) is spared."""
        keep, env, label = self._baseline_sessions, self.env, self.label
        started = await prepare_step(env, self.harbor_task, self._steps.step, self._trial_paths,
                                     after_verifier=after_verifier, label=label,
                                     setup_sessions=(lambda: baseline_sessions(env, label)) if keep is not None else None)
        if keep is not None:
            keep |= started

    def episode_reward(self) -> float | None:
        """The episode's reward: for a multi-step task, its steps' rewards aggregated as Harbor aggregates them
        (`raygrpo.envs.harbor.steps.aggregate_rewards`), reduced as a single step's are; None when nothing was
        scored."""
        if self._steps is None:
            return None
        rewards = self._steps.episode_rewards()
        if rewards is None:
            return None
        return reduce_rewards(rewards, self.spec.reward_reduce, self.spec.reward_key,
                              f"{self.label} (its steps' aggregated rewards)")

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
