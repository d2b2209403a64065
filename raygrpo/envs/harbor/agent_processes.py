"""Stopping what the model left running before a shared verifier runs (`HarborSpec.stop_agent_processes`).

A task verified in the model's own sandbox (Harbor's shared verifier, the default) runs `test.sh` beside whatever the
model's commands left behind. A process the model detached (`nohup setsid ... &`) keeps running into the
verification and can rewrite `/logs/verifier/reward.txt` after `test.sh` wrote it, or the tests while they run: a
reward the model did not earn. Harbor does not stop such processes, and neither does raygrpo by default, because many
tasks ask the model to start a service (a web server, a database) that their tests then query.

With the option on, the adapter notes the sandbox's sessions (in the `setsid` sense) once the episode's sandbox is
ready, before the model acts: the init's, a Dockerfile's `ENTRYPOINT` services', the harness's set-up's. Before each
shared verification it kills every process of any other session, except the shell doing it and its ancestors (the
backend's exec chain). Sessions, not process ids: a service forks children all the time (a loop's `sleep`, a web
server's workers), and they stay in its session; a process the model starts is in the session of its exec, or in a
new one it made, never in one of those (a process cannot join another's session), and it keeps its session when it is
orphaned and adopted by the init. Processes are stopped (SIGSTOP) before they are killed, so that one cannot fork a
replacement between the two, for up to `STOP_ROUNDS` rounds with a pause after each for the killed ones to go.
Everything runs as root inside the sandbox through the backend's own `exec`, with POSIX `sh` builtins and `sleep`
only (no `ps`, no `awk`), so it works in minimal images on every backend.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from raygrpo.core.errors import VerifierError, describe
from raygrpo.envs.base import EnvError

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment

logger = logging.getLogger(__name__)

#: Rounds of stop-then-kill before processes that are still there fail the verification, and the pause after each
#: (a killed process takes a moment to go, longer on a loaded machine).
STOP_ROUNDS = 5
ROUND_PAUSE_S = 0.2
#: Seconds each of the two commands may take.
EXEC_TIMEOUT_S = 30

# `set -- ${line##*) }` splits /proc/<pid>/stat after the command name: $1 state, $2 parent, $3 group, $4 session.
_LIST = r"""read -r line < /proc/$$/stat; set -- ${line##*) }; me=$4
for d in /proc/[0-9]*; do
  read -r line 2>/dev/null < "$d/stat" || continue
  set -- ${line##*) }
  [ "$4" = 0 ] || [ "$4" = "$me" ] || echo "$4"
done
"""

# `$keep` holds the baseline's sessions; the shell's own ancestors are spared too (its exec chain). Zombies are
# skipped: they are dead already, and an init that does not reap keeps them for good.
_STOP = r"""keep=" {keep} "
anc=" "
p=$$
while [ -n "$p" ] && [ "$p" != 0 ]; do
  anc="$anc$p "; q=
  while read -r k v; do [ "$k" = "PPid:" ] && q=$v; done 2>/dev/null < /proc/$p/status
  p=$q
done
pass() {{
  case "$anc" in *" $1 "*) return 1 ;; esac
  read -r line 2>/dev/null < "/proc/$1/stat" || return 1
  set -- ${{line##*) }}
  case "$1" in Z|X|x) return 1 ;; esac
  case "$keep" in *" $4 "*) return 1 ;; esac
  return 0
}}
round=0
while [ $round -lt {rounds} ]; do
  round=$((round + 1)); found=0
  for d in /proc/[0-9]*; do
    pid=${{d#/proc/}}
    pass "$pid" && kill -STOP "$pid" 2>/dev/null && found=$((found + 1))
  done
  [ $found = 0 ] && exit 0
  for d in /proc/[0-9]*; do
    pid=${{d#/proc/}}
    pass "$pid" && kill -KILL "$pid" 2>/dev/null
  done
  echo "killed $found"
  sleep {pause} 2>/dev/null
done
for d in /proc/[0-9]*; do
  pid=${{d#/proc/}}
  pass "$pid" || continue
  c=; read -r c 2>/dev/null < "/proc/$pid/comm"
  echo "left $pid $c"
done
exit 3
"""


def parse_sessions(stdout: str) -> set[int]:
    """The session ids `_LIST` printed, one per line."""
    return {int(word) for word in stdout.split() if word.isdigit()}


def stop_command(keep: set[int], rounds: int = STOP_ROUNDS) -> str:
    """The `sh` script that kills every process of the sandbox outside the sessions `keep`, but its own ancestors
    (module docstring); it exits 0 once none is left, 3 when some still are after `rounds` rounds."""
    return _STOP.format(keep=" ".join(str(pid) for pid in sorted(keep)), rounds=rounds, pause=ROUND_PAUSE_S)


async def baseline_sessions(env: BaseEnvironment, label: str) -> set[int]:
    """The sessions of the processes running in the sandbox `env` before the model acts, whose processes
    `stop_agent_processes` spares.

    Raises:
        EnvError: The sandbox could not list them (infrastructure).
    """
    try:
        result = await env.exec(command=_LIST, user="root", timeout_sec=EXEC_TIMEOUT_S)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every backend fails its own way
        raise EnvError(f"{label}: could not list the sandbox's processes: {describe(exc)}") from exc
    if result.return_code != 0:
        raise EnvError(f"{label}: could not list the sandbox's processes (exit {result.return_code}): "
                       f"{(result.stderr or result.stdout or '').strip()[-500:]}")
    return parse_sessions(result.stdout or "")


async def stop_agent_processes(env: BaseEnvironment, keep: set[int], label: str) -> int:
    """Kill every process in `env` outside the sessions `keep` (see the module docstring); returns how many were
    killed.

    Raises:
        EnvError: The sandbox could not run the command (infrastructure).
        VerifierError: Processes were still there after `STOP_ROUNDS` rounds (the model's processes outran the
            kill): the verification cannot be trusted, so the rollout is not scored.
    """
    try:
        result = await env.exec(command=stop_command(keep), user="root", timeout_sec=EXEC_TIMEOUT_S)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every backend fails its own way
        raise EnvError(f"{label}: could not stop the model's processes before verifying: {describe(exc)}") from exc
    killed = sum(int(line.split()[1]) for line in (result.stdout or "").splitlines()
                 if line.startswith("killed ") and line.split()[1].isdigit())
    if result.return_code == 3:
        left = [line[5:] for line in (result.stdout or "").splitlines() if line.startswith("left ")]
        raise VerifierError(f"{label}: processes the model started were still running after {STOP_ROUNDS} rounds "
                            f"of SIGSTOP and SIGKILL (stop_agent_processes): {'; '.join(left[:10]) or '?'}: the "
                            "verification would not be trusted")
    if result.return_code != 0:
        raise EnvError(f"{label}: could not stop the model's processes before verifying (exit "
                       f"{result.return_code}): {(result.stderr or result.stdout or '').strip()[-500:]}")
    if killed:
        logger.info("%s: stopped %d process(es) the model left running before verifying", label, killed)
    return killed
