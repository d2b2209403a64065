"""Dockerfile syntax, as Docker reads it: instructions (line continuations, parser directives, heredocs) and shell
words (quote removal and `$VAR` / `${VAR:-default}` expansion).

`raygrpo.sandbox.dockerfile` turns the instructions into what the local sandbox applies; this module only reads.
Errors name the file and line (`DockerfileError`); word-level errors (`LexError`) are given their line by the caller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_KNOWN = {
    "FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER",
    "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}
HEREDOC_RE = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DockerfileError(ValueError):
    """A Dockerfile the local sandbox cannot read; the message starts with `path:line:`."""

    def __init__(self, path: Path | str, line: int, message: str):
        self.path = Path(path)
        self.line = line
        super().__init__(f"{path}:{line}: {message}")


# --------------------------------------------------------------------------------------------------------------
# Lexing: quote removal and $VAR expansion, as Docker's shell-word processing does them
# --------------------------------------------------------------------------------------------------------------


class LexError(ValueError):
    """A word the lexer cannot read; the caller turns it into a `DockerfileError` with the instruction's line."""


def expand_var(text: str, i: int, env: dict[str, str]) -> tuple[str, int]:
    """Expand the `$...` starting at `text[i] == '$'`; return (value, index after it)."""
    if i + 1 >= len(text):
        return "$", i + 1
    nxt = text[i + 1]
    if nxt == "{":
        end = text.find("}", i + 2)
        if end < 0:
            raise LexError(f"unterminated ${{...}} in {text!r}")
        body = text[i + 2 : end]
        m = NAME_RE.match(body)
        if not m:
            raise LexError(f"bad variable reference ${{{body}}}")
        name, rest = m.group(0), body[m.end() :]
        value = env.get(name)
        if rest == "":
            return value or "", end + 1
        if rest.startswith(":-"):
            return (value if value else lex_one(rest[2:], env)), end + 1
        if rest.startswith(":+"):
            return (lex_one(rest[2:], env) if value else ""), end + 1
        if rest.startswith("-"):
            return (value if value is not None else lex_one(rest[1:], env)), end + 1
        if rest.startswith("+"):
            return (lex_one(rest[1:], env) if value is not None else ""), end + 1
        raise LexError(f"unsupported modifier in ${{{body}}}")
    m = NAME_RE.match(text, i + 1)
    if not m:
        return "$", i + 1
    return env.get(m.group(0), ""), m.end()


def _plain_step(
    text: str, i: int, env: dict[str, str], escape: str, escapable: tuple[str, ...] | str | None = None
) -> tuple[str, int]:
    """Read one unit at `text[i]`: an escaped character (any, or one of `escapable`), a `$` expansion, or the
    character itself; return (what it stands for, index after it)."""
    c = text[i]
    if c == escape and i + 1 < len(text) and (escapable is None or text[i + 1] in escapable):
        return text[i + 1], i + 2
    if c == "$":
        return expand_var(text, i, env)
    return c, i + 1


def lex(text: str, env: dict[str, str], *, split: bool, escape: str = "\\") -> list[str]:
    """Split `text` into words (or keep it as one when `split` is False), removing quotes and expanding `$VAR`."""
    words: list[str] = []
    cur: list[str] = []
    in_word = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if split and c.isspace():
            if in_word:
                words.append("".join(cur))
                cur, in_word = [], False
            i += 1
            continue
        in_word = True
        if c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise LexError(f"unterminated single quote in {text!r}")
            cur.append(text[i + 1 : end])
            i = end + 1
        elif c == '"':
            i += 1
            while True:
                if i >= n:
                    raise LexError(f"unterminated double quote in {text!r}")
                c = text[i]
                if c == '"':
                    i += 1
                    break
                chunk, i = _plain_step(text, i, env, escape, ('"', "$", escape))
                cur.append(chunk)
        else:
            chunk, i = _plain_step(text, i, env, escape)
            cur.append(chunk)
    if in_word or not split:
        words.append("".join(cur))
    return words


def lex_one(text: str, env: dict[str, str], escape: str = "\\") -> str:
    return lex(text, env, split=False, escape=escape)[0]


# --------------------------------------------------------------------------------------------------------------
# Reading instructions: continuations, comments, parser directives, heredocs
# --------------------------------------------------------------------------------------------------------------


@dataclass
class Instruction:
    line: int
    keyword: str
    args: str
    heredocs: list[tuple[str, str, bool]] = field(default_factory=list)  # (name, body, expand)


def read_instructions(path: Path, text: str) -> tuple[list[Instruction], str]:
    lines = text.splitlines()
    escape = "\\"
    # Parser directives: `# key=value` lines at the very top, before anything else.
    for raw in lines:
        m = re.match(r"^\s*#\s*([A-Za-z]+)\s*=\s*(\S+)\s*$", raw)
        if not m:
            break
        if m.group(1).lower() == "escape":
            if m.group(2) not in ("\\", "`"):
                raise DockerfileError(path, lines.index(raw) + 1, f"invalid escape directive {m.group(2)!r}")
            escape = m.group(2)
    out: list[Instruction] = []
    i = 0
    while i < len(lines):
        raw = lines[i]
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        start = i + 1
        parts: list[str] = []
        line = raw
        while True:
            body = line.rstrip()
            if body.endswith(escape):
                parts.append(body[:-1])
                i += 1
                # Comment and empty lines inside a continuation are skipped, as Docker does.
                while i < len(lines) and (not lines[i].strip() or lines[i].lstrip().startswith("#")):
                    i += 1
                if i >= len(lines):
                    break
                line = lines[i]
                continue
            parts.append(line)
            i += 1
            break
        joined = " ".join(p.strip() for p in parts).strip()
        m = re.match(r"^([A-Za-z]+)(?:\s+(.*))?$", joined, re.S)
        if not m:
            raise DockerfileError(path, start, f"cannot parse instruction {joined[:60]!r}")
        keyword, args = m.group(1).upper(), (m.group(2) or "").strip()
        if keyword not in _KNOWN:
            raise DockerfileError(path, start, f"unknown instruction {m.group(1)!r}")
        instr = Instruction(start, keyword, args)
        if keyword in ("RUN", "COPY", "ADD"):
            for hm in HEREDOC_RE.finditer(args):
                strip_tabs, quote, name = hm.group(1) == "-", hm.group(2), hm.group(3)
                body_lines: list[str] = []
                while True:
                    if i >= len(lines):
                        raise DockerfileError(path, start, f"unterminated heredoc <<{name}")
                    cur = lines[i]
                    i += 1
                    check = cur.lstrip("\t") if strip_tabs else cur
                    if check == name:
                        break
                    body_lines.append(check if strip_tabs else cur)
                body = "\n".join(body_lines) + ("\n" if body_lines else "")
                instr.heredocs.append((name, body, not quote))
        out.append(instr)
    return out, escape


def lex_heredoc(body: str, env: dict[str, str]) -> str:
    """Expand `$VAR` in an unquoted heredoc body (`\\$` and `\\\\` are escapes; quotes are plain text)."""
    out: list[str] = []
    i = 0
    while i < len(body):
        chunk, i = _plain_step(body, i, env, "\\", "$\\")
        out.append(chunk)
    return "".join(out)
