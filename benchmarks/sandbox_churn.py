"""Sandbox churn: the local (bwrap) backend's own cost of starting, using and stopping many sandboxes at once.

No Ray, no agent loop: `--sandboxes` (64) `LocalSandboxEnvironment`s of one small task, created through Harbor's
factory as raygrpo's actors create them, all started at once, each running one short exec, then all stopped at
once; `--rounds` (3) such rounds, the median reported. Per phase (`start`, `exec`, `stop`): the wall of the phase
and the CPU this process spent in it (`getrusage` of itself: the backend's Python and the kernel work of its system
calls: directories, forks) and of its children (bwrap, nsenter, the commands), per sandbox in milliseconds.

What it is for: a stop's cost must not grow with the number of sandboxes alive beside it. (Until `stop` skipped
it, every stop read the environment of every process on the machine to find stragglers: a few milliseconds per
stop at 64 sandboxes, growing with the processes of all the others.) Run it with `--sandboxes 16` and `--sandboxes
128` to see how the per-sandbox figures move, and with `--root /dev/shm` to see what the filesystem under the
sandboxes' host directories costs (their directories are made at each start and removed at each stop; `--root` is
where the sandboxes' root goes, the backend's `sandbox_root`). Prints progress to stderr and one JSON object last.

Run: `python benchmarks/sandbox_churn.py` (about 15 s on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from provisioning import local_sandbox  # noqa: E402

PHASES = ("start", "exec", "stop")
TASK = ROOT / "examples" / "harbor_local" / "tasks" / "count-words"


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


async def one_round(task: Any, count: int, work: Path) -> dict[str, dict[str, float]]:
    envs = [local_sandbox(task, work)[0] for _ in range(count)]
    steps = {"start": lambda e: e.start(force_build=False), "exec": lambda e: e.exec("wc -w < /app/poem.txt"),
             "stop": lambda e: e.stop(delete=True)}
    out: dict[str, dict[str, float]] = {}
    for phase in PHASES:
        (own0, kids0), t0 = _cpu(), time.perf_counter()
        results = await asyncio.gather(*(steps[phase](e) for e in envs), return_exceptions=True)
        wall = time.perf_counter() - t0
        own1, kids1 = _cpu()
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(e.stop(delete=True) for e in envs), return_exceptions=True)
            raise RuntimeError(f"{phase}: {len(errors)} of {count} failed, first: {errors[0]!r}")
        out[phase] = {"wall_s": wall, "own_cpu_ms": 1000 * (own1 - own0) / count,
                      "children_cpu_ms": 1000 * (kids1 - kids0) / count}
    left = list((work / "sandboxes").iterdir()) if (work / "sandboxes").exists() else []
    if left:
        raise RuntimeError(f"{len(left)} sandbox directories left after the stops")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", default=None, help="the folder the sandboxes' root goes in (default: the system's "
                        "temporary folder)")
    args = parser.parse_args()

    from harbor.models.task.task import Task

    task = Task(TASK)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="raygrpo-churn-", dir=args.root) as work:
        for r in range(args.rounds):
            rounds.append(asyncio.run(one_round(task, args.sandboxes, Path(work))))
            print(f"[churn] round {r + 1}: " + ", ".join(
                f"{p} {rounds[-1][p]['wall_s']:.2f} s / {rounds[-1][p]['own_cpu_ms']:.1f} ms own" for p in PHASES),
                file=sys.stderr, flush=True)
    print(json.dumps({
        "sandboxes": args.sandboxes, "rounds": args.rounds, "task": TASK.name, "root": str(Path(work).parent),
        **{phase: {key: round(statistics.median(r[phase][key] for r in rounds), 3) for key in rounds[0][phase]}
           for phase in PHASES},
    }))


if __name__ == "__main__":
    main()
