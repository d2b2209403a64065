"""The governor of a provider, cluster-wide: create schedule, live-sandbox cap, answers to rate limits; and the gate
every sandbox start goes through to ask it.

One vocabulary, as `ray.util.queue` pairs `Queue` with its actor:

- `create_schedule.py`: `CreateSchedule`, the create slots (at most `rate_per_s` a second, in request order);
- `live_cap.py`: `LiveCap`, tickets for sandboxes alive or being created (at most `max_live`);
- `refusals.py`: recognising a provider's 429 in a backend's exception; the back-off of a refused start;
- `governor.py`: `Governor`, the three together for one provider key (`local_governor`: this process's own);
- `actor.py`: `GovernorActor`, the `Governor` as the named Ray actor every env pool actor shares (`get_governor`,
  `ensure_governor`, `governor_name`), and `RayGovernorClient`, a gate's client of it;
- `client.py`: `GovernorClient`, what a gate needs of its governor (a `Governor` or a `RayGovernorClient`), and
  `GovernorClientFactory`, how gates get one;
- `gate.py`: `ProvisioningGate`, an env pool actor's gate of a provider (`gate_for`), counting in `gate_counts.py`.

The limits come from the run config's `providers:` section (`raygrpo.specs.provider.ProviderSpec`). `actor.py`
imports Ray; nothing exported here does.
"""

from raygrpo.governor.client import GovernorClient, GovernorClientFactory, ProvisioningError
from raygrpo.governor.governor import Governor, local_governor, reset_local_governors
from raygrpo.governor.live_cap import LiveCap
from raygrpo.governor.refusals import BackoffSettings, RateLimitSignal, rate_limit_signal
from raygrpo.governor.create_schedule import CreateSchedule, Reservation, max_per_window

__all__ = ["BackoffSettings", "CreateSchedule", "Governor", "GovernorClient", "GovernorClientFactory", "LiveCap",
           "ProvisioningError", "RateLimitSignal", "Reservation", "local_governor", "max_per_window",
           "rate_limit_signal", "reset_local_governors"]
