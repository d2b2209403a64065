"""Listing the tasks of an ORS environment on the driver, with every request under a deadline.

Failures become errors that name the config field and the URL (`envs.echo.url: cannot reach the ORS server at ...`)
instead of the SDK's multi-line retry reports or a hang.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from raygrpo.specs.ors import ORSConfigError, ORSConnectionError

if TYPE_CHECKING:
    from raygrpo.specs.ors import ORSSpec

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Above this many explicit indices, one task-range request replaces per-index requests.
_RANGE_FETCH_THRESHOLD = 16
#: Concurrent per-index task requests while listing.
_LIST_CONCURRENCY = 8


class ORSTaskLister:
    """Lists the tasks an `ORSSpec` selects, as `(index, task spec)` pairs.

    Args:
        spec: The environment's spec (`url` or `catalog`).
        name: The environment's name in the run config, for error messages.
    """

    def __init__(self, spec: ORSSpec, name: str) -> None:
        self.spec = spec
        self.name = name

    async def list(self) -> list[tuple[int, dict[str, Any]]]:
        client = self.spec.make_client()
        envs_api = client.environments
        try:
            env = self.spec.sdk_environment(client)
            return await self._list_with(env)
        finally:
            try:
                await asyncio.wait_for(envs_api.aclose(), 5)
            except Exception:  # noqa: BLE001 - closing a client must not hide the real outcome
                logger.debug("closing the listing client failed", exc_info=True)

    async def _list_with(self, env: Any) -> list[tuple[int, dict[str, Any]]]:
        splits = await self._request(env.list_splits(), "list the splits")
        if self.spec.split not in splits:
            raise ORSConfigError(
                f"{self.spec.field_path(self.name, 'split')}: split {self.spec.split!r} does not exist on "
                f"{self._where()} "
                f"(it has: {', '.join(map(repr, splits)) or 'none'})"
            )
        if self.spec.indices is None and self.spec.num_tasks is None:
            try:
                tasks = await self._request(env.list_tasks(self.spec.split), "list the tasks")
                return [(i, _task_spec(t)) for i, t in enumerate(tasks)]
            except _ServerRefused:
                # Index-only environments (list_tasks not implemented): count, then fetch the range.
                logger.debug("%s: list_tasks refused; counting and fetching a range instead", self.spec.describe())
        total = await self._request(env.num_tasks(self.spec.split), "count the tasks")
        if self.spec.indices is None:
            count = total if self.spec.num_tasks is None else min(self.spec.num_tasks, total)
            if self.spec.num_tasks is not None and self.spec.num_tasks > total:
                logger.warning(
                    "%s: num_tasks=%d but split %r has only %d tasks; using all of them",
                    self.spec.field_path(self.name, "num_tasks"), self.spec.num_tasks, self.spec.split, total,
                )
            tasks = await self._request(env.get_task_range(self.spec.split, 0, count), "fetch the tasks")
            return [(i, _task_spec(t)) for i, t in enumerate(tasks)]
        bad = [i for i in self.spec.indices if i >= total]
        if bad:
            raise ORSConfigError(
                f"{self.spec.field_path(self.name, 'indices')}: index {bad[0]} is out of range: "
                f"split {self.spec.split!r} has "
                f"{total} tasks (0..{total - 1})"
            )
        if len(self.spec.indices) > _RANGE_FETCH_THRESHOLD:
            lo, hi = min(self.spec.indices), max(self.spec.indices) + 1
            tasks = await self._request(env.get_task_range(self.spec.split, lo, hi), "fetch the tasks")
            by_index = {lo + k: _task_spec(t) for k, t in enumerate(tasks)}
            return [(i, by_index[i]) for i in self.spec.indices]
        gate = asyncio.Semaphore(_LIST_CONCURRENCY)

        async def one(index: int) -> tuple[int, dict[str, Any]]:
            async with gate:
                task = await self._request(env.get_task(self.spec.split, index), f"fetch task {index}")
                return index, _task_spec(task)

        return list(await asyncio.gather(*(one(i) for i in self.spec.indices)))

    def _where(self) -> str:
        if self.spec.url is not None:
            return f"the ORS server at {self.spec.url}/"
        return f"catalog environment {self.spec.catalog!r}"

    async def _request(self, aw: Awaitable[T], what: str) -> T:
        """Await one SDK request under `connect_timeout_s`, turning failures into errors that name the field."""
        import aiohttp
        from openreward.api._session import AuthenticationError
        from openreward.api.errors import OpenRewardError

        field = self.spec.field_path(self.name)
        target = self.spec.url or self.spec.session_url()
        try:
            return await asyncio.wait_for(aw, self.spec.connect_timeout_s)
        except asyncio.TimeoutError:
            raise ORSConnectionError(
                f"{field}: cannot reach the ORS server at {target}/ "
                f"(no answer within {self.spec.connect_timeout_s:g} s "
                f"while trying to {what})"
            ) from None
        except AuthenticationError:
            raise ORSConfigError(
                f"{self.spec.field_path(self.name, 'api_key_env')}: {target}/ rejected the API key from "
                f"{self.spec.api_key_env} (401 Unauthorized)"
            ) from None
        except aiohttp.ClientResponseError as exc:
            status = exc.status
            if status == 404 and self.spec.env_name is not None:
                known = await self._server_environments()
                hint = f" (it serves: {', '.join(known)})" if known else ""
                raise ORSConfigError(
                    f"{self.spec.field_path(self.name, 'env_name')}: no environment {self.spec.env_name!r} on "
                    f"{self._where()}"
                    f"{hint}"
                ) from None
            if status in (400, 404, 405, 501):
                raise _ServerRefused(f"{field}: {target}/ refused to {what}: HTTP {status}: {exc.message}") from None
            raise ORSConnectionError(
                f"{field}: the ORS server at {target}/ failed to {what}: HTTP {status}: {exc.message}"
            ) from None
        except (aiohttp.ClientError, OSError, OpenRewardError, TimeoutError) as exc:
            raise ORSConnectionError(
                f"{field}: cannot reach the ORS server at {target}/ ({_short_error(exc)})"
            ) from None

    async def _server_environments(self) -> list[str]:
        """Names a self-hosted server serves (`GET /list_environments`), for error messages; [] when unknown."""
        if self.spec.url is None:
            return []
        import aiohttp

        try:
            timeout = aiohttp.ClientTimeout(total=min(5.0, self.spec.connect_timeout_s))
            async with aiohttp.ClientSession(timeout=timeout) as http:
                async with http.get(f"{self.spec.url}/list_environments") as resp:
                    if resp.ok:
                        return [str(n) for n in await resp.json()]
        except Exception:  # noqa: BLE001 - only an error-message hint
            pass
        return []


class _ServerRefused(ORSConfigError):
    """The server answered a listing request with a client error (e.g. list_tasks not implemented)."""


def _task_spec(task: Any) -> dict[str, Any]:
    spec = task.task_spec if hasattr(task, "task_spec") else task
    return dict(spec) if isinstance(spec, dict) else {"task_spec": spec}


def _short_error(exc: BaseException) -> str:
    """A one-line description of a connection failure (the SDK's retry errors are multi-line)."""
    from openreward.api.errors import MaxRetriesError

    if isinstance(exc, MaxRetriesError) and exc.errors:
        last = exc.errors[-1]
        return f"{type(last).__name__}: {last} (after {len(exc.errors)} attempts)"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run_in_fresh_loop(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion on a new event loop in a worker thread.

    Works from plain sync code and from inside a running loop alike (a nested `asyncio.run` would fail there), and
    the SDK's loop-bound aiohttp sessions live and die with that private loop.
    """

    async def main() -> T:
        return await factory()

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="raygrpo-ors-list") as pool:
        return pool.submit(asyncio.run, main()).result()
