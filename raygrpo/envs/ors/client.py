"""openreward SDK clients for an `ORSSpec`: the API key it sends, where its sessions go, and the client itself.

Shared by the driver's task listing (the SDK's synchronous client) and the env pool actors' sessions (its async
client, made inside the actor's loop).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse, urlunparse

from raygrpo.core.environ import apply_process_env
from raygrpo.specs.ors import ORSSpec

#: The OpenReward platform, when neither the spec's `base_url` nor `$OPENREWARD_URL` names another.
DEFAULT_PLATFORM_URL = "https://openreward.ai"


def api_key(spec: ORSSpec) -> str | None:
    """The API key from the spec's `api_key_env` in this process, or None when unset."""
    return os.environ.get(spec.api_key_env) or None


def sent_api_key(spec: ORSSpec) -> str | None:
    """The key sessions carry: the API key for catalog environments and for `url`s that name `api_key_env`."""
    return api_key(spec) if spec.sends_api_key else None


def session_url(spec: ORSSpec) -> str:
    """Base URL that sessions are opened against: the server itself, or the platform's `sessions.` host (as the SDK
    derives it, `$OPENREWARD_SESSION_URL` first)."""
    if spec.url is not None:
        return spec.url
    override = os.environ.get("OPENREWARD_SESSION_URL")
    if override:
        return override.rstrip("/")
    parsed = urlparse(spec.base_url or os.environ.get("OPENREWARD_URL", DEFAULT_PLATFORM_URL))
    return urlunparse(parsed._replace(netloc=f"sessions.{parsed.netloc}")).rstrip("/")


def make_client(spec: ORSSpec, *, sync: bool = False) -> Any:
    """A new openreward client for `spec`: `AsyncOpenReward` (call inside the loop that will use it: its aiohttp
    sessions bind to that loop) or, with `sync`, `OpenReward`, which runs its own loop thread."""
    apply_process_env()
    from openreward import AsyncOpenReward, OpenReward

    key = sent_api_key(spec)
    # A self-hosted server serves everything from one host; the base_url given to `environments.get` (see
    # `sdk_environment`) overrides the SDK's `sessions.<host>` default.
    client = (OpenReward if sync else AsyncOpenReward)(api_key=key or "", base_url=spec.url or spec.base_url)
    # The SDK falls back to $OPENREWARD_API_KEY and forwards it to every session as a secret; None stops that.
    client.api_key = key
    return client


def sdk_environment(spec: ORSSpec, client: Any) -> Any:
    """The SDK's environment handle for `spec` from `client` (`make_client`).

    Raises:
        ValueError: `spec` is an `environment` spec that has not been served yet (`spec.served_at(url)`).
    """
    if spec.url is not None:
        # With several environments on one server, `variant` is what selects one (paths `/{variant}/...` and the
        # session's env_name); without it every path is redirected to the server's first environment.
        return client.environments.get(spec.env_name or "env", variant=spec.env_name, base_url=spec.url)
    if spec.catalog is not None:
        return client.environments.get(spec.catalog, variant=spec.env_name)
    raise ValueError(f"`environment` {spec.environment!r} is not served yet: serve it, then use spec.served_at(url)")
