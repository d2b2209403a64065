"""The verifier toolbox of the local sandbox backend: a Python venv raygrpo builds on the host, with the tooling task
verifiers usually find baked into their images.

The local backend runs no image (`FROM python:3.12-slim` is not pulled), so without this a sandbox has whatever the
host has: often no `python` alias, no pytest, no pytest-json-ctrf. The toolbox is the same everywhere: a venv of the
host's `/usr/bin/python3` (visible in every sandbox) with `PACKAGES` installed, bound read-only into each sandbox at
its host path and first on its `PATH`, so `python`, `python3`, `pytest` and `python -m pytest --ctrf ...` work as
in the usual task image.

It is built once per machine (`make install` builds it; otherwise the first local sandbox of a run does, under a
file lock), in `$RAYGRPO_TOOLBOX`, else `/var/lib/raygrpo/toolbox` when writable, else `~/.cache/raygrpo/toolbox`,
in a folder named after its contents. `python -m raygrpo.sandbox.toolbox` builds it and prints its path.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)

#: What the toolbox holds (the versions Harbor's task template pins).
PACKAGES = ("pytest==8.4.1", "pytest-json-ctrf==0.3.5")
#: The interpreter the venv is made from: the system's, which every sandbox sees under /usr.
BASE_PYTHON = "/usr/bin/python3"
#: Where to keep toolboxes (a folder); its key names the one of the current contents.
TOOLBOX_ENV = "RAYGRPO_TOOLBOX"
_COMPLETE = ".raygrpo-toolbox.json"


class ToolboxError(RuntimeError):
    """The toolbox could not be built (no `/usr/bin/python3` with `venv`, or the packages did not install)."""


def _key(python: str) -> str:
    real = os.path.realpath(python)
    return hashlib.sha1(json.dumps([PACKAGES, real]).encode()).hexdigest()[:12]


def toolbox_root() -> Path:
    """The folder toolboxes are kept in (see the module docstring)."""
    if os.environ.get(TOOLBOX_ENV):
        return Path(os.environ[TOOLBOX_ENV])
    system = Path("/var/lib/raygrpo/toolbox")
    try:
        system.mkdir(parents=True, exist_ok=True)
        if os.access(system, os.W_OK):
            return system
    except OSError:
        pass
    return Path.home() / ".cache" / "raygrpo" / "toolbox"


def toolbox_path(python: str = BASE_PYTHON) -> Path:
    """Where the toolbox of the current contents lives (built or not)."""
    return toolbox_root() / _key(python)


def is_built(path: Path) -> bool:
    return (path / _COMPLETE).is_file()


def ensure_toolbox(python: str = BASE_PYTHON) -> Path:
    """The toolbox's path, building it first if it is not built yet (once per machine; concurrent callers wait for
    the one that builds).

    Raises:
        ToolboxError: It could not be built; the message says what failed.
    """
    path = toolbox_path(python)
    if is_built(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(path):
            return path
        _build(path, python)
    return path


def _build(path: Path, python: str) -> None:
    if not os.access(python, os.X_OK):
        raise ToolboxError(f"the verifier toolbox needs {python} (Debian's python3 with python3-venv)")
    shutil.rmtree(path, ignore_errors=True)  # an earlier build that did not finish
    began = time.monotonic()
    logger.info("building the local sandbox's verifier toolbox (%s) at %s", ", ".join(PACKAGES), path)
    steps = [
        [python, "-m", "venv", str(path)],
        [str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check",
         *PACKAGES],
    ]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ToolboxError(f"building the verifier toolbox failed at `{' '.join(argv[:4])} ...`: "
                               + " | ".join(tail))
    version = subprocess.run([str(path / "bin" / "python"), "--version"], capture_output=True, text=True).stdout
    (path / _COMPLETE).write_text(json.dumps({"packages": PACKAGES, "python": version.strip()}))
    logger.info("verifier toolbox built in %.1f s: %s", time.monotonic() - began, path)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(ensure_toolbox())
    except ToolboxError as exc:
        print(f"raygrpo: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
