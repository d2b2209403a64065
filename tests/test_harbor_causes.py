"""Causes that say why (issue 43 item 2): the shell's `command not found` lines of a reference solution or verifier,
and the daemon's own line of a failed `docker compose` command, whole, with an image that cannot be pulled as the
task's fault. Pure text in, text out: the outputs are as bash, dash, env, compose 5.6.1 and dockerd 20.10 print them
here."""

from __future__ import annotations

import pytest

from raygrpo.envs.harbor.compose_failures import compose_failure, daemon_reason, explain, pull_failure
from raygrpo.envs.harbor.docker import build_failure
from raygrpo.envs.harbor.missing_commands import missing_command_cause, missing_commands

pytestmark = pytest.mark.timeout(30)

LONG_PATH = "/tmp/raygrpo-trials/" + "a-very-long-folder-name/" * 20 + "docker-compose-build.yaml"


def harbor_compose_error(subcommand: str, stdout: str) -> str:
    """A failed compose command as Harbor 0.25's docker backend raises it."""
    return (f"Docker compose command failed for environment t. Command: docker compose --project-name t__x "
            f"--project-directory /tmp/env -f {LONG_PATH} -f /tmp/trial/raygrpo-docker-compose.json {subcommand}. "
            f"Return code: 1. Stdout: {stdout}. Stderr: None. ")


UNPULLABLE_UP = """ Network t__x_default Creating
 Network t__x_default Created
 Image ghcr.io/example-org/nonexistent-db:1.2 Pulling
 Image ghcr.io/example-org/nonexistent-db:1.2 Error Get "https://ghcr.io/v2/": dial tcp: lookup ghcr.io on \
10.255.255.53:53: no such host
Error response from daemon: Get "https://ghcr.io/v2/": dial tcp: lookup ghcr.io on 10.255.255.53:53: no such host
"""
UNHEALTHY_UP = """ Container t__x-db-1 Started
 Container t__x-db-1 Waiting
 Container t__x-db-1 Error
dependency failed to start: container t__x-db-1 is unhealthy
"""
FROM_UNPULLABLE_BUILD = """ Image hb__abc Building
Sending build context to Docker daemon     219B
Step 1/3 : FROM ghcr.io/example-org/nope:1
Get "https://ghcr.io/v2/": dial tcp: lookup ghcr.io on 10.255.255.53:53: no such host
"""


def test_an_image_that_cannot_be_pulled_is_the_tasks_with_the_daemons_line_whole():
    message = harbor_compose_error("up --detach --wait", UNPULLABLE_UP)
    assert len(message) > 500 and LONG_PATH[:100] in message[:500]  # what a 500-character cut used to keep
    failure = pull_failure(message)
    assert failure is not None and failure.image == "ghcr.io/example-org/nonexistent-db:1.2"
    assert str(failure) == ('the image ghcr.io/example-org/nonexistent-db:1.2 cannot be pulled: Error response from '
                            'daemon: Get "https://ghcr.io/v2/": dial tcp: lookup ghcr.io on 10.255.255.53:53: no such '
                            'host')
    assert explain(message).startswith("docker compose up failed (exit 1): Error response from daemon: Get ")
    assert LONG_PATH not in explain(message)


def test_other_compose_failures_are_not_the_tasks_but_still_say_why():
    unhealthy = harbor_compose_error("up --detach --wait", UNHEALTHY_UP)
    assert pull_failure(unhealthy) is None  # a sidecar that does not become healthy: retried as env_error
    assert explain(unhealthy) == ("docker compose up failed (exit 1): dependency failed to start: container "
                                  "t__x-db-1 is unhealthy")
    assert compose_failure("RuntimeError: something else") is None and explain("no compose here") is None
    assert daemon_reason(" Container x Started\n") is None


def test_a_base_image_that_cannot_be_pulled_is_a_build_step_whose_line_is_kept_whole():
    message = harbor_compose_error("build", FROM_UNPULLABLE_BUILD)
    assert pull_failure(message) is None  # the build's failure, not a pull by `up`
    failure = build_failure(message)
    assert failure is not None and failure.step == "1/3" and failure.detail.endswith("no such host")
    long_line = "E: Unable to locate package " + "x" * 400
    output = (f"Step 2/3 : RUN apt-get install -y x\n{long_line}\n"
              "The command '/bin/sh -c x' returned a non-zero code: 100\n")
    failure = build_failure(harbor_compose_error("build", output))
    assert failure.detail == long_line and failure.exit_code == 100


@pytest.mark.parametrize("output, commands", [
    ("/solution/solve.sh: line 3: cargo: command not found\n", ["cargo"]),  # bash running a script
    ("bash: rustc: command not found\n", ["rustc"]),  # bash -c
    ("/solution/solve.sh: 4: go: not found\n", ["go"]),  # dash (sh)
    ("/usr/bin/env: 'node': No such file or directory\n", ["node"]),
    ("/usr/bin/env: ‘node’: No such file or directory\n", ["node"]),  # GNU env's quotes in a UTF-8 locale
    ("a: command not found\nb: command not found\na: command not found\n", ["a", "b"]),
    ("grep: /app/x: No such file or directory\nnot found: the answer\n", []),  # not a missing command
    ("", []),
])
def test_the_commands_a_shell_could_not_find(output, commands):
    assert missing_commands(output) == commands


def test_a_missing_command_becomes_the_cause_solve_sh_first():
    solve = "installing\n/solution/solve.sh: line 2: cargo: command not found\n"
    assert missing_command_cause(solve, "ok\n") == "solve.sh: cargo: command not found"
    assert missing_command_cause("done\n", "/tests/test.sh: line 5: pytest: command not found\n") == \
        "test.sh: pytest: command not found"
    assert missing_command_cause("a: command not found\nb: command not found\n", None) == \
        "solve.sh: a: command not found (and 1 more: b)"
    assert missing_command_cause("fine\n", None) is None


def test_a_long_cause_is_cut_between_words_never_inside_a_path():
    from raygrpo.core.errors import describe

    message = f"compose failed at {LONG_PATH} because the daemon said no"
    text = describe(RuntimeError(message), limit=120)
    assert len(text) <= 120 and text.endswith(" [...]")
    assert text == "RuntimeError: compose failed at [...]"  # the path is left out whole, never cut inside
    assert describe(RuntimeError("short"), limit=120) == "RuntimeError: short"


def test_describe_names_the_os_error_under_a_chained_exception():
    """Harbor's verifier wraps a full disk as `AddTestsDirError: Failed to add tests directory to environment.`:
    the ENOSPC under it (`raise ... from`) is what the failure cause must show, briefly; one already told is not
    repeated, and a suppressed context (`from None`) stays out."""
    import errno

    from raygrpo.core.errors import describe

    class AddTestsDirError(Exception):
        pass

    def wrapped(cause: BaseException, *, suppress: bool = False) -> BaseException:
        try:
            try:
                raise cause
            except OSError as exc:
                if suppress:
                    raise AddTestsDirError("Failed to add tests directory to environment.") from None
                raise AddTestsDirError("Failed to add tests directory to environment.") from exc
        except AddTestsDirError as exc:
            return exc

    full = OSError(errno.ENOSPC, "No space left on device", "/tests/test.sh")
    text = describe(wrapped(full))
    assert text.startswith("AddTestsDirError: Failed to add tests directory to environment. (from OSError: ")
    assert "No space left on device" in text and len(describe(wrapped(full), limit=80)) <= 80
    assert "No space left on device" in describe(wrapped(full), limit=80)
    assert "from" not in describe(wrapped(full, suppress=True))
    told = RuntimeError(f"copy failed: {full.strerror}")
    told.__cause__ = full
    assert describe(told) == "RuntimeError: copy failed: No space left on device"
