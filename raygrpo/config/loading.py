"""Reading a run config: YAML, `--set dotted.key=value` overrides, validation, and messages that name the field.

Unknown keys and bad values are errors that name the field (`envs.echo.num_taks: Extra inputs are not permitted`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raygrpo.config.run import RunConfig


class ConfigError(ValueError):
    """A run config that cannot be used; the message names the field."""


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set {item!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, _number(value)


def _number(value: Any) -> Any:
    """YAML 1.1 reads `1e-3` (no dot) as a string; take it as the number it means."""
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else value
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides (values parsed as YAML scalars or flow collections) to a raw config."""
    for item in overrides:
        parts, value = _parse_override(item)
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(f"--set {item!r}: {where} is not a mapping")
            node = child
        node[parts[-1]] = value
    return data


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = list(err["loc"])
        if len(loc) > 2 and loc[0] in ("envs", "eval_envs") and loc[2] in ("ors", "harbor"):
            del loc[2]  # the union member's tag: users write envs.<name>.<field>
        where = ".".join(str(p) for p in loc) or "(root)"
        lines.append(f"{where}: {err['msg']}")
    return "invalid run config:\n  " + "\n  ".join(lines)


def load_config(path: str | os.PathLike[str] | None = None, overrides: list[str] | None = None,
                data: dict[str, Any] | None = None) -> RunConfig:
    """Read, override and validate a run config.

    Args:
        path: YAML file; relative paths inside it resolve against its folder.
        overrides: `dotted.key=value` strings applied before validation.
        data: A config given as a mapping instead of a file (then relative paths resolve against the cwd).
    """
    base_dir = os.getcwd()
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"config file not found: {file}")
        try:
            data = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{file}: not valid YAML: {exc}") from exc
        base_dir = str(file.resolve().parent)
    if not isinstance(data, dict):
        raise ConfigError("a run config must be a YAML mapping")
    data = apply_overrides(dict(data), overrides or [])
    try:
        # Specs resolve their relative paths (task folders, harness files) against the config file's folder.
        cfg = RunConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    cfg._base_dir = base_dir
    return cfg
