"""A Ray actor that runs a vLLM server (`vllm serve`, launched the way TRL 1.16 does) on its GPU and exposes its URL.

Env pool actors generate through the URL with `raygrpo.policy.vllm_client.VLLMClient` (`policy.kind: vllm`); the
learner points TRL's `vllm_mode="server"` at it (`raygrpo.policy.vllm_serve.trl_server_kwargs`) and TRL pushes the
weights over NCCL. `raygrpo/policy/vllm_serve.py` says which command is launched, and which endpoints TRL uses.

The server must not outlive its actor (it would keep the GPU's memory). It runs in its own process group, with vLLM's
engine core and workers, and `stop()` ends the whole group: SIGTERM, a grace period, SIGKILL. If the actor dies
instead, the kernel sends the server SIGTERM (`prctl(PR_SET_PDEATHSIG)`), and a detached watcher (double-forked, so
Ray's kill of a dead worker's direct children misses it) ends the rest of the group, escalating to SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import httpx

from raygrpo.config.policy import VLLMServeConfig
from raygrpo.policy.vllm_serve import build_command, server_env

logger = logging.getLogger(__name__)

_WILDCARD = ("0.0.0.0", "", "::")
_WATCHER_TAG = "raygrpo-vllm-watcher"
_WATCHER = "import sys; from raygrpo.actors.vllm_server import _watch; _watch(*sys.argv[2:])"


def _watch(actor_pid: str, pgid: str, grace_s: str) -> None:
    """Body of the detached watcher: once process `actor_pid` is gone, end process group `pgid` (TERM, then KILL)."""
    import psutil

    if os.fork():  # detach: the intermediate exits, the watcher is no longer the actor's child
        os._exit(0)
    try:
        actor = psutil.Process(int(actor_pid))
        while _signal_group(int(pgid)):
            if not actor.is_running() or actor.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.5)
        else:
            return  # stopped by the actor
    except psutil.Error:  # the actor is gone
        pass
    for sig, wait_s in ((signal.SIGTERM, float(grace_s)), (signal.SIGKILL, 0.0)):
        _signal_group(int(pgid), sig)
        deadline = time.monotonic() + wait_s
        while _signal_group(int(pgid)) and time.monotonic() < deadline:
            time.sleep(0.2)


def _death_signal(sig: int) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive `sig` when its parent (thread) exits; None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    prctl, parent = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl, os.getpid()

    def preexec() -> None:
        prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return preexec


def _signal_group(pgid: int, sig: int = 0) -> bool:
    """Send `sig` to process group `pgid` (0 only probes it); False when no process of the group is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


class VLLMServerActor:
    """Runs one vLLM server subprocess (create it with `start_vllm_server`).

    Args:
        cfg: A `VLLMServeConfig` as a dict.
        model_path: Model directory or hub id, as the run names it.
    """

    def __init__(self, cfg: dict[str, Any], model_path: str):
        self.cfg = VLLMServeConfig.model_validate(cfg)
        self.model_path = model_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.command: list[str] = []
        self._url: str | None = None
        self._model_name: str | None = None
        self._log_path: str | None = None

    async def start(self) -> str:
        """Launch the server, wait until `/health` answers and return its URL; on failure, end it and raise."""
        if self.proc is not None:
            raise RuntimeError("the vLLM server was started already")
        cfg = self.cfg
        if not (port := cfg.port):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a free port on this node
                sock.bind(("" if cfg.host in _WILDCARD else cfg.host, 0))
                port = sock.getsockname()[1]
        self.command = build_command(cfg, self.model_path, port)
        log_dir = cfg.log_dir or tempfile.mkdtemp(prefix="raygrpo-vllm-")
        os.makedirs(log_dir, exist_ok=True)
        self._log_path = os.path.join(log_dir, f"vllm-serve-{port}.log")
        if cfg.host in _WILDCARD:  # reachable from other nodes: name this node's IP, probe on loopback
            import ray

            self._url, probe = f"http://{ray.util.get_node_ip_address()}:{port}", f"http://127.0.0.1:{port}"
        else:
            self._url = probe = f"http://{cfg.host}:{port}"
        with open(self._log_path, "ab") as log:
            log.write(f"$ {shlex.join(self.command)}\n".encode())
            log.flush()
            io: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": subprocess.STDOUT}
            self.proc = subprocess.Popen(
                self.command,
                env={**os.environ, **server_env(cfg)},
                start_new_session=True,  # its own process group: vLLM's engine core and workers join it
                preexec_fn=_death_signal(signal.SIGTERM),
                **io,
            )
            watcher = [_WATCHER_TAG, str(os.getpid()), str(self.proc.pid), str(cfg.stop_timeout_s)]
            path_env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
            subprocess.Popen(
                [sys.executable, "-c", _WATCHER, *watcher], env={**os.environ, **path_env}, start_new_session=True, **io
            ).wait()  # the intermediate exits at once; the watcher lives on, detached
        logger.info("started vLLM server pid %d: %s (log %s)", self.proc.pid, shlex.join(self.command), self._log_path)
        try:
            await self._wait_ready(probe)
        except BaseException:
            await asyncio.to_thread(self._terminate)
            raise
        return self._url

    async def _wait_ready(self, probe: str) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.cfg.startup_timeout_s

        def tail() -> str:
            return f"Command: {shlex.join(self.command)}\nLast lines of {self._log_path}:\n{self.log_tail()}"

        async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as http:
            while True:
                if (code := self.proc.poll()) is not None:
                    raise RuntimeError(f"vLLM server exited with code {code} before answering {probe}/health. {tail()}")
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"{probe}/health")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    timeout = self.cfg.startup_timeout_s
                    raise RuntimeError(f"vLLM server did not answer {probe}/health within {timeout:g}s. {tail()}")
                await asyncio.sleep(0.5)
            try:
                self._model_name = (await http.get(f"{probe}/v1/models")).json()["data"][0]["id"]
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
                self._model_name = self.cfg.served_model_name or self.model_path

    def _terminate(self) -> int | None:
        """End the server's process group: SIGTERM, up to `stop_timeout_s`, then SIGKILL. Returns the exit code."""
        if (proc := self.proc) is None:
            return None
        pgid, deadline = proc.pid, time.monotonic() + self.cfg.stop_timeout_s
        _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=self.cfg.stop_timeout_s)  # reap the leader first: a zombie still counts in its group
        while _signal_group(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)
        return proc.wait(timeout=30)

    async def stop(self) -> int | None:
        """Stop the server and every process of its group; returns its exit code (None if never started)."""
        return await asyncio.to_thread(self._terminate)

    async def url(self) -> str:
        """The server's base URL (this node's IP when it listens on all interfaces)."""
        if self._url is None:
            raise RuntimeError("the vLLM server has not been started")
        return self._url

    async def alive(self) -> bool:
        """Whether the server process is running (it may still be loading the model)."""
        return self.proc is not None and self.proc.poll() is None

    async def model_name(self) -> str | None:
        """The model id the server serves (`/v1/models`), for `VLLMClient(model=...)`; None before start."""
        return self._model_name

    async def pid(self) -> int | None:
        """The server's pid, which is also its process group id."""
        return None if self.proc is None else self.proc.pid

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the server log (its path is in the actor's log and in start-up errors)."""
        if not self._log_path or not os.path.exists(self._log_path):
            return "(no log)"
        with open(self._log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(self._log_path) - 64 * 1024))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])


def start_vllm_server(cfg: VLLMServeConfig, model_path: str, name: str | None = None) -> tuple[Any, str]:
    """Start a `VLLMServerActor` (with `cfg.num_gpus` GPUs), wait until its server answers; return (handle, url).

    Raises `RuntimeError` with the server's last log lines if it exits or does not come up in time, or if the actor
    cannot be placed in time (e.g. no free GPU); the actor is killed then.
    """
    import ray

    options: dict[str, Any] = {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, "max_restarts": 0,
                               "resources": cfg.resources or None}
    options.update({"name": name} if name is not None else {})
    handle = ray.remote(VLLMServerActor).options(**options).remote(cfg.model_dump(), model_path)
    wait_s = cfg.startup_timeout_s + 120.0
    try:
        return handle, ray.get(handle.start.remote(), timeout=wait_s)
    except Exception as exc:
        ray.kill(handle, no_restart=True)
        if isinstance(exc, ray.exceptions.GetTimeoutError):
            raise RuntimeError(
                f"the vLLM server actor for {model_path!r} was not ready within {wait_s:g}s "
                f"(is there a node with {cfg.num_gpus:g} free GPU(s)?)"
            ) from exc
        cause = getattr(exc, "cause", None) or exc
        raise RuntimeError(f"the vLLM server for {model_path!r} failed to start: {cause}") from exc


def stop_vllm_server(handle: Any, timeout_s: float | None = None) -> None:
    """Stop the server (its whole process group), then kill the actor; never raises for an actor already gone."""
    import ray

    try:
        ray.get(handle.stop.remote(), timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - the actor may be dead already; its watcher ends the server then
        logger.warning("stopping the vLLM server actor failed: %s: %s", type(exc).__name__, exc)
    finally:
        ray.kill(handle, no_restart=True)
