"""A provider's rate-limit answers: recognising them in whatever a backend raised, and how long to back off.

A backend's create refused with HTTP 429 surfaces as the backend's own exception (e2b `RateLimitException`, httpx
`HTTPStatusError`, raygrpo's fake provider `ProviderRateLimited`); `rate_limit_signal` reads the answer off any of
them, so a refusal is never mistaken for a broken sandbox (a retried `env_error`) and never counts against a
rollout's retries.
"""

from __future__ import annotations

import contextlib
import random
import re
from dataclasses import dataclass

#: The words of a refusal. A bare "429" is not one: a path (`/tmp/pytest-429/...`), a line number or a size in a
#: failure's text would read as a refusal and back the start off for minutes; the status counts only where the text
#: says it is one ("HTTP 429", "status code 429", "error 429", "429 Too Many Requests").
_RATE_LIMIT_TEXT = re.compile(
    r"too many requests|rate[ _-]?limit|\b(?:http(?:/[\d.]+)?|status(?:[ _]?code)?|code|error)\W{0,3}429\b",
    re.IGNORECASE,
)
_LIVE_TEXT = re.compile(r"\blive\b|concurren|quota|too many (sandboxes|instances)", re.IGNORECASE)


@dataclass(frozen=True)
class RateLimitSignal:
    """A provider's "too many requests" answer, read off the exception a backend raised.

    Args:
        reason: `"live"` when it names the live-sandbox limit, else `"rate"` (the create rate, or unknown).
        retry_after_s: The provider's Retry-After, when it said one.
        message: The provider's words.
    """

    reason: str
    retry_after_s: float | None
    message: str


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__]
        if isinstance(e, BaseExceptionGroup):
            todo += list(e.exceptions)
    return seen


def rate_limit_signal(exc: BaseException) -> RateLimitSignal | None:
    """The rate-limit answer `exc` carries, or None when it is any other failure.

    Backends raise their own types (e2b `RateLimitException`, httpx `HTTPStatusError` on 429, raygrpo's fake
    provider `ProviderRateLimited`), so this looks at the whole chain: a status code of 429, a class named for rate
    limits, or the words ("too many requests", "rate limit", or 429 named as a status: "HTTP 429", "status code
    429"). A `retry_after_s` attribute or a Retry-After header is used as given.
    """
    for e in _chain(exc):
        response = getattr(e, "response", None)
        status = getattr(e, "status_code", None) or getattr(response, "status_code", None)
        name = type(e).__name__.lower()
        text = str(e)
        if not (status == 429 or "ratelimit" in name or "toomanyrequests" in name or _RATE_LIMIT_TEXT.search(text)):
            continue
        after = getattr(e, "retry_after_s", None)
        if after is None and response is not None:
            with contextlib.suppress(AttributeError, TypeError, ValueError):
                after = float(response.headers.get("Retry-After"))
        reason = getattr(e, "reason", None) or ("live" if _LIVE_TEXT.search(text) else "rate")
        return RateLimitSignal(str(reason), float(after) if after is not None else None, text[:300])
    return None


@dataclass(frozen=True)
class BackoffSettings:
    """How a start refused by the provider waits before it queues again (internal copy of the spec's fields).

    Args:
        initial_s: Wait after the first refusal; doubles with each refusal in a row.
        max_s: Longest wait.
        jitter: Each wait is stretched by a random factor in `[1, 1 + jitter]`, so refused starts do not come back
            together.
        give_up_after_s: A start refused for this long in total fails (`env_error`).
    """

    initial_s: float = 1.0
    max_s: float = 30.0
    jitter: float = 0.5
    give_up_after_s: float = 600.0

    def delay(self, attempt: int, retry_after_s: float | None = None) -> float:
        """The wait after refusal number `attempt` (1-based): at least the provider's Retry-After."""
        base = min(self.max_s, self.initial_s * 2 ** max(0, attempt - 1))
        return max(base, retry_after_s or 0.0) * (1.0 + random.uniform(0.0, self.jitter))
