"""`FakeProviderEnvironment`: a Harbor backend whose sandboxes live in the fake provider service.

It behaves as a remote provider's backend does, without costing local CPU per sandbox: a create is an HTTP call
that the provider may refuse with 429 (`ProviderRateLimited`, carrying its Retry-After), every exec is a call that
fails once the sandbox is gone (deleted, or its lifetime ended), and stop deletes it. Each sandbox carries the run's
id as a label (`io.raygrpo.run`), so what a run left is a listing away. Uploads are no-ops; downloading the verifier
directory writes `reward.txt` with `reward` when set, so Harbor's verifier scores the rollout.

Its classmethods are the lease hook (`raygrpo.leases.hooks.LeaseHook`): raygrpo labels each sandbox with its
lease (`io.raygrpo.lease`), gives it a lifetime (`lifetime_s`) derived from the rollout deadline, and reaps a crashed
run's sandboxes by listing that label and deleting what it finds.

Load it with `import_path="raygrpo.testing.fake_provider.backend:FakeProviderEnvironment"` and
`environment_kwargs={"url": ...}`.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import httpx
from harbor.environments.base import ExecResult

from raygrpo.leases.ledger import LEASE_LABEL
from raygrpo.testing.null import NullEnvironment
from raygrpo.sandbox.owners import RUN_ENV

RUN_LABEL = "io.raygrpo.run"


class _SharedSession:
    """One aiohttp session per event loop and provider, shared by the loop's sandboxes and closed when the last of
    them stops. A client per sandbox costs more CPU than the sandbox's calls (connections opened again, and for
    httpx an SSL context per client); httpx's pool also scans every pooled connection on each request, which at a
    few hundred sandboxes per actor cost more than the rest of a rollout.

    Args:
        url: The provider's base URL.
        timeout_s: Total timeout of each call.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self.session = aiohttp.ClientSession(
            base_url=url, timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30))
        self.users = 0


_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, float], _SharedSession]] = (
    weakref.WeakKeyDictionary())


def _acquire_session(url: str, timeout_s: float) -> aiohttp.ClientSession:
    sessions = _sessions.setdefault(asyncio.get_running_loop(), {})
    shared = sessions.get((url, timeout_s))
    if shared is None or shared.session.closed:
        shared = sessions[(url, timeout_s)] = _SharedSession(url, timeout_s)
    shared.users += 1
    return shared.session


async def _release_session(url: str, timeout_s: float) -> None:
    sessions = _sessions.get(asyncio.get_running_loop(), {})
    shared = sessions.get((url, timeout_s))
    if shared is None:
        return
    shared.users -= 1
    if shared.users <= 0:
        del sessions[(url, timeout_s)]
        await shared.session.close()


class ProviderRateLimited(RuntimeError):
    """The provider refused a create with HTTP 429 ("too many requests").

    Args:
        message: The provider's answer.
        retry_after_s: What its Retry-After header said (None when absent).
    """

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SandboxGone(RuntimeError):
    """The provider no longer has the sandbox (deleted, or its lifetime ended)."""


class FakeProviderEnvironment(NullEnvironment):
    """A sandbox in the fake provider (see the module docstring); files move as in `NullEnvironment`.

    Args:
        environment_dir, environment_name, session_id, trial_paths, task_env_config, logger:
            as for every Harbor `BaseEnvironment`.
        url (`str`):
            The provider's base URL (`FakeProviderProcess.url`).
        lifetime_s (`float`, *optional*):
            The sandbox's lifetime at the provider: it is deleted then even if nobody stops it.
        labels (`dict[str, str]`, *optional*):
            More labels for the sandbox (the run's id is always added).
        reward (`float`, *optional*):
            When set, the verifier directory's download writes `reward.txt` with this value.
        request_timeout_s (`float`, defaults to `60`):
            Timeout of each call to the provider.
        **kwargs: the remaining `BaseEnvironment` arguments.
    """

    def __init__(self, environment_dir: Path, environment_name: str, session_id: str, trial_paths: Any,
                 task_env_config: Any, logger: Any = None, *, url: str, lifetime_s: float | None = None,
                 labels: dict[str, str] | None = None, reward: float | None = None, request_timeout_s: float = 60.0,
                 **kwargs: Any) -> None:
        self._url = url.rstrip("/")
        self.lifetime_s = lifetime_s
        run = os.environ.get(RUN_ENV)
        self.labels = {**(labels or {}), **({RUN_LABEL: run} if run else {})}
        self._timeout = request_timeout_s
        self._session: aiohttp.ClientSession | None = None
        #: The provider's id of the sandbox, once its create answered.
        self.sandbox_id: str | None = None
        super().__init__(environment_dir, environment_name, session_id, trial_paths, task_env_config, logger,
                         reward=reward, **kwargs)

    #: The lease hook: the argument that sets a sandbox's lifetime.
    lease_lifetime_kwarg: ClassVar[str | None] = "lifetime_s"

    @staticmethod
    def type() -> str:
        return "raygrpo-fake-provider"

    @classmethod
    def lease_kwargs(cls, kwargs: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
        """The lease hook: `kwargs` with `labels` added to the sandbox's labels."""
        return {**kwargs, "labels": {**(kwargs.get("labels") or {}), **labels}}

    @classmethod
    def lease_reach(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The lease hook: what reaches the provider again (its URL)."""
        return {"url": kwargs["url"]}

    @classmethod
    def reap_lease(cls, reach: dict[str, Any], lease_id: str, sandbox_id: str | None,
                   timeout_s: float = 10.0) -> list[str]:
        """The lease hook: delete every sandbox labelled with the lease (a create whose answer never arrived
        included) and `sandbox_id`; returns the ids deleted (one already gone is not an error).

        Raises:
            httpx.HTTPError: The provider did not answer, or refused.
        """
        with httpx.Client(base_url=str(reach["url"]).rstrip("/"), timeout=timeout_s) as client:
            listing = client.get("/sandboxes", params={"label": f"{LEASE_LABEL}={lease_id}"})
            listing.raise_for_status()
            ids = {s["id"] for s in listing.json()} | ({sandbox_id} if sandbox_id else set())
            deleted = []
            for found in sorted(ids):
                response = client.delete(f"/sandboxes/{found}")
                if response.status_code == 204:
                    deleted.append(found)
                elif response.status_code != 404:
                    response.raise_for_status()
        return deleted

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise SandboxGone("the sandbox was not started")
        return self._session

    async def start(self, force_build: bool) -> None:
        if self.sandbox_id is not None:
            return
        if self._session is None:
            self._session = _acquire_session(self._url, self._timeout)
        async with self._session.post("/sandboxes", json={"lifetime_s": self.lifetime_s,
                                                          "labels": self.labels}) as response:
            if response.status == 429:
                after = response.headers.get("Retry-After")
                body = await response.json(content_type=None)
                raise ProviderRateLimited(f"too many requests: {body.get('error', body)}",
                                          float(after) if after else None)
            response.raise_for_status()
            self.sandbox_id = (await response.json())["id"]

    async def stop(self, delete: bool = True) -> None:
        try:
            if self.sandbox_id is not None:
                async with self._http().delete(f"/sandboxes/{self.sandbox_id}") as response:
                    if response.status not in (204, 404):
                        response.raise_for_status()
                self.sandbox_id = None
        finally:
            if self.sandbox_id is None and self._session is not None:
                self._session = None
                await _release_session(self._url, self._timeout)

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        if self.sandbox_id is None:
            raise SandboxGone("the sandbox was not started")
        async with self._http().post(f"/sandboxes/{self.sandbox_id}/exec", json={"command": command}) as response:
            if response.status == 404:
                raise SandboxGone(f"sandbox {self.sandbox_id} is gone at the provider")
            response.raise_for_status()
            body = await response.json()
        return ExecResult(stdout=body.get("stdout") or None, stderr=body.get("stderr") or None,
                          return_code=int(body.get("return_code", 0)))
