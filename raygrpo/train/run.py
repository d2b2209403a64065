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
import sys
import time
from pathlib import Path
from typing import Any

from raygrpo.config import RunConfig
from raygrpo.summary import write_summary

logger = logging.getLogger(__name__)


def _window_mean(values: list[float | None]) -> float | None:
    scored = [v for v in values if v is not None]
    return sum(scored) / len(scored) if scored else None


def reward_change(metrics_path: Path, window: int = 5) -> dict[str, Any]:
    """Mean training reward of the first and last `window` steps, and their difference."""
    from raygrpo.train.metrics import read_metrics

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


def train(cfg: RunConfig, out_dir: str | Path, resume: bool = False, progress: bool | str = True) -> dict[str, Any]:
    """Train `cfg` and return the summary (also written to `OUT/summary.json`).

    `progress`: `"bar"` (or True), `"log"` (a line per step on stderr) or False. Starts a local Ray unless one is
    initialised (or joins `cfg.ray.address`), and shuts down only what it started.
    """
    import ray

    from raygrpo.actors.learner import start_learner
    from raygrpo.launch import RolloutRuntime
    from raygrpo.runtime import init_ray, shutdown_ray

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started_ray = not ray.is_initialized()
    if started_ray:
        init_ray(address=cfg.ray.address, num_cpus=cfg.ray.num_cpus)
    runtime = RolloutRuntime(cfg, actor_prefix="raygrpo-train-envpool", include_eval=True)
    learner = None
    result: dict[str, Any] = {}
    interrupted = False
    t0 = time.perf_counter()
    try:
        with runtime:
            learner_cfg = cfg.train.learner
            job_env = dict((ray.get_runtime_context().runtime_env or {}).get("env_vars") or {})
            learner = start_learner(
                learner_cfg.num_cpus, learner_cfg.num_gpus, env_vars=job_env,
                cfg=cfg.model_copy(update={"policy": runtime.policy}),  # with the URL of a vLLM raygrpo serves
                out_dir=str(out), actors=runtime.actors, engines=runtime.engines,
                tasks_by_env={name: runtime.tasks_by_env[name] for name in cfg.envs},
                eval_tasks=[t for name in cfg.eval_envs for t in runtime.tasks_by_env[name]],
                resume=resume,
            )
            ref = learner.train.remote()
            mode = "bar" if progress is True else (progress or "off")
            with _StepProgress(mode) as bar:
                while not ray.wait([ref], timeout=1.0)[0]:
                    try:
                        bar.update(ray.get(learner.progress.remote(), timeout=10))
                    except ray.exceptions.GetTimeoutError:
                        pass
            result = ray.get(ref)
    except KeyboardInterrupt:
        interrupted = True
        logger.warning("interrupted: the learner was stopped, rollouts cancelled, environments closed")
        raise
    finally:
        if learner is not None:
            ray.kill(learner, no_restart=True)
        summary = {
            **result,
            **reward_change(out / "metrics.jsonl"),
            "mode": cfg.train.mode,
            "wall_seconds": time.perf_counter() - t0,
            "leaked_envs": runtime.leaked_envs,
            "interrupted": interrupted,
        }
        write_summary(out / "summary.json", summary)
        if started_ray:
            shutdown_ray()
    return summary


class _StepProgress:
    """Training progress: a rich bar over steps (`"bar"`), a plain line per step (`"log"`), or nothing."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.last_step = -1
        self.last_phase = ""
        self._bar = None

    def __enter__(self) -> _StepProgress:
        if self.mode == "bar":
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("steps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[info]}"))
            self._bar.start()
            self._task = self._bar.add_task("steps", total=None, info="starting")
        return self

    def update(self, p: dict[str, Any]) -> None:
        reward = p.get("reward_mean")
        info = f"{p.get('phase', '')}  reward {reward:.3f}" if reward is not None else p.get("phase", "")
        if p.get("eval_reward_mean") is not None:
            info += f"  eval {p['eval_reward_mean']:.3f}"
        if self._bar is not None:
            self._bar.update(self._task, completed=p.get("step", 0), total=p.get("max_steps"), info=info)
        elif self.mode == "log" and (p.get("step") != self.last_step or p.get("phase") != self.last_phase):
            if p.get("step") != self.last_step or p.get("phase") in ("warm-up", "evaluating", "saving"):
                print(f"step {p.get('step')}/{p.get('max_steps')}  {info}", file=sys.stderr, flush=True)
        self.last_step, self.last_phase = p.get("step", 0), p.get("phase", "")

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
