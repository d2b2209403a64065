"""Learner overlap: the fraction of wall time the learner waits for rollouts, sync vs async, in one run.

DESIGN section 6, item 4. Real `raygrpo train` runs (`raygrpo.train.run.train`: env pool actors, a transformers
engine with the tiny model, the learner actor with TRL's GRPOTrainer) against `overlap_env.OverlapEnvironment`, an ORS
environment whose every rollout takes at least a set latency (paid before the model's first turn, whatever the model
writes; it travels in the split name, see that module). One Ray runtime serves all runs:

1. **calibrate**: a short sync run with zero latency; the median `train_s` of its steps (first step left out) is the
   training-step time, and the median `wait_s` is what a rollout batch costs with no latency at all
   (`calibration_wait_s`: sessions, chat template, generation; CPU work that shares the cores with training).
2. **sync** and **async** runs with the rollout latency set to that training-step time, the same number of steps, the
   same batch (`--batch` rollouts, groups of `--group-size`, one model turn of `--max-tokens`), `train.max_staleness:
   1`; `--repeats` pairs, the mode that goes first alternating.

Per run, over its steps after the first (the first step waits for the first batch in both modes: it is left out):
`idle_fraction = sum(wait_s) / sum(step_s)` from `metrics.jsonl`, and `steps_per_min` from the wall time between
the first step's metrics line and the last one (the driver watches the file). From the async run also
`dropped_groups` (whole run) and `mean_staleness` (measured steps). Medians over the repeats are reported. Target:
`async_idle_fraction <= 0.25 * sync_idle_fraction`.

With a rollout latency L equal to the training time T and a rollout batch's own work W (`calibration_wait_s`), sync
waits about L + W per step. Async dispatches each group as soon as there is room, destined for the step that will
consume it: it pays L while the learner trains, and generates (W) as soon as the weights that step allows are pushed,
beside the next training step; the learner waits only for what of W does not fit beside training on the cores.

Prints progress to stderr and one JSON object last on stdout. Run: `python benchmarks/learner_overlap.py` (about
four minutes on 2 cores; `--steps`, `--repeats`, `--latency`, `--out` to change it; `--out` keeps the run folders).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from overlap_env import latency_of, split_for  # noqa: E402

TARGET_RATIO = 0.25


def log(msg: str) -> None:
    print(f"[learner_overlap] {msg}", file=sys.stderr, flush=True)


def run_config(args: argparse.Namespace, mode: str, latency_s: float, steps: int):
    """The run config of one run: `steps` GRPO steps of `args.batch` rollouts with `latency_s` per rollout."""
    from raygrpo.config import load_config

    return load_config(data={
        "envs": {"overlap": {
            "kind": "ors",
            "environment": f"{HERE / 'overlap_env.py'}:OverlapEnvironment",
            "split": split_for(latency_s),
        }},
        "model": "tiny",
        "seed": 0,
        "policy": {"kind": "transformers", "max_batch_size": args.batch},
        "sampling": {"max_tokens": args.max_tokens, "temperature": 1.0, "seed": 0},
        "rollout": {"group_size": args.group_size, "max_turns": 1, "max_total_tokens": 512},
        "workers": {"num_env_actors": 2, "max_concurrent_per_actor": args.batch},
        "train": {"mode": mode, **({"max_staleness": 1} if mode == "async" else {}), "eval_every": 0},
        "trainer": {
            "max_steps": steps,
            "per_device_train_batch_size": args.batch,
            "learning_rate": 1.0e-4,
            "beta": 0.0,
            "save_strategy": "no",
        },
        "ray": {"num_cpus": 4},
    })


class _LineClock:
    """Watches a `metrics.jsonl` from the driver and notes when each `"kind": "train"` line appears."""

    def __init__(self, path: Path, interval_s: float = 0.02) -> None:
        self.path = path
        self.interval_s = interval_s
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        offset, buffer = 0, ""
        while not self._stop.is_set():
            if self.path.exists():
                with self.path.open() as f:
                    f.seek(offset)
                    chunk = f.read()
                    offset = f.tell()
                now = time.perf_counter()
                buffer += chunk
                *lines, buffer = buffer.split("\n")
                for line in lines:
                    if line.strip():
                        record = json.loads(line)
                        if record.get("kind") == "train":
                            self.seen.setdefault(record["step"], now)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> _LineClock:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def train_watched(cfg: Any, out: Path, verbose: bool = False) -> tuple[list[dict[str, Any]], dict[int, float]]:
    """Train `cfg` into `out` (its old `metrics.jsonl` removed first) for all its `trainer.max_steps` steps, and
    return the `"kind": "train"` metrics records in step order and when the driver saw each step's line appear."""
    from raygrpo.train.metrics import read_metrics
    from raygrpo.train.run import train

    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    if metrics_path.exists():
        metrics_path.unlink()
    with _LineClock(metrics_path) as clock:
        summary = train(cfg, out, progress="log" if verbose else False)
    if summary.get("steps") != cfg.trainer["max_steps"]:
        raise RuntimeError(f"{out.name}: the run stopped at step {summary.get('steps')} of {cfg.trainer['max_steps']}")
    records = sorted((r for r in read_metrics(metrics_path) if r.get("kind") == "train"), key=lambda r: r["step"])
    return records, clock.seen


def run_once(args: argparse.Namespace, mode: str, latency_s: float, steps: int, out: Path) -> dict[str, Any]:
    """Train once and return the overlap figures of the steps after the first."""
    cfg = run_config(args, mode, latency_s, steps)
    log(f"{mode}: {steps} steps, latency {latency_s:.2f} s, out {out}")
    start = time.perf_counter()
    records, seen = train_watched(cfg, out, args.verbose)
    measured = records[1:]
    wall = seen[records[-1]["step"]] - seen[records[0]["step"]]
    result = {
        "mode": mode,
        "latency_s": latency_s,
        "measured_steps": len(measured),
        "idle_fraction": sum(r["wait_s"] for r in measured) / sum(r["step_s"] for r in measured),
        "steps_per_min": 60.0 * len(measured) / wall,
        "wall_s": wall,
        "wait_s_mean": statistics.fmean(r["wait_s"] for r in measured),
        "wait_s_median": statistics.median(r["wait_s"] for r in measured),
        "train_s_mean": statistics.fmean(r["train_s"] for r in measured),
        "train_s_median": statistics.median(r["train_s"] for r in measured),
        "step_s_mean": statistics.fmean(r["step_s"] for r in measured),
        "first_step_wait_s": records[0]["wait_s"],
        "dropped_groups": sum(r.get("dropped_groups", 0) for r in records),
        "mean_staleness": statistics.fmean(r["staleness_mean"] for r in measured),
        "scored_fraction": statistics.fmean(r.get("scored_fraction") or 0.0 for r in measured),
        "run_seconds": time.perf_counter() - start,
    }
    log(f"{mode}: idle {result['idle_fraction']:.3f}, {result['steps_per_min']:.1f} steps/min, "
        f"wait {result['wait_s_mean']:.2f} s, train {result['train_s_mean']:.2f} s per step, "
        f"staleness {result['mean_staleness']:.2f}, dropped {result['dropped_groups']} "
        f"({result['run_seconds']:.0f} s with start-up)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per mode (one more runs first)")
    parser.add_argument("--calibration-steps", type=int, default=4, help="measured steps of the calibration run")
    parser.add_argument("--repeats", type=int, default=2, help="sync/async pairs; medians are reported")
    parser.add_argument("--latency", type=float, default=None, help="rollout latency in s (skips calibration)")
    parser.add_argument("--batch", type=int, default=32, help="rollouts per step (per_device_train_batch_size)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per model turn (one turn)")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary one, removed)")
    parser.add_argument("--verbose", action="store_true", help="a line per step and the actors' output on stderr")
    args = parser.parse_args()

    from raygrpo.driver.runtime import init_ray, shutdown_ray

    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory(prefix="learner_overlap-")
    out = Path(args.out or tmp.name).resolve()
    t0 = time.perf_counter()
    # The actors' own output (TRL's per-step log dicts, warnings) only with --verbose; their errors still surface.
    init_ray(num_cpus=4, log_to_driver=args.verbose)
    try:
        calibration = None
        latency = args.latency
        if latency is None:
            calibration = run_once(args, "sync", 0.0, args.calibration_steps + 1, out / "calibrate")
            latency = calibration["train_s_median"]
            log(f"calibrated: median train_s {latency:.3f} s -> rollout latency {split_for(latency)}")
        latency = latency_of(split_for(latency))  # on the 10 ms grid of the splits
        runs: dict[str, list[dict[str, Any]]] = {"sync": [], "async": []}
        for r in range(args.repeats):
            # Alternate which mode goes first, so drift on the shared machine hits both alike.
            for mode in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
                runs[mode].append(run_once(args, mode, latency, args.steps + 1, out / f"{mode}-{r}"))
    finally:
        shutdown_ray()
        if tmp is not None:
            tmp.cleanup()

    def med(mode: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[mode])

    sync_idle, async_idle = med("sync", "idle_fraction"), med("async", "idle_fraction")
    print(json.dumps({
        "sync_idle_fraction": round(sync_idle, 4),
        "async_idle_fraction": round(async_idle, 4),
        "sync_steps_per_min": round(med("sync", "steps_per_min"), 2),
        "async_steps_per_min": round(med("async", "steps_per_min"), 2),
        "dropped_groups": med("async", "dropped_groups"),
        "mean_staleness": round(med("async", "mean_staleness"), 3),
        "idle_ratio": round(async_idle / sync_idle, 4) if sync_idle else None,
        "sync_wait_s": round(med("sync", "wait_s_mean"), 3),
        "async_wait_s": round(med("async", "wait_s_mean"), 3),
        "sync_train_s": round(med("sync", "train_s_mean"), 3),
        "async_train_s": round(med("async", "train_s_mean"), 3),
        "target": f"async_idle_fraction <= {TARGET_RATIO} * sync_idle_fraction",
        "target_met": async_idle <= TARGET_RATIO * sync_idle,
        "calibration_train_s": round(calibration["train_s_median"], 4) if calibration else None,
        "calibration_wait_s": round(calibration["wait_s_median"], 4) if calibration else None,
        "latency_s": latency,
        "measured_steps": args.steps,
        "note": "each mode runs steps+1 steps; the first (waiting for the first batch in both modes) is left out",
        "batch_rollouts": args.batch,
        "group_size": args.group_size,
        "max_tokens": args.max_tokens,
        "max_staleness": 1,
        "repeats": args.repeats,
        "runs": {mode: [{k: round(v, 4) if isinstance(v, float) else v for k, v in run.items()} for run in rs]
                 for mode, rs in runs.items()},
        "calibration": {k: round(v, 4) if isinstance(v, float) else v for k, v in (calibration or {}).items()},
        "total_seconds": round(time.perf_counter() - t0, 1),
    }))


if __name__ == "__main__":
    main()
