"""Running a Harbor task's reference solution in its sandbox, as Harbor's oracle agent does (the `oracle` policy,
`raygrpo check`).

`solution/` (what the task's file filter selects) is uploaded to `/solution`, `solve.sh` is made executable (as root)
and run from the working directory, as the sandbox's default user (the task's agent user), with
`DEBIAN_FRONTEND=noninteractive` and the task's `[solution] env` (host `${VAR}` templates resolved), under the task's
`[agent] timeout_sec` (none when unset: the rollout's own deadline still applies). A non-zero exit code is a result,
not an error: the verifier judges the sandbox afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from raygrpo.envs.base import EnvError
from raygrpo.envs.harbor.harness import EXEC_GRACE_S
from raygrpo.core.errors import TaskError, describe
from raygrpo.core.types import ToolResult

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.config import StepConfig
    from harbor.models.task.task import Task

logger = logging.getLogger(__name__)

#: Characters of a reference solution's output kept in its step (the end: errors usually come last).
SOLUTION_OUTPUT_TAIL_CHARS = 2000


class HarborSolutionTimeout(TimeoutError):
    """The task's reference solution ran past the task's `[agent] timeout_sec`; the rollout ends unscored with status
    `timeout`."""


async def run_solution(env: BaseEnvironment, task: Task, label: str, step: StepConfig | None = None) -> ToolResult:
    """Run `task`'s reference solution in the started sandbox `env` (see the module docstring); for a multi-step
    task's `step`, the step's own `solution/` where it has one (else the task's), under the step's `[agent]
    timeout_sec` (else the task's), as Harbor's oracle agent runs each step.

    Returns:
        A finished `ToolResult`: the output's tail and `[exit code N]`, with metadata `exit_code`, `output_tail` (the
        last `SOLUTION_OUTPUT_TAIL_CHARS` characters of stdout and stderr) and `script` (its path in the sandbox).

    Raises:
        TaskError: The task has no `solution/solve.sh` (the message names the file), its file filter excludes it,
            or its `[solution] env` names a host variable that is not set.
        HarborSolutionTimeout: `solve.sh` ran past the task's `[agent] timeout_sec`.
        EnvError: Uploading or running the solution failed (infrastructure: retried).
    """
    from harbor.models.trial.paths import EnvironmentPaths
    from harbor.utils.env import resolve_env_vars
    from harbor.utils.file_staging import selected_directory
    from harbor.utils.scripts import build_execution_command, needs_chmod, quote_shell_arg

    task_os = task.config.environment.os
    solution_dir = task.paths.solution_dir
    solve_path = task.paths.discovered_solve_path_for(task_os) or task.paths.solve_path
    timeout = task.config.agent.timeout_sec
    if step is not None:
        if task.paths.step_solution_dir(step.name).exists():
            solution_dir = task.paths.step_solution_dir(step.name)
            solve_path = (task.paths.discovered_step_solve_path_for(step.name, task_os)
                          or task.paths.step_solve_path_for(step.name, task_os))
        if step.agent.timeout_sec is not None:
            timeout = step.agent.timeout_sec
    if not solve_path.is_file():
        raise TaskError(f"{label}: the task has no reference solution to run: {solve_path} is missing")
    try:
        task.file_filter.require_included(solve_path)
        solution_env = resolve_env_vars(task.config.solution.env) if task.config.solution.env else {}
    except ValueError as exc:
        raise TaskError(f"{label}: cannot run the reference solution: {describe(exc)}") from None
    env_paths = EnvironmentPaths.for_os(env.os)
    script = str(env_paths.solution_dir / solve_path.relative_to(solution_dir).as_posix())
    try:
        with selected_directory(task.file_filter.select(solution_dir)) as source_dir:
            await env.upload_dir(source_dir=source_dir, target_dir=str(env_paths.solution_dir))
        if needs_chmod(script):
            await env.exec(command=f"chmod +x {quote_shell_arg(script, task_os)}", user="root")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the backend could not place the files: infrastructure
        raise EnvError(f"{label}: could not upload the reference solution: {describe(exc)}") from exc
    result = await _exec_solution(env, build_execution_command(script, task_os=task_os), solution_env,
                                  timeout, label)
    output = (result.stdout or "") + (result.stderr or "")
    tail = output[-SOLUTION_OUTPUT_TAIL_CHARS:]
    text = (tail if not tail or tail.endswith("\n") else tail + "\n") + f"[exit code {result.return_code}]"
    if result.return_code != 0:
        logger.info("%s: %s exited %s", label, script, result.return_code)
    return ToolResult(text=text, finished=True,
                      metadata={"exit_code": result.return_code, "output_tail": tail, "script": script})


async def _exec_solution(env: BaseEnvironment, command: str, solution_env: dict[str, str], timeout: float | None,
                         label: str) -> Any:
    """Run the solution's command under its deadline; a backend's timeout (a late failure, or one that says it timed
    out) becomes `HarborSolutionTimeout`, any other failure `EnvError`."""
    began = time.monotonic()
    late = f"{label}: the reference solution did not finish within the task's [agent] timeout_sec={timeout:g}" \
        if timeout else ""
    try:
        # The task's [solution] env wins over everything else, as in Harbor's oracle.
        with env.scoped_exec_env(solution_env):
            run = env.exec(command=command, env={"DEBIAN_FRONTEND": "noninteractive"},
                           timeout_sec=int(math.ceil(timeout)) if timeout else None)
            return await (asyncio.wait_for(run, timeout + EXEC_GRACE_S) if timeout else run)
    except asyncio.CancelledError:
        raise
    except (TimeoutError, asyncio.TimeoutError):
        raise HarborSolutionTimeout(late) from None
    except Exception as exc:  # noqa: BLE001 - sorted below
        if timeout and (time.monotonic() - began >= timeout - 0.05 or "timed out" in str(exc).lower()):
            raise HarborSolutionTimeout(late) from None
        raise EnvError(f"{label}: the sandbox failed to run the reference solution: {describe(exc)}") from exc
