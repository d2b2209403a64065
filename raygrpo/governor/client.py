"""What a provisioning gate needs from the governor of its provider key, and how it gets one.

`GovernorClient` is the protocol the gate (`raygrpo.governor.gate`) talks to. Two things implement it:

- `Governor` itself (`raygrpo.governor.governor`), this process's own of the key (`local_governor`): without Ray, or
  in a test;
- `RayGovernorClient` (`raygrpo.governor.actor`): the named Ray actor (`GovernorActor`) every env pool actor on every
  node shares, reached with bounded, retried calls.

Whoever builds the gates says which through a `GovernorClientFactory`: env pool actors pass `RayGovernorClient`, and
without one the gate uses `local_governor`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from raygrpo.governor.create_schedule import Reservation


class ProvisioningError(RuntimeError):
    """A start could not get its create slot: the governor is gone for too long, the wait exceeded the gate's bound,
    or the provider kept refusing it."""


class GovernorClient(Protocol):
    """What a gate needs from its governor (`raygrpo.governor.Governor`, or a `RayGovernorClient` of the named actor):
    create slots (`reserve`, awaited, may answer "still queued"; `release`), live tickets (`acquire_live`, may answer
    "not yet", `warm` for a warm pool's start, which waits behind rollouts' own; `release_live`; `renew_live`), both
    at once (`admit`: a live ticket, then a create slot, in one round trip), whether to stop an idle warm sandbox for a
    rollout's start (`ask_evict`), and the provider's refusals (`refused`). Only `reserve`, `acquire_live`, `admit`
    and `ask_evict` are awaited; the rest may be fire-and-forget."""

    async def reserve(self, request_id: str, first: bool = False) -> Reservation: ...

    def release(self, request_id: str) -> Any: ...

    async def acquire_live(self, ticket: str, holder: str, warm: bool = False) -> bool: ...

    async def admit(self, ticket: str, holder: str, request_id: str,
                    warm: bool = False) -> tuple[bool, Reservation | None]: ...

    async def ask_evict(self, holder: str) -> bool: ...

    def release_live(self, ticket: str) -> Any: ...

    def renew_live(self, holder: str, tickets: list[str]) -> Any: ...

    def refused(self, reason: str, pause_s: float) -> Any: ...


#: Makes the governor client of a provider key: `factory(key, rate_per_s, max_live=..., margin_s=...)`. The limits are
#: used only by whoever creates the governor; an existing one keeps its own. `RayGovernorClient` or `local_governor`.
GovernorClientFactory = Callable[..., GovernorClient]
