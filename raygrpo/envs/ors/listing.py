"""Listing the tasks of an ORS environment on the driver, with the SDK's synchronous client and a deadline per request.

Failures become errors that name the config field and the URL (`envs.echo.url: cannot reach the ORS server at ...`)
instead of the SDK's multi-line retry reports or a hang. Listing is part of resolving a run (before Ray starts), so
both errors are `ResolveError`s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from raygrpo.envs.ors.client import api_key, make_client, sdk_environment, session_url
from raygrpo.core.errors import ResolveError, describe
from raygrpo.specs.ors import ORSSpec
from raygrpo.core.types import TaskRef

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Above this many explicit indices, one task-range request replaces per-index requests.
_RANGE_FETCH_THRESHOLD = 16


class ORSConfigError(ResolveError):
    """The ORS server answered, but the config does not fit it (unknown split, index out of range, unknown env name,
    missing or rejected API key). The message names the config field."""


class ORSConnectionError(ResolveError):
    """The ORS server could not be reached (refused, timed out, name did not resolve). The message names the URL and
    the config field that points at it."""


class _ServerRefused(ORSConfigError):
    """The server answered a listing request with a client error (e.g. list_tasks not implemented)."""


def list_ors_tasks(spec: ORSSpec, name: str) -> list[TaskRef]:
    """The tasks `spec` selects, as `TaskRef`s (metadata = the task spec dict when `include_metadata`).

    Every request is bounded by `spec.connect_timeout_s`. Runs from sync code; the SDK's client runs its own loop
    thread.

    Raises:
        ORSConnectionError: The server cannot be reached (the message names the URL and the config field).
        ORSConfigError: The server answered but the config does not fit it (split, indices, env_name, API key), or
            the split has no tasks.
    """
    if spec.environment is not None:
        raise ORSConfigError(f"{spec.field_path(name, 'environment')}: {spec.environment!r} must be served before "
                             "its tasks are listed (then list spec.served_at(url))")
    if spec.catalog is not None and not api_key(spec):
        raise ORSConfigError(f"{spec.field_path(name, 'api_key_env')}: environment variable {spec.api_key_env} is "
                             f"not set; the catalog environment {spec.catalog!r} needs an OpenReward API key")
    lister = _Lister(spec, name)
    pairs = lister.list()
    if not pairs:  # a run of nothing would "complete" and exit 0
        raise ORSConfigError(f"{spec.field_path(name, 'split')}: split {spec.split!r} has no tasks on {lister.where}")
    return [
        TaskRef(env=name, index=index, split=spec.split, metadata=dict(task) if spec.include_metadata else {})
        for index, task in pairs
    ]


class _Lister:
    """One listing: the SDK client, a one-thread pool that bounds each blocking request, and the error wording."""

    def __init__(self, spec: ORSSpec, name: str) -> None:
        self.spec = spec
        self.name = name
        self.where = f"the ORS server at {spec.url}/" if spec.url is not None else f"catalog environment {spec.catalog!r}"

    def list(self) -> list[tuple[int, dict[str, Any]]]:
        client = make_client(self.spec, sync=True)
        try:
            return self._list(sdk_environment(self.spec, client))
        finally:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing must not hide the real outcome
                logger.debug("closing the listing client failed", exc_info=True)

    def _list(self, env: Any) -> list[tuple[int, dict[str, Any]]]:
        spec = self.spec
        request = self._request

        splits = request(env.list_splits, "list the splits")
        if spec.split not in splits:
            raise ORSConfigError(f"{spec.field_path(self.name, 'split')}: split {spec.split!r} does not exist on "
                                 f"{self.where} (it has: {', '.join(map(repr, splits)) or 'none'})")
        if spec.indices is None and spec.num_tasks is None:
            try:
                tasks = request(lambda: env.list_tasks(spec.split), "list the tasks")
                return [(i, _task_spec(t)) for i, t in enumerate(tasks)]
            except _ServerRefused:
                # Index-only environments (list_tasks not implemented): count, then fetch the range.
                logger.debug("%s: list_tasks refused; counting and fetching a range instead", spec.describe())
        total = request(lambda: env.num_tasks(spec.split), "count the tasks")
        if spec.indices is None:
            count = total if spec.num_tasks is None else min(spec.num_tasks, total)
            if spec.num_tasks is not None and spec.num_tasks > total:
                logger.warning("%s: num_tasks=%d but split %r has only %d tasks; using all of them",
                               spec.field_path(self.name, "num_tasks"), spec.num_tasks, spec.split, total)
            tasks = request(lambda: env.get_task_range(spec.split, 0, count), "fetch the tasks")
            return [(i, _task_spec(t)) for i, t in enumerate(tasks)]
        bad = [i for i in spec.indices if i >= total]
        if bad:
            raise ORSConfigError(f"{spec.field_path(self.name, 'indices')}: index {bad[0]} is out of range: split "
                                 f"{spec.split!r} has {total} tasks (0..{total - 1})")
        if len(spec.indices) > _RANGE_FETCH_THRESHOLD:
            lo, hi = min(spec.indices), max(spec.indices) + 1
            tasks = request(lambda: env.get_task_range(spec.split, lo, hi), "fetch the tasks")
            by_index = {lo + k: _task_spec(t) for k, t in enumerate(tasks)}
            return [(i, by_index[i]) for i in spec.indices]
        return [(i, _task_spec(request(lambda i=i: env.get_task(spec.split, i), f"fetch task {i}")))
                for i in spec.indices]

    def _request(self, fn: Callable[[], T], what: str) -> T:
        """Run one blocking SDK request under `connect_timeout_s`; failures become errors that name the field."""
        import aiohttp
        from openreward.api.environments import AuthenticationError
        from openreward.api.errors import OpenRewardError

        spec = self.spec
        field = spec.field_path(self.name)
        target = spec.url or session_url(spec)
        try:
            return _call_with_deadline(fn, spec.connect_timeout_s)
        except _DeadlinePassed:
            raise ORSConnectionError(f"{field}: cannot reach the ORS server at {target}/ (no answer within "
                                     f"{spec.connect_timeout_s:g} s while trying to {what})") from None
        except AuthenticationError:
            raise ORSConfigError(f"{spec.field_path(self.name, 'api_key_env')}: {target}/ rejected the API key from "
                                 f"{spec.api_key_env} (401 Unauthorized)") from None
        except aiohttp.ClientResponseError as exc:
            if exc.status == 404 and spec.env_name is not None:
                known = _server_environments(spec)
                hint = f" (it serves: {', '.join(known)})" if known else ""
                raise ORSConfigError(f"{spec.field_path(self.name, 'env_name')}: no environment {spec.env_name!r} "
                                     f"on {self.where}{hint}") from None
            if exc.status in (400, 404, 405, 501):
                raise _ServerRefused(f"{field}: {target}/ refused to {what}: HTTP {exc.status}: {exc.message}") from None
            raise ORSConnectionError(f"{field}: the ORS server at {target}/ failed to {what}: HTTP {exc.status}: "
                                     f"{exc.message}") from None
        except (aiohttp.ClientError, OSError, OpenRewardError, TimeoutError) as exc:
            raise ORSConnectionError(f"{field}: cannot reach the ORS server at {target}/ ({describe(exc)})") from None


class _DeadlinePassed(Exception):
    pass


def _call_with_deadline(fn: Callable[[], T], timeout_s: float) -> T:
    """`fn()` in a daemon thread, waited for at most `timeout_s`.

    The SDK's synchronous calls take no deadline of their own. A call still blocked at the deadline is abandoned to
    its daemon thread (a thread pool would join it at interpreter exit); the run fails at once anyway.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="raygrpo-ors-list", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _DeadlinePassed
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _server_environments(spec: ORSSpec) -> list[str]:
    """Names a self-hosted server serves (`GET /list_environments`), for error messages; [] when unknown."""
    if spec.url is None:
        return []
    import httpx

    try:
        response = httpx.get(f"{spec.url}/list_environments", timeout=min(5.0, spec.connect_timeout_s))
        if response.is_success:
            return [str(n) for n in response.json()]
    except Exception:  # noqa: BLE001 - only an error-message hint
        pass
    return []


def _task_spec(task: Any) -> dict[str, Any]:
    spec = task.task_spec if hasattr(task, "task_spec") else task
    return dict(spec) if isinstance(spec, dict) else {"task_spec": spec}
