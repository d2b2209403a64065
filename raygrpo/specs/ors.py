"""The ORS environment source: one OpenReward Standard environment, reached by URL, catalog name or import path.

An `ORSSpec` is user config (pydantic, validated when the run config loads). It lists its tasks on the driver
(`list_tasks`, `dataset`) and builds the per-actor `ORSProvider` that the env pool actor uses to open sessions. The
spec itself is what travels to actors: it holds only strings and numbers, never a client, a loop or a secret value.
"""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from raygrpo.envs.base import EnvError
from raygrpo.specs.dataset import tasks_to_dataset
from raygrpo.imports import split_spec
from raygrpo.specs.selection import check_indices
from raygrpo.types import TaskRef

if TYPE_CHECKING:
    import datasets

    from raygrpo.envs.ors import ORSProvider

logger = logging.getLogger(__name__)

_ENV_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CATALOG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class ORSConfigError(ValueError):
    """The ORS server answered, but the config does not fit it (unknown split, index out of range, unknown env name,
    missing API key). The message names the config field."""


class ORSConnectionError(EnvError):
    """The ORS server could not be reached (refused, timed out, name did not resolve). The message names the URL and
    the config field that points at it."""


class ORSSpec(BaseModel):
    """An OpenReward Standard (ORS) environment as a source of tasks for raygrpo.

    Exactly one of `url`, `catalog` and `environment` says where the environment lives. Task selection mirrors TRL's
    `OpenRewardSpec`: all tasks of `split`, the first `num_tasks`, or explicit `indices`.

    Args:
        kind (`Literal["ors"]`, *optional*, defaults to `"ors"`):
            Discriminator of environment specs.
        url (`str`, *optional*):
            `http(s)://` URL of a running ORS server (self-hosted, a Space, `python examples/echo/env.py`).
        catalog (`str`, *optional*):
            openreward.ai catalog name, `"Owner/Env"`. Needs an API key (see `api_key_env`).
        environment (`str`, *optional*):
            Import path (`"pkg.module:Class"`) or file path (`"examples/echo/env.py:Class"`, relative to the config
            file) of an `openreward.environments.Environment` subclass. raygrpo serves it itself on 127.0.0.1 and
            then uses the copy returned by `served_at(url)`.
        env_name (`str`, *optional*):
            Name of the environment on the server, for servers hosting several (the lower-cased class name, e.g.
            `"echoenvironment"`); for catalog environments, the variant. None uses the server's default (first)
            environment.
        split (`str`, *optional*, defaults to `"train"`):
            Split to draw tasks from.
        num_tasks (`int`, *optional*):
            Use only the first `num_tasks` tasks of the split (>= 1). Exclusive with `indices`.
        indices (`list[int]`, *optional*):
            Use exactly these task indices of the split. Exclusive with `num_tasks`.
        secrets (`dict[str, str]`, *optional*, defaults to `{}`):
            Per-session secrets: maps the secret name the environment expects to the NAME of an environment variable
            holding its value, e.g. `{"OPENAI_API_KEY": "MY_OPENAI_KEY"}`. Values are read inside the env pool actor
            when a session opens and are never logged or stored in tasks or trajectories.
        api_key_env (`str`, *optional*, defaults to `"OPENREWARD_API_KEY"`):
            Environment variable that holds the OpenReward API key. Required for catalog environments; sent to a
            `url` server only when this field is set explicitly.
        base_url (`str`, *optional*):
            OpenReward platform base URL override for catalog environments (default `https://openreward.ai`).
        weight (`float`, *optional*, defaults to `1.0`):
            Relative sampling weight when several environments are mixed (> 0).
        connect_timeout_s (`float`, *optional*, defaults to `30.0`):
            Deadline of each request made while listing tasks on the driver; an unreachable server fails within it
            with `ORSConnectionError`.
        include_metadata (`bool`, *optional*, defaults to `True`):
            Put each task's spec (the environment's task dict) into `TaskRef.metadata` and the dataset columns.
    """

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    kind: Literal["ors"] = "ors"
    url: str | None = None
    catalog: str | None = None
    environment: str | None = None
    env_name: str | None = None
    split: str = "train"
    num_tasks: int | None = Field(default=None, ge=1)
    indices: list[int] | None = None
    secrets: dict[str, str] = Field(default_factory=dict)
    api_key_env: str = "OPENREWARD_API_KEY"
    base_url: str | None = None
    weight: float = Field(default=1.0, gt=0)
    connect_timeout_s: float = Field(default=30.0, gt=0)
    include_metadata: bool = True

    # The `environment` this spec was served from, when it is the copy made by `served_at` (display only).
    _served_from: str | None = PrivateAttr(default=None)

    # ── validation ──────────────────────────────────────────────────────────────────────────────────────────────

    @field_validator("url", "base_url")
    @classmethod
    def _check_url(cls, value: str | None, info) -> str | None:
        if value is None:
            return None
        value = value.strip()
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"`{info.field_name}` must be an http:// or https:// URL with a host, got {value!r}")
        return value.rstrip("/")

    @field_validator("catalog")
    @classmethod
    def _check_catalog(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if "://" in value:
            raise ValueError(f"`catalog` takes an openreward.ai name like 'Owner/Env'; for a server URL use `url` "
                             f"(got {value!r})")
        if not _CATALOG_NAME.match(value):
            raise ValueError(f"`catalog` must look like 'Owner/Env', got {value!r}")
        return value

    @field_validator("environment")
    @classmethod
    def _check_environment(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            split_spec(value.strip())
        except ImportError as exc:
            raise ValueError(f"`environment`: {exc}") from None
        return value.strip()

    @field_validator("indices")
    @classmethod
    def _check_indices(cls, value: list[int] | None) -> list[int] | None:
        return check_indices(value)

    @field_validator("secrets")
    @classmethod
    def _check_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        # Messages never repeat a value: someone may have pasted the secret itself here.
        for key, var in value.items():
            if not key:
                raise ValueError("`secrets` keys (secret names) must not be empty")
            if not isinstance(var, str) or not _ENV_VAR_NAME.match(var):
                raise ValueError(
                    f"`secrets.{key}` must be the NAME of an environment variable holding the secret (letters, "
                    "digits, underscores), not the secret value itself"
                )
        return value

    @field_validator("api_key_env")
    @classmethod
    def _check_api_key_env(cls, value: str) -> str:
        if not _ENV_VAR_NAME.match(value):
            raise ValueError("`api_key_env` must be the NAME of an environment variable (letters, digits, "
                             "underscores), not the key itself")
        return value

    @model_validator(mode="after")
    def _check_exclusive(self) -> ORSSpec:
        sources = [f for f in ("url", "catalog", "environment") if getattr(self, f) is not None]
        if len(sources) != 1:
            got = "none" if not sources else ", ".join(f"`{f}`" for f in sources)
            raise ValueError(f"exactly one of `url`, `catalog`, `environment` must be set (got {got})")
        if self.num_tasks is not None and self.indices is not None:
            raise ValueError("`num_tasks` and `indices` are exclusive: set one of them, or neither for every task")
        if self.base_url is not None and self.catalog is None:
            raise ValueError("`base_url` applies to `catalog` environments only (a `url` already names the server)")
        return self

    # ── identity and display ────────────────────────────────────────────────────────────────────────────────────

    @property
    def source_field(self) -> str:
        """The config field that says where the environment lives: `url`, `catalog` or `environment`."""
        if self._served_from is not None:
            return "environment"
        if self.url is not None:
            return "url"
        if self.catalog is not None:
            return "catalog"
        return "environment"

    @property
    def served_from(self) -> str | None:
        """The `environment` import path this spec was served from, or None."""
        return self._served_from

    def session_url(self) -> str:
        """Base URL that sessions are opened against (the server itself, or the platform's session host)."""
        if self.url is not None:
            return self.url
        if self.catalog is not None:
            from openreward.client import DEFAULT_BASE_URL, _prepend_subdomain

            override = os.environ.get("OPENREWARD_SESSION_URL")
            if override:
                return override.rstrip("/")
            return _prepend_subdomain(self.base_url or os.environ.get("OPENREWARD_URL", DEFAULT_BASE_URL), "sessions")
        raise ORSConfigError(f"`environment` {self.environment!r} is not served yet: call served_at(url) first")

    def describe(self) -> str:
        """One line for logs and progress displays (never holds a secret)."""
        if self._served_from is not None:
            where = f"{self._served_from} (served at {self.url})"
        else:
            where = self.url or self.catalog or f"{self.environment} (not served)"
        name = f" env_name={self.env_name}" if self.env_name else ""
        return f"ORS {where}{name} split={self.split}"

    def served_at(self, url: str) -> ORSSpec:
        """A copy of this `environment` spec pointing at the server raygrpo started for it.

        The copy has `url=url` and `environment=None` (so "exactly one of" still holds and the copy validates like a
        user-written `url` spec); it remembers the import path for display and error messages.
        """
        if self.environment is None:
            raise ORSConfigError("served_at() applies to `environment` specs only")
        data = self.model_dump(exclude_unset=True)  # keeps "which fields the user set" (see `sends_api_key`)
        data.update(url=url, environment=None)
        data.pop("kind", None)
        copy = type(self).model_validate(data)
        copy._served_from = self.environment
        return copy

    def field_path(self, name: str | None, field: str | None = None) -> str:
        """`envs.<name>.<field>` for error messages (`field` defaults to the source field)."""
        prefix = f"envs.{name}." if name else ""
        return f"{prefix}{field or self.source_field}"

    # ── the SDK side ────────────────────────────────────────────────────────────────────────────────────────────

    def api_key(self) -> str | None:
        """The API key from `api_key_env` in this process, or None when unset."""
        return os.environ.get(self.api_key_env) or None

    def make_client(self):
        """A new `openreward.AsyncOpenReward` client for this spec. Call inside the event loop that will use it."""
        from raygrpo.runtime import apply_process_env

        apply_process_env()
        from openreward import AsyncOpenReward

        key = self.api_key() if self.sends_api_key else None
        # A self-hosted server serves everything from one host; the base_url given to `environments.get` (see
        # `sdk_environment`) overrides the SDK's `sessions.<host>` default.
        client = AsyncOpenReward(api_key=key or "", base_url=self.url or self.base_url)
        # The SDK falls back to $OPENREWARD_API_KEY and forwards it to every session as a secret; None stops that.
        client.api_key = key
        return client

    @property
    def sends_api_key(self) -> bool:
        """Whether sessions carry the API key: always for catalog environments; for a `url` only when the config
        names `api_key_env` explicitly (so the platform key is not handed to any server a URL points at)."""
        return self.catalog is not None or "api_key_env" in self.model_fields_set

    def sdk_environment(self, client) -> Any:
        """The SDK's `AsyncEnvironment` handle for this spec, built from `client` (see `make_client`)."""
        if self.url is not None:
            # With several environments on one server, `variant` is what selects one (paths `/{variant}/...` and
            # the session's env_name); without it every path is redirected to the server's first environment.
            return client.environments.get(self.env_name or "env", variant=self.env_name, base_url=self.url)
        if self.catalog is not None:
            return client.environments.get(self.catalog, variant=self.env_name)
        raise ORSConfigError(f"`environment` {self.environment!r} is not served yet: call served_at(url) first")

    def provider(
        self,
        *,
        name: str | None = None,
        call_timeout_s: float | None = 300.0,
        start_timeout_s: float | None = 600.0,
        close_timeout_s: float = 30.0,
    ) -> ORSProvider:
        """The per-actor session factory for this environment. Cheap: the SDK client is made on first use.

        Args:
            name: The environment's name in the run config, for error messages.
            call_timeout_s: Default deadline of one tool call (None: no deadline).
            start_timeout_s: Default deadline for opening a session, fetching its prompt and tools.
            close_timeout_s: Deadline for closing a session.
        """
        from raygrpo.envs.ors import ORSProvider

        return ORSProvider(
            self,
            name=name,
            call_timeout_s=call_timeout_s,
            start_timeout_s=start_timeout_s,
            close_timeout_s=close_timeout_s,
        )

    # ── listing tasks (driver side) ─────────────────────────────────────────────────────────────────────────────

    def list_tasks(self, name: str) -> list[TaskRef]:
        """The tasks this spec selects, as `TaskRef`s (metadata = the task spec dict when `include_metadata`).

        Runs on the driver, from sync code or from inside a running event loop (it uses its own loop in a worker
        thread). Every request is bounded by `connect_timeout_s`.

        Raises:
            ORSConnectionError: The server cannot be reached (message names the URL and the config field).
            ORSConfigError: The server answered but the config does not fit it (split, indices, env_name, API key).
        """
        if self.environment is not None:
            raise ORSConfigError(
                f"{self.field_path(name, 'environment')}: {self.environment!r} must be served before listing its "
                "tasks (raygrpo.actors.ors_server.start_embedded_server, then spec.served_at(url))"
            )
        if self.catalog is not None and not self.api_key():
            raise ORSConfigError(
                f"{self.field_path(name, 'api_key_env')}: environment variable {self.api_key_env} is not set; the "
                f"catalog environment {self.catalog!r} needs an OpenReward API key"
            )
        from raygrpo.specs.ors_listing import ORSTaskLister, run_in_fresh_loop

        pairs = run_in_fresh_loop(lambda: ORSTaskLister(self, name).list())
        return [
            TaskRef(env=name, index=index, split=self.split, metadata=dict(spec) if self.include_metadata else {})
            for index, spec in pairs
        ]

    def dataset(self, name: str) -> datasets.Dataset:
        """A `datasets.Dataset` of the selected tasks, shaped like TRL's `OpenRewardSpec.train_dataset`.

        Columns: `prompt` (a chat list holding one empty user message: the real prompt comes from the session),
        `task_index`, `env` (this environment's config name) and, with `include_metadata`, one column per task-spec
        key (keys clashing with those columns are left out). Non-scalar metadata that Arrow cannot type consistently
        is stored as JSON text.
        """
        return tasks_to_dataset(self.list_tasks(name), include_metadata=self.include_metadata)
