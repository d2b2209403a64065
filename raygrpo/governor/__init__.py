"""The governor of a provider key, cluster-wide: create schedule, live-sandbox cap, answers to rate limits.

- `schedule.py`: `CreateRateLimiter`, the create slots (at most `rate_per_s` a second, in request order).
- `live.py`: `LiveCap`, tickets for sandboxes alive or being created (at most `max_live`).
- `refusals.py`: recognising a provider's 429 in a backend's exception; the back-off of a refused start.
- `governor.py`: `Governor`, the three together for one key (the body of the named Ray actor).
"""

from raygrpo.governor.governor import Governor, local_governor, reset_local_governors
from raygrpo.governor.live_cap import LiveCap
from raygrpo.governor.refusals import BackoffSettings, RateLimitSignal, rate_limit_signal
from raygrpo.governor.schedule import CreateRateLimiter, Reservation, max_per_window

__all__ = ["BackoffSettings", "CreateRateLimiter", "Governor", "LiveCap", "RateLimitSignal", "Reservation",
           "local_governor", "max_per_window", "rate_limit_signal", "reset_local_governors"]
