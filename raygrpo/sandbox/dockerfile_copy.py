"""`COPY` and `ADD` in a Dockerfile, as the local sandbox applies them: the step (`CopyStep`), parsed from its
instruction (`parse_copy`): sources from the build context (globs expanded, heredocs inline, none outside the
context), a destination resolved against `WORKDIR` (`sandbox_path`), `--chmod`; `--from`, remote sources and archives
are not applied, and say why. `raygrpo.sandbox.dockerfile` calls it for each such instruction.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from raygrpo.sandbox.dockerfile_syntax import HEREDOC_RE, Instruction, LexError, lex, lex_heredoc, lex_one

_ARCHIVE_SUFFIXES = (
    ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".gz", ".bz2", ".xz",
)


@dataclass(frozen=True)
class CopyStep:
    """One `COPY`/`ADD` to apply when a sandbox starts.

    Args:
        line: line of the instruction in the Dockerfile.
        dest: absolute destination inside the sandbox (already resolved against `WORKDIR`).
        dest_is_dir: the destination names a directory (it ends with `/`, or there are several sources).
        sources: host paths inside the build context (files or directories), globs already expanded.
        inline: heredoc sources as `(file name, content)`.
        chmod: mode from `--chmod`, applied to everything copied.
    """

    line: int
    dest: PurePosixPath
    dest_is_dir: bool
    sources: tuple[Path, ...] = ()
    inline: tuple[tuple[str, str], ...] = ()
    chmod: int | None = None

    @property
    def writable_dir(self) -> PurePosixPath:
        """The sandbox directory this step writes into (it must be writable in the sandbox)."""
        if self.dest_is_dir or len(self.sources) + len(self.inline) > 1:
            return self.dest
        if len(self.sources) == 1 and self.sources[0].is_dir():
            return self.dest
        return self.dest.parent


ROOT = PurePosixPath("/")


def split_at_root(step: CopyStep) -> list[CopyStep]:
    """`step` as steps that each write one entry, when it writes into `/` itself (`COPY entrypoint.sh /`,
    `COPY a.json b.json /`, `COPY rootfs/ /`); else `[step]` unchanged.

    The local sandbox's `/` is a tmpfs it cannot copy into: each file it gets there is bound in on its own
    (`raygrpo.sandbox.layout`), and each directory becomes a writable directory like any other destination. A
    directory source's entries each become a step of their own, as `COPY dir /` puts the directory's contents at `/`.
    """
    if step.writable_dir != ROOT:
        return [step]
    into = step.dest_is_dir or len(step.sources) + len(step.inline) > 1
    parts: list[CopyStep] = []
    for source in step.sources:
        if source.is_dir():
            for entry in sorted(source.iterdir()):
                is_dir = entry.is_dir() and not entry.is_symlink()
                parts.append(replace(step, dest=ROOT / entry.name, dest_is_dir=is_dir, sources=(entry,), inline=()))
        else:
            dest = ROOT / source.name if into else step.dest
            parts.append(replace(step, dest=dest, dest_is_dir=False, sources=(source,), inline=()))
    for name, content in step.inline:
        dest = ROOT / name if into else step.dest
        parts.append(replace(step, dest=dest, dest_is_dir=False, sources=(), inline=((name, content),)))
    return parts


def _split_flags(words: list[str]) -> tuple[dict[str, str], list[str]]:
    flags: dict[str, str] = {}
    rest = list(words)
    while rest and rest[0].startswith("--"):
        flag = rest.pop(0)[2:]
        key, _, value = flag.partition("=")
        flags[key] = value
    return flags, rest


def sandbox_path(path: str, workdir: str | None) -> PurePosixPath:
    """The absolute sandbox path a Dockerfile path names: relative ones against `workdir`, `.` and `..` resolved."""
    p = PurePosixPath(path)
    if not p.is_absolute():
        p = PurePosixPath(workdir or "/") / p
    # Normalise `.` and `..` without touching the host filesystem.
    parts: list[str] = []
    for part in p.parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return PurePosixPath("/", *parts)


def parse_copy(
    ins: Instruction,
    subst: dict[str, str],
    escape: str,
    workdir: str | None,
    context: Path,
    context_real: str,
) -> tuple[CopyStep | None, list[str]]:
    """A `COPY` / `ADD` instruction as the step the sandbox applies (None when nothing of it is applied), and why
    the parts not applied are not (`--from`, remote sources, archives).

    Args:
        ins: The instruction.
        subst: The variables `$VAR` expands to at this point of the Dockerfile.
        escape: The Dockerfile's escape character.
        workdir: The `WORKDIR` at this point (None: none set).
        context: The build context; `context_real` is its real path.

    Raises:
        LexError: A bad flag, JSON form or source (missing, or outside the context); the caller adds the line.
    """
    skipped: list[str] = []
    m = re.match(r"^((?:--\S+\s+)*)(.*)$", ins.args, re.S)
    assert m is not None
    flags, _ = _split_flags(lex(m.group(1), subst, split=True, escape=escape))
    body = m.group(2).strip()
    if body.startswith("["):
        try:
            array = json.loads(body)
        except json.JSONDecodeError as e:
            raise LexError(f"bad JSON array in {ins.keyword}: {e.msg}") from None
        if not isinstance(array, list) or not all(isinstance(a, str) for a in array):
            raise LexError(f"{ins.keyword} JSON form must be an array of strings")
        rest = [lex_one(a, subst, escape) for a in array]
    else:
        rest = lex(body, subst, split=True, escape=escape)
    if len(rest) < 2:
        raise LexError(f"{ins.keyword} needs at least one source and a destination")
    *srcs, dest = rest
    if "from" in flags:
        skipped.append(f"--from={flags['from']}: files of another image/stage")
        return None, skipped
    unknown = set(flags) - {"chown", "chmod", "link", "checksum", "keep-git-dir", "exclude", "parents"}
    if unknown:
        raise LexError(f"unsupported {ins.keyword} flag(s): {', '.join('--' + f for f in sorted(unknown))}")
    chmod = None
    if flags.get("chmod"):
        try:
            chmod = int(flags["chmod"], 8)
        except ValueError:
            raise LexError(f"--chmod={flags['chmod']} is not an octal mode") from None

    heredocs = {name: (body, expand) for name, body, expand in ins.heredocs}
    sources: list[Path] = []
    inline: list[tuple[str, str]] = []
    for src in srcs:
        hm = HEREDOC_RE.fullmatch(src) if src.startswith("<<") else None
        if hm and hm.group(3) in heredocs:
            body, expand = heredocs[hm.group(3)]
            inline.append((hm.group(3), lex_heredoc(body, subst) if expand else body))
            continue
        if ins.keyword == "ADD" and re.match(r"^[a-z][a-z0-9+.-]*://", src, re.I) or src.startswith("git@"):
            skipped.append(f"{src}: remote sources are not fetched")
            continue
        if ins.keyword == "ADD" and src.lower().endswith(_ARCHIVE_SUFFIXES):
            skipped.append(f"{src}: archives are not extracted")
            continue
        lexical = os.path.normpath(os.path.join(context, src.lstrip("/")))
        if lexical != os.path.normpath(context) and not lexical.startswith(os.path.normpath(context) + os.sep):
            raise LexError(f"{ins.keyword} source {src!r} is outside the build context {context}")
        matches = sorted(glob.glob(glob.escape(str(context)) + "/" + src.lstrip("/"))) if any(
            ch in src for ch in "*?["
        ) else [str(context / src.lstrip("/"))]
        found = False
        for match in matches:
            if not os.path.lexists(match):
                continue
            real = os.path.realpath(match)
            if real != context_real and not real.startswith(context_real + os.sep):
                raise LexError(f"{ins.keyword} source {src!r} is outside the build context {context}")
            sources.append(Path(match))
            found = True
        if not found:
            raise LexError(f"{ins.keyword} source {src!r} not found in the build context {context}")
    if not sources and not inline:
        return None, skipped
    dest_is_dir = dest.endswith("/") or len(srcs) > 1
    step = CopyStep(
        line=ins.line,
        dest=sandbox_path(dest, workdir),
        dest_is_dir=dest_is_dir,
        sources=tuple(sources),
        inline=tuple(inline),
        chmod=chmod,
    )
    return step, skipped
