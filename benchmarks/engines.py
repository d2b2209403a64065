"""Engines: one rollout workload through the transformers engines and the vLLM engine actors, and vLLM alone.

Issue 40, item 6. One Ray runtime, then one process of vLLM alone:

1. **transformers** and **vllm**: `raygrpo.driver.collect.collect` (what `raygrpo rollout` runs) of the same run
   config but `policy.kind`: both example environments in one collect (`envs: {echo, arith}`, served embedded, as
   `examples/*/rollout.yaml` do), `--rollouts` per environment (the 8 train tasks of each × a group of
   `--rollouts / 8`), the tiny model (`model: tiny`), one engine actor of `--engine-cpus` CPUs with
   `policy.max_batch_size` = `--in-flight`, and `--in-flight` rollouts at once (2 env pool actors × `--in-flight / 2`),
   so the pool stays full until the last wave. Same sampling for both: `--max-tokens` per turn, temperature
   `--temperature`, `sampling.seed` `--seed` (the agent loop derives a seed per request), up to 8 turns and 2,048
   tokens per rollout (arith's limits). The tiny model is random, so it rarely writes a tool call: most rollouts are
   one turn of `--max-tokens`, which makes this a generation benchmark with an environment around it.
   `tokens_per_s` = the completion tokens the model wrote (`env_mask` 1: tool results and template glue left out),
   summed over the trajectories, / `wall_s`; `rollouts_per_s` = trajectories / `wall_s`. `wall_s` is the rollout
   window: from the first environment opened to the last one closed (the trajectories' `env_span`), so the engines'
   start (vLLM's is ~20 s on the CPU) and the actors' stop are outside it; `collect_s`, the whole `collect` call with
   them, is reported beside it.
2. **weight push** (vLLM): after the rollouts a fresh vLLM engine set (`start_engines`, the run's policy settings) takes
   the tiny model's weights `--pushes` times through `raygrpo.train.weights.push_weights` (the object store, the
   run's `WeightStore`, `set_weights`: drain, `reload_weights`, prefix cache reset); `weight_push_s` is the median
   wall time of one push as the learner sees it, `weight_load_s` the engine's own mean load time (`stats()`).
3. **vllm_alone** (the ceiling): every request the vLLM run sent — each turn's prompt (the trajectory's prompt ids and
   its completion ids up to that turn), its `max_tokens` (capped by the rollout's token budget, as the agent loop
   caps it) and its seed (`request_seed(seed, group/sample/attempt, turn)`, as the agent loop derives it) — through
   `vllm.LLM.generate` on the whole batch at once, in a fresh process (this script with `--alone`), no Ray, no
   environments, the same engine arguments as the engine actors (`raygrpo.policy.vllm_engine.engine_arg_values`:
   raygrpo's defaults, the CPU build's, `--kv-cache-mb`, `max_num_seqs` = `--in-flight`, seed 0) and the same
   per-request `SamplingParams` (`max_tokens`, `temperature`, `top_p`, `seed`, `logprobs=0`). The engine runs in that
   process as in the actors (`VLLM_ENABLE_V1_MULTIPROCESSING=0`; `--alone-multiprocessing` gives vLLM its own engine
   core process instead), with torch's threads set to `--engine-cpus`. Only `generate` is timed. With the same seeds
   and weights it writes the same tokens as the vLLM run (`same_ids`: the share of turns whose ids match), but every
   turn's prompt is there from the start: no turn waits for an environment or for the turn before it.
   `vllm_ratio_to_alone` = vllm `tokens_per_s` / vllm_alone `tokens_per_s`.

Prints progress to stderr and one JSON object last on stdout. Run: `python benchmarks/engines.py` (about 2.5 minutes on
2 cores; `--rollouts`, `--in-flight`, `--max-tokens`, `--engines`, `--pushes` to change it; `--out` keeps the run
folders and the requests file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

#: The example environments and their train splits' task counts (8 each).
ENVS = {"echo": ("examples/echo/env.py", "EchoEnvironment"), "arith": ("examples/arith/env.py", "ArithEnvironment")}
TASKS_PER_ENV = 8
MAX_TURNS = 8
MAX_TOTAL_TOKENS = 2048


def log(msg: str) -> None:
    print(f"[engines] {msg}", file=sys.stderr, flush=True)


def run_config(args: argparse.Namespace, kind: str):
    """The run config of one engine kind: both environments in one collect, `args.in_flight` rollouts at once."""
    from raygrpo.config import load_config

    policy: dict[str, Any] = {"kind": kind, "max_batch_size": args.in_flight, "engine_num_cpus": args.engine_cpus}
    if kind == "vllm":
        policy["vllm"] = vllm_overrides(args)
    return load_config(data={
        "envs": {name: {"kind": "ors", "environment": f"{ROOT / path}:{cls}", "split": "train",
                        "num_tasks": TASKS_PER_ENV}
                 for name, (path, cls) in ENVS.items()},
        "model": "tiny",
        "seed": args.seed,
        "policy": policy,
        "sampling": {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed},
        "rollout": {"group_size": args.rollouts // TASKS_PER_ENV, "max_turns": MAX_TURNS,
                    "max_total_tokens": MAX_TOTAL_TOKENS},
        "workers": {"num_env_actors": 2, "max_concurrent_per_actor": args.in_flight // 2},
        "ray": {"num_cpus": 4},
    })


def vllm_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """`policy.vllm` of the vLLM run (the alone run passes the same to `engine_arg_values`)."""
    return {"kv_cache_memory_bytes": args.kv_cache_mb << 20}


def read_trajectories(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def model_turns(env_mask: list[int]) -> list[tuple[int, int]]:
    """Where each model turn lies in a trajectory's completion: `(start, end)` of every run of `env_mask` 1s."""
    turns = []
    for i, m in enumerate(env_mask):
        if m == 1 and (i == 0 or env_mask[i - 1] == 0):
            turns.append([i, i + 1])
        elif m == 1:
            turns[-1][1] = i + 1
    return [(start, end) for start, end in turns]


def run_collect(args: argparse.Namespace, kind: str, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One collect of the workload with engine `kind`; returns its figures and its trajectories."""
    from raygrpo.driver.collect import collect

    cfg = run_config(args, kind)
    log(f"{kind}: {args.rollouts} rollouts per environment ({', '.join(ENVS)}), {args.in_flight} in flight, "
        f"max_tokens {args.max_tokens}, out {out}")
    started = time.perf_counter()
    summary = collect(cfg, out, progress="log")
    collect_s = time.perf_counter() - started
    trajs = read_trajectories(out / "trajectories.jsonl")
    spans = [t["env_span"] for t in trajs if t.get("env_span")]
    if len(spans) != len(trajs):
        raise RuntimeError(f"{kind}: {len(trajs) - len(spans)} trajectories have no env_span")
    wall = max(s[1] for s in spans) - min(s[0] for s in spans)
    tokens = sum(sum(t["env_mask"]) for t in trajs)
    turns = sum(t["turns"] for t in trajs)
    result = {
        "tokens_per_s": tokens / wall,
        "rollouts_per_s": len(trajs) / wall,
        "wall_s": wall,
        "collect_s": collect_s,
        "rollouts": len(trajs),
        "tokens": tokens,
        "turns": turns,
        "tool_calls": summary.get("tool_calls"),
        "max_concurrent_envs": summary.get("max_concurrent_envs"),
        "status_counts": summary.get("status_counts"),
        "retried_attempts": summary.get("retried_attempts"),
        "reward_mean": summary.get("reward_mean"),
    }
    if summary.get("completed") != summary.get("requested") or summary.get("retried_attempts"):
        log(f"{kind}: WARNING: {summary.get('completed')} of {summary.get('requested')} completed, "
            f"{summary.get('retried_attempts')} retried attempts: {summary.get('failure_causes')}")
    log(f"{kind}: {tokens} tokens in {len(trajs)} rollouts ({turns} turns) over {wall:.1f} s: "
        f"{result['tokens_per_s']:.1f} tokens/s, {result['rollouts_per_s']:.2f} rollouts/s "
        f"(collect {collect_s:.1f} s with start and stop; peak {result['max_concurrent_envs']} environments)")
    return result, trajs


def requests_of(trajs: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every generation request the trajectories' turns made: prompt ids, max_tokens and seed, as the agent loop sent
    them (`raygrpo.agent.rollout._episode`), and the ids the vLLM run answered with (`run_ids`)."""
    from raygrpo.policy.base import request_seed

    requests = []
    for t in trajs:
        turns = model_turns(t["env_mask"])
        if len(turns) != t["turns"]:
            raise RuntimeError(f"trajectory {t['group_id']}/{t['sample']}: {t['turns']} turns but {len(turns)} runs "
                               "of model tokens (an empty turn?)")
        sample_key = f"{t['group_id']}/{t['sample']}/{t['attempt']}"
        for turn_index, (start, end) in enumerate(turns):
            prompt = t["prompt_ids"] + t["completion_ids"][:start]
            requests.append({
                "prompt_ids": prompt,
                "max_tokens": min(args.max_tokens, MAX_TOTAL_TOKENS - len(prompt)),
                "seed": request_seed(args.seed, sample_key, turn_index),
                "run_ids": t["completion_ids"][start:end],
            })
    return requests


def measure_weight_push(args: argparse.Namespace) -> dict[str, Any]:
    """Start the vLLM run's engine set afresh and push the tiny model's weights to it `args.pushes` times."""
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from raygrpo.actors.policy_engine import start_engines, stop_engines
    from raygrpo.policy.tiny import resolve_model_path
    from raygrpo.train.weights import push_weights

    cfg = run_config(args, "vllm")
    model_path = resolve_model_path(cfg.model)
    log(f"weight push: starting {cfg.policy.num_engines} vLLM engine(s), then {args.pushes} pushes")
    engines = start_engines(cfg.policy, model_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        seconds = []
        for version in range(1, args.pushes + 1):
            started = time.perf_counter()
            versions = push_weights(model, engines, version)
            seconds.append(time.perf_counter() - started)
            if versions != [version] * len(engines):
                raise RuntimeError(f"push {version}: engines report versions {versions}")
        stats = ray.get(engines[0].stats.remote(), timeout=60)
    finally:
        stop_engines(engines)
    params = sum(p.numel() for p in model.parameters())
    result = {
        "weight_push_s": statistics.median(seconds),
        "weight_push_samples_s": seconds,
        "weight_load_s": stats["weight_update_s"] / max(1, stats["weight_updates"]),
        "parameters": params,
    }
    log(f"weight push: median {result['weight_push_s'] * 1000:.1f} ms per push of {params} parameters "
        f"(engine's own load {result['weight_load_s'] * 1000:.1f} ms)")
    return result


def run_alone(args: argparse.Namespace, requests_path: Path) -> dict[str, Any]:
    """Run this script with `--alone` in a fresh process and return what it measured."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if args.alone_multiprocessing else "0",
           "OMP_NUM_THREADS": str(max(1, int(round(args.engine_cpus))))}
    command = [sys.executable, str(Path(__file__).resolve()), "--alone", str(requests_path),
               "--in-flight", str(args.in_flight), "--engine-cpus", str(args.engine_cpus),
               "--kv-cache-mb", str(args.kv_cache_mb), "--temperature", str(args.temperature)]
    log(f"vllm_alone: {' '.join(command[2:])} (VLLM_ENABLE_V1_MULTIPROCESSING="
        f"{env['VLLM_ENABLE_V1_MULTIPROCESSING']})")
    proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm_alone exited {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alone_main(args: argparse.Namespace) -> None:
    """`--alone REQUESTS`: generate every request with `vllm.LLM.generate` in one call; print one JSON line."""
    import torch

    from raygrpo.policy.tiny import resolve_model_path
    from raygrpo.policy.vllm_engine import engine_arg_values

    requests = read_trajectories(Path(args.alone))
    model_path = resolve_model_path("tiny")
    torch.set_num_threads(max(1, int(round(args.engine_cpus))))  # as the engine actor does (`num_threads`)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = engine_arg_values(model_path, args.in_flight, 0, vllm_overrides(args))
    kwargs.setdefault("disable_log_stats", False)  # LLM turns stats off by default; the actors' LLMEngine keeps them
    started = time.perf_counter()
    llm = LLM(**kwargs)
    load_s = time.perf_counter() - started
    prompts = [TokensPrompt(prompt_token_ids=r["prompt_ids"]) for r in requests]
    params = [SamplingParams(max_tokens=r["max_tokens"], temperature=args.temperature, top_p=1.0, seed=r["seed"],
                             logprobs=0) for r in requests]
    log(f"vllm_alone: {len(requests)} requests through LLM.generate (engine up in {load_s:.1f} s)")
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    same = sum(list(o.outputs[0].token_ids) == r["run_ids"] for o, r in zip(outputs, requests)) / len(requests)
    log(f"vllm_alone: {tokens} tokens in {seconds:.2f} s: {tokens / seconds:.1f} tokens/s; {same:.1%} of the turns "
        "the same ids as in the vLLM run")
    print(json.dumps({"tokens_per_s": tokens / seconds, "generate_s": seconds, "tokens": tokens,
                      "requests": len(requests), "same_ids": same, "engine_start_s": load_s,
                      "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")}))


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=128,
                        help=f"rollouts per environment (a multiple of its {TASKS_PER_ENV} tasks: the group size)")
    parser.add_argument("--in-flight", type=int, default=64,
                        help="rollouts at once (2 env pool actors × half); also the engines' batch (max_num_seqs)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per model turn")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="sampling.seed (a seed per request is derived from it)")
    parser.add_argument("--engines", default="transformers,vllm", help="engine kinds to run, in order")
    parser.add_argument("--engine-cpus", type=float, default=1.0, help="policy.engine_num_cpus (torch threads)")
    parser.add_argument("--kv-cache-mb", type=int, default=256, help="policy.vllm.kv_cache_memory_bytes in MiB")
    parser.add_argument("--pushes", type=int, default=5, help="weight pushes to the vLLM engine (0: none)")
    parser.add_argument("--no-alone", action="store_true", help="skip vllm_alone")
    parser.add_argument("--alone-multiprocessing", action="store_true",
                        help="vllm_alone with VLLM_ENABLE_V1_MULTIPROCESSING=1 (vLLM's engine core process)")
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temporary one, removed)")
    parser.add_argument("--verbose", action="store_true", help="the actors' output on stderr")
    parser.add_argument("--alone", default=None, help=argparse.SUPPRESS)  # internal: the vllm_alone process
    args = parser.parse_args()
    if args.alone:
        alone_main(args)
        return
    kinds = [k.strip() for k in args.engines.split(",") if k.strip()]
    if not kinds or set(kinds) - {"transformers", "vllm"}:
        parser.error(f"--engines: transformers and/or vllm, got {args.engines!r}")
    if args.rollouts < TASKS_PER_ENV or args.rollouts % TASKS_PER_ENV:
        parser.error(f"--rollouts must be a multiple of {TASKS_PER_ENV}")
    if args.in_flight < 2 or args.in_flight % 2:
        parser.error("--in-flight must be even (2 env pool actors)")

    from raygrpo.driver.runtime import init_ray, shutdown_ray
    from raygrpo.policy.tiny import ensure_tiny_model

    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory(prefix="engines-")
    out = Path(args.out or tmp.name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    ensure_tiny_model()  # built once, before any timer
    results: dict[str, Any] = {}
    try:
        trajs_by_kind: dict[str, list[dict[str, Any]]] = {}
        init_ray(num_cpus=4, log_to_driver=args.verbose)
        try:
            for kind in kinds:
                results[kind], trajs_by_kind[kind] = run_collect(args, kind, out / kind)
            if "vllm" in kinds and args.pushes > 0:
                results["vllm"].update(measure_weight_push(args))
        finally:
            shutdown_ray()
        if "vllm" in kinds and not args.no_alone:
            requests = requests_of(trajs_by_kind["vllm"], args)
            requests_path = out / "vllm_requests.jsonl"
            with requests_path.open("w") as f:
                for r in requests:
                    f.write(json.dumps(r) + "\n")
            results["vllm_alone"] = run_alone(args, requests_path)
    finally:
        if tmp is not None:
            tmp.cleanup()

    alone = results.get("vllm_alone")
    ratio = results["vllm"]["tokens_per_s"] / alone["tokens_per_s"] if alone and "vllm" in results else None
    if ratio is not None:
        log(f"vllm / vllm_alone: {ratio:.3f}")
    print(json.dumps({
        **{kind: rounded(results[kind]) for kind in ("transformers", "vllm", "vllm_alone") if kind in results},
        "vllm_ratio_to_alone": round(ratio, 4) if ratio is not None else None,
        "rollouts_per_env": args.rollouts,
        "envs": list(ENVS),
        "in_flight": args.in_flight,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "engine_cpus": args.engine_cpus,
        "kv_cache_mb": args.kv_cache_mb,
        "total_seconds": round(time.perf_counter() - t0, 1),
    }))


if __name__ == "__main__":
    main()
