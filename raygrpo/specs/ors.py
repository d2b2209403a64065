"""The ORS environment spec: one OpenReward Standard environment, reached by URL, catalog name or import path.

Pure data. Loading a config validates the fields; the driver's resolve step (`raygrpo.envs.kinds`) checks that an
`environment` class loads and that a `url` or `catalog` server answers, before Ray starts. The spec travels to the
env pool actors as it is: strings and numbers only, never a client, a loop or a secret value.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlparse

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from raygrpo.core.imports import ImportSpecError, is_file_spec, resolve_file, split_spec
from raygrpo.specs.base import EnvSpecBase, base_dir_of
from raygrpo.specs.selection import check_indices

_ENV_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CATALOG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class ORSSpec(EnvSpecBase):
    """An OpenReward Standard (ORS) environment as a source of tasks for raygrpo.

    Exactly one of `url`, `catalog` and `environment` says where the environment lives. Task selection mirrors TRL's
    `OpenRewardSpec`: all tasks of `split`, the first `num_tasks`, or explicit `indices`. The session owns its
    deadlines: `start_timeout_s`, `tool_timeout_s`, `close_timeout_s`.

    Args:
        kind (`Literal["ors"]`, *optional*, defaults to `"ors"`):
            Discriminator of environment specs.
        url (`str`, *optional*):
            `http(s)://` URL of a running ORS server (self-hosted, a Space, `python examples/echo/env.py`).
        catalog (`str`, *optional*):
            openreward.ai catalog name, `"Owner/Env"`. Needs an API key (see `api_key_env`).
        environment (`str`, *optional*):
            Import path (`"pkg.module:Class"`) or file path (`"examples/echo/env.py:Class"`, relative to the config
            file) of an `openreward.environments.Environment` subclass. raygrpo serves it itself for the run and
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
        connect_timeout_s (`float`, *optional*, defaults to `30.0`):
            Deadline of each request made while listing tasks on the driver; an unreachable server fails the run
            before it starts, naming this environment's `url` or `catalog`.
        start_timeout_s (`float`, *optional*, defaults to `60.0`):
            Deadline for opening a session and fetching its prompt and tools. A session that misses it is an
            `env_error` (retried).
        tool_timeout_s (`float`, *optional*, defaults to `60.0`):
            Deadline of one tool call, the `@terminal` tool's included. A call that misses it ends the rollout as an
            `env_error` naming the tool (retried): the server may still be running the call, and finish the episode
            with it, out of sight.
        close_timeout_s (`float`, *optional*, defaults to `30.0`):
            Deadline for closing a session (deleting it on the server); past it the server's idle reaper gets it.
        reward_mode (`Literal["final", "sum", "last"]`, *optional*, defaults to `"final"`):
            The episode's reward from its tool rewards: `"final"` the reward of the call that finished the episode
            (an episode the environment ended without one, or that the model ended, is `no_answer`), `"sum"` the sum
            of every reward given, `"last"` the last reward given. A rollout that hit a limit is `truncated` whatever
            its steps gave.
        image_blocks (`Literal["drop", "placeholder"]`, *optional*, defaults to `"drop"`):
            What the model sees of an image block in a prompt or a tool result: nothing (as TRL's integration), or
            the text `[image]`.
        include_metadata (`bool`, *optional*, defaults to `True`):
            Put each task's spec (the environment's task dict) into `TaskRef.metadata` and the dataset columns.
    """

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
    connect_timeout_s: float = Field(default=30.0, gt=0)
    start_timeout_s: float = Field(default=60.0, gt=0)
    tool_timeout_s: float = Field(default=60.0, gt=0)
    close_timeout_s: float = Field(default=30.0, gt=0)
    reward_mode: Literal["final", "sum", "last"] = "final"
    image_blocks: Literal["drop", "placeholder"] = "drop"
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
    def _check_environment(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        value = value.strip()
        try:
            target, attr = split_spec(value)
        except ImportSpecError as exc:
            raise ValueError(f"`environment`: {exc}") from None
        return f"{resolve_file(target, base_dir_of(info))}:{attr}" if is_file_spec(target) else value

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
            raise ValueError("served_at() applies to `environment` specs only")
        data = self.model_dump(exclude_unset=True)  # keeps "which fields the user set" (see `sends_api_key`)
        data.update(url=url, environment=None)
        data.pop("kind", None)
        copy = type(self).model_validate(data)
        copy._served_from = self.environment
        return copy

    def field_path(self, name: str | None, field: str | None = None) -> str:
        """`envs.<name>.<field>` for error messages (`field` defaults to the source field)."""
        return super().field_path(name, field or self.source_field)

    @property
    def sends_api_key(self) -> bool:
        """Whether sessions carry the API key: always for catalog environments; for a `url` only when the config
        names `api_key_env` explicitly (so the platform key is not handed to any server a URL points at)."""
        return self.catalog is not None or "api_key_env" in self.model_fields_set
