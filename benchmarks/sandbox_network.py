"""What a local sandbox's network costs: starts of `public` sandboxes (slirp4netns and a firewall in their network
namespace) against `no-network` ones (a network namespace with loopback only), side by side.

    .venv/bin/python benchmarks/sandbox_network.py [--repeats 3] [--sequential 20] [--batch 16]

Each repeat, per mode (interleaved): one untimed sandbox, then `--sequential` sandboxes started, given one `true`
exec and stopped one after another (start p50, CPU per sandbox), then `--batch` at once (wall, CPU per sandbox).
CPU is this process's and its reaped children's (bwrap, nsenter, slirp4netns, iptables-restore): the kernel's work
for them is not all in it. Prints one JSON object last: per mode, the median over repeats of each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harbor.models.task.task import Task

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from provisioning import local_sandbox  # noqa: E402

MODES = {"public": "", "no-network": 'network_mode = "no-network"\n'}


def cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def write_task(root: Path, name: str, environment: str) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "task.toml").write_text(f'[task]\nname = "bench/{name}"\n\n[environment]\n{environment}')
    (task / "environment" / "Dockerfile").write_text("FROM python:3.12-slim\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return task


async def one(task: Task, root: Path) -> float:
    """Start, exec `true`, stop one local sandbox; the start's seconds."""
    env, _ = local_sandbox(task, root)
    began = time.perf_counter()
    await env.start(force_build=False)
    started = time.perf_counter() - began
    try:
        await env.exec("true")
    finally:
        await env.stop(delete=True)
    return started


async def measure(task: Task, root: Path, sequential: int, batch: int) -> dict[str, float]:
    await one(task, root)
    before = cpu_s()
    starts = [await one(task, root) for _ in range(sequential)]
    seq_cpu = (cpu_s() - before) / sequential
    before, began = cpu_s(), time.perf_counter()
    await asyncio.gather(*(one(task, root) for _ in range(batch)))
    return {
        "start_p50_ms": statistics.median(starts) * 1000,
        "cpu_ms_per_sandbox": seq_cpu * 1000,
        "batch_s": time.perf_counter() - began,
        "batch_cpu_ms_per_sandbox": (cpu_s() - before) / batch * 1000,
    }


async def main(args: argparse.Namespace) -> dict:
    root = Path(tempfile.mkdtemp(prefix="raygrpo-bench-net-"))
    tasks = {mode: Task(write_task(root / "tasks", mode, toml)) for mode, toml in MODES.items()}
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for mode, task in tasks.items():
            runs[mode].append(await measure(task, root, args.sequential, args.batch))
            print(f"repeat {repeat + 1}/{args.repeats} {mode}: {runs[mode][-1]}", file=sys.stderr)
    medians = {mode: {key: round(statistics.median(r[key] for r in rs), 2) for key in rs[0]}
               for mode, rs in runs.items()}
    return {"benchmark": "sandbox_network", "repeats": args.repeats, "sequential": args.sequential,
            "batch": args.batch, **medians,
            "public_extra_start_ms": round(medians["public"]["start_p50_ms"] - medians["no-network"]["start_p50_ms"], 2),
            "public_extra_cpu_ms": round(medians["public"]["cpu_ms_per_sandbox"]
                                         - medians["no-network"]["cpu_ms_per_sandbox"], 2)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sequential", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    logging.basicConfig(level=logging.ERROR)
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
