"""One Harbor sandbox from create to stop: `HarborSandbox`, the unit an adapter runs its episode in.

Its start is the whole sequence a sandbox goes through before a model may act in it: the backend is made through
Harbor's factory, a live ticket is taken from the provisioning gate (the cluster-wide live cap), the lease intent is
written, a start slot is waited for (per-actor concurrency, the create rate), the backend's `start` runs and the lease
gets the sandbox's id, a provider's refusal (429) is backed off and queued again, and the sandbox is prepared (copied
files re-uploaded where a backend drops them, the task's healthcheck, `/logs/verifier`, the agent user). Its stop
undoes all of it once: the backend's `stop` (retried), the lease, the live ticket, the host files. A sandbox whose stop
failed keeps its live ticket, and its stop is tried again in the background, until it is known gone (stopped, or its
lease's lifetime at the provider is over): the live cap counts what may be alive, not what was asked to stop.

A sandbox belongs to no episode: an adapter starts one for itself, or adopts one that the suite's warm pool
(`raygrpo.envs.harbor.warm`) or a hedged start (`raygrpo.envs.harbor.starts`) started before it asked. Whoever holds it
last closes it; the suite's context tracks every sandbox that is not closed (`SuiteContext.sandboxes`), so that the
provider's `aclose` stops those nobody adopted.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol

from tenacity import AsyncRetrying, stop_after_attempt, wait_exponential

from raygrpo.envs.base import EnvError
from raygrpo.envs.harbor.environment import create_environment
from raygrpo.envs.harbor.files import upload_copied_files
from raygrpo.envs.harbor.trial import TrialDir
from raygrpo.envs.live import LiveAdapter
from raygrpo.core.errors import describe
from raygrpo.governor import rate_limit_signal

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.task import Task

    from raygrpo.envs.harbor.context import SuiteContext
    from raygrpo.governor.gate import ProvisioningGate
    from raygrpo.leases.ledger import Lease

logger = logging.getLogger(__name__)

#: Tries of a sandbox's stop within its `stop_timeout_s`, and the first pause between two (doubling, at most 2 s).
STOP_ATTEMPTS = 3
STOP_RETRY_WAIT_S = 0.5
#: After a failed stop: the first pause before it is tried again in the background, the longest, and how long that
#: goes on for a sandbox whose lifetime at the provider is not known.
RESTOP_INITIAL_S = 5.0
RESTOP_MAX_S = 60.0
RESTOP_GIVE_UP_S = 600.0
#: Background stops of sandboxes whose stop failed (strong references until they are done).
_STOPPING: set[asyncio.Task] = set()


class TicketYielder(Protocol):
    """A warm pool, as a start under a live cap sees it: a rollout's own start comes before the pool's."""

    async def ticket_for_cold(self, acquire: Awaitable[str | None]) -> str | None: ...

    async def ticket_for_warm(self, acquire: Awaitable[str | None]) -> str | None: ...


class StartDeadline(TimeoutError):
    """The sandbox's start ran past raygrpo's own deadline (`start_timeout_s`), not a timeout of the backend's
    client (which stays the backend's `TimeoutError`, and is reported as what it is)."""


class SandboxUnhealthy(EnvError):
    """A started sandbox failed the check made before a rollout adopts it (it is stopped and replaced)."""


class HarborSandbox(LiveAdapter):
    """One sandbox of one task: started once (`start`), checked before a later adoption (`check`), closed once
    (`close`, never raises, finishes in the background when its caller is cancelled).

    `timings` holds seconds per phase of its start (`create`, `governor_wait`, `backoff`, `start`, `healthcheck`)
    and of its stop (`stop`). `start` raises what the backend raised (the adapter says what it means for the
    rollout); the sandbox must be closed whatever `start` did.

    Args:
        context: The task's suite (spec, gate, leases, docker support, the sandboxes it tracks).
        task_dir: The task dir the sandbox is for.
        for_pool: Started by the warm pool, ahead of any rollout. A start for a rollout (`False`) that waits for a
            live ticket has the warm pool stop idle sandboxes to free one (`WarmPool.ticket_for_cold`); a pool's
            start still waiting for one then gives up (`WarmPool.ticket_for_warm`).
        tickets: The suite's warm pool, which orders live tickets under a live cap (a rollout's own start before
            the pool's); None without a warm pool.
        task: The task to start it for, when it is not the suite's task of `task_dir` as loaded (a separate verifier
            environment's view of it: `raygrpo.envs.harbor.separate.verifier_task`).
    """

    def __init__(self, context: SuiteContext, task_dir: str, for_pool: bool = False, *,
                 tickets: TicketYielder | None = None, task: Task | None = None) -> None:
        super().__init__(context.sandboxes)
        self.context = context
        self.tickets = tickets
        self.for_pool = for_pool
        self.spec = context.spec
        self.task_dir = task_dir
        self.harbor_task: Task | None = None
        self._task = task
        self.env: BaseEnvironment | None = None
        self.session_id: str | None = None
        self.trial: TrialDir | None = None
        self.timings: dict[str, float] = {}
        #: Loop time by which the start (and an adapter's set-up right after it) must be done.
        self.deadline: float | None = None
        #: Monotonic times the gate let its create in, and its start finished (None until then).
        self.admitted_at: float | None = None
        self.ready_at: float | None = None
        #: Set once the gate let its create in (a hedge's timer runs from then).
        self.admitted = asyncio.Event()
        self._gate: ProvisioningGate | None = None
        self._live_ticket: str | None = None
        self._lease: Lease | None = None
        self._lease_started = False
        self._start_called = False

    @property
    def label(self) -> str:
        name = f" task {self.harbor_task.name}" if self.harbor_task is not None else ""
        return f"{self.context.label}{name}"

    @property
    def ready(self) -> bool:
        return self.ready_at is not None and not self.closed

    @property
    def startup_s(self) -> float | None:
        """Seconds from when the gate let its create in until it was ready (None before it was)."""
        if self.ready_at is None or self.admitted_at is None:
            return None
        return self.ready_at - self.admitted_at

    async def start(self) -> None:
        """Create, admit, start, lease and prepare the sandbox (see the module docstring); `start_timeout_s` counts
        from when the gate lets the create in, so waiting for a slot never fails a start.

        Raises:
            StartDeadline: The start or the preparation ran past `start_timeout_s`.
            Exception: Whatever the backend, the healthcheck or the lease ledger raised (a backend's own
                `TimeoutError` included).
        """
        if self._started or self._closed:
            raise EnvError(f"{self.label}: a sandbox starts once")
        self._started = True
        self._live.add(self)
        try:
            await self._start()
        except TimeoutError as exc:
            # Only raygrpo's deadline has passed when it fires; a backend's own timeout comes before it.
            if self.deadline is not None and asyncio.get_running_loop().time() >= self.deadline:
                raise StartDeadline(f"start_timeout_s={self.spec.start_timeout_s:g} passed") from exc
            raise
        finally:
            if self.context.docker is not None and self.session_id is not None:
                self.context.docker.release(self.session_id)

    async def _start(self) -> None:
        from harbor.models.trial.paths import EnvironmentPaths

        clock = time.perf_counter
        began = clock()
        context = self.context
        harbor_task = self.harbor_task = self._task or context.tasks.task(self.task_dir)
        self.trial = TrialDir.make(harbor_task.short_name)
        self.session_id = f"{harbor_task.short_name}__{uuid.uuid4().hex[:10]}__env"
        self.env = await create_environment(context, harbor_task, self.trial.paths, self.session_id)
        self.timings["create"] = clock() - began

        loop = asyncio.get_running_loop()
        gate = self._gate = context.gate
        began = clock()
        warm = self.tickets
        if warm is None or gate.max_live is None:
            self._live_ticket = await gate.acquire_live()
        elif self.for_pool:
            self._live_ticket = await warm.ticket_for_warm(gate.acquire_live(warm=True))
        else:
            self._live_ticket = await warm.ticket_for_cold(gate.acquire_live())
        waited = clock() - began
        refusals, refused_since = 0, 0.0
        while True:
            # The intent is on disk before the slot is waited for: a durable write inside the slot would delay the
            # create past it (under load, by more than the schedule's margin: the provider's window then refuses it).
            await self._lease_intent()
            asked = clock()
            async with gate.start_slot(self._live_ticket):
                waited += clock() - asked
                self.deadline = loop.time() + self.spec.start_timeout_s
                self._start_called = True
                if self.admitted_at is None:
                    self.admitted_at = time.monotonic()
                    self.admitted.set()
                began = clock()
                try:
                    async with asyncio.timeout_at(self.deadline):
                        await self.env.start(force_build=False)
                        await self._lease_bind()
                except Exception as exc:
                    if (refusal := rate_limit_signal(exc)) is None:
                        raise
                else:
                    self.timings["start"] = clock() - began
                    break
            # The provider refused the create (429): not a failure of this rollout; back off, then queue again.
            refusals += 1
            refused_since = refused_since or time.time()
            backoff = await gate.back_off(refusal, refusals, refused_since)
            self.timings["backoff"] = self.timings.get("backoff", 0.0) + backoff
        self.timings["governor_wait"] = waited
        if context.docker is not None:
            context.docker.started(harbor_task)
            context.docker.release(self.session_id)
        began = clock()
        async with asyncio.timeout_at(self.deadline):
            if self.spec.reuploads_copied_files:
                await upload_copied_files(self.env, harbor_task.paths.environment_dir)
            await self.env.run_healthcheck()
            self.timings["healthcheck"] = clock() - began
            # test.sh writes its reward here; the shell cannot create the parent itself.
            await self.env.empty_dirs([EnvironmentPaths.for_os(self.env.os).verifier_dir], chmod=True)
            # Tool commands run as the task's agent user, as in a Harbor trial.
            self.env.default_user = harbor_task.config.agent.user
        self.ready_at = time.monotonic()
        logger.debug("%s: sandbox %s up in %.2f s", self.label, self.session_id, self.timings.get("start", 0.0))

    async def check(self) -> None:
        """Check that a sandbox started earlier still answers, right before a rollout adopts it: one run of the
        task's healthcheck command (a plain `true` for a task without one), bounded by `exec_timeout_s`.

        Raises:
            SandboxUnhealthy: It did not answer, answered non-zero, or is closed.
        """
        if not self.ready or self.env is None:
            raise SandboxUnhealthy(f"{self.label}: the sandbox is not started or already closed")
        healthcheck = self.env.task_env_config.healthcheck if self.env.task_env_config is not None else None
        command = healthcheck.command if healthcheck is not None else "true"
        timeout = self.spec.exec_timeout_s
        try:
            result = await asyncio.wait_for(self.env.exec(command, timeout_sec=int(max(1, timeout))), timeout + 5)
        except Exception as exc:  # noqa: BLE001 - dead, unreachable or hung: all mean "do not use it"
            raise SandboxUnhealthy(f"{self.label}: sandbox {self.session_id} failed its check: {describe(exc)}") from exc
        if result.return_code != 0:
            raise SandboxUnhealthy(f"{self.label}: sandbox {self.session_id} failed its check "
                                   f"({command!r} exited {result.return_code})")

    async def _lease_intent(self) -> None:
        """Write the sandbox's lease intent durably (leased backends only); call it right before each create
        attempt is sent (a retried create rewrites it with fresh times).

        Raises:
            OSError: The record could not be written (the create must not be sent).
        """
        holder = self._gate.holder if self._gate is not None and self._live_ticket is not None else None
        self._lease = await self.context.leases.intent(self.session_id, self.harbor_task, holder) or self._lease

    async def _lease_bind(self) -> None:
        """The create answered: the lease gets the sandbox's id (when the backend exposes one)."""
        self._lease_started = True
        await self.context.leases.bind(self._lease, self.env, self.harbor_task)

    async def _lease_release(self) -> None:
        """The sandbox was stopped: its lease goes (see `HarborLeases.release`); kept when that fails."""
        try:
            await self.context.leases.release(self._lease, self._lease_started)
        except Exception as exc:  # noqa: BLE001 - close never raises; the lease stays for `raygrpo reap`
            logger.warning("%s: lease %s of sandbox %s kept: %s", self.label, self._lease.id, self.session_id,
                           describe(exc))
        else:
            self._lease = None

    def _holds_resources(self) -> bool:
        return self.env is not None or self.trial is not None or self._live_ticket is not None

    async def _stop(self) -> None:
        """The backend's `stop`, tried up to `STOP_ATTEMPTS` times (a provider's delete API has bad seconds too), all
        of them within `stop_timeout_s`.

        Raises:
            TimeoutError: `stop_timeout_s` passed.
            Exception: What the last try raised.
        """
        async with asyncio.timeout(self.spec.stop_timeout_s):
            async for attempt in AsyncRetrying(stop=stop_after_attempt(STOP_ATTEMPTS), reraise=True,
                                               wait=wait_exponential(multiplier=STOP_RETRY_WAIT_S, max=2.0)):
                with attempt:
                    await self.env.stop(delete=self.spec.stop_delete)

    def _keep_ticket(self) -> None:
        """The stop failed: the sandbox may still be alive at the provider, so its live ticket stays taken (else
        `max_live` stops holding) while the stop is tried again in the background (`_stop_later`)."""
        logger.warning("%s: sandbox %s keeps its live ticket until it is known gone; its stop is tried again in the "
                       "background", self.label, self.session_id)
        task = asyncio.get_running_loop().create_task(self._stop_later(), name=f"stop-later-{self.session_id}")
        _STOPPING.add(task)
        task.add_done_callback(_STOPPING.discard)

    async def _stop_later(self) -> None:
        """Try the stop again every so often (`RESTOP_INITIAL_S`, doubling to `RESTOP_MAX_S`) until it is stopped
        (its lease goes too), its lease's lifetime at the provider is over (the provider ended it: the lease is left
        for the end-of-run reap, which drops it), or, where no lifetime is known, `RESTOP_GIVE_UP_S` passed (then the
        provider's own limit refuses what is too much, and the run's reap counts the lease as leaked). The live
        ticket is given back then, and not before: a run whose provider cannot delete waits for its live tickets
        rather than go past the cap. Cancelled (the process ends), it keeps the ticket: the governor drops the
        tickets of a holder that stopped renewing them."""
        lease = self._lease
        ends = lease.expires if lease is not None and lease.expires is not None else time.time() + RESTOP_GIVE_UP_S
        delay, tries, stopped = RESTOP_INITIAL_S, 0, False
        while not stopped and (left := ends - time.time()) > 0:
            await asyncio.sleep(min(delay, left))
            delay = min(2 * delay, RESTOP_MAX_S)
            if time.time() >= ends:
                continue
            tries += 1
            try:
                await self._stop()
            except Exception as exc:  # noqa: BLE001 - any failure: try again later
                logger.debug("%s: stopping sandbox %s again failed: %s", self.label, self.session_id, describe(exc))
            else:
                stopped = True
        if stopped:
            logger.warning("%s: sandbox %s stopped at try %d in the background; its live ticket is given back",
                           self.label, self.session_id, tries)
            try:
                if self.context.docker is not None:
                    await asyncio.wait_for(self.context.docker.stopped(self.session_id), self.spec.stop_timeout_s)
                if self._lease is not None:
                    await asyncio.wait_for(self._lease_release(), self.spec.stop_timeout_s)
            except Exception as exc:  # noqa: BLE001 - it is stopped: the ticket goes back whatever the bookkeeping did
                logger.warning("%s: sandbox %s stopped, but its records were not updated: %s", self.label,
                               self.session_id, describe(exc))
        else:
            what = "its lifetime at the provider is over" if lease is not None and lease.expires is not None \
                else f"no lifetime known, given up after {RESTOP_GIVE_UP_S:g} s"
            logger.warning("%s: sandbox %s could not be stopped (%d tries in the background); %s: its live ticket "
                           "is given back, its lease left for the reap", self.label, self.session_id, tries, what)
        self._give_ticket_back()

    def _give_ticket_back(self) -> None:
        if self._gate is not None:
            self._gate.release_live(self._live_ticket)
            self._live_ticket = None

    async def _release(self) -> None:
        """Stop the sandbox (retried, bounded by `stop_timeout_s`), drop its lease once it is stopped (a failed stop
        keeps it, for the reap), give its live ticket back once it is known gone (`_stop_later` after a failed stop)
        and remove its host files."""
        began = time.perf_counter()
        gone = True  # nothing of it is alive at the provider (its create was never sent, or it stopped)
        try:
            if self.env is not None and self._start_called:
                gone = False
                await self._stop()
                gone = True
                logger.debug("%s: sandbox %s stopped", self.label, self.session_id)
                if self.context.docker is not None:
                    await asyncio.wait_for(self.context.docker.stopped(self.session_id), self.spec.stop_timeout_s)
                if self._lease is not None:
                    await asyncio.wait_for(self._lease_release(), self.spec.stop_timeout_s)
            elif self._lease is not None:  # written, but the create was never sent (cancelled waiting for its slot)
                self.context.leases.discard(self._lease)
                self._lease = None
        except TimeoutError:
            logger.warning("%s: stopping sandbox %s took over %g s; the sandbox reaper gets what is left",
                           self.label, self.session_id, self.spec.stop_timeout_s)
        except Exception as exc:  # noqa: BLE001 - close never raises
            logger.warning("%s: stopping sandbox %s failed: %s", self.label, self.session_id, describe(exc))
        finally:
            self.timings["stop"] = time.perf_counter() - began
            if gone or self._gate is None or self._live_ticket is None:
                self._give_ticket_back()
            else:
                self._keep_ticket()
            if self.trial is not None:
                await self.trial.remove()
