"""Which parts of a Dockerfile's `RUN` steps the local sandbox runs, and which it leaves to the toolbox and the host.

The local sandbox builds no image, but many tasks make their data with `RUN` (`RUN mkdir -p /app/logs && printf
... > /app/logs/boot.log`, `RUN ln -s ...`), and without it their reference solution cannot work. So each `RUN` is
split at its top-level `&&`, `;` and newlines into commands, and:

- commands that install software (`apt-get`, `pip`, `npm`, `curl ... | sh`, `useradd`, ...) and their clean-ups
  (`rm -rf /var/lib/apt/lists/*`) are skipped: the sandbox sees the host's read-only system and the verifier
  toolbox, which is what the sandbox has instead of the image's packages;
- the rest run, in order, at every sandbox start, as root, from the `WORKDIR` and with the `ENV` in effect at that
  step (`raygrpo.sandbox.local`). One that fails is reported once per task, and the sandbox starts anyway.

This is a reading of shell text, not a shell: a command it cannot classify runs.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

#: A command that installs software or cleans up after an install.
INSTALL = re.compile(
    r"""^\s*(?:sudo\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:
        (?:apt-get|apt|aptitude|apk|yum|dnf|microdnf|zypper|pacman)\b
      | (?:pip|pip3|pipx|uv|poetry|conda|mamba|micromamba|npm|npx|yarn|pnpm|gem|cargo|bundle|corepack)\b
      | python[0-9.]*\s+-m\s+(?:pip|ensurepip)\b
      | go\s+(?:install|get)\b
      | (?:curl|wget)\b.*\|\s*(?:sudo\s+)?(?:ba|z|da)?sh\b
      | (?:useradd|adduser|groupadd|addgroup|usermod|chsh|update-alternatives|update-ca-certificates|locale-gen|
         dpkg|dpkg-reconfigure|ldconfig)\b
      | rm\s+-r?f\s+(?:-r\s+)?/var/lib/apt/lists
      | rm\s+-rf\s+/root/\.cache
    )""",
    re.X,
)


_COMPOUND = re.compile(r"(?:^|[;&|(\s])(?:if|for|while|until|case|select)\s")


@dataclass(frozen=True)
class RunStep:
    """The commands of one `RUN` that the local sandbox runs.

    Args:
        line: The `RUN`'s line in the Dockerfile.
        command: What runs (`bash -c`), the install commands taken out.
        workdir: The `WORKDIR` in effect at that step (`/` when none was set yet).
        env: The `ENV` in effect at that step.
        skipped: The commands taken out (installs).
    """

    line: int
    command: str
    workdir: str
    env: dict[str, str] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()


def split_commands(text: str) -> list[str]:
    """`text` cut at its top-level `&&`, `;` and newlines (outside quotes, parentheses and braces)."""
    parts: list[str] = []
    current: list[str] = []
    quote: str | None = None
    depth = 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote is not None:
            current.append(c)
            if c == "\\" and quote == '"' and i + 1 < len(text):
                current.append(text[i + 1])
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
            current.append(c)
        elif c == "\\" and i + 1 < len(text):
            current.append(text[i: i + 2])
            i += 1
        elif c in "({":
            depth += 1
            current.append(c)
        elif c in ")}":
            depth = max(0, depth - 1)
            current.append(c)
        elif depth == 0 and (text.startswith("&&", i) or c in ";\n"):
            parts.append("".join(current))
            current = []
            i += 2 if c == "&" else 1
            continue
        else:
            current.append(c)
        i += 1
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def shell_text(args: str) -> str | None:
    """The shell command of a `RUN`'s arguments (its `--flags` dropped; the exec form `["a", "b"]` quoted); None
    for a form this module does not read (a here-document `RUN <<EOF`)."""
    rest = args.strip()
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        rest = rest.strip()
    if rest.startswith("<<"):
        return None
    if rest.startswith("["):
        try:
            words = json.loads(rest)
        except ValueError:
            return rest
        if isinstance(words, list) and all(isinstance(w, str) for w in words):
            return shlex.join(words)
    return rest


def plan_run(line: int, args: str, workdir: str | None, env: dict[str, str]) -> RunStep | None:
    """What the local sandbox runs of one `RUN` (None: nothing, or a form it does not read)."""
    text = shell_text(args)
    if text is None:
        return None
    kept: list[str] = []
    skipped: list[str] = []
    # Compound commands (`if ...; then ...; fi`, loops) stay whole: run unless an install is anywhere in them.
    commands = [text] if _COMPOUND.search(text) else split_commands(text)
    for command in commands:
        installs = any(INSTALL.match(part) for part in split_commands(command))
        (skipped if installs else kept).append(command)
    return RunStep(line, " && ".join(kept), workdir or "/", dict(env), tuple(skipped))
