"""A fake vLLM server: the `/v1/completions` request and response shapes of vLLM's OpenAI-compatible server.

vLLM cannot run on the CPU-only machines raygrpo is developed on, so `raygrpo.policy.vllm_client.VLLMClient` is
tested against this FastAPI app. It is deterministic: each request answers with a scripted continuation (token ids
given up front, or computed from the prompt), cut at `max_tokens`, with made-up but reproducible log-probabilities.
It records every request body it received, can fail the next N requests with HTTP 500, and can be made slow; it
lists its model at `/v1/models` as vLLM does (name, root path, `max_model_len`), which raygrpo's resolve step reads.

Shapes follow vLLM's `CompletionRequest` / `CompletionResponse` (vllm/entrypoints/openai/protocol.py): the request
model here forbids unknown fields, so a misspelt field in the client fails loudly (real vLLM would only log it).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict


class CompletionRequest(BaseModel):
    """The subset of vLLM's completion request fields raygrpo uses (types as vLLM declares them)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: list[int] | str
    max_tokens: int | None = 16
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    n: int = 1
    seed: int | None = None
    logprobs: int | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    skip_special_tokens: bool = True


class FakeVLLM:
    """State and behaviour of the fake server.

    Args:
        continuation: Token ids every request answers with, or a function of the prompt ids returning them. Put
            the eos id last for a turn that ends by itself.
        model: The served model name; requests naming another model get a 404 as from vLLM.
        decode: Optional function of token ids to text, for the `text` field.
        root: The model path `/v1/models` reports (vLLM's `--model`); defaults to `model`.
        max_model_len: The context length `/v1/models` reports, as vLLM does.
    """

    def __init__(
        self,
        continuation: list[int] | Callable[[list[int]], list[int]],
        model: str = "fake-model",
        decode: Callable[[list[int]], str] | None = None,
        root: str | None = None,
        max_model_len: int = 8192,
    ):
        self.continuation = continuation
        self.model = model
        self.root = root or model
        self.max_model_len = max_model_len
        self.decode = decode or (lambda ids: "")
        self.requests: list[dict[str, Any]] = []
        self.fail_next = 0  # answer this many next requests with HTTP 500
        self.delay_s = 0.0  # sleep this long before answering
        self.app = self._build_app()

    @staticmethod
    def logprob_of(position: int, token: int) -> float:
        """The made-up log-probability the fake reports for `token` at output `position`."""
        return -0.01 * ((token + 7 * position) % 97) - 0.001

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> dict[str, str]:
            return {}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            # vLLM's `ModelList` of `ModelCard`s (vllm/entrypoints/openai/models/protocol.py), permissions left out
            return {"object": "list", "data": [{
                "id": self.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": self.root, "parent": None, "max_model_len": self.max_model_len,
            }]}

        @app.post("/v1/completions")
        async def completions(request: CompletionRequest):
            self.requests.append(request.model_dump(exclude_unset=True))
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.fail_next > 0:
                self.fail_next -= 1
                return JSONResponse({"object": "error", "message": "injected failure", "code": 500}, status_code=500)
            if request.model is not None and request.model != self.model:
                return JSONResponse(
                    {"object": "error", "message": f"The model `{request.model}` does not exist.", "code": 404},
                    status_code=404,
                )
            if not isinstance(request.prompt, list):
                return JSONResponse({"object": "error", "message": "fake takes token ids only", "code": 400}, 400)
            prompt = list(request.prompt)
            full = self.continuation(prompt) if callable(self.continuation) else list(self.continuation)
            max_tokens = request.max_tokens if request.max_tokens is not None else 16
            ids = full[:max_tokens]
            finish = "length" if len(full) > max_tokens else "stop"
            choice: dict[str, Any] = {
                "index": 0,
                "text": self.decode(ids),
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
            if request.logprobs is not None:
                lps = [self.logprob_of(i, t) for i, t in enumerate(ids)]
                as_ids = bool(request.return_tokens_as_token_ids)
                choice["logprobs"] = {
                    "text_offset": list(range(len(ids))),
                    "token_logprobs": lps,
                    "tokens": [f"token_id:{t}" if as_ids else self.decode([t]) for t in ids],
                    "top_logprobs": [
                        {(f"token_id:{t}" if as_ids else self.decode([t])): lp} for t, lp in zip(ids, lps)
                    ]
                    if request.logprobs > 0
                    else None,
                }
            if request.return_token_ids:
                choice["token_ids"] = ids
                choice["prompt_token_ids"] = prompt
            return {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [choice],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)},
            }

        return app


class ServerThread:
    """Serve an ASGI app with uvicorn on 127.0.0.1 (a free port) in a background thread; a context manager."""

    def __init__(self, app: Any):
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for connection-refused tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def have_vllm_and_gpu() -> bool:
    """Whether a real vLLM server could run here (vLLM importable and a CUDA GPU present)."""
    try:
        import torch
        import vllm  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()
