"""What a Harbor task's `tests/test.sh` needs to run, and a probe of the sandbox for it before the model acts.

A verifier whose tooling is missing writes a reward of 0.0 (`pytest: command not found` inside `if ...; then echo 1
else echo 0`), exactly what a wrong answer writes. Such a 0.0 may only be set aside when the tooling was shown
missing *before the model acted* (the model could otherwise delete pytest to turn its wrong answers into retries):
`scan_test_script` reads what the script relies on, `probe_command` checks it in the freshly started sandbox, and
the verdict is `verifier_error` only when that probe found something missing and the verifier then did not award
full reward.

What the scan finds (a reading of the script, not a shell parser; words it cannot place are left out, not guessed):

- **commands**: the first word of each simple command (after `;`, `&&`, `||`, `|`, `(`, `$(`, `then`, `do`, ...),
  less shell keywords and builtins, the script's own functions, arithmetic, variables, and the task's own scripts (`/tests/...`, relative paths), and less
  the programs the script installs itself (`apt-get install curl`, the uv installer's `uv` and `uvx`);
- **python packages**: `uvx --with SPEC` specs and the tool `uvx` runs, `pytest` for `pytest`/`python -m pytest`,
  and `pytest-json-ctrf` when `--ctrf` is passed;
- **downloads**: the URLs `curl` and `wget` fetch.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

#: Words that are never a program to look for.
SHELL_WORDS = frozenset(
    "if then else elif fi for while until do done case esac in function select time coproc { } [[ ]] ! "
    "echo printf cd source . export set unset exit return true false test [ read local declare typeset eval exec "
    "shift trap wait : alias unalias type command hash ulimit umask pushd popd dirs let break continue builtin "
    "shopt getopts readonly mapfile readarray jobs fg bg disown kill sudo env nohup timeout xargs".split()
)
#: Operators after which a new simple command starts.
COMMAND_STARTERS = frozenset(";; ; && || | |& & ( ) { !".split()) | {"then", "do", "else", "elif", "if", "while",
                                                                    "until", "time", "!"}
#: Programs the uv installer puts on PATH.
UV_PROGRAMS = ("uv", "uvx")
#: What `--ctrf` needs.
CTRF_PACKAGE = "pytest-json-ctrf"
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_FUNCTION = re.compile(r"(?m)^\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\(\)")
_FUNCTION_KEYWORD = re.compile(r"(?m)^\s*function\s+([A-Za-z_][A-Za-z0-9_.-]*)")
_URL = re.compile(r"https?://[^\s'\"|;&)]+")
_PROGRAM = re.compile(r"^[A-Za-z0-9_.+-]+$|^/(usr|bin|sbin|opt)/[A-Za-z0-9_./+-]+$")


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
    """

    commands: list[str] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)
    via_uvx: bool = False
    urls: list[str] = field(default_factory=list)
    installs: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    """The script's lines with continuations joined, comments dropped, and here-document bodies left out."""
    lines: list[str] = []
    pending = ""
    ending: str | None = None
    for raw in text.splitlines():
        if ending is not None:  # inside a here-document: its text is data, not commands
            if raw.strip() == ending:
                ending = None
            continue
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        line = pending + raw
        pending = ""
        heredoc = _HEREDOC.search(line)
        if heredoc:
            ending = heredoc.group(2)
            line = line[: heredoc.start()]
        lines.append(line)
    if pending:
        lines.append(pending)
    return lines


def _tokens(line: str) -> list[str]:
    line = line.replace("$(", " ( ").replace("`", " ( ")
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()!")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # an unbalanced quote: read what can be read
        return line.split()


def _without_arithmetic(line: str) -> str:
    """`line` with arithmetic (`$((...))`, `((...))`) replaced by a plain word: its names are variables."""
    while True:
        start = line.find("((")
        if start == -1:
            return line
        depth, i = 0, start
        while i < len(line):
            depth += {"(": 1, ")": -1}.get(line[i], 0)
            i += 1
            if depth == 0:
                break
        word = "0" if start > 0 and line[start - 1] == "$" else "true"
        line = line[: start - 1 if word == "0" else start] + word + line[i:]


def _substitutions(line: str) -> list[str]:
    """The text of each `$(...)` in `line` (nested ones included, through the outer one's text)."""
    out: list[str] = []
    start = line.find("$(")
    while start != -1:
        depth, i = 1, start + 2
        while i < len(line) and depth:
            depth += {"(": 1, ")": -1}.get(line[i], 0)
            i += 1
        inner = line[start + 2: i - 1]
        out.append(inner)
        out += _substitutions(inner)
        start = line.find("$(", i)
    return out


def _simple_commands(text: str) -> list[list[str]]:
    """Each simple command of the script as its words."""
    commands: list[list[str]] = []
    lines = [_without_arithmetic(line) for line in _logical_lines(text)]
    lines += [inner for line in lines for inner in _substitutions(line)]  # `"$(cmd ...)"` inside quotes too
    for line in lines:
        current: list[str] = []
        for token in _tokens(line):
            if token in COMMAND_STARTERS:
                if current:
                    commands.append(current)
                current = []
                continue
            current.append(token)
        if current:
            commands.append(current)
    return commands


def scan_test_script(text: str) -> ToolingNeeds:
    """What the test script `text` relies on (see the module docstring)."""
    needs = ToolingNeeds()
    functions = set(_FUNCTION.findall(text)) | set(_FUNCTION_KEYWORD.findall(text))
    installs: set[str] = set()
    runs: list[str] = []
    packages: list[str] = []
    for words in _simple_commands(text):
        while words and ("=" in words[0] and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
            words = words[1:]  # assignments before the command
        if not words or words[0] in ("for", "case", "select", "function"):
            continue
        if words[0] in ("sudo", "env", "nohup", "timeout", "exec", "command", "time") and len(words) > 1:
            rest = words[1:]
            while rest and (rest[0].startswith("-") or re.match(r"^[0-9.]+[smhd]?$", rest[0])
                            or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", rest[0])):
                rest = rest[1:]
            words = rest or words
        program = words[0]
        if program in ("curl", "wget"):
            needs.urls += [u for w in words[1:] for u in _URL.findall(w)]
        if "astral.sh/uv" in " ".join(words):
            installs.update(UV_PROGRAMS)
        if program in ("apt-get", "apt", "apk", "yum", "dnf") and "install" in words:
            installs.update(w for w in words[words.index("install") + 1:] if not w.startswith("-"))
        if program == "uvx" or (program == "uv" and words[1:2] in (["run"], ["tool"])):
            needs.via_uvx = True
            packages += _uvx_packages(words)
        if program in ("python", "python3") or re.match(r"^python3\.\d+$", program):
            if words[1:3] == ["-m", "pytest"]:
                packages.append("pytest")
        if program in ("pytest", "py.test"):
            packages.append("pytest")
        if "--ctrf" in words or any(w.startswith("--ctrf=") for w in words):
            packages.append(CTRF_PACKAGE)
        if program in SHELL_WORDS or program in functions or program.startswith(("$", "/tests/", "/solution/", "/logs/", "./", "../", "~")):
            continue
        if "/" in program and not program.startswith("/"):
            continue
        if _PROGRAM.match(program):
            runs.append(program)
    needs.installs = sorted(installs)
    needs.commands = list(dict.fromkeys(c for c in runs if c not in installs))
    needs.packages = _dedupe_packages(packages)
    return needs


def _uvx_packages(words: list[str]) -> list[str]:
    """The packages an `uvx [--with SPEC]... TOOL` (or `uv run --with SPEC ...`) invocation brings in."""
    out: list[str] = []
    i = 1
    tool: str | None = None
    while i < len(words):
        w = words[i]
        if w in ("--with", "-w", "--from") and i + 1 < len(words):
            out.append(words[i + 1])
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
    if needs.packages and not (needs.via_uvx and "uvx" not in served):
        # Installed packages must already be there: checked with the python3 the tests would run.
        args = " ".join(shlex.quote(p) for p in needs.packages)
        missing_python = shlex.quote(json.dumps({"command": "python3"}))
        parts.append(f"if command -v python3 >/dev/null 2>&1; then python3 -c {shlex.quote(_PACKAGE_CHECK)} {args}; "
                     f"else echo {missing_python}; fi")
    if check_urls:
        for url in dict.fromkeys(needs.urls):
            q = shlex.quote(url)
            note = shlex.quote(json.dumps({"url": url}))
            parts.append(f"(curl -sSfL -o /dev/null --max-time 10 -r 0-0 {q} >/dev/null 2>&1 || "
                         f"wget -q -O /dev/null -T 10 {q} >/dev/null 2>&1) || echo {note}")
    return "; ".join(parts) if parts else None


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
