"""The errors every layer raises, and one way to describe any exception in one line.

The agent loop sorts failures by class into the statuses of DESIGN section 7: `EnvError` (the environment failed:
retried, unscored), `PolicyError` (the generation server failed: retried, unscored), `TaskError` (the task itself is
broken, e.g. its verifier wrote no reward (`RewardMissingError`): not retried, unscored, reported), `VerifierError`
(the verifier's tooling was shown broken before the model acted: retried, unscored). `ResolveError` is raised on the driver, before Ray starts, when
something a config names cannot be used; its message names the config field.
"""

from __future__ import annotations


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
    for line in str(text).strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def describe(exc: BaseException, limit: int = 500) -> str:
    """`Type: first line of the message`, at most `limit` characters; a longer one is cut between words and marked
    (` [...]`), never inside a word such as a path.

    An exception that carries the attempts behind it (the openreward SDK's `MaxRetriesError.errors`) is described by
    its last attempt, with the number of attempts; one that wraps its cause (Ray's `RayTaskError.cause`, whose own
    message is a remote traceback) by that cause.
    """
    attempts = getattr(exc, "errors", None)
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        text = describe(cause, limit)
    elif isinstance(attempts, list) and attempts and isinstance(attempts[-1], BaseException):
        text = f"{describe(attempts[-1], limit)} (after {len(attempts)} attempts)"
    else:
        line = first_line(exc)
        text = f"{type(exc).__name__}: {line}" if line else type(exc).__name__
    return shorten(text, limit)


def shorten(text: str, limit: int) -> str:
    """`text` when it fits in `limit` characters, else its start cut at the last space that fits, with ` [...]`."""
    if len(text) <= limit:
        return text
    mark = " [...]"
    head = text[:max(0, limit - len(mark))]
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head) + mark
