"""The cluster-wide create-rate limiter of a provider key: a named Ray actor every env pool actor shares.

Naming: `raygrpo-ratelimit-<key>` in the fixed namespace `raygrpo`, created with `get_if_exists=True` by whoever
asks first. Without an explicit namespace a named actor lives in its job's namespace, which is anonymous (one per
driver) unless `ray.init(namespace=...)` names it: actors of one job (and actors they create) would find it, but a
second `ray job submit` job would not. With the fixed namespace, concurrent jobs on one cluster that limit the same
provider key share one limiter, as they share the provider's quota. Whoever creates it sets its rate; `ensure_rate_limiter` warns when an existing one runs at another rate.

Lifetime: tied to the job (not detached), so nothing outlives the run. A non-detached actor dies with its owner,
the process that created it: call `ensure_rate_limiter` in the driver before the env pool actors start so the
driver owns it (else the first env pool actor to start a sandbox does, and the limiter dies with that actor).
A limiter shared with another job dies when that job ends; this job's callers then create their own.
If the limiter dies anyway, callers re-resolve the name (creating a new one) and go on; if its process crashes
while its owner lives, Ray restarts it (`max_restarts`). Either way the new limiter knows nothing of the slots the
old one handed out, so it leaves a pause of `max_lead_s + margin_s + 1` s (about 2 s) before its first slot, after
every slot the old one can have handed out (see `CreateRateLimiter`).

Waits are bounded: each call to the limiter has a timeout, and a limiter that stays unreachable for
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
from tenacity import AsyncRetrying, RetryCallState, RetryError, retry_if_exception_type, stop_after_delay, wait_fixed

from raygrpo.provisioning import CreateRateLimiter, ProvisioningError, Reservation

logger = logging.getLogger(__name__)

NAMESPACE = "raygrpo"
MAX_RESTARTS = 10


def limiter_name(key: str) -> str:
    """The actor name of `key`'s limiter (characters outside `[A-Za-z0-9_.-]` become `_`)."""
    return "raygrpo-ratelimit-" + re.sub(r"[^A-Za-z0-9_.-]", "_", key)


class RateLimiter(CreateRateLimiter):
    """`CreateRateLimiter` as a Ray actor; a restart by Ray counts as recovering (its schedule state is lost).

    Args:
        key: Provider key.
        rate_per_s: Most creates in any 1 s window, cluster-wide.
        recovering: A caller re-creates it after the previous one died.
        **kwargs: `CreateRateLimiter` settings.
    """

    def __init__(self, key: str, rate_per_s: float, recovering: bool = False, **kwargs: Any) -> None:
        with warnings.catch_warnings():  # ray 2.60 warns about an API it calls itself here
            warnings.simplefilter("ignore")
            restarted = ray.get_runtime_context().was_current_actor_reconstructed
        super().__init__(key, rate_per_s, recovering=recovering or restarted, **kwargs)

    async def cancel(self, request_id: str) -> bool:
        return self.release(request_id)

    async def ping(self) -> dict[str, Any]:
        return self.stats()


RateLimiterActor = ray.remote(num_cpus=0, max_restarts=MAX_RESTARTS, max_concurrency=10_000)(RateLimiter)


#: A handle per key kept for the life of this process, so an actor this process created is never collected early.
_handles: dict[str, Any] = {}


def get_rate_limiter(key: str, rate_per_s: float, *, recovering: bool = False, **kwargs: Any):
    """The handle of `key`'s limiter, created if it does not exist (blocking: a GCS round trip or two).

    The creator's `rate_per_s` and settings hold; later callers get the existing actor whatever they pass.
    """
    handle = RateLimiterActor.options(name=limiter_name(key), namespace=NAMESPACE, get_if_exists=True).remote(
        key, rate_per_s, recovering=recovering, **kwargs
    )
    _handles[key] = handle
    return handle


def ensure_rate_limiter(key: str, rate_per_s: float, timeout_s: float = 60.0, **kwargs: Any) -> dict[str, Any]:
    """Create `key`'s limiter from this process (the driver, so that it owns it) and wait until it answers.

    Returns its stats; logs a warning if an existing limiter runs at another rate.
    """
    stats = ray.get(get_rate_limiter(key, rate_per_s, **kwargs).ping.remote(), timeout=timeout_s)
    if stats["rate_per_s"] != rate_per_s:
        logger.warning("rate limiter %r already runs at %s/s, not %s/s", key, stats["rate_per_s"], rate_per_s)
    return stats


class RayRateLimiterClient:
    """A gate's way to the named limiter of `key`: resolves it lazily, re-resolves it when it dies, bounds waits.

    Args:
        key: Provider key.
        rate_per_s: Rate used if this client creates the limiter.
        call_timeout_s: Longest one `reserve` call may take (the limiter answers within its `max_hold_s`).
        unavailable_after_s: How long the limiter may stay dead or unreachable before `reserve` raises.
        retry_delay_s: Pause before re-resolving a limiter that failed.
        **limiter_kwargs: `CreateRateLimiter` settings, used if this client creates the limiter.
    """

    def __init__(
        self,
        key: str,
        rate_per_s: float,
        *,
        call_timeout_s: float = 40.0,
        unavailable_after_s: float = 60.0,
        retry_delay_s: float = 0.5,
        **limiter_kwargs: Any,
    ) -> None:
        self.key = key
        self.rate_per_s = rate_per_s
        self._call_timeout = call_timeout_s
        self._unavailable_after = unavailable_after_s
        self._retry_delay = retry_delay_s
        self._kwargs = limiter_kwargs
        self._handle = None
        self._lookup: asyncio.Lock | None = None
        self._recovering = False

    async def _resolve(self):
        if self._handle is None:
            if self._lookup is None:
                self._lookup = asyncio.Lock()
            async with self._lookup:
                if self._handle is None:
                    # Off the loop: the lookup blocks on the GCS, and a blocked loop delays other starts' wake-ups.
                    self._handle = await asyncio.wait_for(
                        asyncio.to_thread(
                            get_rate_limiter, self.key, self.rate_per_s, recovering=self._recovering, **self._kwargs
                        ),
                        self._call_timeout,
                    )
        return self._handle

    async def reserve(self, request_id: str) -> Reservation:
        """Ask the limiter for `request_id`'s slot; re-resolve it (and retry) while it is dead or unreachable.

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
                    return await asyncio.wait_for(handle.reserve.remote(request_id), self._call_timeout)
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            raise ProvisioningError(
                f"rate limiter {limiter_name(self.key)!r} (namespace {NAMESPACE!r}) unavailable for "
                f"{self._unavailable_after:g} s: {type(cause).__name__}: {cause}"
            ) from cause
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _forget(self, state: RetryCallState) -> None:
        """After a failed call: resolve the limiter again next time (a new one recovers: see `CreateRateLimiter`)."""
        error = state.outcome.exception() if state.outcome is not None else None
        logger.warning("rate limiter %r failed (%s); resolving it again", self.key, type(error).__name__)
        self._handle = None
        self._recovering = True

    def release(self, request_id: str) -> None:
        if self._handle is not None:
            try:
                self._handle.cancel.remote(request_id)
            except Exception:  # the limiter is gone: its slots went with it
                logger.debug("could not release %s on %r", request_id, self.key, exc_info=True)
