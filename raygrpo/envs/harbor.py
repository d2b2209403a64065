"""Harbor task sandboxes as raygrpo environments: `HarborProvider` (one per suite per actor) and `HarborAdapter`
(one episode: one sandbox).

Built on Harbor's own API: the sandbox is a `BaseEnvironment` made by Harbor's `EnvironmentFactory` (a built-in
`environment_type`, or a class by import path; raygrpo's local bubblewrap sandbox by default), optionally wrapped by
raygrpo's fault injector, and graded by Harbor's `Verifier` (uploads `tests/`, runs `test.sh`, reads
`/logs/verifier/reward.json` or `reward.txt`). Harbor's async clients bind to the loop that creates them, so every
environment is created inside `start`, on the env pool actor's loop; nothing loop-bound is made or pickled earlier.

Outcomes, as the agent loop (`raygrpo.rollout`) reports them:

- the sandbox fails to start, its healthcheck fails, or it dies mid-episode: `EnvError` -> `env_error` (retried);
- the task's image does not build (docker: a Dockerfile step fails): `TaskError` -> `task_error`, not retried;
- the verifier crashes (cannot upload the tests, cannot read the results back, ...): `EnvError` -> `env_error`;
- the verifier runs past its deadline: `TimeoutError` (`HarborVerifierTimeout`) -> `timeout`, not retried;
- the verifier writes no usable reward (no file, an empty or unparsable one, a missing `reward_key`):
  `RewardMissingError` -> `task_error`, not retried.

The oracle policy runs the task's reference solution through `run_solution` (as Harbor's oracle agent does); a
missing `solution/solve.sh` is a `TaskError`, a solution past the task's `[agent] timeout_sec` a `TimeoutError`
(`timeout`), a sandbox that cannot run it an `EnvError`; a solution that exits non-zero is left to the verifier.

None of them is ever scored 0.0. Whatever the outcome, what the verifier left behind (exit code, output tail, raw
rewards, and for failed verifications the sandbox's `/logs`) is the adapter's `verifier` (`raygrpo.envs.harbor_verify`)
and goes into the trajectory. Every sandbox that was started is stopped in `close()`, which is idempotent,
never raises, and finishes in the background when its rollout is cancelled; the provider's `aclose()` stops what is
still alive and waits for those background stops.

Remote sandboxes are leased (`raygrpo.envs.harbor_leases`, `raygrpo.sandbox.ledger`): for backends other than the
local bubblewrap backend and docker (whose sandboxes have owner-based reapers already, `raygrpo.sandbox.reaper`), an
intent record is written durably right before the create is sent, the sandbox carries the lease's label and a
lifetime derived from the rollout deadline, its id is added once known, and the record goes once the sandbox is
stopped; a failed stop keeps it for `raygrpo reap`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raygrpo.envs.base import EnvError, RewardMissingError, refuse_call
from raygrpo.envs.harbor_docker import DockerSupport
from raygrpo.envs.harbor_leases import HarborLeases
from raygrpo.envs.harbor_sandbox import HarborSandbox
from raygrpo.envs.harbor_solution import run_solution
from raygrpo.envs.harbor_starts import SandboxStarts
from raygrpo.envs.harbor_tasks import discover_task_dirs, load_environment_class, load_task
from raygrpo.envs.harbor_trial import keep_fresh
from raygrpo.envs.harbor_verify import VerifierEvidence, gather, probe_tooling, run_verifier
from raygrpo.envs.harbor_warm import WarmPool
from raygrpo.envs.harness import load_harness
from raygrpo.envs.live import LiveAdapter, LiveAdapters
from raygrpo.envs.rewards import reduce_rewards
from raygrpo.errors import TaskError, VerifierError, describe
from raygrpo.governor import BackoffSettings
from raygrpo.imports import is_file_spec, split_spec
from raygrpo.provisioning import LimiterFactory, ProvisioningGate, gate_for
from raygrpo.sandbox.faults import wrap_environment
from raygrpo.sandbox.toolbox import ToolboxError, ensure_toolbox
from raygrpo.specs.harbor import HarborSpec
from raygrpo.types import Observation, TaskRef, ToolResult

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

logger = logging.getLogger(__name__)


class HarborStartError(EnvError):
    """The sandbox could not be created or started, or its healthcheck failed (retried as `env_error`)."""


class HarborVerifierError(EnvError):
    """The task's verifier crashed (infrastructure: retried as `env_error`)."""


class HarborVerifierTimeout(TimeoutError):
    """The task's verifier ran past its deadline; the rollout ends unscored with status `timeout`."""


class HarborProvider:
    """Starts sandboxes for one Harbor suite on one event loop (the env pool actor's).

    Holds the harness class, a cache of parsed tasks, the provisioning gate (per-actor start concurrency and the
    cluster-wide create-rate limit, made lazily inside the loop) and the set of live adapters, so that `aclose()`
    can stop every sandbox still alive (shutdown, cancellation, Ctrl-C).

    Args:
        spec: The suite's spec (validated: absolute paths).
        name: The environment's name in the run config, for error messages and sandbox labels.
        limiters: Makes the client of the cluster-wide create-rate limiter of a provider key (the env pool actor
            passes the named Ray actor's); None limits the rate within this process only.
        rollout_timeout_s: The run's `rollout.rollout_timeout_s`, part of the lifetime a leased sandbox gets at its
            provider (`raygrpo.envs.harbor_leases`); None assumes the default.
    """

    def __init__(self, spec: HarborSpec, *, name: str | None = None, limiters: LimiterFactory | None = None,
                 rollout_timeout_s: float | None = None) -> None:
        # Harbor's modules take a moment to import: pay for it when the actor starts, not in the first rollout.
        import harbor.environments.factory  # noqa: F401
        import harbor.verifier.factory  # noqa: F401

        self.spec = spec
        self.name = name
        self.limiters = limiters
        self.rollout_timeout_s = rollout_timeout_s
        self.harness_cls = load_harness(spec.harness)
        self._environment_import_path = _harbor_import_path(spec.environment_import_path)
        #: The lease ledger around this suite's sandboxes (a no-op for local and docker sandboxes).
        self.leases = HarborLeases(spec, self.label, self._environment_import_path, rollout_timeout_s)
        self._tasks: dict[str, Task] = {}
        self._tooling: dict[str, list[str]] = {}
        self._task_dirs: list[str] | None = None
        self._live = LiveAdapters(self.label)
        self._closed = False
        #: raygrpo's additions to Harbor's docker backend (labels, an init, image reuse, build failures).
        self.docker = DockerSupport(self.label) if spec.environment_type == "docker" else None
        #: Every sandbox of the suite on this actor not closed yet: adapters', the warm pool's, hedges' losers.
        self.sandboxes = LiveAdapters(self.label)
        #: Starts sandboxes (hedged where the spec says), and measures them.
        self.starts = SandboxStarts(self, spec.hedge)
        #: Sandboxes started ahead for the tasks that come next (None without `warm_pool`).
        self.warm = WarmPool(self, self.starts, spec.warm_pool) if spec.warm_pool is not None else None
        if spec.backend == "local" and spec.environment_kwargs.get("toolbox", True):
            # Built once per machine; here, when the actor starts, rather than on the event loop of a first rollout.
            with contextlib.suppress(ToolboxError):  # then each start fails saying why (an env_error)
                ensure_toolbox()

    def __getstate__(self) -> dict[str, Any]:
        # Sandboxes, gates and adapters are loop-bound: a pickled provider carries only its configuration.
        return {"spec": self.spec, "name": self.name, "limiters": self.limiters,
                "rollout_timeout_s": self.rollout_timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"], name=state["name"], limiters=state["limiters"],
                      rollout_timeout_s=state.get("rollout_timeout_s"))

    # ── EnvProvider ──────────────────────────────────────────────────────────────────────────────────────────────

    def adapter(self) -> HarborAdapter:
        """A new, unstarted adapter (one episode, one sandbox)."""
        if self._closed:
            raise EnvError(f"{self.label}: the Harbor provider is closed")
        return HarborAdapter(self)

    def expect(self, tasks: list[TaskRef]) -> None:
        """Rollouts of these tasks come to this actor next: the warm pool starts sandboxes for them (nothing
        without a warm pool)."""
        if self.warm is not None and not self._closed:
            self.warm.expect([self.task_dir_of(t) for t in tasks])

    def stats(self) -> dict[str, Any]:
        """Its starts (hedges included) and its warm pool's figures."""
        out: dict[str, Any] = {"starts": self.starts.stats(), "open_sandboxes": self.sandboxes.open_count()}
        if self.warm is not None:
            out["warm_pool"] = self.warm.stats()
        return out

    async def aclose(self) -> None:
        """Stop every sandbox still alive (adapters', the warm pool's, hedges' losers) and wait for background stops
        of cancelled rollouts. Never raises; idempotent."""
        self._closed = True
        # Stops still running in the background (their rollouts were cancelled) must finish before the actor
        # reports it is shut down, or the sandboxes outlive it.
        await self._live.close_all(self.spec.stop_timeout_s + 5, "sandbox(es)")
        if self.warm is not None:
            await self.warm.aclose()
        await self.starts.aclose()
        await self.sandboxes.close_all(self.spec.stop_timeout_s + 5, "sandbox(es)")

    # ── used by adapters ─────────────────────────────────────────────────────────────────────────────────────────

    @property
    def label(self) -> str:
        """How errors name this suite: `envs.<name>.path (<folder>)`."""
        return f"{self.spec.field_path(self.name)} ({self.spec.path})"

    @property
    def live_sandboxes(self) -> int:
        """Sandboxes of this provider whose start began and that are not closed yet (warm ones included)."""
        return self.sandboxes.open_count()

    @property
    def gate(self) -> ProvisioningGate:
        """This actor's provisioning gate of the suite's rate-limit key (`raygrpo.provisioning.gate_for`): start
        concurrency per actor, the cluster-wide create rate and live cap, and the back-off of refused creates. Made
        on first use on the running loop; suites on the same key share it (gates hold no resources to release)."""
        backoff = self.spec.rate_limit_backoff
        return gate_for(
            self.spec.effective_rate_limit_key,
            max_concurrent_starts=self.spec.max_concurrent_starts,
            rate_per_s=self.spec.create_rate_per_s,
            max_live=self.spec.max_live,
            backoff=BackoffSettings(backoff.initial_s, backoff.max_s, backoff.jitter, backoff.give_up_after_s),
            limiters=self.limiters,
        )

    def task(self, task_dir: str) -> Task:
        """Harbor's parsed task for a task dir (cached: every rollout of a task shares it, read-only)."""
        task = self._tasks.get(task_dir)
        if task is None:
            task = self._tasks[task_dir] = load_task(task_dir)
        return task

    def task_dir_of(self, ref: TaskRef) -> str:
        """The task dir a `TaskRef` points at: its `task_dir` metadata, else its index into the suite."""
        task_dir = ref.metadata.get("task_dir") if ref.metadata else None
        if isinstance(task_dir, str) and task_dir:
            return task_dir
        if self._task_dirs is None:
            self._task_dirs = [str(d) for d in discover_task_dirs(Path(self.spec.path))]
        dirs = self._task_dirs
        if not 0 <= ref.index < len(dirs):
            raise EnvError(f"{self.label}: task index {ref.index} is out of range (the suite has {len(dirs)} tasks)")
        return dirs[ref.index]

    async def create_environment(self, task: Task, trial_paths: TrialPaths, session_id: str) -> BaseEnvironment:
        """Build (not start) the task's sandbox through Harbor's `EnvironmentFactory`, with fault injection when
        the spec configures it (on docker, with raygrpo's compose file and the task's image once it is built; on a
        leased backend, with the lease's label and the sandbox's lifetime, the lease id being `session_id`)."""
        from harbor.environments.factory import EnvironmentFactory
        from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig

        kwargs = dict(self.spec.environment_kwargs)
        task_env_config = task.config.environment.model_copy(deep=True)
        if self.docker is not None:
            task_env_config, kwargs = await self.docker.prepare(task, trial_paths.trial_dir, kwargs, session_id)
        kwargs = self.leases.backend_kwargs(kwargs, task, session_id)
        config = TrialEnvironmentConfig(
            type=self.spec.environment_type,
            import_path=self._environment_import_path,
            delete=self.spec.stop_delete,
            kwargs=kwargs,
        )
        env = EnvironmentFactory.create_environment_from_config(
            config=config,
            environment_dir=task.paths.environment_dir,
            environment_name=task.short_name,
            session_id=session_id,
            trial_paths=trial_paths,
            task_env_config=task_env_config,
            logger=logger,
        )
        if self.spec.faults is not None:
            env = wrap_environment(env, self.spec.faults)
        try:
            mounted = env.capabilities.mounted
        except Exception:  # noqa: BLE001 - a backend that cannot say is taken to mount it
            mounted = True
        if mounted:
            keep_fresh(trial_paths.trial_dir)
        return env

    async def tooling_missing(self, task_dir: str, task: Task, env: BaseEnvironment) -> list[str]:
        """What the task's `test.sh` needs and its sandboxes lack, probed in `env` (a sandbox no model has acted in
        yet) the first time a task starts here; its later sandboxes start from the same image and reuse it."""
        found = self._tooling.get(task_dir)
        if found is None:
            found = self._tooling[task_dir] = await probe_tooling(env, task, offline_tooling=self.spec.offline_tooling)
            if found:
                logger.warning("%s task %s: its verifier needs what its sandbox lacks: %s; rollouts it does not award "
                               "full reward are verifier_error", self.label, task.name, ", ".join(found))
        return found

    def _register(self, adapter: HarborAdapter) -> None:
        if self._closed:
            raise EnvError(f"{self.label}: the Harbor provider is closed")
        self._live.add(adapter)


class HarborAdapter(LiveAdapter):
    """One episode of one Harbor task: a sandbox started in `start`, driven through the harness, graded by the
    task's verifier in `score`, stopped in `close`.

    `timings` records seconds per phase of this episode: of its sandbox's start when it started one (`create`,
    `governor_wait`, `backoff`, `start`, `healthcheck`), the wait for a warm one (`warm_wait`), then `exec` (summed
    over calls), `verify`, `stop`; for summaries, benchmarks and debugging.

    Args:
        provider: The provider (suite, harness, gate) this adapter belongs to.
    """

    def __init__(self, provider: HarborProvider) -> None:
        super().__init__(provider._live)
        spec = provider.spec
        self.provider = provider
        self.spec = spec
        self.harness = provider.harness_cls(exec_timeout_s=spec.exec_timeout_s, max_output_chars=spec.max_output_chars)
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

    # ── state ─────────────────────────────────────────────────────────────────────────────────────────────────────

    @property
    def label(self) -> str:
        name = f" task {self.harbor_task.name}" if self.harbor_task is not None else ""
        return f"{self.provider.label}{name}"

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
        (hedged when the spec says so). The sandbox start runs inside the provider's provisioning gate (per-actor concurrency, cluster-wide create
        rate); `start_timeout_s` counts from when the gate lets it in, so waiting for a slot never fails a start. On
        any failure the adapter must still be closed (`close` is safe after a failed or cancelled start).

        Raises:
            HarborStartError: Creating or starting the sandbox failed, the healthcheck failed, or the deadline
                passed.
            TaskError: The task's image does not build (docker: a Dockerfile step failed).
        """
        if self._started or self._closed:
            raise HarborStartError(f"{self.label}: start() may be called once, on a new adapter")
        self._started = True
        self.task = task
        self.provider._register(self)
        try:
            return await self._start(task)
        except (EnvError, TaskError):
            raise
        except TimeoutError:
            self._dead = f"did not start within start_timeout_s={self.spec.start_timeout_s:g}"
            raise HarborStartError(f"{self.label}: the sandbox {self._dead}") from None
        except Exception as exc:  # noqa: BLE001 - every backend fails its own way; all are start failures
            self._dead = describe(exc)
            docker = self.provider.docker
            broken = await docker.start_failed(self.harbor_task, exc) if docker is not None else None
            if broken is not None:
                raise broken from exc
            raise HarborStartError(f"{self.label}: the sandbox failed to start: {self._dead}") from exc

    async def _start(self, task: TaskRef) -> Observation:
        clock = time.perf_counter
        provider = self.provider
        task_dir = provider.task_dir_of(task)
        harbor_task = self.harbor_task = provider.task(task_dir)
        sandbox = None
        if provider.warm is not None:
            began = clock()
            sandbox = await provider.warm.take(task_dir)
            self.timings["warm_wait"] = clock() - began
        if sandbox is not None:
            self.sandbox, self.provenance = sandbox, "warm"
            deadline = asyncio.get_running_loop().time() + self.spec.start_timeout_s
        else:
            sandbox, hedged = await provider.starts.start(task_dir)
            self.sandbox, self.provenance = sandbox, "hedged" if hedged else "cold"
            self.timings.update(sandbox.timings)
            deadline = sandbox.deadline
        env = sandbox.env
        async with asyncio.timeout_at(deadline):
            setup = getattr(self.harness, "setup", None)
            if setup is not None:
                await setup(env)
            if self.spec.probe_verifier:
                self._tooling_missing = await provider.tooling_missing(task_dir, harbor_task, env)
        self.timings["exec"] = 0.0
        tools = copy.deepcopy(list(self.harness.tools))
        self._tool_names = {t["function"]["name"] for t in tools}
        return Observation(messages=[{"role": "user", "content": harbor_task.instruction}], tools=tools)

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
        `raygrpo.envs.harbor_solution.run_solution`, which says what it returns and raises).

        Raises:
            TaskError: The task has no runnable `solution/solve.sh`.
            HarborSolutionTimeout (`raygrpo.envs.harbor_solution`): `solve.sh` ran past the task's `[agent] timeout_sec`.
            EnvError: The sandbox is dead, or uploading or running the solution failed (infrastructure: retried).
        """
        if not self._started or self.env is None or self.harbor_task is None:
            raise EnvError(f"{self.label}: run_solution() before start()")
        if self._dead is not None:
            raise EnvError(f"{self.label}: the sandbox is dead ({self._dead})")
        began = time.perf_counter()
        try:
            return await run_solution(self.env, self.harbor_task, self.label)
        except EnvError as exc:
            self._dead = str(exc)
            raise
        finally:
            self.timings["solution"] = time.perf_counter() - began

    async def score(self) -> float:
        """Run the task's verifier in the sandbox and reduce its rewards to one number. What the verifier left
        behind (exit code, output tail, raw rewards, and for a failed verification the sandbox's `/logs`) is in
        `verifier` afterwards, however it ended.

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
                self._check_tooling(None, exc)
                raise
            self._check_tooling(reward)
            return reward
        finally:
            self.timings["verify"] = time.perf_counter() - began
            if not self._score_cancelled:
                keep = self.spec.keep_logs == "all" or (self.spec.keep_logs == "failed" and not (reward or 0) >= 1.0)
                await gather(self.env, self._trial_paths, evidence, keep_logs=keep,
                             keep_logs_kib=self.spec.keep_logs_kib, label=self.label)

    def _check_tooling(self, reward: float | None, cause: BaseException | None = None) -> None:
        """The verdict stands unless the probe at start showed the verifier's tooling missing and the verifier then
        did not award full reward: then it is not the model's (`VerifierError`, status `verifier_error`)."""
        if not self._tooling_missing or (reward is not None and reward >= 1.0):
            return
        verdict = f"reward {reward:g}" if reward is not None else "no reward"
        raise VerifierError(
            f"{self.label}: the verifier's tooling was missing before the model acted: "
            f"{', '.join(self._tooling_missing)}; its verdict ({verdict}) is not the model's") from cause

    async def _score(self, evidence: VerifierEvidence) -> float:
        from harbor.verifier.verifier import RewardFileEmptyError, RewardFileNotFoundError, VerifierOutputParseError
        from pydantic import ValidationError

        timeout = self.spec.verifier_timeout_s or self.harbor_task.config.verifier.timeout_sec
        try:
            result = await asyncio.wait_for(
                run_verifier(self.env, self.harbor_task, self._trial_paths, evidence,
                             offline_tooling=self.spec.offline_tooling), timeout)
        except TimeoutError:
            raise HarborVerifierTimeout(f"{self.label}: the verifier did not finish within {timeout:g} s") from None
        except (RewardFileNotFoundError, RewardFileEmptyError, VerifierOutputParseError, ValidationError) as exc:
            raise RewardMissingError(f"{self.label}: the verifier wrote no usable reward: {describe(exc)}") from None
        except asyncio.CancelledError:
            self._score_cancelled = True
            raise
        except EnvError:
            raise
        except Exception as exc:  # noqa: BLE001 - uploading tests, running test.sh or reading results failed
            raise HarborVerifierError(f"{self.label}: the verifier crashed: {describe(exc)}") from exc
        return reduce_rewards(dict(result.rewards or {}), self.spec.reward_reduce, self.spec.reward_key, self.label)

    @property
    def verifier(self) -> dict[str, Any] | None:
        """What the last verification left behind (`raygrpo.envs.harbor_verify.VerifierEvidence` as a dict); None
        before `score`."""
        return self._evidence.to_dict() if self._evidence is not None else None

    def _holds_resources(self) -> bool:
        return self.sandbox is not None

    async def _release(self) -> None:
        """Close the episode's sandbox (see `HarborSandbox.close`: the stop, the lease, the live ticket, the host
        files)."""
        began = time.perf_counter()
        try:
            await self.sandbox.close()
        finally:
            self.timings["stop"] = self.sandbox.timings.get("stop", time.perf_counter() - began)


def _harbor_import_path(spec: str | None) -> str | None:
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
