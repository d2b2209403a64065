"""ORS throughput: tool calls per second through raygrpo, vs the bare SDK ceiling, vs TRL's adapter.

DESIGN section 6, item 2. One local ORS server (its own process) runs `ors_bench_env.BenchEnvironment`: episodes of 4
`step` calls, each answered after 50 ms, rewarded at the end. Three arms, all against that server, all with the SDK's
update check off:

- **ceiling**: a bare `AsyncOpenReward` loop with every episode in flight at once, split over as many processes as
  raygrpo has env pool actors;
- **raygrpo**: the real `rollout` code path (env pool actors, agent loop, tokenizer, tool-call parser, scripted
  policy); Ray start-up and actor creation stay outside the timer;
- **trl**: TRL's `OpenRewardSpec` adapter driven the way GRPOTrainer drives it: every reset of the batch one after
  another, then each turn's calls one rollout after another (fewer episodes: it is a rate).

Prints progress to stderr and one JSON object last on stdout. Run: `python benchmarks/ors_throughput.py`
(about a minute on 2 cores; `--episodes`, `--trl-episodes`, `--actors`, `--repeats` to change the shape).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from ors_bench_env import CALLS_PER_EPISODE  # noqa: E402


def log(msg: str) -> None:
    print(f"[ors_throughput] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "ors_bench_env.py"), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the benchmark ORS server did not start within 60 s")


# ── ceiling: the bare async SDK ────────────────────────────────────────────────────────────────────────────────────


async def _bare_episodes(url: str, indices: list[int]) -> int:
    from openreward import AsyncOpenReward

    client = AsyncOpenReward(base_url=url)
    env = client.environments.get("benchenvironment", base_url=url)

    async def episode(index: int) -> int:
        async with env.session(split="train", index=index) as session:
            await session.get_prompt()
            await session.list_tools(format="openai")
            for n in range(1, CALLS_PER_EPISODE + 1):
                await session.call_tool("step", {"n": n})
        return CALLS_PER_EPISODE

    try:
        return sum(await asyncio.gather(*(episode(i) for i in indices)))
    finally:
        await client.environments.aclose()


def _ceiling_worker(url: str, indices: list[int], ready, go, results) -> None:
    # Imports happen before the barrier, so process start-up stays outside the timer.
    import openreward  # noqa: F401

    ready.set()
    go.wait()
    results.put(asyncio.run(_bare_episodes(url, indices)))


def run_ceiling(url: str, episodes: int, processes: int) -> float:
    ctx = mp.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    readies, procs = [], []
    for p in range(processes):
        ready = ctx.Event()
        proc = ctx.Process(target=_ceiling_worker, args=(url, list(range(p, episodes, processes)), ready, go, results))
        proc.start()
        readies.append(ready)
        procs.append(proc)
    for ready in readies:
        ready.wait(120)
    start = time.perf_counter()
    go.set()
    calls = sum(results.get(timeout=300) for _ in procs)
    wall = time.perf_counter() - start
    for proc in procs:
        proc.join(30)
    return calls / wall


# ── TRL's adapter, driven like GRPOTrainer ─────────────────────────────────────────────────────────────────────────


def run_trl(url: str, episodes: int) -> float:
    from trl.experimental.openreward import OpenRewardSpec

    # TRL's adapter builds its SDK environment without `base_url`; these point the SDK at the local server.
    os.environ["OPENREWARD_API_URL"] = url
    os.environ["OPENREWARD_SESSION_URL"] = url
    spec = OpenRewardSpec(url, num_tasks=episodes, env_name="benchenvironment", discover_task_tools=False)
    dataset = spec.train_dataset
    envs = [spec.environment_factory() for _ in range(episodes)]
    start = time.perf_counter()
    for env, index in zip(envs, dataset["task_index"]):
        env.reset(task_index=index)
    calls = 0
    for n in range(1, CALLS_PER_EPISODE + 1):
        for env in envs:
            env.step(n=n)
            calls += 1
    wall = time.perf_counter() - start
    for env in envs:
        env._close()
    return calls / wall


# ── raygrpo ────────────────────────────────────────────────────────────────────────────────────────────────────────


def raygrpo_config(url: str, episodes: int, actors: int):
    from raygrpo.config import load_config

    return load_config(data={
        "envs": {"bench": {"kind": "ors", "url": url, "env_name": "benchenvironment", "num_tasks": episodes}},
        "model": "tiny",
        "policy": {"kind": "scripted", "script": str(HERE / "ors_bench_env.py") + ":policy"},
        "sampling": {"max_tokens": 64},
        "rollout": {"group_size": 1, "max_turns": CALLS_PER_EPISODE + 1},
        "workers": {"num_env_actors": actors, "max_concurrent_per_actor": -(-episodes // actors)},
    })


def run_raygrpo(runtime, episodes: int) -> tuple[float, dict]:
    from raygrpo.driver.attempts import make_groups
    from raygrpo.driver.orchestrator import Orchestrator
    from raygrpo.driver.pools import PoolSet

    requests = make_groups(runtime.tasks[:episodes], group_size=1)
    orchestrator = Orchestrator(PoolSet.of_actors(runtime.actors, runtime.cfg.workers.max_concurrent_per_actor))
    start = time.perf_counter()
    trajs = list(orchestrator.run(requests))
    wall = time.perf_counter() - start
    calls = sum(t.tool_calls for t in trajs)
    statuses = {s: sum(1 for t in trajs if t.status.value == s) for s in {t.status.value for t in trajs}}
    rewards = [t.reward for t in trajs if t.reward is not None]
    return calls / wall, {"statuses": statuses, "reward_mean": statistics.fmean(rewards) if rewards else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--trl-episodes", type=int, default=16)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs per arm; medians are reported")
    args = parser.parse_args()

    from raygrpo.driver.launch import RolloutRuntime
    from raygrpo.driver.resolve import resolve_run
    from raygrpo.driver.runtime import init_ray, shutdown_ray

    server, url = start_server()
    log(f"server at {url}")
    try:
        init_ray(num_cpus=4)
        cfg = raygrpo_config(url, args.episodes, args.actors)
        samples: dict[str, list[float]] = {"raygrpo": [], "ceiling": [], "trl": []}
        checks = {}
        with RolloutRuntime(cfg, resolve_run(cfg).tasks_by_env) as runtime:
            for r in range(args.repeats):
                # Side by side in the same run, arms interleaved so drift hits them alike.
                rate, checks = run_raygrpo(runtime, args.episodes)
                samples["raygrpo"].append(rate)
                samples["ceiling"].append(run_ceiling(url, args.episodes, args.actors))
                samples["trl"].append(run_trl(url, args.trl_episodes))
                log(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} calls/s" for k, v in samples.items()))
        shutdown_ray()
    finally:
        server.terminate()
        server.wait(30)
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(json.dumps({
        "raygrpo_calls_per_s": round(med["raygrpo"], 1),
        "ceiling_calls_per_s": round(med["ceiling"], 1),
        "trl_calls_per_s": round(med["trl"], 1),
        "ratio_to_ceiling": round(med["raygrpo"] / med["ceiling"], 3),
        "speedup_vs_trl": round(med["raygrpo"] / med["trl"], 1),
        "episodes": args.episodes,
        "trl_episodes": args.trl_episodes,
        "calls_per_episode": CALLS_PER_EPISODE,
        "actors": args.actors,
        "repeats": args.repeats,
        "samples": {k: [round(x, 1) for x in v] for k, v in samples.items()},
        "raygrpo_check": checks,
    }))


if __name__ == "__main__":
    main()
