"""The lease ledger around a Harbor suite's sandboxes: their label and lifetime, and the record from before the create
is sent until the sandbox is stopped (`raygrpo.leases.ledger`).

Only for backends other than raygrpo's local bubblewrap backend and docker, which have owner-based reapers already
(`raygrpo.sandbox.orphans`), and other than import-path classes without a lease hook (`raygrpo.leases.hooks`).
Per rollout it costs three small file operations (an fsync'd intent, a bind, a removal) and no thread.

The lifetime: where the backend takes one (the fake provider's `lifetime_s`, e2b's and Modal's
`sandbox_timeout_secs`, the others in `raygrpo.leases.hooks.BUILTIN_LIFETIME_KWARGS`), a sandbox lives no longer than
its rollout can: `start_timeout_s + rollout.rollout_timeout_s + the verifier's timeout + stop_timeout_s (+ the warm
pool's ttl_s) + LIFETIME_MARGIN_S`, so it dies on its own even if every raygrpo process is gone. A lifetime set in
`environment_kwargs` wins (logged once).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from raygrpo.core.imports import ImportSpecError, load_object
from raygrpo.leases.hooks import OWNER_REAPED, LeasePolicy, lease_policy
from raygrpo.leases.ledger import LEASE_LABEL, Lease, LeaseLedger, safe_id
from raygrpo.specs.harbor import HarborSpec

if TYPE_CHECKING:
    from harbor.models.task.task import Task

logger = logging.getLogger(__name__)

#: Seconds added to a sandbox's derived lifetime beyond its rollout's deadlines.
LIFETIME_MARGIN_S = 120.0
#: The rollout deadline assumed when the provider is not told the run's (`rollout.rollout_timeout_s`'s default).
DEFAULT_ROLLOUT_TIMEOUT_S = 900.0


class HarborLeases:
    """Leases of one Harbor suite's sandboxes in one process.

    Args:
        spec: The suite's spec.
        label: How logs name the suite.
        import_path: The backend's `module:Class` as Harbor's factory imports it (to find its lease hook); None for a
            built-in `environment_type`.
        rollout_timeout_s: The run's `rollout.rollout_timeout_s` (part of each sandbox's lifetime).
        ledger: The ledger (default: `$RAYGRPO_LEASE_DIR`, else `~/.raygrpo/leases`).
    """

    def __init__(self, spec: HarborSpec, label: str, import_path: str | None = None,
                 rollout_timeout_s: float | None = None, ledger: LeaseLedger | None = None) -> None:
        self.spec = spec
        self.label = label
        environment_class = None
        if spec.environment_type is None and import_path is not None and spec.backend not in OWNER_REAPED:
            try:
                environment_class = load_object(import_path)
            except ImportSpecError as exc:  # then every start fails, saying why (an env_error)
                logger.debug("%s: backend %s does not load here: %s", label, import_path, exc)
        self.policy: LeasePolicy = lease_policy(spec.backend, environment_class)
        self.rollout_timeout_s = rollout_timeout_s or DEFAULT_ROLLOUT_TIMEOUT_S
        self.ledger = (ledger or LeaseLedger()) if self.policy.tracked else None
        self._told_user_lifetime = False
        #: Sandbox ids being written to their leases, by lease id: a release waits for its lease's write.
        self._binding: dict[str, asyncio.Future[None]] = {}
        if self.ledger is not None:
            self.ledger.own()  # the heartbeat runs from now on, before the first rollout

    @property
    def tracked(self) -> bool:
        """Whether this suite's sandboxes are leased."""
        return self.ledger is not None

    @staticmethod
    def lease_id(session_id: str) -> str:
        """The lease id of a sandbox: its Harbor session id, made file-safe."""
        return safe_id(session_id)

    def derived_lifetime_s(self, task: Task) -> float:
        """The longest a sandbox of `task` can be needed: start, episode, verifier, stop, and a margin; with a warm
        pool also its `ttl_s`, the longest a warm sandbox waits ready before a rollout adopts it (without it, one
        adopted late would be ended by the provider under its rollout). Every sandbox of such a suite gets it: which
        start ends up warm is not known when its create is sent (a hedge or a cold start may be handed on)."""
        verifier = self.spec.verifier_timeout_s or float(task.config.verifier.timeout_sec)
        warm = self.spec.warm_pool.ttl_s if self.spec.warm_pool is not None else 0.0
        return (self.spec.start_timeout_s + self.rollout_timeout_s + verifier + self.spec.stop_timeout_s + warm
                + LIFETIME_MARGIN_S)

    def lifetime_s(self, task: Task) -> float | None:
        """The lifetime a sandbox of `task` gets at the provider, in seconds: the user's (`environment_kwargs`, in
        the argument's unit) when set, else the derived one; None when the backend takes none."""
        name = self.policy.lifetime_kwarg
        if name is None:
            return None
        user = self.spec.environment_kwargs.get(name)
        return float(user) * self.policy.lifetime_unit_s if user is not None else self.derived_lifetime_s(task)

    def _expires_after_s(self, task: Task) -> float | None:
        """How long after its create a sandbox of `task` is gone at the latest: its lifetime, twice it where the
        lifetime counts from the last activity (`Lifetime.idle`: up to a rollout's worth, then the idle time)."""
        lifetime = self.lifetime_s(task)
        if lifetime is None:
            return None
        return 2 * lifetime if self.policy.lifetime_idle else lifetime

    def backend_kwargs(self, kwargs: dict[str, Any], task: Task, session_id: str) -> dict[str, Any]:
        """The backend's constructor arguments with the lease's label (when the backend has a hook) and the
        sandbox's lifetime (when it takes one and the user set none)."""
        if not self.tracked:
            return kwargs
        hook, name = self.policy.hook, self.policy.lifetime_kwarg
        if hook is not None:
            kwargs = hook.lease_kwargs(dict(kwargs), {LEASE_LABEL: self.lease_id(session_id)})
        if name is not None:
            if name in self.spec.environment_kwargs:
                if not self._told_user_lifetime:
                    self._told_user_lifetime = True
                    logger.info("%s: %s=%s set in environment_kwargs wins over the lifetime derived from the rollout "
                                "deadline (%g s)", self.label, name, self.spec.environment_kwargs[name],
                                self.derived_lifetime_s(task))
            else:
                # Whole units (e2b: an int of seconds; daytona: minutes), rounded up.
                kwargs = {**kwargs, name: math.ceil(self.derived_lifetime_s(task) / self.policy.lifetime_unit_s)}
        return kwargs

    async def intent(self, session_id: str, task: Task, live_holder: str | None = None) -> Lease | None:
        """Write the lease's intent record (durably, off the event loop) before its create is sent; None when the
        suite is not leased. Again for the same lease (a retried create) rewrites it with fresh times. `live_holder`:
        who holds the sandbox's live ticket with the governor (forgotten by whoever reaps the lease).

        Raises:
            OSError: The record could not be written: the create must not be sent.
        """
        if self.ledger is None:
            return None
        now = time.time()
        lifetime = self._expires_after_s(task)
        reach = self.policy.hook.lease_reach(dict(self.spec.environment_kwargs)) if self.policy.hook else {}
        return await asyncio.to_thread(
            self.ledger.intent, self.lease_id(session_id), provider_key=self.spec.provider_key,
            backend=self.spec.backend, reach=reach, deadline=now + self.derived_lifetime_s(task),
            # The create goes out within the start's deadline; the lifetime counts from it.
            expires=None if lifetime is None else now + self.spec.start_timeout_s + lifetime, live_holder=live_holder)

    async def bind(self, lease: Lease | None, env: Any, task: Task) -> None:
        """The create answered: record the sandbox's id when the backend exposes one (`env.sandbox_id`), off the
        event loop (a file write there would delay other starts' create slots)."""
        if lease is None or self.ledger is None:
            return
        sandbox_id = getattr(env, "sandbox_id", None)
        if isinstance(sandbox_id, str) and sandbox_id:
            lifetime = self._expires_after_s(task)
            # A write in a thread goes on when its start is cancelled; `release` waits for it, so that it cannot
            # put the record back after the release removed it.
            write = self._binding[lease.id] = asyncio.ensure_future(asyncio.to_thread(
                self.ledger.bind, lease, sandbox_id, expires=None if lifetime is None else time.time() + lifetime))
            write.add_done_callback(lambda done: self._bound(lease.id, done))
            await asyncio.shield(write)

    def _bound(self, lease_id: str, write: asyncio.Future[None]) -> None:
        self._binding.pop(lease_id, None)
        if not write.cancelled() and (exc := write.exception()) is not None:  # seen here if its start was cancelled
            logger.debug("%s: lease %s: recording its sandbox id failed: %s", self.label, lease_id, exc)

    def discard(self, lease: Lease) -> None:
        """Drop a lease whose create was never sent (its start was cancelled before its create slot)."""
        if self.ledger is not None:
            self.ledger.remove(lease)

    async def release(self, lease: Lease | None, started: bool) -> None:
        """The sandbox was stopped: drop the lease. When its start never completed, the provider may still hold a
        sandbox whose id nobody learnt: a backend with a hook reaps it by label first; without one the lease is kept
        for `raygrpo reap` (which drops it once its lifetime is over).

        Raises:
            Exception: The hook could not reach the provider (the lease is kept).
        """
        if lease is None or self.ledger is None:
            return
        if (write := self._binding.get(lease.id)) is not None:
            await asyncio.wait([write])
        if not started:
            hook = self.policy.hook
            if hook is None:
                logger.info("%s: lease %s kept: its start did not complete and %s has no reap hook", self.label,
                            lease.id, self.spec.backend)
                return
            stopped = await asyncio.to_thread(hook.reap_lease, lease.reach, lease.id, lease.sandbox_id)
            if stopped:
                logger.warning("%s: sandbox(es) %s of lease %s, whose start did not complete, stopped by label",
                               self.label, ", ".join(stopped), lease.id)
        await asyncio.to_thread(self.ledger.remove, lease)
