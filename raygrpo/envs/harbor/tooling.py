"""What a Harbor task's `tests/test.sh` needs to run, and a probe of the sandbox for it before the model acts.

A verifier whose tooling is missing writes a reward of 0.0 (`pytest: command not found` inside `if ...; then echo 1
else echo 0`), exactly what a wrong answer writes. Such a 0.0 may only be set aside when the tooling was shown
missing *before the model acted* (the model could otherwise delete pytest to turn its wrong answers into retries):
`scan_test_script` reads what the script relies on, `probe_command` checks it in the freshly started sandbox, and
the verdict is `verifier_error` only when that probe found something missing, the verifier then did not award full
reward, and it lacked that too (`raygrpo.envs.harbor.grading`: bash missed the command, the package was still
missing after `test.sh` ran). A command reported missing that the script does not run would set a real verdict
aside, so the script is parsed as bash parses it (`raygrpo.envs.harbor.shell_words`, a tree-sitter bash grammar),
not read off its tokens; what the grammar cannot read is left out (`ToolingNeeds.unread`), never guessed.

What the scan finds:

- **commands**: the program of each simple command (pipelines, lists, compound commands, function bodies, command
  substitutions, `bash -c`/`su -c` bodies; the program behind `sudo`, `timeout`, `env`, `exec`, ...), less shell
  keywords and builtins, the script's own functions, programs named by an expansion (`$PYTHON`), the task's own
  scripts (`/tests/...`, relative paths), and the programs the script installs itself (`apt-get install curl`, the uv
  installer's `uv` and `uvx`); a script whose `#!` line names another interpreter (`python3`) needs only that;
- **python packages**: `uvx --with SPEC` specs and the tool `uvx` runs, `pytest` for `pytest`/`python -m pytest`,
  and `pytest-json-ctrf` when `--ctrf` is passed; apart (`pip_packages`), the requirements it installs itself with
  `pip install` (`pip3`, `python3 -m pip`, `uv pip`): those are checked in the sandbox's `python3` before the model
  acts, and again after the verifier ran (`package_check_command`), since its own install may have provided them;
  a `pip install` into a virtual environment the script makes, or into `--target`/`--prefix`/`--root`, is not read
  (that `python3` is not the one checked);
- **downloads**: the URLs `curl` and `wget` fetch (written out in full: a URL built from a variable is not checked).

A command the task's instruction names (`set_aside_named`: a word of its Markdown code, `wordstat` in "create the
command `wordstat`", or the last part of a path in it, `/app/bin/wordstat`) is the model's to provide, not the
verifier's tooling: it is not looked for, so its absence is the model's 0.0. The Python runners (`python3`, `pytest`,
`pip`, `uv`, ...) are looked for whatever the instruction says.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from raygrpo.envs.harbor.shell_words import read_script, script_interpreter

#: Words that are never a program to look for: keywords, builtins, and the wrappers `shell_words` looks through.
SHELL_WORDS = frozenset(
    "if then else elif fi for while until do done case esac in function select time coproc { } [[ ]] ! "
    "echo printf cd pwd source . export set unset exit return true false test [ read local declare typeset eval "
    "exec shift trap wait : alias unalias type command hash ulimit umask pushd popd dirs let break continue builtin "
    "shopt getopts readonly mapfile readarray jobs fg bg disown kill caller compgen complete enable help history "
    "logout suspend times bind sudo env nohup timeout xargs".split()
)
#: Programs the uv installer puts on PATH.
UV_PROGRAMS = ("uv", "uvx")
#: What `--ctrf` needs.
CTRF_PACKAGE = "pytest-json-ctrf"
#: Package managers whose `install P...` puts programs P on PATH.
PACKAGE_MANAGERS = ("apt-get", "apt", "apk", "yum", "dnf")
#: Where the task's own scripts are (uploaded with it, or written by the script) and relative paths: not looked for.
TASK_PATHS = ("/tests/", "/solution/", "/logs/", "./", "../", "~")
_URL = re.compile(r"https?://[^\s'\"|;&)]+")
_PROGRAM = re.compile(r"^[A-Za-z0-9_.+-]+$|^/(usr|bin|sbin|opt)/[A-Za-z0-9_./+-]+$")
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
_PIP = re.compile(r"^pip(3(\.\d+)?)?$")
#: The Python runners: looked for even where the instruction names them (a task never asks the model to make them).
_RUNNER = re.compile(r"^(python(3(\.\d+)?)?|pip(3(\.\d+)?)?|pytest|py\.test|uvx?)$")
#: Options of `pip` (before `install`) and of `pip install` / `uv pip install` that take a value.
_PIP_VALUE_OPTIONS = frozenset(
    "-r --requirement -c --constraint -e --editable -i --index-url --extra-index-url -f --find-links --src "
    "--platform --python-version --implementation --abi --upgrade-strategy --progress-bar --no-binary "
    "--only-binary -C --config-settings --global-option --trusted-host --cache-dir --log --proxy --timeout "
    "--retries --exists-action --cert --client-cert --report --root-user-action --use-feature --use-deprecated "
    "-p --python --index --default-index --index-strategy --keyring-provider --resolution --prerelease --extra "
    "--group --python-platform".split()
)
#: `pip install` options that install somewhere other than the environment of the `python3` the probe checks.
_PIP_ELSEWHERE = frozenset("-t --target --prefix --root".split())
#: A requirement `pip install` takes from an index: `name`, `name[extra]`, `name==1.2`, `name>=1,<2`, ...
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(?P<version>[<>=!~].*)?$")
_PINNED = re.compile(r"^==\s*(?P<version>[A-Za-z0-9._+-]+)$")
#: Markdown code in an instruction (fenced blocks and inline spans), and the absolute paths anywhere in it.
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.DOTALL)
_CODE_WORD = re.compile(r"[^\s`'\"<>|;&(){}=,]+")
_ABS_PATH = re.compile(r"(?<![\w.~-])/[\w.+-]+(?:/[\w.+-]+)*")


@dataclass
class ToolingNeeds:
    """What a test script relies on (see the module docstring).

    Args:
        commands: Programs it runs that it does not install itself.
        packages: Python distributions its tests need (`name` or `name==version`), in the sandbox's `python3`
            unless `uvx` provides them.
        via_uvx: The packages are meant to come through `uvx` (which installs them), not the sandbox's `python3`.
        urls: What it downloads.
        installs: Programs it installs itself (not looked for before it runs).
        pip_packages: The requirements it `pip install`s into the sandbox's `python3` (`name` or `name==version`):
            checked there whatever `uvx` does.
        unread: The start of each part of the script the bash grammar could not read (left out of the rest).
    """

    commands: list[str] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)
    via_uvx: bool = False
    urls: list[str] = field(default_factory=list)
    installs: list[str] = field(default_factory=list)
    pip_packages: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)


def scan_test_script(text: str) -> ToolingNeeds:
    """What the test script `text` relies on (see the module docstring)."""
    needs = ToolingNeeds()
    interpreter = script_interpreter(text)
    if interpreter is not None:
        needs.commands = [interpreter] if _PROGRAM.match(interpreter) else []
        return needs
    script = read_script(text)
    needs.unread = script.unread
    installs: set[str] = set()
    runs: list[str] = []
    packages: list[str] = []
    pip_packages: list[str] = []
    urls: list[str] = []
    in_venv = False
    for command in script.commands:
        program = command.program
        values = command.values
        if program in ("curl", "wget"):
            urls += [u for v in values[1:] if v for u in _URL.findall(v)]
        if "astral.sh/uv" in " ".join(w.text for w in command.words):
            installs.update(UV_PROGRAMS)
        if program in PACKAGE_MANAGERS and "install" in values:
            installs.update(v for v in values[values.index("install") + 1:] if v and not v.startswith("-"))
        if program == "uvx" or (program == "uv" and values[1:2] in (["run"], ["tool"])):
            needs.via_uvx = True
            packages += _uvx_packages(values)
        if program is not None and _PYTHON.match(program) and values[1:3] == ["-m", "pytest"]:
            packages.append("pytest")
        if program in ("pytest", "py.test"):
            packages.append("pytest")
        if "--ctrf" in values or any(v and v.startswith("--ctrf=") for v in values):
            packages.append(CTRF_PACKAGE)
        in_venv = in_venv or _makes_venv(program, values)
        pip = _pip_install_specs(program, values)
        if pip:
            pip_packages += pip
        if program is not None and _is_program(program, script.functions):
            runs.append(program)
    needs.installs = sorted(installs)
    needs.commands = list(dict.fromkeys(c for c in runs if c not in installs))
    needs.packages = _dedupe_packages(packages)
    needs.pip_packages = [] if in_venv else _dedupe_packages(pip_packages)
    needs.urls = list(dict.fromkeys(urls))
    return needs


def _is_program(program: str, functions: set[str]) -> bool:
    """Whether `program` is one to look for on PATH (not a builtin, a function, or the task's own file)."""
    if program in SHELL_WORDS or program in functions or program.startswith(TASK_PATHS):
        return False
    if "/" in program and not program.startswith("/"):
        return False
    return bool(_PROGRAM.match(program))


def _makes_venv(program: str | None, values: list[str | None]) -> bool:
    """Whether the command makes or activates a virtual environment (`python3 -m venv`, `virtualenv`, `uv venv`,
    `source .venv/bin/activate`): a `pip install` after it installs into a `python3` the probe does not check."""
    if program is None:
        return False
    if program in ("virtualenv", "conda", "mamba", "micromamba") or (program == "uv" and values[1:2] == ["venv"]):
        return True
    if _PYTHON.match(program) and values[1:3] in (["-m", "venv"], ["-m", "virtualenv"]):
        return True
    target = values[1] if len(values) > 1 else None
    return program in ("source", ".") and target is not None and target.rsplit("/", 1)[-1] == "activate"


def _pip_install_specs(program: str | None, values: list[str | None]) -> list[str] | None:
    """The requirements a `pip install` (`pip3`, `python3 -m pip`, `uv pip`) installs from an index into the
    sandbox's `python3`, each as `package_check_command` checks it (`name`, or `name==version` when pinned); None when
    the command is not one, or installs elsewhere (`--target`, `--prefix`, `--root`). Local paths, URLs, archives and
    requirements built from an expansion are left out, never guessed."""
    if program is None:
        return None
    if _PIP.match(program):
        rest = values[1:]
    elif _PYTHON.match(program) and values[1:3] == ["-m", "pip"]:
        rest = values[3:]
    elif program == "uv" and values[1:2] == ["pip"]:
        rest = values[2:]
    else:
        return None
    i = 0
    while i < len(rest) and rest[i] is not None and rest[i].startswith("-"):  # pip's own options
        i += 2 if rest[i] in _PIP_VALUE_OPTIONS else 1
    if i >= len(rest) or rest[i] != "install":
        return None
    specs: list[str] = []
    words = iter(rest[i + 1:])
    for word in words:
        if word is None:
            continue
        if word.startswith("-"):
            if word.split("=", 1)[0] in _PIP_ELSEWHERE:
                return None
            if word in _PIP_VALUE_OPTIONS:
                next(words, None)
            continue
        spec = _checkable(word)
        if spec is not None:
            specs.append(spec)
    return specs


def _checkable(requirement: str) -> str | None:
    """`requirement` as the package check reads it: `name==version` when pinned to one version, else `name`; None
    for what is not a requirement from an index (a path, a URL, an archive, `name @ url`)."""
    if "/" in requirement or ":" in requirement or "@" in requirement or requirement.endswith(
            (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2")):
        return None
    m = _REQUIREMENT.match(requirement.strip())
    if m is None:
        return None
    pinned = _PINNED.match((m["version"] or "").strip())
    return f"{m['name']}=={pinned['version']}" if pinned and "*" not in pinned["version"] else m["name"]


def set_aside_named(needs: ToolingNeeds, instructions: list[str]) -> list[str]:
    """Take the commands the task's `instructions` name out of `needs.commands` and return them: the model is asked
    to provide them ("create the command `wordstat`"), so their absence before it acts is not the verifier's
    tooling. Named: a word of the instructions' Markdown code, or the last part of an absolute path in them; a
    command written as a path is named by itself or by its last part. The Python runners are never set aside."""
    named: set[str] = set()
    for text in instructions:
        for code in _CODE.findall(text):
            named.update(_CODE_WORD.findall(code.strip("`")))
        named.update(path.rstrip(".") for path in _ABS_PATH.findall(text))  # a sentence's full stop is not part
    named |= {word.rstrip("/").rsplit("/", 1)[-1] for word in named if "/" in word}
    aside = [c for c in needs.commands
             if not _RUNNER.match(c.rsplit("/", 1)[-1]) and (c in named or c.rsplit("/", 1)[-1] in named)]
    needs.commands = [c for c in needs.commands if c not in aside]
    return aside


def _uvx_packages(words: list[str | None]) -> list[str]:
    """The packages an `uvx [--with SPEC]... TOOL` (or `uv run --with SPEC ...`) invocation brings in (`words` as
    bash passes them, None for a word built from an expansion: such a spec is not looked for)."""
    out: list[str] = []
    i = 1
    tool: str | None = None
    while i < len(words):
        w = words[i]
        if w is None:
            break  # the tool is an expansion (option values are skipped below)
        if w in ("--with", "-w", "--from") and i + 1 < len(words):
            spec = words[i + 1]
            if spec is not None:
                out.append(spec)
            i += 2
            continue
        if w.startswith("--with="):
            out.append(w.split("=", 1)[1])
        elif w in ("run", "tool") or w.startswith("-"):
            if w in ("-p", "--python") and i + 1 < len(words):
                i += 1
        elif tool is None:
            tool = w
            break
        i += 1
    if tool == "pytest" and not any(_dist_name(p) == "pytest" for p in out):
        out.append("pytest")
    return out


def _dist_name(spec: str) -> str:
    return re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].strip().lower().replace("_", "-")


def _dedupe_packages(specs: list[str]) -> list[str]:
    """One spec per distribution, a pinned one winning over a bare name."""
    chosen: dict[str, str] = {}
    for spec in specs:
        name = _dist_name(spec)
        if name and (name not in chosen or ("==" in spec and "==" not in chosen[name])):
            chosen[name] = spec.strip()
    return list(chosen.values())


#: Python run in the sandbox to check packages: prints one JSON object per missing or mismatched spec.
_PACKAGE_CHECK = """
import importlib.metadata as m, json, sys
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        have = m.version(name)
    except m.PackageNotFoundError:
        print(json.dumps({"package": spec, "found": None}))
        continue
    if want and have != want:
        print(json.dumps({"package": spec, "found": have}))
"""


def probe_command(needs: ToolingNeeds, *, served: tuple[str, ...] = (), check_urls: bool = True) -> str | None:
    """A shell command that prints one JSON line per thing the script needs and the sandbox lacks; None when there
    is nothing to check.

    Args:
        needs: What the script relies on.
        served: Programs that raygrpo serves during verification (offline tooling's shims): not looked for.
        check_urls: Also check that each download answers (off when offline tooling serves them).
    """
    parts: list[str] = []
    for program in needs.commands:
        if program in served:
            continue
        q = shlex.quote(program)
        parts.append(f"command -v {q} >/dev/null 2>&1 || echo {shlex.quote(json.dumps({'command': program}))}")
    # Installed packages must already be there (uvx, online, brings its own): checked with the python3 the tests
    # would run, as are those test.sh pip-installs (its install may fail).
    packages = [] if needs.via_uvx and "uvx" not in served else needs.packages
    specs = _dedupe_packages(packages + needs.pip_packages)
    if specs:
        parts.append(package_check_command(specs))
    if check_urls:
        for url in dict.fromkeys(needs.urls):
            q = shlex.quote(url)
            note = shlex.quote(json.dumps({"url": url}))
            parts.append(f"(curl -sSfL -o /dev/null --max-time 10 -r 0-0 {q} >/dev/null 2>&1 || "
                         f"wget -q -O /dev/null -T 10 {q} >/dev/null 2>&1) || echo {note}")
    return "; ".join(parts) if parts else None


def package_check_command(specs: list[str]) -> str:
    """A shell command that prints one JSON line per spec (`name` or `name==version`) the sandbox's `python3` lacks
    or has at another version, and `{"command": "python3"}` when there is no `python3`."""
    args = " ".join(shlex.quote(p) for p in specs)
    missing_python = shlex.quote(json.dumps({"command": "python3"}))
    return (f"if command -v python3 >/dev/null 2>&1; then python3 -c {shlex.quote(_PACKAGE_CHECK)} {args}; "
            f"else echo {missing_python}; fi")


def read_probe(stdout: str) -> list[str]:
    """What the probe found missing, one phrase each (`pytest 8.4.1 (found 7.4.0)`, `the command jq`, ...)."""
    found: list[str] = []
    for line in stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if not isinstance(item, dict):
            continue
        if "command" in item:
            found.append(f"the command `{item['command']}`")
        elif "package" in item:
            have = f" (found {item['found']})" if item.get("found") else ""
            found.append(f"the Python package `{item['package']}`{have}")
        elif "url" in item:
            found.append(f"the download {item['url']} (unreachable)")
    return found


_COMMAND_PHRASE = re.compile(r"^the command `(?P<command>.+)`$")
_PACKAGE_PHRASE = re.compile(r"^the Python package `(?P<package>[^`]+)`( \(found .+\))?$")


def probe_commands(phrases: list[str]) -> list[str]:
    """The commands among what `read_probe` found missing (its `the command `X`` phrases), in order."""
    return [m["command"] for m in map(_COMMAND_PHRASE.match, phrases) if m is not None]


def probe_packages(phrases: list[str]) -> list[str]:
    """The package specs among what `read_probe` found missing (its `the Python package `X`` phrases), in order."""
    return [m["package"] for m in map(_PACKAGE_PHRASE.match, phrases) if m is not None]
