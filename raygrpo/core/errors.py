"""The errors every layer raises, and one way to describe any exception in one line.

The agent loop sorts failures by class into the statuses of DESIGN section 7: `EnvError` (the environment failed:
retried, unscored), `PolicyError` (the generation server failed: retried, unscored), `TaskError` (the task itself is
broken, e.g. its verifier wrote no reward (`RewardMissingError`): not retried, unscored, reported), `VerifierError`
(the verifier's tooling was shown broken before the model acted: retried, unscored). `ResolveError` is raised on the driver, before Ray starts, when
something a config names cannot be used; its message names the config field.
"""

from __future__ import annotations

import re


class EnvError(RuntimeError):
    """An infrastructure failure of the environment: the episode cannot go on, and its reward is None.

    Raised when a session or sandbox fails to start, dies mid-episode, or cannot be reached. The orchestrator may
    retry the rollout.
    """


class TaskError(RuntimeError):
    """The task itself is broken: its verifier writes no reward, its image fails to build.

    The rollout is kept unscored with status `task_error`, is not retried (it would fail the same way), and is
    reported, so the task can be fixed or left out.
    """


class RewardMissingError(TaskError):
    """The episode ran to its end but its verifier produced no reward (e.g. it wrote no reward file)."""


class VerifierError(RuntimeError):
    """The verifier's own tooling could not run, as evidence gathered before the model acted shows (a command its
    test script needs was missing when the sandbox started, a package it asks for is not there): the verdict it
    gave cannot be the model's. Unscored with status `verifier_error` and retried; the message names what was
    missing.
    """


class PolicyError(RuntimeError):
    """The policy could not generate (server down, request rejected). An infrastructure failure: retryable."""


class ResolveError(ValueError):
    """Something a run config names (a file, a class, a script, a task folder, a server) cannot be used.

    Raised by the driver's resolve step before Ray starts; the message starts with the config field
    (`envs.echo.environment: ...`).
    """


def first_line(text: object) -> str:
    """The first non-empty line of `str(text)`, stripped ('' when there is none)."""
    return first_lines(text, 1)


def first_lines(text: object, lines: int) -> str:
    """The first `lines` non-empty lines of `str(text)`, each stripped, joined by spaces ('' when there is none).

    A message's first line often only announces what follows ("To fix this, either:"): more than one keeps the fix
    or the cause that the next lines give. Bounded, and ended at a traceback the message quotes.
    """
    kept: list[str] = []
    for line in str(text).strip().splitlines():
        if kept and line.startswith("Traceback (most recent call last)"):
            break  # a traceback quoted in a message is for -v, not for the line
        if line.strip():
            kept.append(line.strip())
        if len(kept) >= lines:
            break
    return " ".join(kept)


#: A frame of a Python traceback as Ray quotes one in a message, and the task named in its header (`ray::A.f()`).
_FRAME = re.compile(r'^\s*File "')
_TASK = re.compile(r"ray::(\S+?\(\))")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def creation_error(exc: BaseException) -> tuple[str, str] | None:
    """`(task, error)` for an actor that died raising in its constructor (Ray's `ActorDiedError` with
    `actor_init_failed`): the creation task (`VLLMEngineActor.__init__()`) and what it raised (`ValueError: ...`,
    every line of it); None for any other exception.

    Ray 2.60 keeps no cause object on the error, only the creation task's traceback in its message, whose first
    line names the actor's pid and whose last lines are the exception: those are what says what went wrong.
    """
    if not getattr(exc, "actor_init_failed", False):
        return None
    lines = _ANSI.sub("", str(exc)).splitlines()
    frames = [i for i, line in enumerate(lines) if _FRAME.match(line)]
    if not frames:
        return None
    rest = lines[frames[-1] + 1:]
    while rest and (not rest[0].strip() or rest[0][:1].isspace()):  # the frame's code line and its ^^^ marks
        rest.pop(0)
    task = _TASK.search(lines[0]) if lines else None
    return (task.group(1) if task else "the actor's constructor"), "\n".join(rest)


def describe(exc: BaseException, limit: int = 500, lines: int = 1) -> str:
    """`Type: first line of the message`, at most `limit` characters; a longer one is cut between words and marked
    (` [...]`), never inside a word such as a path. `lines` > 1 keeps that many of the message's first lines, joined
    (the CLI's one line: the fix a message gives after announcing it).

    An exception that carries the attempts behind it (the openreward SDK's `MaxRetriesError.errors`) is described by
    its last attempt, with the number of attempts; one that wraps its cause (Ray's `RayTaskError.cause`, whose own
    message is a remote traceback) by that cause; an actor that died raising in its constructor by what it raised
    (`creation_error`), since the first line of Ray's message only names the actor's pid. One raised from an
    `OSError` (`raise X from exc`, or while handling it) whose message does not say it names it briefly
    (`(from OSError: [Errno 28] No space left on device ...)`): Harbor's `AddTestsDirError` says only that the tests
    could not be added, and the full disk under it is the cause to read.
    """
    attempts = getattr(exc, "errors", None)
    cause = getattr(exc, "cause", None)
    creation = creation_error(exc)
    if isinstance(cause, BaseException) and cause is not exc:
        text = describe(cause, limit, lines)
    elif isinstance(attempts, list) and attempts and isinstance(attempts[-1], BaseException):
        text = f"{describe(attempts[-1], limit, lines)} (after {len(attempts)} attempts)"
    elif creation is not None and creation[1].strip():
        task, error = creation
        text = f"{type(exc).__name__}: {task} raised {first_lines(error, lines)}"
    else:
        line = first_lines(exc, lines)
        text = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
        root = _root_os_error(exc)
        if root is not None and (root.strerror or str(root)) not in text:
            brief = f"{type(root).__name__}: {root.strerror}" if root.strerror else describe(root)
            if root.strerror and root.filename:
                brief += f": {root.filename}"
            under = f" (from {shorten(brief, max(0, min(200, limit - 30) - 8))})"
            return shorten(text, max(0, limit - len(under))) + under
    return shorten(text, limit)


def _root_os_error(exc: BaseException) -> OSError | None:
    """The deepest `OSError` in the chain under `exc` (`__cause__`, else `__context__` unless suppressed), if any."""
    found, seen, current = None, {id(exc)}, exc
    while True:
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
        if current is None or id(current) in seen:
            return found
        seen.add(id(current))
        if isinstance(current, OSError):
            found = current


def shorten(text: str, limit: int) -> str:
    """`text` when it fits in `limit` characters, else its start cut at the last space that fits, with ` [...]`."""
    if len(text) <= limit:
        return text
    mark = " [...]"
    head = text[:max(0, limit - len(mark))]
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head) + mark
