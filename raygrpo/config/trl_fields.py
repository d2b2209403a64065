"""The fields of TRL's `GRPOConfig` and their annotations, read from TRL's source without importing it.

The `trainer:` mapping is checked when the config loads (names and types), before Ray and the servers start. Importing
`trl` to list `GRPOConfig`'s fields costs 8-10 s (it imports torch, transformers and peft) on the 2-core machines
raygrpo is tested on, against ~0.1 s to parse the three source files the class is built from; and building a whole
`GRPOConfig` on the driver would run `TrainingArguments`' device checks (bf16 support, ...) on a machine that may
not be the learner's. So this reads the dataclass fields from the source (following the base classes through the
imports, TYPE_CHECKING re-exports included), and the learner still builds and validates the real `GRPOConfig`.
Where the source cannot be read (an unusual install), the names are left to the learner (None).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import logging
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

GRPO_CONFIG = ("trl.trainer.grpo_config", "GRPOConfig")


@functools.lru_cache(maxsize=1)
def grpo_config_fields() -> dict[str, str] | None:
    """`GRPOConfig`'s fields by name, each with its annotation as text (`"int | None"`); None where TRL's source
    cannot be read. Taken from the class itself where TRL is imported already."""
    module, name = GRPO_CONFIG
    loaded = sys.modules.get(module)
    if loaded is not None and hasattr(loaded, name):
        return {f.name: str(f.type) for f in dataclasses.fields(getattr(loaded, name)) if f.init}
    try:
        return fields_from_source(module, name)
    except (OSError, SyntaxError, LookupError, ValueError) as exc:
        logger.debug("cannot read GRPOConfig's fields from TRL's source (%s): the learner checks them", exc)
        return None


def fields_from_source(module: str, name: str) -> dict[str, str]:
    """The fields of dataclass `name` as seen from `module`, with their annotations as text, read from the source
    files of it and its bases without importing them. Raises `LookupError` (or `OSError`, `SyntaxError`) where the
    source cannot be found or read."""
    return _fields(*_find_class(module, name))


@functools.lru_cache(maxsize=16)
def _parse(module: str) -> tuple[ast.Module, bool]:
    """A module's syntax tree, found without executing it, and whether it is a package."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)  # a top-level name is located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"package {top!r} not found")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    package = path.is_dir()
    file = path / "__init__.py" if package else path.with_suffix(".py")
    return ast.parse(file.read_text(encoding="utf-8")), package


def _find_class(module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef]:
    """The module that defines class `name` as seen from `module` (defined there, or imported into it) and its
    definition."""
    if depth > 8:
        raise LookupError(f"{name}: import chain too long")
    tree, package = _parse(module)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == name and a.asname in (None, name) for a in node.names):
            return _find_class(_absolute(module, package, node), name, depth + 1)
    raise LookupError(f"class {name} not found in {module}")


def _absolute(module: str, package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name of a (possibly relative) `from ... import`."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _fields(module: str, cls: ast.ClassDef) -> dict[str, str]:
    """A dataclass's fields in order: its bases' first, then its own (which override theirs)."""
    fields: dict[str, str] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name):
            fields.update(_fields(*_find_class(module, base.id)))
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation)
            if not annotation.startswith(("ClassVar", "typing.ClassVar", "InitVar")):
                fields[node.target.id] = annotation
    return fields
