"""The commands the verifier's shell could not find while it ran: bash's own `command_not_found_handle`, and the
`command not found` (and, for a path, `No such file or directory`) lines of `test.sh`'s output.

The pre-agent probe (`raygrpo.envs.harbor.tooling`) reads `test.sh` to find the commands it runs; a reading that
takes a word for a command (`2>&1` as a command `1`, a `python3 -c` body's `import`) and finds it missing would set a
real verdict aside. So a command the probe found missing sets a verdict aside only when bash also failed to find it
while the verifier ran: the probe keeps the rule un-gameable (only what was missing before the model acted counts),
and bash keeps it from misreading (only what the script really ran and missed counts).

Bash calls `command_not_found_handle` for every command it cannot find, in the script, its subshells and the
`bash` processes it starts (`BASH_ENV` names the file defining it, which every non-interactive bash reads first):
the handler appends the name to a record, then prints bash's own message and returns 127, as bash would. A script
run by `sh` (dash) has no such hook; its `cmd: not found` lines in the output are read instead
(`raygrpo.envs.harbor.missing_commands`), as are bash's. Nor does bash call the handler for a command given by its
path (`/opt/verifier-venv/bin/pytest`): it prints `test.sh: line 9: /opt/verifier-venv/bin/pytest: No such file or
directory` and returns 127, so the paths in such lines of the whole output of `test.sh` are read with the record
(a redirection to a missing folder prints the same line, but only a path the probe found missing counts).
"""

from __future__ import annotations

import shlex

#: Where the handler and its record live in the sandbox (made fresh, as root, before each verification).
WATCH_DIR = "/tmp/.raygrpo-verify"
HANDLER = f"{WATCH_DIR}/command-not-found.sh"
RECORD = f"{WATCH_DIR}/missing"
#: Where `test.sh`'s stdout and stderr are in the sandbox (Harbor's `EnvironmentPaths.verifier_dir` and
#: `TrialPaths.test_stdout_path`'s name, on Linux).
OUTPUT = "/logs/verifier/test-stdout.txt"
#: `sed` program printing the path of each of bash's `<script>: line N: /path: No such file or directory` lines.
MISSING_PATHS = r"s#^.*: line [0-9][0-9]*: \(/[^[:space:]:]*\): No such file or directory$#\1#p"
_HANDLER_TEXT = f"""command_not_found_handle() {{
  printf '%s\\n' "$1" >> {RECORD} 2>/dev/null
  printf 'bash: %s: command not found\\n' "$1" >&2
  return 127
}}
"""


def install_command() -> str:
    """The command (run as root) that writes the handler and an empty record anyone may append to."""
    return (f"rm -rf {WATCH_DIR} && mkdir -p {WATCH_DIR} && chmod 755 {WATCH_DIR} && "
            f"printf '%s' {shlex.quote(_HANDLER_TEXT)} > {HANDLER} && chmod 644 {HANDLER} && "
            f": > {RECORD} && chmod 666 {RECORD}")


def watched(command: str) -> str:
    """`command` (the verifier's run of `test.sh`) with every bash it starts reading the handler."""
    return f"export BASH_ENV={HANDLER}; {command}"


def read_command() -> str:
    """The command that prints the record and the paths bash could not run (one a line; nothing when none was
    missed)."""
    return f"cat {RECORD} 2>/dev/null; sed -n {shlex.quote(MISSING_PATHS)} {OUTPUT} 2>/dev/null; true"


def read_record(stdout: str | None) -> list[str]:
    """The command names in the record's text, in order, each once."""
    return list(dict.fromkeys(line.strip() for line in (stdout or "").splitlines() if line.strip()))
