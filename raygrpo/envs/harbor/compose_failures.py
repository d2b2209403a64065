"""Why a `docker compose` command of Harbor's docker backend failed, in the daemon's own words.

Harbor raises a failed compose command as one long message: `Docker compose command failed for environment ...
Command: docker compose --project-name ... -f /a/long/path ... up .... Return code: 1. Stdout: <output>. Stderr: ...`.
Its first 500 characters (what a cause used to keep) end in the middle of a compose file's path and never reach the
output, where the daemon said why. This reads the output instead:

- `daemon_reason`: the last line of the output that says why (`Error response from daemon: ...`, compose's
  `Image X Error ...`, a `dependency failed to start` line), whole: a cause is cut at a line boundary, never inside
  a path;
- `pull_failure`: an image the task names that cannot be had (a sidecar's `image:` that cannot be pulled; no
  registry answers): the task's fault, `task_error`, not retried. A failed Dockerfile step (a `FROM` that cannot be
  pulled included) is `raygrpo.envs.harbor.docker.build_failure`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Harbor's failed compose command (harbor/environments/docker/docker.py).
_COMPOSE_FAILURE = re.compile(r"Command: (?P<cmd>.*?)\. Return code: (?P<rc>-?\d+)\. Stdout: (?P<out>.*)\. Stderr: ",
                              re.DOTALL)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
#: Lines of compose and the daemon that say why a command failed.
_REASON = re.compile(r"^(?:Error response from daemon: |Error: |error: |(?:Image|Container|Service )?\S+ Error\b|"
                     r"dependency failed to start|.*\bunhealthy\b|failed to )", re.IGNORECASE)
#: What the daemon says when an image cannot be had.
_PULL = re.compile(r"pull access denied|manifest unknown|manifest for \S+ not found|repository does not exist|"
                   r"no such host|failed to resolve reference|not found: manifest|toomanyrequests|"
                   r"unauthorized: |dial tcp|i/o timeout|connection refused|Client\.Timeout", re.IGNORECASE)
#: Compose naming the image it failed to pull: ` Image ghcr.io/x/db:1 Error <why>` (compose v2.2x and later).
_IMAGE_ERROR = re.compile(r"^\s*Image (?P<image>\S+) Error\b\s*(?P<why>.*)$", re.MULTILINE)
#: The daemon naming it: `pull access denied for X,` / `manifest for X not found`.
_DAEMON_IMAGE = re.compile(r"(?:pull access denied for |manifest for )(?P<image>[^\s,]+)")


@dataclass(frozen=True)
class ComposeFailure:
    """A failed compose command, as Harbor raised it.

    Args:
        command: The compose subcommand (`up`, `build`, `pull`, `down`, ...).
        return_code: Its exit code.
        output: What it printed (stdout and stderr), colour codes removed.
    """

    command: str
    return_code: int
    output: str


def compose_failure(message: str) -> ComposeFailure | None:
    """The compose command behind Harbor's error `message`; None when it is not a failed compose command."""
    match = _COMPOSE_FAILURE.search(message)
    if match is None:
        return None
    words = match["cmd"].split()
    command = ""
    for i, word in enumerate(words):  # the word after the last `-f FILE` pair is the subcommand
        if word == "-f" and i + 2 < len(words):
            command = words[i + 2]
    return ComposeFailure(command, int(match["rc"]), _ANSI.sub("", match["out"]))


def daemon_reason(output: str) -> str | None:
    """The last whole line of `output` that says why the command failed (see the module docstring); None when no
    line does."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    reasons = [line for line in lines if _REASON.match(line) and not line.startswith("time=")]
    return reasons[-1] if reasons else None


@dataclass(frozen=True)
class PullFailure:
    """An image the task names that the daemon could not pull.

    Args:
        image: The image, when the output names it.
        reason: The daemon's line that says why (whole).
    """

    image: str | None
    reason: str

    def __str__(self) -> str:
        what = f"the image {self.image}" if self.image else "an image of the task"
        return f"{what} cannot be pulled: {self.reason}"


def pull_failure(message: str) -> PullFailure | None:
    """The image Harbor's error `message` failed to pull, when it is a failed `up` or `pull` whose daemon says the
    image cannot be had; None otherwise (the command did not fail that way: infrastructure, or a build's step)."""
    failure = compose_failure(message)
    if failure is None or failure.command not in ("up", "pull", "create", "run"):
        return None
    reason = daemon_reason(failure.output)
    pulled = [m for m in _IMAGE_ERROR.finditer(failure.output) if _PULL.search(m["why"])]
    if reason is None or not (pulled or (_PULL.search(reason) and "Pulling" in failure.output)):
        return None
    image = pulled[-1]["image"] if pulled else None
    if image is None:
        named = _DAEMON_IMAGE.search(reason)
        image = named["image"] if named else None
    return PullFailure(image, reason)


def explain(message: str) -> str | None:
    """`docker compose up failed (exit 1): <the daemon's line>` for Harbor's error `message` of a failed compose
    command; None when it is not one or its output says nothing."""
    failure = compose_failure(message)
    if failure is None:
        return None
    reason = daemon_reason(failure.output)
    if reason is None:
        return None
    return f"docker compose {failure.command} failed (exit {failure.return_code}): {reason}"
