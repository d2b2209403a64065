"""Asking a vLLM server at `policy.url`, before Ray starts, whether it answers and serves the run's model.

vLLM's OpenAI-compatible server lists what it serves at `GET /v1/models`: `{"object": "list", "data": [{"id":
NAME, "root": PATH, "max_model_len": N, ...}]}` (`vllm/entrypoints/openai/models/protocol.py`, `ModelCard`), the
same endpoint TRL's `VLLMClient` reads the served name from. Without this probe a URL without a scheme, a server that
is down or a name it does not serve started the run and ended every rollout as `policy_error`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

import httpx

from raygrpo.core.errors import ResolveError, describe


@dataclass(frozen=True)
class ServedModel:
    """One model a vLLM server serves, as `/v1/models` lists it.

    Args:
        name: The name requests give as `model` (`--served-model-name`, else the path it was started with).
        max_model_len: The server's context length for it; None where the server does not say.
    """

    name: str
    max_model_len: int | None


def server_root(url: str) -> str:
    """`url` without a trailing `/` or `/v1`, as `VLLMClient` takes it.

    Raises:
        ResolveError: `url` is not an http(s) URL with a host (the message starts with `policy.url`).
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ResolveError(f"policy.url: {url!r} is not an http(s) URL: give the vLLM server's root with its scheme, "
                           "e.g. http://10.0.0.5:8000")
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def probe_vllm_server(url: str, model: str, name_field: str, timeout_s: float = 10.0) -> ServedModel:
    """The entry of `/v1/models` whose name is `model`, asked of the server at `url` within `timeout_s`.

    Args:
        url: `policy.url`.
        model: The name the run's requests will send.
        name_field: Where that name comes from, for the message (`policy.served_model_name`, or what stands in).
        timeout_s: Deadline of the request, connect included.

    Raises:
        ResolveError: A bad URL, no answer, an answer that is not vLLM's model list (messages start with
            `policy.url`), or a list without `model` (the message starts with `name_field` and names what is served).
    """
    root = server_root(url)
    try:
        response = httpx.get(f"{root}/v1/models", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ResolveError(f"policy.url: cannot reach the vLLM server at {root} ({describe(exc)}; deadline "
                           f"{timeout_s:g} s): start it first, or fix the URL") from None
    if response.status_code != 200:
        raise ResolveError(f"policy.url: the server at {root} answered GET /v1/models with HTTP "
                           f"{response.status_code} ({response.text[:200]!r}): is it vLLM's OpenAI-compatible server?")
    try:
        served = [ServedModel(str(m["id"]), _length(m.get("max_model_len"))) for m in response.json()["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ResolveError(f"policy.url: the server at {root} sent an answer to GET /v1/models that is not a model "
                           f"list ({describe(exc)}): is it vLLM's OpenAI-compatible server?") from None
    for entry in served:
        if entry.name == model:
            return entry
    names = ", ".join(repr(m.name) for m in served) or "nothing"
    raise ResolveError(f"{name_field}: the vLLM server at {root} does not serve {model!r}; it serves {names}: set "
                       "policy.served_model_name to the name it serves (its --served-model-name)")


def _length(value: object) -> int | None:
    return value if isinstance(value, int) and value > 0 else None
