"""The fake provider's rules: a sliding-window create rate, a live-sandbox cap, lifetimes, and a log of every call.

Plain Python, driven by the HTTP service (`service.py`) under one lock. Times are `time.time()` seconds, so the log
lines up with other processes' clocks on the same machine.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass
class Limits:
    """What the provider allows.

    Args:
        create_rate_per_s: Most creates accepted in any sliding 1 s window (None: no limit).
        max_live: Most sandboxes alive at once (None: no limit).
        create_delay_s: How long a create takes before it answers (a provider's start latency).
        hold_creates: Creates wait before answering until this is cleared (a response held back, for crash tests);
            the sandbox already exists while its create waits.
        exec_delay_s: How long each exec takes.
    """

    create_rate_per_s: float | None = None
    max_live: int | None = None
    create_delay_s: float = 0.0
    hold_creates: bool = False
    exec_delay_s: float = 0.0


@dataclass
class Sandbox:
    id: str
    created: float
    expires: float | None
    labels: dict[str, str] = field(default_factory=dict)


class RateLimited(Exception):
    """A create beyond the provider's limits (HTTP 429)."""

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class ProviderState:
    """The provider's sandboxes and limits.

    Args:
        limits: What it allows (changeable while it runs: `set_limits`).
        log: Where every call is written, one JSON object per line (`{"t", "op", "id", "status", ...}`).
    """

    def __init__(self, limits: Limits, log: IO[str] | None = None) -> None:
        self.limits = limits
        self.log = log
        self.lock = threading.Lock()
        self.sandboxes: dict[str, Sandbox] = {}
        self._accepted: deque[float] = deque()

    def _write(self, op: str, status: int, sandbox_id: str | None = None, **extra: Any) -> None:
        if self.log is not None:
            self.log.write(json.dumps({"t": time.time(), "op": op, "id": sandbox_id, "status": status, **extra})
                           + "\n")
            self.log.flush()

    def set_limits(self, **changes: Any) -> Limits:
        with self.lock:
            for key, value in changes.items():
                if not hasattr(self.limits, key):
                    raise ValueError(f"no such limit: {key}")
                setattr(self.limits, key, value)
            self._write("limits", 200, limits=dict(self.limits.__dict__))
            return self.limits

    def expire(self, now: float | None = None) -> list[str]:
        """Delete the sandboxes whose lifetime ended; returns their ids."""
        now = time.time() if now is None else now
        with self.lock:
            gone = [s.id for s in self.sandboxes.values() if s.expires is not None and s.expires <= now]
            for sandbox_id in gone:
                del self.sandboxes[sandbox_id]
                self._write("expire", 200, sandbox_id)
            return gone

    def create(self, lifetime_s: float | None, labels: dict[str, str]) -> Sandbox:
        """Create a sandbox, or raise `RateLimited` when the rate or the live cap would be exceeded."""
        now = time.time()
        self.expire(now)
        with self.lock:
            limits = self.limits
            while self._accepted and self._accepted[0] <= now - 1.0:
                self._accepted.popleft()
            if limits.create_rate_per_s is not None and len(self._accepted) >= limits.create_rate_per_s:
                self._write("create", 429, reason="rate")
                raise RateLimited("too many requests: create rate exceeded", self._accepted[0] + 1.0 - now)
            if limits.max_live is not None and len(self.sandboxes) >= limits.max_live:
                self._write("create", 429, reason="live")
                raise RateLimited("too many requests: live sandbox limit reached", 1.0)
            self._accepted.append(now)
            sandbox = Sandbox(uuid.uuid4().hex[:16], now, now + lifetime_s if lifetime_s else None, dict(labels))
            self.sandboxes[sandbox.id] = sandbox
            self._write("create", 201, sandbox.id, labels=sandbox.labels, lifetime_s=lifetime_s)
            return sandbox

    def delete(self, sandbox_id: str) -> bool:
        with self.lock:
            found = self.sandboxes.pop(sandbox_id, None) is not None
            self._write("delete", 204 if found else 404, sandbox_id)
            return found

    def exists(self, sandbox_id: str) -> bool:
        self.expire()
        with self.lock:
            return sandbox_id in self.sandboxes

    def record_exec(self, sandbox_id: str, found: bool) -> None:
        with self.lock:
            self._write("exec", 200 if found else 404, sandbox_id)

    def listing(self, label: tuple[str, str] | None = None) -> list[dict[str, Any]]:
        self.expire()
        with self.lock:
            return [{"id": s.id, "created": s.created, "expires": s.expires, "labels": s.labels}
                    for s in self.sandboxes.values() if label is None or s.labels.get(label[0]) == label[1]]


def open_log(path: str | Path) -> IO[str]:
    """The log file, appended to, line-buffered."""
    return open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the service
