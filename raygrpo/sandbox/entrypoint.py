"""A Dockerfile's `ENTRYPOINT` in a local sandbox, started as Harbor's docker backend starts a task's container.

Many tasks start a service from their entrypoint (`entrypoint.sh`: `python3 server.py & exec "$@"`); without it the
service is never up and even the reference solution fails. The local sandbox builds no image, so it runs the
entrypoint itself when the sandbox starts (`raygrpo.sandbox.local`).
"""

from __future__ import annotations

import shlex
from typing import Any

from raygrpo.sandbox import dockerfile as _df
from raygrpo.sandbox.commands import log_once

#: Where the Dockerfile's `ENTRYPOINT` writes its output, in the sandbox (its `/run` is a tmpfs of its own).
ENTRYPOINT_LOG = "/run/raygrpo-entrypoint.log"
#: How long a sandbox's start waits to see whether its `ENTRYPOINT` stays up.
ENTRYPOINT_GRACE_S = 0.2
#: What the start's command prints when the `ENTRYPOINT` exited within that time, before its exit status.
ENTRYPOINT_EXITED = "raygrpo: entrypoint exited"


async def start_entrypoint(sandbox: Any, plan: Any, timeout_s: float) -> None:
    """Start the Dockerfile's `ENTRYPOINT` (`plan.entrypoint`) in `sandbox` in the background, in a session of its
    own, as the container's main process would be under Harbor's docker backend: as root, from the final `WORKDIR`,
    with the Dockerfile's `ENV`, and `sh -c "sleep infinity"` as its arguments (what Harbor's compose file runs in
    place of `CMD`). Its output goes to `ENTRYPOINT_LOG` in the sandbox; it dies with the sandbox.

    One that exits within `ENTRYPOINT_GRACE_S` (a missing script, a crash) would stop a container with it; here the
    sandbox goes on, and that is warned about once per task, with its exit status and the end of its output.

    Args:
        sandbox: The started local sandbox (its `exec` runs a command in it).
        plan: The sandbox's reading of the task's Dockerfile (`raygrpo.sandbox.dockerfile`).
        timeout_s: Deadline of the start command.
    """
    entrypoint, log = list(plan.entrypoint), ENTRYPOINT_LOG
    command = (f"setsid -w {shlex.join([*entrypoint, *_df.HARBOR_COMMAND])} </dev/null >{log} 2>&1 & pid=$!; "
               f"sleep {ENTRYPOINT_GRACE_S}; kill -0 $pid 2>/dev/null && exit 0; wait $pid; "
               f"echo \"{ENTRYPOINT_EXITED} $?\"; tail -c 1000 {log}")
    result = await sandbox.exec(command, cwd=plan.workdir or "/", user="root", timeout_sec=int(timeout_s))
    out = result.stdout or ""
    if out.startswith(ENTRYPOINT_EXITED):
        status, _, tail = out[len(ENTRYPOINT_EXITED):].partition("\n")
        log_once(f"entrypoint:{sandbox.environment_dir}", "%s: the Dockerfile's ENTRYPOINT %s exited %s right after "
                 "it started (on docker the container would stop with it); the sandbox goes on: %s",
                 plan.path, entrypoint, status.strip(), tail.strip()[-500:] or "(no output)")
