"""`raygrpo rollout`: collect trajectories for every task of a run config, without training.

Writes `OUT/trajectories.jsonl` (a line as each rollout finishes), `OUT/metrics.jsonl` (the env pools' sizes, queue
and attempts by status every few seconds) and `OUT/summary.json`. A run starts both JSON lines files anew, as
`raygrpo train` without `--resume` does (a warning says how many lines of a previous run it replaced). On Ctrl-C or
an error the rollouts in flight are cancelled, every environment is closed, and a partial summary is written.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from raygrpo.config import RunConfig
from raygrpo.driver.attempts import make_groups
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.driver.pools.ray_metrics import PoolMetricsLog
from raygrpo.driver.progress import Progress, progress_mode
from raygrpo.driver.resolve import resolve_run
from raygrpo.driver.session import RunSession
from raygrpo.driver.summary import RunSummary, TrajectoryWriter, warn_replaced
from raygrpo.core.types import Trajectory

logger = logging.getLogger(__name__)


def collect(cfg: RunConfig, out_dir: str | Path, progress: bool | str = True) -> dict[str, Any]:
    """Run every task of `cfg` `group_size` times and write the outputs; returns the summary.

    Resolves what the config names first (a failure raises `ResolveError` before Ray starts), then starts a local
    Ray (or joins `cfg.ray.address`) unless Ray is already initialised, and shuts down only what it started.

    Args:
        cfg: The validated run config.
        out_dir: The run folder.
        progress: `"bar"` (or True) for a live progress bar, `"log"` for a plain line every few seconds (logs of
            `ray job submit`, CI), False for none.
    """
    resolved = resolve_run(cfg)
    out = Path(out_dir)
    # Known before any actor starts, unless an environment lists its tasks only then: an interrupt while the actors
    # start must not report 0 requested (and no rollout cancelled).
    listed = [resolved.tasks_by_env.get(name) for name in cfg.envs if name in resolved.tasks_by_env]
    known = all(tasks is not None for tasks in listed)
    summary = RunSummary(requested=sum(len(t or []) for t in listed) * cfg.rollout.group_size if known else None)
    writer = TrajectoryWriter(out / "trajectories.jsonl")
    if warn_replaced(out / "metrics.jsonl"):
        (out / "metrics.jsonl").unlink()  # the pools' lines are appended as they come: this run's only
    dispatch = {"attempts_lost_to_actors": 0, "attempts_abandoned": 0, "duplicates_discarded": 0}
    session = RunSession(cfg, out, resolved.tasks_by_env, actor_prefix="raygrpo-envpool",
                         summarize=lambda: summary.to_dict(extra={
                             "server_live_sessions": session.runtime.server_live_sessions,
                             **dispatch, "pools": session.runtime.pool_snapshot}))
    try:
        with session:
            requests = make_groups(session.runtime.tasks, cfg.rollout.group_size)
            summary.requested = len(requests)
            orchestrator = Orchestrator(
                pools=session.runtime.pools,
                max_retries=cfg.workers.max_retries,
                on_failed_attempt=summary.add_failed_attempt,
            )
            pool_log = PoolMetricsLog(out / "metrics.jsonl")
            try:
                with Progress("rollouts", len(requests), progress_mode(progress)) as bar:
                    for traj in orchestrator.run(requests, on_poll=lambda o: o.log_pools(pool_log)):
                        writer.write(traj)
                        summary.add(traj)
                        bar.update(len(summary.trajectories), _progress_info(summary.trajectories,
                                                                              orchestrator.in_flight))
            finally:
                for traj in orchestrator.salvaged:  # an interrupted run's finished rollouts of unfinished groups
                    writer.write(traj)
                    summary.add(traj)
                orchestrator.log_pools(pool_log, force=True)
                stats = orchestrator.stats
                dispatch.update(attempts_lost_to_actors=stats.lost_to_actors, attempts_abandoned=stats.abandoned,
                                duplicates_discarded=stats.duplicates_discarded)
    finally:
        writer.close()
    return session.summary


def _progress_info(trajectories: list[Trajectory], in_flight: int) -> str:
    rewards = [t.reward for t in trajectories if t.reward is not None]
    mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
    return f"in flight {in_flight}  scored {len(rewards)}  reward {mean}"
