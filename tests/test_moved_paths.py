"""Every module path that moved when the package took its folders still imports, as the module at its new path,
with a `DeprecationWarning` that names the new path (`raygrpo.core.moved`); and `import raygrpo` stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raygrpo.core.moved import MOVED

pytestmark = pytest.mark.timeout(120)

_PROBE = r"""
import importlib, json, sys, warnings
old_names = json.loads(sys.argv[1])
import raygrpo
out = {}
for old in old_names:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    out[old] = {"name": module.__name__, "spec": module.__spec__.name, "same": sys.modules[old] is module,
                "warnings": [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]}
print(json.dumps(out))
"""


def test_every_old_path_imports_the_moved_module_with_a_warning_naming_the_new_path():
    old_names = sorted(MOVED)
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(old_names)], capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    for old in old_names:
        new = MOVED[old]
        assert found[old]["name"] == new and found[old]["spec"] == new and found[old]["same"], (old, found[old])
        assert any(new in message for message in found[old]["warnings"]), (old, found[old]["warnings"])


def test_no_old_path_is_a_module_that_exists_or_a_parent_of_its_new_path():
    for old, new in MOVED.items():
        assert not new.startswith(old + "."), f"{old} is the package of its own new path {new}"


def test_old_import_path_strings_in_configs_still_load():
    """`import_path:` strings users wrote (a backend class by its old module) load the class at its new home."""
    done = subprocess.run([sys.executable, "-c",
                           "from raygrpo.core.imports import load_object; "
                           "print(load_object('raygrpo.sandbox.null:NullEnvironment').__module__)"],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "raygrpo.testing.null"


def test_import_raygrpo_loads_neither_ray_trl_nor_transformers():
    code = ("import sys, raygrpo; raygrpo.__all__; "
            "print([m for m in ('ray', 'trl', 'transformers', 'torch') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_public_api_names_resolve():
    import raygrpo

    for name in raygrpo.__all__:
        assert getattr(raygrpo, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        raygrpo.no_such_name  # noqa: B018
