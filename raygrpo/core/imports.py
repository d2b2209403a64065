"""Loading user code named in a config: `"pkg.module:Attr"` or `"path/to/file.py:Attr"`.

Configs name embedded ORS environments and scripted policies this way. Errors say which spec failed and why (no
module, no file, no attribute), so a typo in a config fails at load time with a message naming it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from raygrpo.core.errors import ResolveError


class ImportSpecError(ImportError):
    """A `"module:Attr"` or `"file.py:Attr"` spec could not be loaded."""


def split_spec(spec: str) -> tuple[str, str]:
    """Split `"target:Attr"` into `(target, "Attr")`; the attribute may be dotted (`"mod:Class.method"`).

    The last `:` separates the attribute so Windows-style drive letters in file paths still work.
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise ImportSpecError(
            f"invalid import spec {spec!r}: expected 'package.module:Attr' or 'path/to/file.py:Attr'"
        )
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ImportSpecError(
            f"invalid import spec {spec!r}: expected 'package.module:Attr' or 'path/to/file.py:Attr'"
        )
    return target, attr


def is_file_spec(target: str) -> bool:
    """True when the module part of a spec is a file path rather than a dotted module name."""
    return target.endswith(".py") or os.sep in target or "/" in target


def resolve_file(target: str, base_dir: str | None = None) -> str:
    """Absolute path of a spec's file part: relative paths are taken from `base_dir`, else the working directory."""
    path = os.path.expanduser(target)
    if not os.path.isabs(path):
        path = os.path.join(base_dir or os.getcwd(), path)
    return os.path.normpath(os.path.abspath(path))


def _load_file_module(path: str, spec: str) -> ModuleType:
    if not os.path.isfile(path):
        raise ImportSpecError(f"cannot load {spec!r}: file {path} does not exist")
    # One module per file path, under a stable synthetic name, so loading the same file twice returns the same
    # classes (pickling by reference and `isinstance` keep working) and two files named env.py do not collide.
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    stem = os.path.splitext(os.path.basename(path))[0].replace("-", "_").replace(".", "_")
    name = f"_raygrpo_user_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportSpecError(f"cannot load {spec!r}: {path} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    # The file's own folder goes on sys.path so it can import its neighbours, as `python file.py` would.
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.append(folder)
    try:
        module_spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        raise ImportSpecError(f"cannot load {spec!r}: executing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _load_dotted_module(target: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
            raise ImportSpecError(f"cannot load {spec!r}: no module named {exc.name!r}") from exc
        raise ImportSpecError(
            f"cannot load {spec!r}: module {target!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc
    except Exception as exc:
        raise ImportSpecError(
            f"cannot load {spec!r}: module {target!r} failed to import: {type(exc).__name__}: {exc}"
        ) from exc


def load_object(spec: str, base_dir: str | None = None) -> Any:
    """Load the object a spec names.

    Args:
        spec: `"package.module:Attr"` (imported from `sys.path`) or `"path/to/file.py:Attr"` (a file path, relative
            to `base_dir` when relative). `Attr` may be dotted to reach a nested attribute.
        base_dir: Folder that relative file paths are resolved from; the working directory when None. Configs pass the
            folder of the config file.

    Raises:
        ImportSpecError: The spec is malformed, or its module, file or attribute does not exist. The message names
            the spec.
    """
    target, attr = split_spec(spec)
    if is_file_spec(target):
        module = _load_file_module(resolve_file(target, base_dir), spec)
    else:
        module = _load_dotted_module(target, spec)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = getattr(module, "__file__", None) or target
            raise ImportSpecError(f"cannot load {spec!r}: {where} has no attribute {attr!r}") from None
    return obj


def load_function(spec: str, field: str) -> Any:
    """The callable a config field names (a scripted policy, the warm-up's example function).

    Raises:
        ResolveError: It does not load or is not callable; the message starts with `field`.
    """
    try:
        obj = load_object(spec)
    except ImportSpecError as exc:
        raise ResolveError(f"{field}: {exc}") from None
    if not callable(obj):
        raise ResolveError(f"{field}: {spec!r} is a {type(obj).__name__}, not a function")
    return obj
