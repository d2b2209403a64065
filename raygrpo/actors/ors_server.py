"""A Ray actor that serves `environment:` ORS specs: `raygrpo.envs.ors.server` in its own worker process.

The driver starts one per embedded environment (`start_embedded_server`), lists tasks against its URL and hands env
pool actors the spec returned by `spec.served_at(url)`. The actor owns the server thread; killing the actor (or the
driver's job ending) stops it, so a crashed run leaves no server behind.

The server binds 127.0.0.1 by default, so env pool actors must run on the same node. On a cluster pass
`host="node"`: it binds the address of the node it landed on and advertises that (`"0.0.0.0"` binds every interface
and advertises the node's address too). There its environment's file path is mapped into the node's copy of the job's
working_dir (`workdir`, see `raygrpo.core.workdir`).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import ray

from raygrpo.actors.heap import freeze_heap
from raygrpo.envs.ors.server import serve_environments
from raygrpo.core.errors import describe
from raygrpo.specs.ors import ORSSpec
from raygrpo.core.workdir import relocate

logger = logging.getLogger(__name__)

#: CPU reservation of one embedded server (it is mostly idle between requests).
SERVER_NUM_CPUS = 0.5


class _ORSServer:
    """Actor body: serves environment classes named by import/file-path specs.

    Args:
        environments: Import specs (`"pkg.mod:Class"`, `"/abs/path/env.py:Class"`) of the environments to serve.
        host: Interface to bind: 127.0.0.1 on one machine, `"node"` for this node's address on a cluster.
        port: Port to bind; 0 picks a free one.
        idle_timeout_s: Server-side idle timeout of sessions (None: openreward's 900 s).
        workdir: The driver's working_dir on a cluster (paths under it are mapped into this node's copy).
    """

    def __init__(
        self,
        environments: list[str],
        host: str = "127.0.0.1",
        port: int = 0,
        idle_timeout_s: float | None = None,
        workdir: str | None = None,
    ) -> None:
        if host == "node":
            host = ray.util.get_node_ip_address()
        self._running = serve_environments(
            relocate(environments, workdir), host=host, port=port, idle_timeout_s=idle_timeout_s
        )
        self._url = self._running.url
        if host in ("0.0.0.0", "::"):
            self._url = f"http://{ray.util.get_node_ip_address()}:{self._running.port}"
        freeze_heap()

    def url(self) -> str:
        """The base URL clients use."""
        return self._url

    def env_names(self) -> list[str]:
        return self._running.env_names

    def live_sessions(self) -> int:
        """Sessions alive in the server's own registry."""
        return self._running.live_sessions()

    def stop(self) -> None:
        """Stop serving (idempotent). Kill the actor afterwards to free its resources."""
        self._running.stop()


ORSServerActor = ray.remote(num_cpus=SERVER_NUM_CPUS, max_restarts=0)(_ORSServer)


def start_embedded_server(
    spec: ORSSpec,
    name: str,
    *,
    host: str = "127.0.0.1",
    idle_timeout_s: float | None = None,
    startup_timeout_s: float = 120.0,
    workdir: str | None = None,
) -> tuple[Any, str]:
    """Start an `ORSServerActor` serving `spec.environment` and return `(actor_handle, url)`.

    The spec's file path is absolute (made so when the config loaded), since the actor's working directory differs.
    Then `spec.served_at(url)` is the spec to list tasks with and to give to env pool actors. Stop with
    `actor.stop.remote()` then `ray.kill(actor)`.

    Raises:
        ValueError: `spec` has no `environment`.
        RuntimeError: The server did not come up (the message names the config field and the import spec).
    """
    if spec.environment is None:
        raise ValueError(f"envs.{name}: start_embedded_server needs an `environment` spec")
    actor = ORSServerActor.options(name=f"raygrpo-ors-{name}-{uuid.uuid4().hex[:8]}").remote(
        [spec.environment], host=host, idle_timeout_s=idle_timeout_s, workdir=workdir
    )
    try:
        url = ray.get(actor.url.remote(), timeout=startup_timeout_s)
    except Exception as exc:
        ray.kill(actor)
        raise RuntimeError(f"envs.{name}.environment: cannot serve {spec.environment!r}: {describe(exc)}") from exc
    logger.info("envs.%s: serving %s at %s", name, spec.environment, url)
    return actor, url
