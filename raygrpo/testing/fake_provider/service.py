"""The fake provider's HTTP service, and running it in a process of its own.

    POST   /sandboxes              {"lifetime_s": 60, "labels": {...}}  -> 201 {"id": ...} | 429 (Retry-After)
    DELETE /sandboxes/{id}                                             -> 204 | 404
    POST   /sandboxes/{id}/exec    {"command": "..."}                  -> 200 {"stdout", "stderr", "return_code"} | 404
    GET    /sandboxes[?label=k=v]                                      -> 200 [{"id", "created", "expires", "labels"}]
    PUT    /limits                 {"create_rate_per_s": 10, ...}      -> 200 (the limits now: lowered mid-run = a 429 storm)
    GET    /health                                                     -> 200

A create makes the sandbox at once, then answers after `create_delay_s` (and, while `hold_creates` is set, not
before it is cleared): a client that dies meanwhile never learns the id of a sandbox that exists and bills.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from raygrpo.testing.fake_provider.state import Limits, ProviderState, RateLimited, open_log


def create_app(state: ProviderState) -> Any:
    """The FastAPI app serving `state`."""
    from fastapi import FastAPI, HTTPException, Response
    from fastapi.responses import JSONResponse

    app = FastAPI(title="raygrpo fake sandbox provider")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"ok": True, "live": len(state.sandboxes)}

    @app.post("/sandboxes", status_code=201, response_model=None)
    async def create(body: dict[str, Any]) -> Any:
        try:
            sandbox = state.create(body.get("lifetime_s"), body.get("labels") or {})
        except RateLimited as exc:
            return JSONResponse({"error": str(exc)}, status_code=429,
                                headers={"Retry-After": f"{max(exc.retry_after_s, 0.0):.3f}"})
        if state.limits.create_delay_s:
            await asyncio.sleep(state.limits.create_delay_s)
        while state.limits.hold_creates:
            await asyncio.sleep(0.05)
        return {"id": sandbox.id, "created": sandbox.created, "expires": sandbox.expires}

    @app.delete("/sandboxes/{sandbox_id}", response_model=None)
    async def delete(sandbox_id: str) -> Any:
        if not state.delete(sandbox_id):
            raise HTTPException(404, f"no sandbox {sandbox_id}")
        return Response(status_code=204)

    @app.post("/sandboxes/{sandbox_id}/exec")
    async def execute(sandbox_id: str, body: dict[str, Any]) -> dict[str, Any]:
        found = state.exists(sandbox_id)
        state.record_exec(sandbox_id, found)
        if not found:
            raise HTTPException(404, f"no sandbox {sandbox_id}")
        if state.limits.exec_delay_s:
            await asyncio.sleep(state.limits.exec_delay_s)
        return {"stdout": "", "stderr": "", "return_code": 0}

    @app.get("/sandboxes")
    async def listing(label: str | None = None) -> list[dict[str, Any]]:
        key, _, value = (label or "").partition("=")
        return state.listing((key, value) if label else None)

    @app.put("/limits")
    async def set_limits(body: dict[str, Any]) -> dict[str, Any]:
        try:
            return dict(state.set_limits(**body).__dict__)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc

    return app


def serve(limits: Limits, log_path: str | Path, port_file: str | Path | None = None, port: int = 0) -> None:
    """Serve on 127.0.0.1 until killed; the bound port is written to `port_file` once listening."""
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    state = ProviderState(limits, open_log(log_path))
    if port_file is not None:
        tmp = Path(f"{port_file}.tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        tmp.replace(port_file)
    server = uvicorn.Server(uvicorn.Config(create_app(state), log_level="warning", access_log=False))
    server.run(sockets=[sock])


class FakeProviderProcess:
    """The service in a subprocess on 127.0.0.1; a context manager.

    Args:
        log_path: Its call log.
        limits: Its limits at start.
        ready_timeout_s: Longest wait for the launched process to answer its health check (not a sandbox's start:
            the fake provider's own create latency is `Limits.create_delay_s`).
    """

    def __init__(self, log_path: str | Path, limits: Limits | None = None, ready_timeout_s: float = 30.0) -> None:
        self.log_path = Path(log_path)
        self.limits = limits or Limits()
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> FakeProviderProcess:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> str:
        import httpx

        port_file = self.log_path.with_suffix(".port")
        port_file.unlink(missing_ok=True)
        lim = self.limits
        argv = [sys.executable, "-m", "raygrpo.testing.fake_provider", "--log", str(self.log_path),
                "--port-file", str(port_file), "--create-delay", str(lim.create_delay_s),
                "--exec-delay", str(lim.exec_delay_s)]
        if lim.create_rate_per_s is not None:
            argv += ["--create-rate", str(lim.create_rate_per_s)]
        if lim.max_live is not None:
            argv += ["--max-live", str(lim.max_live)]
        self.proc = subprocess.Popen(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the fake provider exited with {self.proc.returncode}")
            if port_file.exists():
                self.url = f"http://127.0.0.1:{int(port_file.read_text())}"
                try:
                    httpx.get(f"{self.url}/health", timeout=2).raise_for_status()
                    return self.url
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the fake provider did not answer within ready_timeout_s={self.ready_timeout_s:g}")

    def set_limits(self, **changes: Any) -> dict[str, Any]:
        import httpx

        response = httpx.put(f"{self.url}/limits", json=changes, timeout=10)
        response.raise_for_status()
        return response.json()

    def live(self, label: str | None = None) -> list[dict[str, Any]]:
        """The sandboxes alive now, as the provider sees them (optionally those with label `k=v`)."""
        import httpx

        response = httpx.get(f"{self.url}/sandboxes", params={"label": label} if label else None, timeout=10)
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m raygrpo.testing.fake_provider",
                                     description="A fake sandbox provider on 127.0.0.1 (tests and benchmarks).")
    parser.add_argument("--log", required=True, help="call log (JSON lines, appended)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", help="write the bound port here once listening")
    parser.add_argument("--create-rate", type=float, help="most creates in any 1 s window")
    parser.add_argument("--max-live", type=int, help="most sandboxes alive at once")
    parser.add_argument("--create-delay", type=float, default=0.0, help="seconds a create takes")
    parser.add_argument("--exec-delay", type=float, default=0.0, help="seconds an exec takes")
    args = parser.parse_args(argv)
    serve(Limits(args.create_rate, args.max_live, args.create_delay, False, args.exec_delay), args.log,
          args.port_file, args.port)
