"""Offline test tooling (`HarborSpec.offline_tooling`): Harbor's download-at-test-time verifier template, served by
what is already in the sandbox.

Harbor's standard `tests/test.sh` fetches its tooling when it runs: `apt-get install curl`, the uv installer through
`curl ... | sh`, `source $HOME/.local/bin/env`, then `uvx --with pytest==8.4.1 --with pytest-json-ctrf==0.3.5 pytest
...`. Where sandboxes cannot download (these machines, air-gapped clusters), every such verification fails and
writes 0.0. With `offline_tooling`, during the verifier phase only, shims come first on `test.sh`'s `PATH`:

- `apt-get update` succeeds; `apt-get install P...` succeeds for programs already there and hands the rest to the
  real `apt-get`;
- `curl` of the uv installer prints an installer that writes `$HOME/.local/bin/env` (putting `uv` and `uvx` on
  `PATH`); any other `curl` is the real one;
- `uvx [--with SPEC]... TOOL ARGS` and `uv run [--with SPEC]... CMD ARGS` check that every SPEC is installed in the
  sandbox's `python3` (the local backend's toolbox, or the image's), then run TOOL (`pytest` as `python3 -m
  pytest`); a SPEC that is not there stops the verification with a message naming it.

The task's files are never rewritten: the shims are uploaded to `SHIM_DIR` before the verifier runs, and only
`test.sh`'s own process gets them on its `PATH`. Whether what they need is there is checked before the model acts
(`raygrpo.envs.harbor.tooling`), so a missing package is a `verifier_error` naming it, never a 0.0.
"""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment

#: Where the shims go in the sandbox.
SHIM_DIR = "/tmp/.raygrpo-offline-tooling"
#: Programs the shims stand in for.
SERVED = ("apt-get", "curl", "uv", "uvx")
#: Downloads the shims serve (the uv installer).
SERVED_URL_PART = "astral.sh/uv"

_FIND_REAL = """
real() {  # the first $1 on PATH that is not this shim
  IFS=:; for d in $PATH; do
    [ "$d" = "%(dir)s" ] && continue
    [ -x "$d/$1" ] && { echo "$d/$1"; return 0; }
  done; return 1
}
"""

_APT_GET = """#!/bin/sh
# raygrpo offline tooling: apt-get during verification (see raygrpo.envs.harbor.offline).
%(find_real)s
case "$1" in update|clean|autoclean|autoremove) exit 0 ;; esac
if [ "$1" = install ]; then
  shift; flags=""; wanted=""
  for p in "$@"; do
    case "$p" in -*) flags="$flags $p" ;; *) command -v "$p" >/dev/null 2>&1 || wanted="$wanted $p" ;; esac
  done
  [ -z "$wanted" ] && exit 0
  r=$(real apt-get) && "$r" install $flags $wanted && exit 0
  echo "raygrpo offline tooling: apt-get could not install:$wanted" >&2
  exit 100
fi
r=$(real apt-get) || { echo "raygrpo offline tooling: no apt-get for: $*" >&2; exit 100; }
exec "$r" "$@"
"""

_CURL = """#!/bin/sh
# raygrpo offline tooling: curl during verification (see raygrpo.envs.harbor.offline).
%(find_real)s
for a in "$@"; do
  case "$a" in
    *%(url)s*)
      cat <<'INSTALLER'
#!/bin/sh
# raygrpo offline tooling: the uv installer, served offline: uv and uvx are raygrpo's shims.
mkdir -p "$HOME/.local/bin"
ln -sf %(dir)s/uv "$HOME/.local/bin/uv"
ln -sf %(dir)s/uvx "$HOME/.local/bin/uvx"
printf 'export PATH="$HOME/.local/bin:$PATH"\\n' > "$HOME/.local/bin/env"
echo "uv (raygrpo offline tooling) installed to $HOME/.local/bin"
INSTALLER
      exit 0 ;;
  esac
done
r=$(real curl) || { echo "raygrpo offline tooling: no curl for: $*" >&2; exit 127; }
exec "$r" "$@"
"""

_UV_WRAPPER = """#!/bin/sh
# raygrpo offline tooling: %(name)s during verification (see raygrpo.envs.harbor.offline).
exec python3 %(dir)s/uv_shim.py %(name)s "$@"
"""

_UV_SHIM = '''"""raygrpo offline tooling: `uvx` and `uv run` served by the packages already installed in this python3."""
import importlib.metadata as metadata
import os
import re
import sys

TAKES_VALUE = {"--with", "-w", "--from", "-p", "--python", "--with-requirements", "--index-url", "--index",
               "--extra-index-url", "--find-links", "-f"}


def fail(message):
    sys.stderr.write("raygrpo offline tooling: " + message + "\\n")
    raise SystemExit(2)


def check(spec):
    name = re.split(r"[<>=!~\\\\[; ]", spec, maxsplit=1)[0].strip()
    want = spec.split("==", 1)[1].strip() if "==" in spec else None
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        fail(f"{spec} is not installed in the sandbox's python3 ({sys.executable}); nothing can be downloaded here")
    if want is not None and have != want:
        fail(f"{spec} is wanted but the sandbox's python3 ({sys.executable}) has {name} {have}")


def main(program, args):
    if program == "uv":
        if args[:1] in (["--version"], ["-V"], ["version"]):
            print("uv 0.0.0 (raygrpo offline tooling)")
            return
        if args[:2] == ["pip", "install"]:
            for spec in args[2:]:
                if not spec.startswith("-"):
                    check(spec)
            return
        if args[:1] != ["run"]:
            fail("uv " + " ".join(args[:2]) + " is not served offline (only `uv run`, `uv pip install`, `uvx`)")
        args = args[1:]
    specs, i = [], 0
    while i < len(args) and args[i].startswith("-"):
        flag, _, inline = args[i].partition("=")
        if flag in ("--with", "-w", "--from"):
            specs.append(inline or args[i + 1])
        i += 1 if inline or flag not in TAKES_VALUE else 2
    if i >= len(args):
        fail(program + ": nothing to run")
    tool, rest = args[i], args[i + 1:]
    if program == "uvx" and tool == "pytest" and not any(re.match(r"^pytest($|[<>=!~ ])", s) for s in specs):
        specs.append("pytest")
    for spec in specs:
        check(spec)
    if tool in ("pytest", "py.test"):
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *rest])
    if tool in ("python", "python3"):
        os.execv(sys.executable, [sys.executable, *rest])
    os.execvp(tool, [tool, *rest])


main(sys.argv[1], sys.argv[2:])
'''


def shim_files() -> dict[str, str]:
    """The shims' files, by name."""
    find_real = _FIND_REAL % {"dir": SHIM_DIR}
    values = {"dir": SHIM_DIR, "find_real": find_real, "url": SERVED_URL_PART}
    return {
        "apt-get": _APT_GET % values,
        "curl": _CURL % values,
        "uv": _UV_WRAPPER % {**values, "name": "uv"},
        "uvx": _UV_WRAPPER % {**values, "name": "uvx"},
        "uv_shim.py": _UV_SHIM,
    }


async def install_shims(env: BaseEnvironment, scratch: Path) -> None:
    """Upload the shims to `SHIM_DIR` in the sandbox (`scratch`: a host folder for this episode's files)."""
    with tempfile.TemporaryDirectory(dir=scratch, prefix="offline-tooling-") as tmp:
        for name, text in shim_files().items():
            path = Path(tmp) / name
            path.write_text(text)
            path.chmod(0o755)
        await env.upload_dir(source_dir=Path(tmp), target_dir=SHIM_DIR)
    await env.exec(f"chmod -R a+rx {shlex.quote(SHIM_DIR)}", user="root")


def with_shims(command: str) -> str:
    """`command` with the shims first on its `PATH`."""
    return f"export PATH={shlex.quote(SHIM_DIR)}:\"$PATH\"; {command}"
