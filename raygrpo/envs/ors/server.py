"""Serving ORS environments from this process: uvicorn + `openreward.environments.Server` in a background thread.

Used for `environment:` specs (raygrpo serves the class itself, see `raygrpo.actors.ors_server`), by tests, and by the
example environments' `__main__`. Binds 127.0.0.1 by default; the port is picked by the OS unless given.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from raygrpo.core.compat import ors_session_ids, patch_ors_idle_timeout, patch_sse_exit_signal, set_ors_server_log_level
from raygrpo.core.environ import apply_process_env
from raygrpo.core.errors import ResolveError
from raygrpo.core.imports import ImportSpecError, load_object

logger = logging.getLogger(__name__)


def environment_class(env: Any, field: str | None = None) -> type:
    """The `openreward.environments.Environment` subclass `env` names: a class, or an import or file-path spec.

    Raises:
        ResolveError: It does not load, or is not an Environment subclass (the message starts with `field`).
    """
    from openreward.environments import Environment

    where = f"{field}: " if field else ""
    try:
        obj = load_object(env) if isinstance(env, str) else env
    except ImportSpecError as exc:
        raise ResolveError(f"{where}{exc}") from None
    if not (isinstance(obj, type) and issubclass(obj, Environment)):
        raise ResolveError(f"{where}{env!r} is not an openreward.environments.Environment subclass (got {obj!r})")
    return obj


class RunningORSServer:
    """An ORS server running in a background thread of this process.

    Args:
        server: The `openreward.environments.Server` being served.
        url: Its base URL (`http://127.0.0.1:<port>`).
        environments: The environment classes it serves (first one is the default).
    """

    def __init__(self, server: Any, uv_server: Any, thread: threading.Thread, url: str,
                 environments: list[type]) -> None:
        self.server = server
        self.url = url
        self.environments = environments
        self._uv = uv_server
        self._thread = thread
        self._stopped = False

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def env_names(self) -> list[str]:
        """Names the server routes by (lower-cased class names); usable as `ORSSpec.env_name`."""
        return [cls.name().lower() for cls in self.environments]

    def live_sessions(self) -> int:
        """Sessions alive in the server's own registry (created and not yet deleted or reaped)."""
        return len(self.session_ids())

    def session_ids(self) -> list[str]:
        """Ids of the live sessions in the server's registry."""
        return ors_session_ids(self.server)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut the server down (its lifespan tears down remaining sessions) and join its thread. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._uv.should_exit = True
        self._thread.join(timeout_s / 2)
        if self._thread.is_alive():
            self._uv.force_exit = True
            self._thread.join(timeout_s / 2)
        if self._thread.is_alive():
            logger.warning("ORS server at %s did not stop within %g s", self.url, timeout_s)
        else:
            logger.info("ORS server at %s stopped", self.url)

    def __enter__(self) -> RunningORSServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        names = ", ".join(self.env_names)
        return f"RunningORSServer({self.url}, [{names}], live_sessions={self.live_sessions()})"


def serve_environments(
    environments: Sequence[Any] | Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    idle_timeout_s: float | None = None,
    server_log_level: int | str | None = "WARNING",
    startup_timeout_s: float = 30.0,
) -> RunningORSServer:
    """Serve ORS environments on `host:port` from a background thread.

    Args:
        environments: Environment classes or import specs (`"pkg.mod:Class"`, `"/abs/path/env.py:Class"`; a relative
            file path resolves against the working directory); one or a list. The first is the server's default.
        host: Interface to bind; 127.0.0.1 unless you mean to expose it.
        port: Port to bind; 0 lets the OS pick a free one.
        idle_timeout_s: Delete sessions that get no ping or request for this long (the SDK pings every 10 s);
            None keeps openreward's default (900 s).
        server_log_level: Level for the openreward server's per-request logs (process-wide); None leaves them.
        startup_timeout_s: How long to wait for the server to accept connections.

    Returns:
        The running server (a context manager that stops it).
    """
    apply_process_env()
    import uvicorn
    from openreward.environments import Server

    patch_sse_exit_signal()
    items = list(environments) if isinstance(environments, (list, tuple)) else [environments]
    classes = [environment_class(e) for e in items]
    if server_log_level is not None:
        set_ors_server_log_level(server_log_level)
    ors = Server(classes)
    if idle_timeout_s is not None:
        patch_ors_idle_timeout(ors, idle_timeout_s)

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot serve ORS environments on {host}:{port}: {exc}") from exc
    bound_port = sock.getsockname()[1]
    url = f"http://{host if ':' not in host else f'[{host}]'}:{bound_port}"

    config = uvicorn.Config(
        ors.app,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=60,
        timeout_graceful_shutdown=3,
        lifespan="on",
        backlog=4096,
    )
    uv_server = uvicorn.Server(config)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            uv_server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            errors.append(exc)
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=f"ors-server-{bound_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not uv_server.started:
        if not thread.is_alive() or errors:
            raise RuntimeError(f"the ORS server at {url} failed to start: {errors[0] if errors else 'exited'}")
        if time.monotonic() > deadline:
            uv_server.should_exit = True
            raise RuntimeError(f"the ORS server at {url} did not start within {startup_timeout_s:g} s")
        time.sleep(0.01)
    running = RunningORSServer(ors, uv_server, thread, url, classes)
    logger.info("serving %s at %s", ", ".join(c.__name__ for c in classes), url)
    return running


@contextlib.contextmanager
def serving(environments: Sequence[Any] | Any, **kwargs: Any) -> Iterator[RunningORSServer]:
    """`with serving([Env]) as srv:` — `serve_environments` as a context manager that always stops the server."""
    running = serve_environments(environments, **kwargs)
    try:
        yield running
    finally:
        running.stop()


def main(environment: Any, argv: Sequence[str] | None = None) -> None:
    """Command-line entry for example environment files: `python env.py [--host H] [--port P]`.

    Serves `environment` (a class or spec) until interrupted. Binds 127.0.0.1 unless `--host` says otherwise.
    """
    import argparse

    parser = argparse.ArgumentParser(description=f"Serve {getattr(environment, '__name__', environment)} over ORS")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default: 8000; 0 picks a free one)")
    parser.add_argument("--idle-timeout", type=float, default=None,
                        help="seconds before an unpinged session is deleted (default: openreward's 900)")
    parser.add_argument("--log-level", default="INFO", help="openreward server log level (default: INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    running = serve_environments(environment, host=args.host, port=args.port, idle_timeout_s=args.idle_timeout,
                                 server_log_level=args.log_level)
    print(f"ORS server for {', '.join(running.env_names)} listening on {running.url}", flush=True)
    try:
        while running.running:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()
