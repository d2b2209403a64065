"""What `raygrpo rollout` and `raygrpo train` share around their work: Ray, the run's actors, and the summary.

    with RunSession(cfg, out, tasks_by_env, actor_prefix="raygrpo-envpool", summarize=lambda: {...}) as session:
        ...  # session.runtime holds the env pool actors, engines and servers

On entry it starts a local Ray (or joins `cfg.ray.address`) unless Ray is already initialised, and brings the
run's actors up. However the block ends (done, an error, Ctrl-C, SIGTERM), it shuts every actor down (closing every
session and sandbox), writes `OUT/summary.json` (what `summarize()` returns, plus `wall_seconds`, `leaked_envs`,
`leaked_envs_by_node` (the nodes where sandboxes were left, with their counts) and `interrupted`), and stops only
the Ray it started. The summary is then `session.summary`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raygrpo.config import RunConfig
from raygrpo.driver.launch import RolloutRuntime
from raygrpo.driver.runtime import init_ray, shutdown_ray
from raygrpo.driver.summary import write_summary
from raygrpo.core.types import TaskRef

logger = logging.getLogger(__name__)


class RunSession:
    """One run's time on Ray (see the module docstring).

    Args:
        cfg: The validated run config.
        out_dir: The run folder (created if missing).
        tasks_by_env: The resolved environments and their tasks (see `RolloutRuntime`).
        actor_prefix: Prefix of the env pool actors' names.
        summarize: Called once at the end, whatever happened: the run's own summary fields.
        own_pools: Start the env pools on the driver (see `RolloutRuntime`).
        other_actors: The run's actors the caller starts itself (see `RolloutRuntime`).
    """

    def __init__(self, cfg: RunConfig, out_dir: str | Path, tasks_by_env: dict[str, list[TaskRef] | None], *,
                 actor_prefix: str, summarize: Callable[[], dict[str, Any]], own_pools: bool = True,
                 other_actors: dict[str, dict[str, float]] | None = None) -> None:
        self.cfg = cfg
        self.out = Path(out_dir).resolve()
        self.runtime = RolloutRuntime(cfg, tasks_by_env, actor_prefix=actor_prefix, own_pools=own_pools,
                                      other_actors=other_actors)
        self.summarize = summarize
        self.summary: dict[str, Any] = {}
        self.started = time.perf_counter()
        self._started_ray = False

    def begin(self) -> None:
        """Start the clock of `wall_seconds` now (by default it starts once the actors are up)."""
        self.started = time.perf_counter()

    def __enter__(self) -> RunSession:
        import ray

        self.out.mkdir(parents=True, exist_ok=True)
        self._started_ray = not ray.is_initialized()
        try:  # a Ctrl-C while Ray starts still writes the partial summary the CLI then points to
            if self._started_ray:
                init_ray(address=self.cfg.ray.address, num_cpus=self.cfg.ray.num_cpus)
            self.runtime.__enter__()
        except BaseException as exc:
            self._finish(isinstance(exc, KeyboardInterrupt))
            raise
        self.begin()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        if interrupted:
            logger.warning("interrupted: rollouts cancelled, environments closed")
        try:
            self.runtime.__exit__(exc_type, exc, tb)
        finally:
            self._finish(interrupted)

    def _finish(self, interrupted: bool) -> None:
        try:
            self.summary = {
                **self.summarize(),
                "wall_seconds": time.perf_counter() - self.started,
                "leaked_envs": self.runtime.leaked_envs,
                "leaked_envs_by_node": self.runtime.leaked_envs_by_node,
                "interrupted": interrupted,
            }
            write_summary(self.out / "summary.json", self.summary)
        finally:
            if self._started_ray:
                shutdown_ray()
