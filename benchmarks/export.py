"""`raygrpo export` of a large run: time and peak memory per format (issue 45).

What runs:

- A `trajectories.jsonl` of `--trajectories` lines (100,000 by default) is generated, shaped like a Harbor run's and
  each one different (seeded): a prompt of 150-300 token ids, 1-3 turns of 20-80 model tokens with full-precision
  log-probabilities, tool results of 20-100 environment tokens between them, the matching messages (a bash call per
  turn but the last, its output, a final answer), one environment step per call, per-phase timings, a verifier's
  evidence and the task's metadata: about 6 KB a line, every field of schema_version 5.
- Each format is exported by the real command, `raygrpo export FILE --format F --out ...` (`raygrpo.cli.main`), in
  a child process of its own, so each peak RSS is that export's alone. The child imports what the export uses
  (pyarrow, datasets, pandas, harbor's models) first and reports that RSS as `baseline_rss_mib`: the export's own
  working memory is `peak_rss_mib` minus it. Peak RSS is `resource.getrusage(RUSAGE_SELF).ru_maxrss`, including
  file pages `datasets` maps to read its Arrow cache (shared and reclaimable, but counted).
- The same is run on a file of a tenth of the lines: bounded memory shows as the same peak at both sizes.

Printed: progress on stderr and ONE JSON object last: `trajectories`, `input_mib`, `generate_seconds`, and per format
(`parquet`, `hf`, `atif`) `seconds`, `peak_rss_mib`, `baseline_rss_mib`, `output_mib`, `written`, plus
`peak_rss_mib_at_tenth` (the same export of the tenth-size file) and `seconds_at_tenth`.

    .venv/bin/python benchmarks/export.py              # 100,000 trajectories (several minutes on 2 cores)
    .venv/bin/python benchmarks/export.py --quick      # 2,000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("benchmarks.export")

FORMATS = ("parquet", "hf", "atif")
COMMANDS = ["ls -la /app", "cat /app/config.json", "python3 -m pytest -q /app/tests", "grep -rn TODO /app/src",
            "sed -i 's/old/new/' /app/main.py", "find /app -name '*.py' | head"]


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(32_000) for _ in range(n)]


def make_line(i: int, rng: random.Random) -> dict[str, Any]:
    """One trajectory line of schema_version 5, Harbor-shaped (see the module docstring)."""
    turns = rng.randint(1, 3)
    prompt_ids = _ids(rng, rng.randint(150, 300))
    completion_ids: list[int] = []
    logprobs: list[float] = []
    env_mask: list[int] = []
    instruction = f"Task {i}: fix the failing test in /app. " + "Keep the rest of the code unchanged. " * 4
    messages: list[dict[str, Any]] = [{"role": "user", "content": instruction}]
    steps = []
    for turn in range(turns):
        n = rng.randint(20, 80)
        completion_ids += _ids(rng, n)
        logprobs += [-rng.expovariate(3.0) for _ in range(n)]
        env_mask += [1] * n
        if turn < turns - 1:
            command = rng.choice(COMMANDS)
            messages.append({"role": "assistant", "content": "",
                             "tool_calls": [{"type": "function", "function": {"name": "bash",
                                                                              "arguments": {"command": command}}}]})
            output = f"$ {command}\n" + "".join(f"line {k}: {rng.random():.6f}\n" for k in range(rng.randint(2, 20)))
            messages.append({"role": "tool", "name": "bash", "content": output + "[exit code 0]"})
            steps.append({"tool": "bash", "reward": None, "finished": False, "metadata": None})
            m = rng.randint(20, 100)
            completion_ids += _ids(rng, m)
            logprobs += [0.0] * m
            env_mask += [0] * m
        else:
            messages.append({"role": "assistant", "content": "I fixed the test and ran it: it passes."})
    reward = rng.choice([0.0, 1.0])
    total = rng.uniform(2, 60)
    start = 1_800_000_000 + i * 0.5
    return {
        "schema_version": 5,
        "task": {"env": "suite", "index": i % 500, "split": "train", "prompt": None,
                 "metadata": {"task_dir": f"/tasks/task-{i % 500}", "task_name": f"org/task-{i % 500}",
                              "instruction": instruction, "difficulty": rng.choice(["easy", "medium", "hard"])}},
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "logprobs": logprobs,
        "env_mask": env_mask,
        "messages": messages,
        "reward": reward,
        "status": "ok",
        "error": None,
        "turns": turns,
        "tool_calls": len(steps),
        "timings": {"provision": total * 0.3, "generate": total * 0.4, "tools": total * 0.1, "verify": total * 0.2,
                    "total": total, "governor_wait": rng.random() * 0.01, "start": total * 0.25},
        "policy_versions": [i // 1000] * turns,
        "attempt": 0,
        "group_id": f"suite:train:{i % 500}:{i // 8:08x}",
        "sample": i % 8,
        "worker": f"raygrpo-envpool-{i % 4}",
        "node": f"10.0.0.{i % 4 + 1}",
        "env_span": [start, start + total],
        "steps": steps,
        "verifier": {"exit_code": 0 if reward else 1, "output_tail": "=== 3 passed, %d failed ===\n" % (1 - reward),
                     "rewards": {"reward": reward}},
        "sandbox": rng.choice(["cold", "warm"]),
    }


def generate(path: Path, n: int, seed: int = 0) -> float:
    """Write `n` lines to `path`; returns the seconds it took."""
    began = time.perf_counter()
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps(make_line(i, rng), ensure_ascii=False) + "\n")
    return time.perf_counter() - began


def _rss_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def child(source: str, fmt: str, out: str) -> None:
    """Export `source` to `out` with the CLI in this process; print one JSON object with time and memory."""
    import datasets  # noqa: F401 - what the export uses, imported before the baseline
    import harbor.models.trajectories  # noqa: F401
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from raygrpo.cli import main

    baseline = _rss_mib()
    began = time.perf_counter()
    code = main(["export", source, "--format", fmt, "--out", out, "--no-progress"])
    seconds = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"code": code, "seconds": round(seconds, 2), "peak_rss_mib": round(peak, 1),
                      "baseline_rss_mib": round(baseline, 1)}))


def _size_mib(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def export_once(source: Path, fmt: str, work: Path) -> dict[str, Any]:
    out = work / f"out.{fmt}"
    proc = subprocess.run([sys.executable, __file__, "--child", str(source), fmt, str(out)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"export to {fmt} failed: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result.pop("code") != 0:
        raise RuntimeError(f"export to {fmt} exited non-zero: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
    result["output_mib"] = round(_size_mib(out), 1)
    result["written"] = (len(list(out.glob("*.json"))) if fmt == "atif"
                         else int(proc.stdout.split("wrote ")[1].split(" ")[0]))
    shutil.rmtree(out) if out.is_dir() else out.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="2,000 trajectories")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--work-dir", help="where to write the files (default: a temporary folder, removed)")
    parser.add_argument("--child", nargs=3, metavar=("SOURCE", "FORMAT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    n = 2_000 if args.quick else args.trajectories
    formats = [f for f in args.formats.split(",") if f]
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="raygrpo-export-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        full, tenth = work / "full" / "trajectories.jsonl", work / "tenth" / "trajectories.jsonl"
        full.parent.mkdir(exist_ok=True)
        tenth.parent.mkdir(exist_ok=True)
        logger.info("generating %d trajectories", n)
        gen_seconds = generate(full, n)
        generate(tenth, n // 10)
        result: dict[str, Any] = {"trajectories": n, "input_mib": round(full.stat().st_size / 2**20, 1),
                                  "generate_seconds": round(gen_seconds, 1)}
        for fmt in formats:
            logger.info("exporting %d trajectories to %s", n // 10, fmt)
            small = export_once(tenth, fmt, tenth.parent)
            logger.info("exporting %d trajectories to %s", n, fmt)
            big = export_once(full, fmt, full.parent)
            big["peak_rss_mib_at_tenth"] = small["peak_rss_mib"]
            big["seconds_at_tenth"] = small["seconds"]
            result[fmt] = big
            logger.info("%s: %s", fmt, big)
        print(json.dumps(result))
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
