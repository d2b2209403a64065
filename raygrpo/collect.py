"""`raygrpo rollout`: collect trajectories for every task of a run config, without training.

Writes `OUT/trajectories.jsonl` (appended as rollouts finish) and `OUT/summary.json`. On Ctrl-C or an error the
rollouts in flight are cancelled, every environment is closed, and a partial summary is written.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from raygrpo.config import RunConfig
from raygrpo.summary import RunSummary, TrajectoryWriter, write_summary

logger = logging.getLogger(__name__)


def collect(cfg: RunConfig, out_dir: str | Path, progress: bool | str = True) -> dict[str, Any]:
    """Run every task of `cfg` `group_size` times and write the outputs; returns the summary.

    `progress`: `"bar"` (or True) for a live progress bar, `"log"` for a plain line every few seconds (logs of
    `ray job submit`, CI), False for none.

    Starts a local Ray (or joins `cfg.ray.address`) unless Ray is already initialised, and shuts down only what it
    started.
    """
    import ray

    from raygrpo.launch import RolloutRuntime
    from raygrpo.orchestrator import Orchestrator, make_groups
    from raygrpo.runtime import init_ray, shutdown_ray

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started_ray = not ray.is_initialized()
    if started_ray:
        init_ray(address=cfg.ray.address, num_cpus=cfg.ray.num_cpus)
    summary: RunSummary | None = None
    writer = TrajectoryWriter(out / "trajectories.jsonl")
    runtime = RolloutRuntime(cfg)
    interrupted = False
    t0 = time.perf_counter()
    try:
        with runtime:
            requests = make_groups(runtime.tasks, cfg.rollout.group_size)
            summary = RunSummary(requested=len(requests))
            orchestrator = Orchestrator(
                runtime.actors,
                max_in_flight_per_actor=cfg.workers.max_concurrent_per_actor,
                max_retries=cfg.workers.max_retries,
                on_failed_attempt=summary.add_failed_attempt,
            )
            t0 = time.perf_counter()
            mode = "bar" if progress is True else (progress or "off")
            with _Progress(len(requests), mode=mode) as bar:
                for traj in orchestrator.run(requests):
                    writer.write(traj)
                    summary.add(traj)
                    bar.advance(traj, orchestrator.in_flight)
    except KeyboardInterrupt:
        interrupted = True
        logger.warning("interrupted: in-flight rollouts cancelled, environments closed")
        raise
    finally:
        writer.close()
        wall = time.perf_counter() - t0
        if summary is None:
            summary = RunSummary(requested=0)
        result = summary.to_dict(
            wall_seconds=wall,
            leaked_envs=runtime.leaked_envs,
            interrupted=interrupted,
            extra={"server_live_sessions": runtime.server_live_sessions},
        )
        write_summary(out / "summary.json", result)
        if started_ray:
            shutdown_ray()
    return result


class _Progress:
    """Progress of a run with the running reward mean: a rich bar (`"bar"`), plain lines on stderr at most every
    `log_every_s` (`"log"`), or nothing (`"off"`)."""

    def __init__(self, total: int, mode: str, log_every_s: float = 5.0) -> None:
        self.total, self.mode, self.log_every_s = total, mode, log_every_s
        self.enabled = mode == "bar"
        self.done = self.scored = 0
        self.reward_sum = 0.0
        self._started = self._logged = time.monotonic()

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"),
            )
            self._progress.start()
            self._task = self._progress.add_task("rollouts", total=self.total, info="")
        return self

    def advance(self, traj: Any, in_flight: int) -> None:
        self.done += 1
        if traj.reward is not None:
            self.scored += 1
            self.reward_sum += traj.reward
        mean = f"{self.reward_sum / self.scored:.3f}" if self.scored else "-"
        info = f"in flight {in_flight}  scored {self.scored}  reward {mean}"
        if self.enabled:
            self._progress.update(self._task, completed=self.done, info=info)
        elif self.mode == "log":
            now = time.monotonic()
            if now - self._logged >= self.log_every_s or self.done == self.total:
                self._logged = now
                print(f"rollouts {self.done}/{self.total}  {info}  {now - self._started:.1f} s",
                      file=sys.stderr, flush=True)

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self._progress.stop()
