"""Reading a run config: YAML, `--set dotted.key=value` overrides, validation, and messages that name the field.

Unknown keys and bad values are errors that name the field (`envs.echo.num_taks: Extra inputs are not permitted`); so
are a key given twice in one mapping and a file that is not UTF-8.
"""

from __future__ import annotations

import copy
import io
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from raygrpo.config.run import RunConfig


class ConfigError(ValueError):
    """A run config that cannot be used; the message names the field."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error naming it and its lines
    (PyYAML would keep the last one, silently dropping the other's settings)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: PyYAML's own constructor reports it
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first.line + 1}): give each key once",
                    key_node.start_mark)
        return super().construct_mapping(node, deep)


def _read_yaml(file: Path) -> Any:
    """A config file's content: UTF-8 YAML (a byte-order mark is allowed), every key once."""
    try:
        text = file.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}): save "
                          "the config as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read it: {exc.strerror or exc}") from None
    stream = io.StringIO(text)
    stream.name = str(file)  # PyYAML's marks name the file
    try:
        return yaml.load(stream, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set {item!r}: empty key")
    return parts, _override_value(item, raw.strip())


def _override_value(item: str, text: str) -> Any:
    """What a `--set` value means: a YAML scalar or flow collection (`4`, `true`, `null`, `[0, 3]`, `{a: 1}`), and
    otherwise the text as typed. So `#` is never a comment (`--set 'rollout.system_prompt=#1 rule'`), prose with a
    colon or a leading dash stays a string, and a quoted value is always a string (`--set 'envs.echo.split="1.0"'`).
    """
    if not text:
        return None
    collection = text.startswith(("{", "["))
    try:
        value = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.constructor.ConstructorError as exc:  # a key given twice
        raise ConfigError(f"--set {item!r}: {exc.problem}") from None
    except yaml.YAMLError:
        return text
    if isinstance(value, (dict, list)) and not collection:
        return text  # a block mapping or list ("Be brief: answer", "- x") is prose on a command line
    if text.count("#") > _hashes(value):  # YAML read " #..." as a comment
        if collection:
            raise ConfigError(f"--set {item!r}: YAML reads ' #' as the start of a comment; quote the string that "
                              "holds the '#'")
        return text
    return _number(value) if isinstance(value, str) and value == text else value


def _hashes(value: Any) -> int:
    """How many `#` the strings of a parsed value hold (keys included)."""
    if isinstance(value, str):
        return value.count("#")
    if isinstance(value, dict):
        return sum(_hashes(k) + _hashes(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_hashes(v) for v in value)
    return 0


def _number(value: str) -> Any:
    """YAML 1.1 reads `1e-3` (no dot) as a string; take an unquoted one as the number it means."""
    try:
        return float(value) if any(c in value for c in ".eE") else value
    except ValueError:
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
        data = _read_yaml(file) or {}
        base_dir = str(file.resolve().parent)
    if not isinstance(data, dict):
        raise ConfigError("a run config must be a YAML mapping")
    data = apply_overrides(copy.deepcopy(data), overrides or [])  # the caller's mapping stays as it was
    try:
        # Specs resolve their relative paths (task folders, harness files) against the config file's folder.
        cfg = RunConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
    cfg._base_dir = base_dir
    return cfg
