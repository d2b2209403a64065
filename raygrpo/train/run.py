"""`raygrpo train`: start the rollout side (env pool actors, engines, embedded servers) and the learner actor,
show progress while the learner trains, and write `summary.json`.

Outputs in the run folder: `metrics.jsonl` (one line per step, plus `"kind": "eval"` lines), `checkpoints/`
(TRL checkpoints with raygrpo's `raygrpo_state.json`; `--resume` continues from the latest), `model/` (the final
model and tokenizer: usable as `model:` of `raygrpo rollout`), `reward_curve.png` and `summary.json`.

The learner writes to the run folder from its own process: on a multi-node cluster put the folder on storage the
learner's node shares with the driver.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from raygrpo.actors.learner import start_learner
from raygrpo.driver.check import read_broken_tasks
from raygrpo.config import RunConfig
from raygrpo.driver.placement import actor_resources, wait_placed
from raygrpo.driver.progress import Progress, progress_mode
from raygrpo.driver.resolve import ResolvedRun, resolve_run
from raygrpo.driver.runtime import ray_info
from raygrpo.driver.session import RunSession
from raygrpo.train.checkpoint import find_checkpoint
from raygrpo.train.metrics import read_metrics

logger = logging.getLogger(__name__)

#: How long each env pool actor of an interrupted run gets to close its environments, and how long the driver waits
#: for the learner to have them all closed (it also stops its rollout producer first) before it kills the learner.
CLOSE_ENV_POOL_S = 60.0
CLOSE_LEARNER_S = 150.0


def _window_mean(values: list[float | None]) -> float | None:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def reward_change(metrics_path: Path, window: int = 5) -> dict[str, Any]:
    """Mean training reward of the first and last `window` steps, and their difference."""
    records = read_metrics(metrics_path) if metrics_path.exists() else []
    steps = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    first = _window_mean([r.get("reward_mean") for r in steps[:window]])
    last = _window_mean([r.get("reward_mean") for r in steps[-window:]])
    return {
        f"reward_first{window}_mean": first,
        f"reward_last{window}_mean": last,
        "reward_gain": (last - first) if first is not None and last is not None else None,
        "eval_reward_first": evals[0]["eval_reward_mean"] if evals else None,
        "eval_reward_last": evals[-1]["eval_reward_mean"] if evals else None,
        "mean_staleness": _window_mean([r.get("staleness_mean") for r in steps]),
    }


def train(cfg: RunConfig, out_dir: str | Path, resume: bool = False, progress: bool | str = True,
          skip_broken: str | Path | None = None) -> dict[str, Any]:
    """Train `cfg` and return the summary (also written to `OUT/summary.json`).

    Resolves what the config names first, and with `resume` that a complete checkpoint is there if any is (a failure
    raises `ResolveError` before Ray starts), then starts a local Ray unless one is initialised (or joins
    `cfg.ray.address`), and shuts down only what it started.

    Args:
        cfg: The validated run config.
        out_dir: The run folder.
        resume: Continue from the latest checkpoint in `out_dir/checkpoints`.
        progress: `"bar"` (or True), `"log"` (a line per step on stderr) or False.
        skip_broken: A `raygrpo check --json` result: its broken tasks are left out of training and evaluation
            (logged by name, listed as `skipped_tasks` in the summary); a file that is not a check result raises
            `ResolveError` naming it.
    """
    import ray

    resolved = resolve_train(cfg, skip_broken)
    out = Path(out_dir).resolve()
    if resume:  # checkpoints there but none complete: ResolveError (exit 2) naming the folder, before Ray starts
        find_checkpoint(out / "checkpoints", True, warn=False)
    result: dict[str, Any] = {}

    def summarize() -> dict[str, Any]:
        skipped = [str(t.metadata.get("task_name") or f"{t.env}/{t.index}") for t in resolved.skipped]
        return {**result, **reward_change(out / "metrics.jsonl"), "mode": cfg.train.mode, "skipped_tasks": skipped}

    learner_cfg = cfg.train.learner
    learner_demand = actor_resources(learner_cfg.num_cpus, learner_cfg.num_gpus, resources=learner_cfg.resources)
    # The learner dispatches the rollouts, so it owns the env pools: the driver hands it the spawners.
    session = RunSession(cfg, out, resolved.tasks_by_env, actor_prefix="raygrpo-train-envpool", summarize=summarize,
                         own_pools=False, other_actors={"train.learner": learner_demand})
    with session:
        runtime = session.runtime
        job_env = dict((ray.get_runtime_context().runtime_env or {}).get("env_vars") or {})
        learner = start_learner(
            "raygrpo.train.learner:Learner", learner_cfg.num_cpus, learner_cfg.num_gpus, env_vars=job_env,
            resources=learner_cfg.resources,
            cfg=cfg.model_copy(update={"policy": runtime.policy}),  # with the URL of a vLLM raygrpo serves
            out_dir=str(out), spawners=runtime.spawners, engines=runtime.engines,
            tasks_by_env={name: runtime.tasks_by_env[name] for name in cfg.envs},
            eval_tasks=[t for name in cfg.eval_envs for t in runtime.tasks_by_env[name] or []],
            resume=resume, workdir=ray_info().workdir,
        )
        placed = False
        try:
            where = wait_placed(learner.node_ip.remote(), "train.learner", learner_demand)
            placed = True
            logger.info("placed learner on %s", where)
            ref = learner.train.remote()
            with Progress("steps", None, progress_mode(progress), log_every_s=60.0) as bar:
                last = (-1, "")
                while not ray.wait([ref], timeout=1.0)[0]:
                    try:
                        p = ray.get(learner.progress.remote(), timeout=10)
                    except ray.exceptions.GetTimeoutError:
                        continue
                    now = (p.get("step", 0), p.get("phase", ""))
                    bar.update(now[0], _step_info(p), total=p.get("max_steps"),
                               log_now=now[0] != last[0] or (now != last and now[1] in ("warm-up", "evaluating",
                                                                                          "saving")))
                    last = now
            result.update(ray.get(ref))
            runtime.add_final_stats(result.pop("env_actor_stats", []))
        except KeyboardInterrupt:
            if placed:  # an unplaced learner has started no env pool
                result.update(close_interrupted(learner, runtime))
            raise
        finally:
            ray.kill(learner, no_restart=True)
    return session.summary


def close_interrupted(learner: Any, runtime: Any) -> dict[str, Any]:
    """Have an interrupted run's learner close its env pools (ORS sessions, sandboxes) before it is killed: the env
    pool actors die with it, and a kill runs no `shutdown`. Returns what the learner knows of the run so far (steps,
    statuses) for the summary; the actors' final stats go to `runtime`'s leak count. A second Ctrl-C, or a learner
    that does not answer within `CLOSE_LEARNER_S`, gives up (the nodes' reapers see to what is left)."""
    import ray

    logger.warning("interrupted: closing the learner's environments (up to %.0f s; Ctrl-C again to stop at once)",
                   CLOSE_LEARNER_S)
    try:
        part = dict(ray.get(learner.interrupt.remote(CLOSE_ENV_POOL_S), timeout=CLOSE_LEARNER_S))
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001
        logger.warning("the learner did not close its environments: %r", exc)
        return {}
    runtime.add_final_stats(part.pop("env_actor_stats", []))
    return part


def resolve_train(cfg: RunConfig, skip_broken: str | Path | None = None) -> ResolvedRun:
    """Train's resolve step: `resolve_run(cfg, train=True)`, leaving out the broken tasks of a check result.

    Raises:
        ResolveError: Something the config names cannot be used, or `skip_broken` is not a check result.
    """
    broken = read_broken_tasks(skip_broken) if skip_broken is not None else []
    return resolve_run(cfg, train=True, skip_task_dirs=[v.task_dir for v in broken])


def _step_info(p: dict[str, Any]) -> str:
    reward = p.get("reward_mean")
    info = f"{p.get('phase', '')}  reward {reward:.3f}" if reward is not None else p.get("phase", "")
    if p.get("eval_reward_mean") is not None:
        info += f"  eval {p['eval_reward_mean']:.3f}"
    return info
