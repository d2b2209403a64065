"""The commands a shell said it could not find, read off a script's output (`cargo: command not found`).

A reference solution that needs a toolchain the image lacks (its Dockerfile's `curl ... | sh` installer failed
quietly without a network) leaves the sandbox untouched, and the verifier scores it 0: a verdict that looks like a
broken verifier. The shell's own words say what happened, so `raygrpo check` makes them the cause
(`solve.sh: cargo: command not found`). Read as bash, dash and `env` print them:

- bash: `/solution/solve.sh: line 3: cargo: command not found`, `bash: cargo: command not found`;
- dash (`sh`): `/solution/solve.sh: 3: cargo: not found`;
- env: `/usr/bin/env: 'cargo': No such file or directory`.
"""

from __future__ import annotations

import re

_BASH = re.compile(r"^(?:\S+: )?(?:line \d+: )?(?P<cmd>[^\s:'\"]+): command not found\s*$", re.MULTILINE)
_DASH = re.compile(r"^\S+: (?:line )?\d+: (?P<cmd>[^\s:'\"]+): not found\s*$", re.MULTILINE)
_ENV = re.compile(r"^(?:/usr)?/bin/env: ['‘](?P<cmd>[^'’\s]+)['’]: No such file or directory\s*$", re.MULTILINE)


def missing_commands(output: str | None) -> list[str]:
    """The commands `output` (a script's stdout and stderr) says were not found, in order, each once."""
    if not output:
        return []
    found: list[tuple[int, str]] = []
    for pattern in (_BASH, _DASH, _ENV):
        found += [(m.start(), m["cmd"]) for m in pattern.finditer(output)]
    return list(dict.fromkeys(cmd for _, cmd in sorted(found)))


def missing_command_cause(solution_output: str | None, verifier_output: str | None) -> str | None:
    """`solve.sh: cargo: command not found` (or `test.sh: ...`) when the reference solution's output (else the
    verifier's) says a command was not found; None when neither does. Further commands are counted and named."""
    for script, output in (("solve.sh", solution_output), ("test.sh", verifier_output)):
        commands = missing_commands(output)
        if commands:
            more = f" (and {len(commands) - 1} more: {', '.join(commands[1:4])})" if len(commands) > 1 else ""
            return f"{script}: {commands[0]}: command not found{more}"
    return None
