"""Run outputs: trajectories written as JSON lines (a fresh run starts the file anew), and the summary of a run."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from raygrpo.core.jsonl import JsonLines, count_lines, rewrite_lines
from raygrpo.core.outcome import Outcomes
from raygrpo.core.types import Trajectory

logger = logging.getLogger(__name__)

#: Folder of a run folder holding the verifier logs trajectories carried (`HarborSpec.keep_logs`).
VERIFIER_LOGS = "verifier_logs"


def trajectory_line(traj: Trajectory, run_dir: Path) -> dict[str, Any]:
    """`traj` as a JSON line for a file in `run_dir`; verifier logs it carries are written to files under
    `run_dir/verifier_logs/<rollout>/` instead, and the line's `verifier.logs_dir` names that folder (relative to
    `run_dir`)."""
    line = traj.to_dict()
    verifier = line.get("verifier")
    if verifier and verifier.get("logs") is not None:
        rollout = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{traj.group_id or 'rollout'}-{traj.sample}-{traj.attempt}")
        folder = run_dir / VERIFIER_LOGS / rollout
        for rel, text in verifier.pop("logs").items():
            target = (folder / rel).resolve()
            if not target.is_relative_to(folder.resolve()):  # a path from the sandbox must stay in its folder
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        verifier["logs_dir"] = str(folder.relative_to(run_dir))
    return line


class TrajectoryWriter:
    """Writes one trajectory per line to `path`, flushed as each arrives so nothing finished is lost; kept verifier
    logs go to files next to it (`trajectory_line`).

    A run starts the file anew, as `raygrpo train` without `--resume` does: a second run with the same `--out`
    appending to the first's lines would leave `summary.json` describing only its own, mix both runs in an export,
    and glue its first line onto a killed run's cut-off last one. Lines of a previous run it replaces are counted in
    a warning naming the file.

    Args:
        path: The `trajectories.jsonl` file.
        append: Keep the file's lines and append after them (a cut-off last line is dropped first, so no line is
            glued onto it). No command uses it today.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if append:
            drop_cut_off_line(self.path)
        else:
            warn_replaced(self.path)
            start_verifier_logs_anew(self.path.parent)
        self._file = self.path.open("a" if append else "w", encoding="utf-8")

    def write(self, traj: Trajectory) -> None:
        self._file.write(json.dumps(trajectory_line(traj, self.path.parent), ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def warn_replaced(path: Path) -> int:
    """Warn, naming `path`, how many lines of a previous run a fresh run is about to replace there; the count."""
    previous = count_lines(path)
    if previous:
        logger.warning("%s holds %d line(s) of a previous run with this --out: this run starts it anew (move it "
                       "away first to keep them)", path, previous)
    return previous


def start_verifier_logs_anew(run_dir: Path) -> int:
    """Remove the `verifier_logs/` a previous run with this `--out` left in `run_dir`, as a fresh run replaces its
    trajectories: kept, they would sit beside lines that no longer name them, and a rollout of this run whose name
    matches one of them would mix both runs' files in one folder. Warns with how many rollouts' logs go; the count."""
    folder = run_dir / VERIFIER_LOGS
    if folder.is_symlink() or not folder.is_dir():
        return 0
    previous = sum(1 for _ in folder.iterdir())
    if previous:
        logger.warning("%s holds the verifier logs of %d rollout(s) of a previous run with this --out: this run "
                       "starts it anew (move it away first to keep them)", folder, previous)
    shutil.rmtree(folder)
    return previous


def drop_cut_off_line(path: Path) -> None:
    """Before appending to `path`: drop a cut-off last line a killed run left (with a warning)."""
    if not path.exists():
        return
    lines = JsonLines(path)
    kept = [line.raw for line in lines]
    if lines.cut_off_line is not None:
        logger.warning("%s", lines.cut_off_note(len(kept), action="dropped it before appending; kept"))
        rewrite_lines(path, kept)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def peak_concurrency(spans: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (an interval that closes as another opens does not overlap it)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


class RunSummary:
    """Accumulates what `summary.json` reports.

    Args:
        requested: Rollouts requested (tasks × group size); None while not known (an environment whose server lists
            its tasks once the run has started).
    """

    def __init__(self, requested: int | None) -> None:
        self.requested = requested
        self.trajectories: list[Trajectory] = []
        self.failed_attempts: list[Trajectory] = []
        self.outcomes = Outcomes()

    def add(self, traj: Trajectory) -> None:
        self.trajectories.append(traj)
        self.outcomes.add(traj)

    def add_failed_attempt(self, traj: Trajectory) -> None:
        self.failed_attempts.append(traj)

    def to_dict(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The run's figures (`RunSession` adds `wall_seconds`, `leaked_envs` and `interrupted`)."""
        trajs = self.trajectories
        rewards = [t.reward for t in trajs if t.reward is not None]
        status_counts = Counter(t.status.value for t in trajs)
        missing = self.requested - len(trajs) if self.requested is not None else 0
        if missing > 0:
            status_counts["cancelled"] += missing  # requested but never finished (interrupted run)
        phases: dict[str, dict[str, float]] = {}
        for phase in ("provision", "governor_wait", "backoff", "warm_wait", "start", "generate", "tools", "verify",
                      "total"):
            values = [t.timings[phase] for t in trajs if phase in t.timings]
            if values:
                phases[phase] = {"p50": _percentile(values, 0.5), "p95": _percentile(values, 0.95)}
        spans = [t.env_span for t in trajs + self.failed_attempts if t.env_span]
        per_env: dict[str, dict[str, Any]] = {}
        for name in sorted({t.task.env for t in trajs}):
            env_rewards = [t.reward for t in trajs if t.task.env == name and t.reward is not None]
            per_env[name] = {
                "completed": sum(1 for t in trajs if t.task.env == name),
                "scored": len(env_rewards),
                "reward_mean": statistics.fmean(env_rewards) if env_rewards else None,
            }
        return {
            "requested": self.requested,
            "completed": len(trajs),
            "scored": len(rewards),
            "reward_mean": statistics.fmean(rewards) if rewards else None,
            "status_counts": dict(sorted(status_counts.items())),
            "failure_causes": self.outcomes.causes(),
            "retried_attempts": len(self.failed_attempts),
            "phase_seconds": phases,
            "max_concurrent_envs": peak_concurrency(spans),
            "sandboxes": dict(sorted(Counter(t.sandbox for t in trajs if t.sandbox).items())),
            "tool_calls": sum(t.tool_calls for t in trajs),
            "per_env": per_env,
            **(extra or {}),
        }


def write_summary(path: str | os.PathLike[str], summary: dict[str, Any]) -> None:
    """Write `summary.json` atomically (a reader never sees half a file)."""
    path = Path(path)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
