"""`raygrpo check CONFIG | TASK_DIR`: does each Harbor task's verifier tell its reference solution from doing nothing?

For every task of the config's Harbor suites, one rollout with the built-in oracle policy (the task's
`solution/solve.sh`, run as Harbor's oracle agent runs it) and one with noop (nothing done), all at once over the env
pool actors of one Ray runtime. A task is sound when its oracle ends `ok` with at least `pass_threshold` and its noop
ends `ok` below it; anything else is broken, with the first line of the cause:

- `ok`: the oracle ended `ok` with at least the threshold, the noop `ok` below it;
- `oracle_below_threshold`: the verifier scored the reference solution below the threshold (the cause gives
  `solve.sh`'s exit code and the last line of its output when it failed);
- `oracle_<status>`: the oracle's rollout did not end `ok` (`oracle_task_error`: no `solve.sh`, no reward written,
  an image that does not build; `oracle_env_error`, `oracle_timeout`, ...);
- `noop_passes`: the untouched sandbox scores at least the threshold: the verifier does not tell doing nothing from
  solving;
- `noop_<status>`: the noop rollout did not end `ok` (e.g. the verifier writes no reward when nothing was done);
- `refused`: the task cannot be loaded or run on the suite's backend (an invalid `task.toml`, a missing
  `tests/test.sh`, a separate verifier environment or compose services on the local backend): nothing ran, and
  every other task is still judged.

When the reference solution scores below the threshold and its output, or the verifier's, says a command was not
found (`cargo: command not found`), that line is the cause (`solve.sh: cargo: command not found`): a toolchain the
image lacks, not a wrong verifier.

A folder instead of a config (one task dir, or a suite folder) is checked with a default config on the local
backend (`default_config`). `CheckResult.write` saves the verdicts as JSON (`"kind": "raygrpo-check"`), which
`raygrpo train --skip-broken FILE` reads back (`read_broken_tasks`) to leave the broken tasks out.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raygrpo.config import PolicyConfig, RunConfig, load_config
from raygrpo.core.errors import ResolveError, first_line
from raygrpo.driver.launch import RolloutRuntime
from raygrpo.driver.attempts import RolloutRequest
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.driver.progress import Progress, progress_mode
from raygrpo.driver.resolve import resolve_run
from raygrpo.driver.runtime import init_ray, shutdown_ray
from raygrpo.driver.summary import TrajectoryWriter
from raygrpo.core.types import SOLUTION_STEP, Status, TaskRef, Trajectory
from raygrpo.envs.harbor.missing_commands import missing_command_cause
from raygrpo.envs.harbor.refusals import Refusal

logger = logging.getLogger(__name__)

#: `kind` of a check result file, and the version of its fields.
CHECK_KIND = "raygrpo-check"
CHECK_VERSION = 1
#: The policies a check runs on every task, in this order.
CHECK_POLICIES = ("oracle", "noop")
#: The status of a task that cannot be loaded or run (see the module docstring).
REFUSED = "refused"


@dataclass
class TaskVerdict:
    """What `raygrpo check` found about one task.

    Args:
        env: The environment's name in the config.
        index: The task's index in its suite.
        task: Harbor's name of the task (`[task] name`, else the folder's name).
        task_dir: The task folder (absolute): what `--skip-broken` matches.
        oracle_status: How the oracle's rollout ended (`ok`, `task_error`, ...).
        oracle_reward: The verifier's reward for the reference solution (None when unscored).
        oracle_exit_code: `solve.sh`'s exit code (None when it did not run).
        noop_status: How the noop rollout ended.
        noop_reward: The verifier's reward for the untouched sandbox (None when unscored).
        status: `ok`, or why the task is broken (see the module docstring).
        cause: The first line of the cause ('' when `ok`).
    """

    env: str
    index: int
    task: str
    task_dir: str
    oracle_status: str
    oracle_reward: float | None
    oracle_exit_code: int | None
    noop_status: str
    noop_reward: float | None
    status: str
    cause: str = ""

    @property
    def broken(self) -> bool:
        return self.status != "ok"


def judge(ref: TaskRef, oracle: Trajectory, noop: Trajectory, pass_threshold: float) -> TaskVerdict:
    """The verdict on one task from its oracle and noop rollouts."""
    solution = next((s for s in oracle.steps if s.get("tool") == SOLUTION_STEP), None)
    meta = (solution or {}).get("metadata") or {}
    exit_code = meta.get("exit_code")
    if oracle.status is not Status.OK:
        status, cause = f"oracle_{oracle.status.value}", first_line(oracle.error or oracle.status.value)
    elif oracle.reward is None or oracle.reward < pass_threshold:
        status = "oracle_below_threshold"
        missing = missing_command_cause(meta.get("output_tail"), (oracle.verifier or {}).get("output_tail"))
        if missing is not None:
            cause = missing
        elif exit_code not in (None, 0):
            last = _last_line(meta.get("output_tail") or "")
            cause = f"solve.sh exited {exit_code}" + (f": {last}" if last else "")
        else:
            cause = f"the verifier scored the reference solution {oracle.reward:g} (< {pass_threshold:g})"
    elif noop.status is not Status.OK:
        status, cause = f"noop_{noop.status.value}", first_line(noop.error or noop.status.value)
    elif noop.reward is not None and noop.reward >= pass_threshold:
        status = "noop_passes"
        cause = (f"the untouched sandbox scores {noop.reward:g} (>= {pass_threshold:g}): the verifier does not tell "
                 "doing nothing from solving")
    else:
        status, cause = "ok", ""
    return TaskVerdict(
        env=ref.env, index=ref.index, task=str(ref.metadata.get("task_name") or ref.index),
        task_dir=str(ref.metadata.get("task_dir") or ""), oracle_status=oracle.status.value,
        oracle_reward=oracle.reward, oracle_exit_code=exit_code, noop_status=noop.status.value,
        noop_reward=noop.reward, status=status, cause=cause,
    )


def refused_verdict(env: str, refusal: Refusal) -> TaskVerdict:
    """The verdict on a task that cannot be loaded or run: nothing ran, `status` `refused`, the refusal's cause."""
    return TaskVerdict(env=env, index=refusal.index, task=refusal.task, task_dir=refusal.task_dir,
                       oracle_status=REFUSED, oracle_reward=None, oracle_exit_code=None, noop_status=REFUSED,
                       noop_reward=None, status=REFUSED, cause=refusal.cause)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


@dataclass
class CheckResult:
    """The verdicts of one `raygrpo check`.

    Args:
        pass_threshold: The oracle's reward must be at least this, the noop's below it.
        verdicts: One per task, in the config's order.
        wall_seconds: How long the check took, actors' start included.
        leaked_envs: Sandboxes still alive after it (see `RolloutRuntime.leaked_envs`).
    """

    pass_threshold: float
    verdicts: list[TaskVerdict] = field(default_factory=list)
    wall_seconds: float = 0.0
    leaked_envs: int = 0

    @property
    def broken(self) -> list[TaskVerdict]:
        return [v for v in self.verdicts if v.broken]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": CHECK_KIND, "version": CHECK_VERSION, "pass_threshold": self.pass_threshold,
            "tasks": len(self.verdicts), "broken": len(self.broken), "wall_seconds": round(self.wall_seconds, 3),
            "leaked_envs": self.leaked_envs, "verdicts": [asdict(v) for v in self.verdicts],
        }

    def write(self, path: str | Path) -> None:
        """Save the verdicts as JSON (what `raygrpo train --skip-broken` reads)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def read_broken_tasks(path: str | Path, option: str = "--skip-broken") -> list[TaskVerdict]:
    """The broken tasks a check result file lists.

    Raises:
        ResolveError: The file is missing, or is not a `raygrpo check` result (the message starts with `option` and
            names the file).
    """
    file = Path(path)
    try:
        data = json.loads(file.read_text())
    except OSError as exc:
        raise ResolveError(f"{option}: cannot read {file}: {exc.strerror or exc}") from None
    except ValueError:
        raise ResolveError(f"{option}: {file} is not a raygrpo check result (not JSON; write one with "
                           "`raygrpo check ... --json FILE`)") from None
    if not isinstance(data, dict) or data.get("kind") != CHECK_KIND or not isinstance(data.get("verdicts"), list):
        raise ResolveError(f"{option}: {file} is not a raygrpo check result (no \"kind\": \"{CHECK_KIND}\" with "
                           "verdicts; write one with `raygrpo check ... --json FILE`)")
    if data.get("version") != CHECK_VERSION:
        raise ResolveError(f"{option}: {file} is a raygrpo check result of version {data.get('version')!r}; this "
                           f"raygrpo reads version {CHECK_VERSION}: run raygrpo check again")
    try:
        verdicts = [TaskVerdict(**v) for v in data["verdicts"]]
    except TypeError as exc:
        raise ResolveError(f"{option}: {file} is not a raygrpo check result ({exc})") from None
    return [v for v in verdicts if v.broken]


def default_config(folder: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """The config `raygrpo check TASK_DIR` uses: the folder (one task dir, or a suite) as environment `tasks` on the
    local sandbox backend, two env pool actors of eight rollouts each; `overrides` (`--set`) apply on top."""
    data = {
        "envs": {"tasks": {"kind": "harbor", "path": str(Path(folder).resolve())}},
        "policy": {"kind": "oracle"},
        "rollout": {"group_size": 1},
        "workers": {"num_env_actors": 2, "max_concurrent_per_actor": 8},
    }
    return load_config(data=data, overrides=overrides)


def load_target(target: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """The config of `raygrpo check TARGET`: a folder gets `default_config`, a file is read as a run config.

    Raises:
        ConfigError: The config is invalid, or the target does not exist.
    """
    path = Path(target)
    if path.is_dir():
        return default_config(path, overrides)
    return load_config(path, overrides)


def run_check(cfg: RunConfig, pass_threshold: float = 1.0, *, out_dir: str | Path | None = None,
              progress: bool | str = False) -> CheckResult:
    """Check every task of `cfg`'s environments (see the module docstring) and return the verdicts.

    Resolves what the config names first (a failure raises `ResolveError` before Ray starts), then starts a local
    Ray unless one is initialised (or joins `cfg.ray.address`), runs the oracle and noop rollouts of every task at
    once over the env pool actors, shuts them down (closing every sandbox), and stops only the Ray it started.

    Args:
        cfg: The run config; its `policy` is ignored (the check runs the oracle and noop), its `envs` must all be
            Harbor suites.
        pass_threshold: The oracle must score at least this; the noop must score less.
        out_dir: Where to write the check's trajectories (`trajectories.jsonl`, started anew), if anywhere.
        progress: `"bar"` (or True), `"log"` or False.

    A task that cannot be loaded or run gets a `refused` verdict; the others are judged all the same (no Ray is
    started when no task can run).

    Raises:
        ResolveError: An environment is not a Harbor suite, or something the config names cannot be used (a suite
            folder that holds no task, a backend that does not load).
    """
    for name, spec in cfg.envs.items():
        if spec.kind != "harbor":
            raise ResolveError(f"envs.{name}: raygrpo check runs Harbor tasks (their reference solution and "
                               f"verifier); this is an {spec.kind.upper()} environment")
    cfg = cfg.model_copy(update={"policy": PolicyConfig(kind="oracle"), "eval_envs": {}})
    resolved = resolve_run(cfg, keep_refused=True)
    began = time.perf_counter()
    refused = [refused_verdict(env, r) for env, kept in resolved.refused.items() for r in kept]
    for verdict in refused:
        logger.warning("refused task %s (%s): %s", verdict.task, verdict.task_dir, verdict.cause)
    runnable = {env: tasks for env, tasks in resolved.tasks_by_env.items() if tasks}
    if not runnable:
        result = CheckResult(pass_threshold=pass_threshold, verdicts=_in_order(cfg, refused))
        result.wall_seconds = time.perf_counter() - began
        return result
    requests: list[RolloutRequest] = []
    refs: dict[str, tuple[TaskRef, str]] = {}
    trajectories: dict[tuple[str, int, str], Trajectory] = {}
    import ray

    started_ray = not ray.is_initialized()
    if started_ray:
        init_ray(address=cfg.ray.address, num_cpus=cfg.ray.num_cpus)
    writer = TrajectoryWriter(Path(out_dir) / "trajectories.jsonl") if out_dir is not None else None
    try:
        runtime = RolloutRuntime(cfg, runnable, actor_prefix="raygrpo-check-envpool")
        with runtime:
            for ref in runtime.tasks:
                for policy in CHECK_POLICIES:
                    group_id = f"check:{ref.env}:{ref.index}:{policy}"
                    refs[group_id] = (ref, policy)
                    requests.append(RolloutRequest(ref, group_id, policy=policy))
            orchestrator = Orchestrator(pools=runtime.pools, max_retries=cfg.workers.max_retries)
            with Progress("rollouts", len(requests), progress_mode(progress)) as bar:
                for traj in orchestrator.run(requests):
                    ref, policy = refs[traj.group_id]
                    trajectories[(ref.env, ref.index, policy)] = traj
                    if writer is not None:
                        writer.write(traj)
                    bar.update(len(trajectories), f"in flight {orchestrator.in_flight}")
        result = CheckResult(pass_threshold=pass_threshold, leaked_envs=runtime.leaked_envs)
    finally:
        if writer is not None:
            writer.close()
        if started_ray:
            shutdown_ray()
    for ref, policy in refs.values():
        if policy != CHECK_POLICIES[0]:
            continue
        oracle = trajectories[(ref.env, ref.index, "oracle")]
        noop = trajectories[(ref.env, ref.index, "noop")]
        result.verdicts.append(judge(ref, oracle, noop, pass_threshold))
    result.verdicts = _in_order(cfg, result.verdicts + refused)
    result.wall_seconds = time.perf_counter() - began
    for verdict in result.broken:
        logger.info("broken task %s (%s): %s: %s", verdict.task, verdict.task_dir, verdict.status, verdict.cause)
    return result


def _in_order(cfg: RunConfig, verdicts: list[TaskVerdict]) -> list[TaskVerdict]:
    """`verdicts` in the config's order: by environment, then by the task's place in its suite."""
    order = {name: i for i, name in enumerate(cfg.envs)}
    return sorted(verdicts, key=lambda v: (order.get(v.env, len(order)), v.index))


def render_table(result: CheckResult) -> Any:
    """A rich table of the verdicts: task, oracle reward, noop reward, status, first line of the cause."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"raygrpo check: {len(result.verdicts) - len(result.broken)} of {len(result.verdicts)} "
                        f"tasks ok (pass threshold {result.pass_threshold:g})")
    for column in ("task", "oracle", "noop", "status", "cause"):
        table.add_column(column, overflow="fold", no_wrap=column in ("oracle", "noop"))
    for v in result.verdicts:
        table.add_row(
            v.task if len({x.env for x in result.verdicts}) == 1 else f"{v.env}/{v.task}",
            _reward(v.oracle_reward, v.oracle_status), _reward(v.noop_reward, v.noop_status),
            f"[green]{v.status}[/green]" if not v.broken else f"[red]{v.status}[/red]",
            escape(v.cause),
        )
    return table


def _reward(reward: float | None, status: str) -> str:
    return f"{reward:g}" if reward is not None else status
