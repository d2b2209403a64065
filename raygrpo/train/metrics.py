"""Training metrics: reward statistics of groups, `metrics.jsonl` (one JSON line per step) and the reward plot."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from raygrpo.core.jsonl import JsonLines, JsonLinesError, rewrite_lines
from raygrpo.core.types import Trajectory
from raygrpo.driver.summary import start_verifier_logs_anew, trajectory_line

logger = logging.getLogger(__name__)


def reward_stats(trajectories: Iterable[Trajectory]) -> dict[str, Any]:
    """Mean and std of the scored rewards, and the fraction of rollouts that were scored (None when empty)."""
    trajs = list(trajectories)
    rewards = [t.reward for t in trajs if t.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else None
    return {
        "reward_mean": mean,
        "reward_std": std,
        "reward_ci95": mean_interval(rewards),
        "scored_fraction": len(rewards) / len(trajs) if trajs else None,
        "rollouts": len(trajs),
    }


def sandbox_stats(trajectories: Iterable[Trajectory]) -> dict[str, Any]:
    """How the step's sandboxes were provided (`Trajectory.sandbox`): `sandboxes` (count by `cold`, `hedged`,
    `warm`) and `warm_hits` (those from the warm pool); empty where no environment says (ORS sessions)."""
    counts: dict[str, int] = {}
    for traj in trajectories:
        if traj.sandbox:
            counts[traj.sandbox] = counts.get(traj.sandbox, 0) + 1
    if not counts:
        return {}
    return {"sandboxes": dict(sorted(counts.items())), "warm_hits": counts.get("warm", 0)}


def mean_interval(values: list[float], z: float = 1.96) -> list[float] | None:
    """A normal-approximation 95% interval `[low, high]` of the mean of `values` (None for fewer than two), kept
    within the values' own range: with few rollouts the approximation reaches below the lowest reward (a mean of 1
    in 8 at 0.125 gives -0.12), which no mean of these rewards can be."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = z * std / math.sqrt(len(values))
    return [max(min(values), mean - half), min(max(values), mean + half)]


def per_env_stats(trajectories: Iterable[Trajectory]) -> dict[str, dict[str, Any]]:
    """`reward_stats` per environment name."""
    by_env: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        by_env.setdefault(traj.task.env, []).append(traj)
    return {env: reward_stats(trajs) for env, trajs in sorted(by_env.items())}


class MetricsLog:
    """Appends one JSON object per line to `path` (flushed at once, so a crash loses nothing written).

    A fresh run starts the file anew. A resumed run keeps the lines of steps up to its checkpoint: the file is read
    through `raygrpo.core.jsonl.JsonLines`, so a last line that a killed run left cut off is dropped (and logged)
    while any other line that is not JSON fails naming the file and line; the kept lines replace the file through a
    temporary file, so a crash during that rewrite loses nothing.

    Args:
        path: The `metrics.jsonl` file.
        keep_until_step: When resuming: drop lines of steps after this one (written after the checkpoint that the
            run resumes from), so the file has each step once. Negative: start the file anew (a fresh run); None:
            append to it as it is (a cut-off last line is still dropped, so no line is glued onto it).

    Raises:
        JsonLinesError: A line other than a cut-off last one is not JSON (resuming, or appending).
    """

    def __init__(self, path: str | os.PathLike[str], keep_until_step: int | None = None) -> None:
        self.path = Path(path)
        if keep_until_step is not None and keep_until_step < 0:
            self.path.write_bytes(b"")
        elif self.path.exists():
            self._keep(keep_until_step)
        self._file = self.path.open("a")

    def _keep(self, until_step: int | None) -> None:
        lines = JsonLines(self.path)
        kept = [line.raw for line in lines
                if until_step is None or _step_of(line.value, self.path, line.number) <= until_step]
        if lines.cut_off_line is None and until_step is None:
            return  # nothing to drop
        note = lines.cut_off_note(len(kept), action="dropped it; kept")
        if note:
            logger.warning("%s", note)
        rewrite_lines(self.path, kept)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _step_of(value: Any, path: Path, number: int) -> int:
    step = value.get("step", 0) if isinstance(value, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        raise JsonLinesError(f"{path.name}: line {number} is not a JSON object with an integer step")
    return step


class RolloutLog(MetricsLog):
    """`rollouts.jsonl`: every trajectory a step consumed (tokens, masks, messages, reward), tagged with the step;
    kept verifier logs go to `verifier_logs/` next to it (a fresh run removes a previous run's)."""

    def __init__(self, path: str | os.PathLike[str], keep_until_step: int | None = None) -> None:
        super().__init__(path, keep_until_step)
        if keep_until_step is not None and keep_until_step < 0:
            start_verifier_logs_anew(self.path.parent)

    def write(self, traj: Trajectory, step: int) -> None:  # type: ignore[override]
        super().write({"step": step, **trajectory_line(traj, self.path.parent)})


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a `metrics.jsonl`; a cut-off last line (a run killed while writing it) is left out.

    Raises:
        JsonLinesError: A line other than a cut-off last one is not JSON.
    """
    return [line.value for line in JsonLines(path)]


def plot_rewards(metrics_path: str | os.PathLike[str], png_path: str | os.PathLike[str]) -> None:
    """Plot the training reward mean per step (per environment too, for mixtures) and the eval reward, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    steps = [r for r in records if "reward_mean" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in steps], [_nan(r["reward_mean"]) for r in steps], label="train reward", lw=2)
    envs = sorted({e for r in steps for e in (r.get("envs") or {})})
    if len(envs) > 1:
        for env in envs:
            pts = [(r["step"], _nan(r["envs"][env]["reward_mean"])) for r in steps if env in (r.get("envs") or {})]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"train {env}", lw=1, alpha=0.7)
    evals = [r for r in records if r.get("eval_reward_mean") is not None]
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_reward_mean"] for r in evals], "o--", label="eval reward")
    ax.set_xlabel("step")
    ax.set_ylabel("reward (scored rollouts)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value
