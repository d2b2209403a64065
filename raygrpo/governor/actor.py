"""The cluster-wide governor of a provider key (create rate, live cap, rate-limit answers: `raygrpo.governor`): a
named Ray actor every env pool actor shares.

- `GovernorActor`: the `Governor` as a Ray actor;
- `get_governor` / `ensure_governor`: its handle, created if it does not exist (`ensure_governor`: by the driver,
  which then owns it); `governor_name`: its actor name;
- `RayGovernorClient`: a gate's `GovernorClient` (`raygrpo.governor.client`) of it, with bounded, retried calls.

Naming: `raygrpo-ratelimit-<key>` (`governor_name`; the name it had as the rate limiter) in the fixed namespace
`raygrpo`, created with `get_if_exists=True` by whoever asks first. Without an explicit namespace a named actor lives
in its job's namespace, which is anonymous (one per driver) unless `ray.init(namespace=...)` names it: actors of one
job (and actors they create) would find it, but a second `ray job submit` job would not. With the fixed namespace,
concurrent jobs on one cluster that limit the same provider key share one governor, as they share the provider's
quota. Whoever creates it sets its limits (the run
config's `providers.<key>`); `ensure_governor` warns when an existing one runs with other limits.

Lifetime: tied to the job (not detached), so nothing outlives the run. A non-detached actor dies with its owner,
the process that created it: the driver calls `ensure_governor` before the env pool actors start so it owns it and it
runs on the driver's node (else the first env pool actor to start a sandbox creates it, and the governor dies with
that actor).
A governor shared with another job dies when that job ends; this job's callers then create their own.
If the governor dies anyway, callers re-resolve the name (creating a new one) and go on; if its process crashes
while its owner lives, Ray restarts it (`max_restarts`). Either way the new governor knows nothing of the slots the
old one handed out, so it leaves a pause of `max_lead_s + margin_s + 1` s (about 2 s) before its first slot, after
every slot the old one can have handed out (see `CreateSchedule`).

Waits are bounded: each call to the governor has a timeout, and a governor that stays unreachable for
`unavailable_after_s` fails the start with a `ProvisioningError` naming it (the calls are retried with tenacity).
"""

from __future__ import annotations

import asyncio
import logging
import re
import warnings
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tenacity import AsyncRetrying, RetryCallState, RetryError, retry_if_exception_type, stop_after_delay, wait_fixed

from raygrpo.governor.client import ProvisioningError
from raygrpo.governor.governor import Governor
from raygrpo.governor.create_schedule import Reservation

__all__ = ["NAMESPACE", "GovernorActor", "RayGovernorClient", "ensure_governor", "forget_holders", "get_governor",
           "governor_name"]

logger = logging.getLogger(__name__)

NAMESPACE = "raygrpo"
MAX_RESTARTS = 10


def governor_name(key: str) -> str:
    """The actor name of `key`'s governor (characters outside `[A-Za-z0-9_.-]` become `_`)."""
    return "raygrpo-ratelimit-" + re.sub(r"[^A-Za-z0-9_.-]", "_", key)


@ray.remote(num_cpus=0, max_restarts=MAX_RESTARTS, max_concurrency=10_000)
class GovernorActor(Governor):
    """`Governor` as a Ray actor (its processes are named `ray::GovernorActor`); a restart by Ray counts as
    recovering (its state is lost: the schedule pauses, live tickets come back as their holders renew them).

    Args:
        key: Provider key.
        rate_per_s: Most creates in any 1 s window, cluster-wide; None for none.
        max_live: Most sandboxes alive at once, cluster-wide; None for no cap.
        recovering: A caller re-creates it after the previous one died.
        **kwargs: `CreateSchedule` settings.
    """

    def __init__(self, key: str, rate_per_s: float | None, max_live: int | None = None, recovering: bool = False,
                 **kwargs: Any) -> None:
        with warnings.catch_warnings():  # ray 2.60 warns about an API it calls itself here
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        super().__init__(key, rate_per_s, max_live, recovering=recovering or restarted, **kwargs)

    async def cancel(self, request_id: str) -> bool:
        return self.release(request_id)

    async def ping(self) -> dict[str, Any]:
        return self.stats()

    async def node_id(self) -> str:
        """The Ray node it runs on."""
        return ray.get_runtime_context().get_node_id()


#: Every handle this process got, per key, kept for its life: the first one of an actor this process created is its
#: owner's, and dropping it (even for another handle of the same actor) would let Ray collect the actor.
_handles: dict[str, list[Any]] = {}


def get_governor(key: str, rate_per_s: float | None, *, max_live: int | None = None, recovering: bool = False,
                 node_id: str | None = None, **kwargs: Any):
    """The handle of `key`'s governor, created if it does not exist (blocking: a GCS round trip or two).

    The creator's `rate_per_s`, `max_live` and settings hold; later callers get the existing actor whatever they pass.
    `node_id`: the node a new governor must run on (Ray's soft node affinity placed it elsewhere in 11 of 12 tries on a
    simulated cluster, so it is a hard one: pass a live node, such as the caller's own).
    """
    options: dict[str, Any] = {"name": governor_name(key), "namespace": NAMESPACE, "get_if_exists": True}
    if node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    handle = GovernorActor.options(**options).remote(key, rate_per_s, max_live, recovering=recovering, **kwargs)
    _handles.setdefault(key, []).append(handle)
    return handle


def forget_holders(key: str, holders: list[str]) -> None:
    """Tell `key`'s governor (fire-and-forget) that these live-ticket holders are dead: the gates of actors whose
    sandboxes someone else reaped (`raygrpo.leases.reaper.LeaseWatch`)."""
    handles = _handles.get(key)
    handle = handles[0] if handles else ray.get_actor(governor_name(key), namespace=NAMESPACE)
    handle.forget_holders.remote(holders)


def ensure_governor(key: str, rate_per_s: float | None, timeout_s: float = 60.0, *, max_live: int | None = None,
                    **kwargs: Any) -> dict[str, Any]:
    """Create `key`'s governor from this process (the driver, so that it owns it) on this process's node, and wait
    until it answers. On the driver's node it is lost only with the driver; elsewhere, losing a worker node would
    also lose the governor, and with it a few seconds of creates (the new one's pause) and its live-cap state.

    Returns its stats; logs a warning if an existing governor has other limits.
    """
    here = ray.get_runtime_context().get_node_id()
    stats = ray.get(get_governor(key, rate_per_s, max_live=max_live, node_id=here, **kwargs).ping.remote(),
                    timeout=timeout_s)
    if (stats["rate_per_s"], stats["max_live"]) != (rate_per_s, max_live):
        logger.warning("governor %r already runs at %s creates/s and %s live, not %s and %s", key,
                       stats["rate_per_s"], stats["max_live"], rate_per_s, max_live)
    return stats


class RayGovernorClient:
    """A gate's `GovernorClient` of the named governor of `key`: resolves it lazily, re-resolves it when it dies,
    bounds waits.

    Args:
        key: Provider key.
        rate_per_s: Rate used if this client creates the governor.
        max_live: Live cap used if this client creates the governor.
        call_timeout_s: Longest one call may take (the governor answers within its holds: `admit` within the live
            cap's and the schedule's, 30 + 10 s by default).
        unavailable_after_s: How long the governor may stay dead or unreachable before a call raises.
        retry_delay_s: Pause before re-resolving a governor that failed.
        release_batch_s: Live tickets given back within this long go to the governor in one call (each call costs
            both sides about a millisecond of CPU; a sandbox's ticket is held this much longer).
        **schedule_kwargs: `CreateSchedule` settings, used if this client creates the governor.
    """

    def __init__(
        self,
        key: str,
        rate_per_s: float | None,
        *,
        max_live: int | None = None,
        call_timeout_s: float = 50.0,
        unavailable_after_s: float = 60.0,
        retry_delay_s: float = 0.5,
        release_batch_s: float = 0.05,
        **schedule_kwargs: Any,
    ) -> None:
        self.key = key
        self.rate_per_s = rate_per_s
        self.max_live = max_live
        self._call_timeout = call_timeout_s
        self._unavailable_after = unavailable_after_s
        self._retry_delay = retry_delay_s
        self._kwargs = schedule_kwargs
        self._handle = None
        self._lookup: asyncio.Lock | None = None
        self._recovering = False
        self._release_batch_s = release_batch_s
        self._released: list[str] = []

    async def _resolve(self):
        if self._handle is None:
            if self._lookup is None:
                self._lookup = asyncio.Lock()
            async with self._lookup:
                if self._handle is None:
                    # Off the loop: the lookup blocks on the GCS, and a blocked loop delays other starts' wake-ups.
                    self._handle = await asyncio.wait_for(
                        asyncio.to_thread(
                            get_governor, self.key, self.rate_per_s, max_live=self.max_live,
                            recovering=self._recovering, **self._kwargs
                        ),
                        self._call_timeout,
                    )
        return self._handle

    async def reserve(self, request_id: str, first: bool = False) -> Reservation:
        """Ask the governor for `request_id`'s create slot (see `_call`)."""
        return await self._call("reserve", request_id, first)

    async def acquire_live(self, ticket: str, holder: str, warm: bool = False) -> bool:
        """Ask the governor for a live ticket (see `_call`); False: not yet, ask again."""
        return await self._call("acquire_live", ticket, holder, warm)

    async def admit(self, ticket: str, holder: str, request_id: str,
                    warm: bool = False) -> tuple[bool, Reservation | None]:
        """Ask the governor for a live ticket and then a create slot in one call (see `Governor.admit`)."""
        return await self._call("admit", ticket, holder, request_id, warm)

    async def ask_evict(self, holder: str) -> bool:
        """Ask the governor whether to stop an idle warm sandbox for a rollout's start (see `Governor.ask_evict`)."""
        return await self._call("ask_evict", holder)

    async def _call(self, method: str, *args: Any) -> Any:
        """Call the governor; re-resolve it (and retry) while it is dead or unreachable.

        Raises:
            ProvisioningError: It stayed unavailable for `unavailable_after_s`.
        """
        try:
            # ValueError: the name was taken by an actor that died between lookup and use.
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type((RayActorError, TimeoutError, ValueError)),
                stop=stop_after_delay(self._unavailable_after),
                wait=wait_fixed(self._retry_delay),
                before_sleep=self._forget,
            ):
                with attempt:
                    handle = await self._resolve()
                    return await asyncio.wait_for(getattr(handle, method).remote(*args), self._call_timeout)
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            raise ProvisioningError(
                f"governor {governor_name(self.key)!r} (namespace {NAMESPACE!r}) unavailable for "
                f"{self._unavailable_after:g} s: {type(cause).__name__}: {cause}"
            ) from cause
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _forget(self, state: RetryCallState) -> None:
        """After a failed call: resolve the governor again next time (a new one recovers: see `CreateSchedule`)."""
        error = state.outcome.exception() if state.outcome is not None else None
        logger.warning("governor %r failed (%s); resolving it again", self.key, type(error).__name__)
        self._handle = None
        self._recovering = True

    def _tell(self, method: str, *args: Any) -> None:
        """Fire-and-forget a call to the governor; a governor that is gone lost what it would change."""
        if self._handle is not None:
            try:
                getattr(self._handle, method).remote(*args)
            except Exception:
                logger.debug("could not call %s on governor %r", method, self.key, exc_info=True)

    def release(self, request_id: str) -> None:
        self._tell("cancel", request_id)

    def release_live(self, ticket: str) -> None:
        """Give a live ticket back; the releases of the next `release_batch_s` go in one call."""
        self._released.append(ticket)
        if len(self._released) > 1:
            return
        try:
            asyncio.get_running_loop().call_later(self._release_batch_s, self._flush_released)
        except RuntimeError:  # no loop (a synchronous caller): at once
            self._flush_released()

    def _flush_released(self) -> None:
        tickets, self._released = self._released, []
        if tickets:
            self._tell("release_lives", tickets)

    def renew_live(self, holder: str, tickets: list[str]) -> None:
        self._tell("renew_live", holder, tickets)

    def refused(self, reason: str, pause_s: float) -> None:
        self._tell("refused", reason, pause_s)
