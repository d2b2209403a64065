"""Staleness: async GRPO on groups that arrive 0-2 versions stale, with and without off-policy correction, vs sync.

DESIGN section 6, item 10; issue 41. Real `raygrpo train` runs (`raygrpo.train.run.train`: env pool actors, a
transformers engine, the learner actor with TRL's GRPOTrainer, all on the tiny model) on the echo task of
`examples/echo` served by `staleness_env.StalenessEchoEnvironment`, whose `echo` call answers after a seeded random
latency per rollout (slow with probability 0.1, see that module). At the default `--scale` (2.5 s) a slow rollout
lasts about three training steps, so the learner sometimes waits and the groups it consumes are 0, 1 or 2 versions
stale (`staleness_counts`); at 0.6 s rollouts end within a step and nearly every group is 2 versions stale. One Ray
runtime serves every run.

Per seed: the tiny model gets `examples/echo`'s supervised format warm-up once, in this process (it then calls
`echo` with one of 8 words at random: ~1 in 8 rollouts wins), and every arm starts GRPO from that saved model, with
the same run seed and the same latency draws (the split `stale-<scale>-s<seed>`). Arms, same workload (one task,
`--steps` steps of 4 groups of 8, two turns of at most 48 tokens, `--lr` (5e-4 constant), no KL):

- `none`: async, `train.max_staleness: 2`, `off_policy: {mode: none}`, `behaviour_ratio: false` (TRL as is: its
  ratio is against the learner's own log-probs at the generation batch, so stale groups are trained on uncorrected).
- `behaviour`: async, `off_policy: {mode: none}`, `behaviour_ratio: true` (PPO ratio against the sampling log-probs).
- `tis`: async, `off_policy: {mode: tis}` (async mode's default since 2026-12-06; decoupled PPO: clip against the proximal policy's log-probs, by default
  a moving average of the learner's weights one optimizer step behind (PPO-EWMA, `proximal_decay` 0.5;
  `--proximal-decay 0`: the learner's own weights at the batch, the arm as first measured); advantages times the
  importance weight pi_prox / pi_behaviour truncated to [0, 2]).
- `mis` (not run unless named in `--arms`): as `tis`, but tokens whose weight falls outside [0.5, 2] get weight 0
  instead of being truncated (masked importance sampling, IcePop).
- `sync`: sync mode, the run's default correction (each step waits for its slowest rollout; no group is stale).

`--mask-truncated` sets `trainer.mask_truncated_completions` in every arm: rollouts cut at the token limit leave the
loss (DAPO's overlong filtering) instead of training with their advantage.

Per arm, from `metrics.jsonl`: the reward curve (mean reward of each generation batch with unscored rollouts at 0,
against groups consumed: 4 per step in every arm; with `--steps-per-generation` k a batch of 4k groups feeds k
steps, and only the step that consumed it carries its figures), `auc` (the curve's mean over all batches: the area
under reward vs groups consumed, per group), `final_reward` (mean of the last 5 batches), `peak_reward`, `clip_frac`
(`clip_ratio/region_mean` mean over steps), `truncated_frac` (`is_weight/truncated_frac` mean), `masked_frac`
(`mis`: `is_weight/masked_frac` mean), `is_weight_max`, `dropped_groups` (`dropped_groups_total` at the end),
`mean_staleness` / `max_staleness`, `staleness_counts` (consumed groups per staleness over the run), `steps_per_min`
(wall time between the first and the last step's metrics line, as the driver sees them appear), and
`ended_below_start`. All arms' curves go into
one plot, `OUT/staleness_rewards.png`.

Targets, per seed (each reported with whether it held in every seed, `met`, the issue's reading; and with its margin
per seed and the median margin over the seeds, `met_on_median`, a reading that one seed's tie does not decide):
`tis_vs_sync_per_group`: auc(tis) >= 0.9 * auc(sync); `tis_faster_than_sync`: steps_per_min(tis) >
steps_per_min(sync); `tis_better_than_none`: auc(tis) > auc(none); `tis_no_collapse`: final_reward(tis) >= peak(tis)
- 0.5. The same four are reported for `mis` (`mis_vs_sync_per_group`, ...) when it ran. Beside them, not part of
`all_met`: `tis_ends_above_start` (last-5 mean >= first-5 mean), the failure the collapse rule misses (a run whose
peak stayed under 0.5 above its start and that ended at 0).

Prints progress to stderr and one JSON line on stdout: the arms as keys (per-seed figures under `seeds`, medians
beside them), and `targets`. Run: `python benchmarks/staleness.py --quick` (one seed: ~13 minutes on 2 cores at load
1-6, warm-up 11-18 s, sync 5-6 min, each async arm 2-2.7 min with its start-up) or `python benchmarks/staleness.py --seeds
0 1 2` (three seeds; `--reuse` takes arms an earlier run left in `--out`). `--out` keeps the run folders and the plot (default
`runs/bench-staleness`); `--dry-run` runs 3 steps per arm to check the plumbing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from learner_overlap import train_watched  # noqa: E402
from staleness_env import split_for  # noqa: E402

ARMS = ("sync", "none", "behaviour", "tis")
#: Arms run only when `--arms` names them.
EXTRA_ARMS = ("mis",)
GROUPS_PER_STEP = 4
GROUP_SIZE = 8
LAST_N = 5


def log(msg: str) -> None:
    print(f"[staleness] {msg}", file=sys.stderr, flush=True)


def warm_up(seed: int, steps: int, out: Path) -> tuple[Path, dict[str, Any]]:
    """The echo example's format warm-up on the tiny model (`steps` steps, seeded by `seed`), saved to `out`;
    reused if there. One torch thread: on 2 shared cores more threads spin against each other."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from raygrpo.config.train import WarmupConfig
    from raygrpo.policy.tiny import resolve_model_path
    from raygrpo.train.warmup import warm_up_on

    if (out / "config.json").exists():
        return out, {"reused": True}
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    path = resolve_model_path("tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    cfg = WarmupConfig(examples=f"{ROOT / 'examples/echo/warmup.py'}:format_examples", seed=seed, steps=steps)
    stats = warm_up_on("cpu", model, tokenizer, cfg)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, stats


def run_config(args: argparse.Namespace, arm: str, seed: int, model: Path):
    """The run config of one arm."""
    from raygrpo.config import load_config

    train: dict[str, Any] = {"mode": "sync" if arm == "sync" else "async", "eval_every": 0, "save_rollouts": False}
    if arm != "sync":
        train["max_staleness"] = 2  # sync mode reads none
    if arm in ("none", "behaviour"):
        train.update(off_policy={"mode": "none"}, behaviour_ratio=arm == "behaviour")
    elif arm in ("tis", "mis"):
        train.update(off_policy={"mode": arm})
        if args.proximal_decay is not None:
            train["off_policy"]["proximal_decay"] = args.proximal_decay
    return load_config(data={
        "envs": {"stale": {
            "kind": "ors",
            "environment": f"{HERE / 'staleness_env.py'}:StalenessEchoEnvironment",
            "split": split_for(args.scale, seed),
            "indices": [0],
        }},
        "model": str(model),
        "seed": seed,
        "policy": {"kind": "transformers", "max_batch_size": 32},
        "sampling": {"max_tokens": 48, "temperature": 1.0, "seed": seed},
        "rollout": {"group_size": GROUP_SIZE, "max_turns": 2, "max_total_tokens": 1024},
        # Room for every outstanding rollout of async mode (3 generation batches) while they wait in `echo`.
        "workers": {"num_env_actors": 2, "max_concurrent_per_actor": max(64, 48 * args.steps_per_generation)},
        "train": train,
        "trainer": {
            "max_steps": args.steps,
            "per_device_train_batch_size": GROUPS_PER_STEP * GROUP_SIZE,
            "steps_per_generation": args.steps_per_generation,
            "learning_rate": args.lr,
            "lr_scheduler_type": "constant",
            "beta": 0.0,
            "save_strategy": "no",
            "mask_truncated_completions": args.mask_truncated,
        },
        "ray": {"num_cpus": 4},
    })


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _counts(per_step: list[dict[str, int] | None]) -> dict[str, int] | None:
    """Consumed groups per staleness over a run (None where the metrics predate `staleness_counts`)."""
    if any(c is None for c in per_step):
        return None
    total: dict[str, int] = {}
    for counts in per_step:
        for lag, n in counts.items():
            total[lag] = total.get(lag, 0) + n
    return dict(sorted(total.items()))


def ended_below_start(rewards: list[float]) -> bool:
    """The failure the collapse rule misses: a run that never rose far (peak under its start + 0.5) and ended in the
    all-truncated or silent state, where every group's rewards are 0 and no gradient leads out."""
    return statistics.fmean(rewards[-LAST_N:]) < statistics.fmean(rewards[:LAST_N])


def run_arm(args: argparse.Namespace, arm: str, seed: int, model: Path, out: Path) -> dict[str, Any]:
    """Train one arm and return its figures."""
    from raygrpo.train.correction import correction_for

    cfg = run_config(args, arm, seed, model)
    correction = correction_for(cfg)
    log(f"seed {seed} {arm}: {args.steps} steps, {cfg.train.mode}, correction {correction.mode}, out {out}")
    start = time.perf_counter()
    records, seen = train_watched(cfg, out, args.verbose)
    run_s = time.perf_counter() - start
    # The reward of each generation batch over every rollout, unscored ones at 0 (a model that stops answering scores
    # lower). With several optimizer steps per generation batch only the step that consumed the batch has its
    # figures; the others' lines carry none and are not points of the curve.
    batches = [r for r in records if r.get("groups") is not None]
    rewards = [(r.get("reward_mean") or 0.0) * (r.get("scored_fraction") or 0.0) for r in batches]
    groups = []
    total = 0
    for r in batches:
        total += r["groups"]
        groups.append(total)
    wall = seen[records[-1]["step"]] - seen[records[0]["step"]]
    last = statistics.fmean(rewards[-LAST_N:])
    result = {
        "mode": cfg.train.mode,
        "correction": correction.mode,
        "proximal_decay": correction.proximal_decay,
        "mask_truncated": args.mask_truncated,
        "steps": len(records),
        "groups_consumed": groups[-1],
        "auc": statistics.fmean(rewards),
        "final_reward": last,
        "peak_reward": max(rewards),
        "first_reward": rewards[0],
        "collapsed": last < max(rewards) - 0.5,
        "ended_below_start": ended_below_start(rewards),
        "clip_frac": _mean([r.get("clip_ratio/region_mean") for r in records]),
        "truncated_frac": _mean([r.get("is_weight/truncated_frac") for r in records]),
        "masked_frac": _mean([r.get("is_weight/masked_frac") for r in records]),
        "is_weight_mean": _mean([r.get("is_weight/mean") for r in records]),
        "is_weight_max": max((r["is_weight/max"] for r in records if r.get("is_weight/max") is not None),
                             default=None),
        "entropy": _mean([r.get("entropy") for r in records]),
        "dropped_groups": records[-1].get("dropped_groups_total", 0),
        "mean_staleness": _mean([r.get("staleness_mean") for r in records]),
        "max_staleness": max(r.get("staleness_max", 0) for r in records),
        "staleness_counts": _counts([r.get("staleness_counts") for r in batches]),
        "steps_per_min": 60.0 * (len(records) - 1) / wall if wall > 0 else None,
        "wait_s_mean": _mean([r.get("wait_s") for r in records[1:]]),
        "train_s_mean": _mean([r.get("train_s") for r in records[1:]]),
        "run_s": run_s,
        "rewards": rewards,
        "groups": groups,
    }
    (out / "result.json").write_text(json.dumps(result))
    log(f"seed {seed} {arm}: auc {result['auc']:.3f}, final {last:.3f}, peak {result['peak_reward']:.3f}"
        f"{', ENDED BELOW ITS START' if result['ended_below_start'] else ''}, "
        f"clip {result['clip_frac'] or 0:.3f}, trunc {result['truncated_frac'] or 0:.3f}, "
        f"masked {result['masked_frac'] or 0:.3f}, "
        f"staleness {result['mean_staleness']:.2f} (groups per staleness {result['staleness_counts']}), dropped {result['dropped_groups']}, "
        f"{result['steps_per_min'] or 0:.1f} steps/min ({run_s:.0f} s with start-up)")
    return result


def plot(runs: dict[str, dict[int, dict[str, Any]]], path: Path) -> None:
    """Reward against groups consumed, one colour per arm, one line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"sync": "black", "none": "tab:red", "behaviour": "tab:orange", "tis": "tab:blue", "mis": "tab:green"}
    fig, ax = plt.subplots(figsize=(8, 5))
    for arm, by_seed in runs.items():
        for i, (seed, result) in enumerate(sorted(by_seed.items())):
            ax.plot(result["groups"], result["rewards"], color=colours.get(arm), alpha=0.85,
                    linewidth=1.6 if i == 0 else 1.0, linestyle=("-", "--", ":", "-.")[i % 4],
                    label=f"{arm} (seed {seed})")
    ax.set_xlabel("groups consumed")
    ax.set_ylabel("mean reward per step (unscored = 0)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("echo task, tiny model: async with 0-2 versions of staleness vs sync")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def targets(runs: dict[str, dict[int, dict[str, Any]]], arm: str = "tis") -> dict[str, Any]:
    """Each target for `arm` per seed, and whether it held in every seed (`met`, the issue's reading).

    Beside it, each target's margin per seed and its median over the seeds (`median_margin`; the target holds on
    the median when it is positive, `met_on_median`): auc(arm) / auc(sync) - 0.9, steps_per_min(arm) /
    steps_per_min(sync) - 1, auc(arm) - auc(none), final - (peak - 0.5). One seed's noise then moves the verdict
    less than in the per-seed reading, where a tie in one seed fails the target."""
    seeds = sorted(runs[arm])
    mine, sync, none = runs[arm], runs["sync"], runs["none"]
    # name: (rule, margin per seed, whether a margin of exactly 0 holds: `>=` rules do, `>` rules do not)
    checks = {
        f"{arm}_vs_sync_per_group": (f"auc({arm}) >= 0.9 * auc(sync)",
                                     lambda s: mine[s]["auc"] / sync[s]["auc"] - 0.9, True),
        f"{arm}_faster_than_sync": (f"steps_per_min({arm}) > steps_per_min(sync)",
                                    lambda s: (mine[s]["steps_per_min"] or 0) / (sync[s]["steps_per_min"] or 1) - 1,
                                    False),
        f"{arm}_better_than_none": (f"auc({arm}) > auc(none)", lambda s: mine[s]["auc"] - none[s]["auc"], False),
        f"{arm}_no_collapse": (f"last-{LAST_N} mean reward of {arm} >= its peak - 0.5",
                               lambda s: mine[s]["final_reward"] - (mine[s]["peak_reward"] - 0.5), True),
    }
    out: dict[str, Any] = {}
    for name, (rule, margin, zero_holds) in checks.items():
        margins = {str(s): margin(s) for s in seeds}
        median = statistics.median(margins.values())
        per_seed = {s: m >= 0 if zero_holds else m > 0 for s, m in margins.items()}
        out[name] = {"rule": rule, "per_seed": per_seed, "met": all(per_seed.values()),
                     "margin_per_seed": {s: round(m, 4) for s, m in margins.items()},
                     "median_margin": round(median, 4), "met_on_median": median >= 0 if zero_holds else median > 0}
    out["seeds"] = seeds
    out["all_met"] = all(v["met"] for v in out.values() if isinstance(v, dict))
    out["all_met_on_median"] = all(v["met_on_median"] for v in out.values() if isinstance(v, dict))
    # Reported beside the four, not part of `all_met`: the failure its collapse rule does not see.
    per_seed = {str(s): not ended_below_start(mine[s]["rewards"]) for s in seeds}
    out[f"{arm}_ends_above_start"] = {"rule": f"last-{LAST_N} mean reward of {arm} >= its first-{LAST_N} mean "
                                              "(not part of all_met)",
                                      "per_seed": per_seed, "met": all(per_seed.values())}
    return out


def summarise(by_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """An arm's medians over seeds, and its per-seed figures (curves rounded)."""
    def r(v: Any) -> Any:
        if isinstance(v, float):
            return round(v, 4)
        if isinstance(v, list):
            return [r(x) for x in v]
        return v

    keys = ("auc", "final_reward", "peak_reward", "clip_frac", "truncated_frac", "masked_frac", "is_weight_max",
            "dropped_groups", "mean_staleness", "max_staleness", "steps_per_min", "wait_s_mean", "train_s_mean")
    first = next(iter(by_seed.values()))
    out: dict[str, Any] = {"mode": first["mode"], "correction": first["correction"]}
    for key in keys:
        values = [v[key] for v in by_seed.values() if v.get(key) is not None]  # older results lack newer keys
        out[key] = r(statistics.median(values)) if values else None
    out["auc_per_seed"] = [r(by_seed[s]["auc"]) for s in sorted(by_seed)]
    out["seeds"] = {str(s): {k: r(v) for k, v in res.items() if k not in ("groups",)} for s, res in
                    sorted(by_seed.items())}
    return out


def reusable(saved: Path, args: argparse.Namespace, arm: str, seed: int, model: Path) -> bool:
    """Whether an earlier run's `result.json` is of this arm as configured now: the same number of steps, the same
    proximal policy (`--proximal-decay`; a result from before the field counts as decay 0) and the same
    `--mask-truncated`."""
    if not saved.exists():
        return False
    from raygrpo.train.correction import correction_for

    earlier = json.loads(saved.read_text())
    decay = correction_for(run_config(args, arm, seed, model)).proximal_decay
    return (earlier["steps"] == args.steps and earlier.get("proximal_decay", 0.0) == decay
            and earlier.get("mask_truncated", False) == args.mask_truncated)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed (the first of --seeds)")
    parser.add_argument("--dry-run", action="store_true", help="3 steps per arm, one seed: checks the plumbing")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps per arm (4 groups of 8 each)")
    parser.add_argument("--lr", type=float, default=5.0e-4,
                        help="learning rate (constant; half the echo example's: at 1e-3 and 2e-3 runs collapsed "
                             "under staleness, and 2e-3 broke even sync in 1 of 3 seeds)")
    parser.add_argument("--scale", type=float, default=2.5,
                        help="latency scale in s: fast rollouts take 0-0.5x it, slow ones (1 in 10) 1.5-2.5x; at "
                             "2.5 the slowest rollouts span about three training steps, so consumed groups are 0, 1 "
                             "or 2 versions stale (at 0.6 nearly all were 2)")
    parser.add_argument("--warmup-steps", type=int, default=150,
                        help="steps of the format warm-up (its loss is at its floor, ~0.10, by ~75)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS + EXTRA_ARMS)
    parser.add_argument("--steps-per-generation", type=int, default=1,
                        help="optimizer steps per generation batch (TRL's steps_per_generation): above 1 a policy "
                             "version spans several steps, and PPO's clip against the proximal policy acts from the "
                             "second")
    parser.add_argument("--proximal-decay", type=float, default=None,
                        help="train.off_policy.proximal_decay of the tis and mis arms (PPO-EWMA: the proximal policy "
                             "as a moving average of the learner's weights); unset: the config's default")
    parser.add_argument("--mask-truncated", action="store_true",
                        help="trainer.mask_truncated_completions in every arm (DAPO's overlong filtering: rollouts cut "
                             "at the token limit leave the loss instead of training with their advantage)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench-staleness"), help="run folders and the plot")
    parser.add_argument("--reuse", action="store_true",
                        help="take an arm's figures from OUT/s<seed>-<arm>/result.json where an earlier run of the "
                             "same --steps left one, instead of running it again")
    parser.add_argument("--verbose", action="store_true", help="a line per step and the actors' output on stderr")
    args = parser.parse_args()
    if args.quick or args.dry_run:
        args.seeds = args.seeds[:1]
    if args.dry_run:
        args.steps = 3
        args.warmup_steps = 20

    from raygrpo.driver.runtime import init_ray, shutdown_ray

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs: dict[str, dict[int, dict[str, Any]]] = {arm: {} for arm in args.arms}
    warmups: dict[str, Any] = {}
    models: dict[int, Path] = {}
    for seed in args.seeds:
        start = time.perf_counter()
        model, stats = warm_up(seed, args.warmup_steps, out / f"warm-s{seed}-w{args.warmup_steps}")
        models[seed] = model
        warmups[str(seed)] = {"seconds": round(time.perf_counter() - start, 1),
                              "final_loss": stats.get("final_loss", stats.get("loss"))}
        log(f"seed {seed}: warm-up {warmups[str(seed)]['seconds']} s -> {model}")
    init_ray(num_cpus=4, log_to_driver=args.verbose)
    try:
        for i, seed in enumerate(args.seeds):
            # Rotate the arms' order with the seed, so drift on the shared machine does not always hit the same arm.
            order = args.arms[i % len(args.arms):] + args.arms[:i % len(args.arms)]
            for arm in order:
                saved = out / f"s{seed}-{arm}" / "result.json"
                if args.reuse and reusable(saved, args, arm, seed, models[seed]):
                    runs[arm][seed] = json.loads(saved.read_text())
                    log(f"seed {seed} {arm}: reused {saved}")
                    continue
                runs[arm][seed] = run_arm(args, arm, seed, models[seed], out / f"s{seed}-{arm}")
    finally:
        shutdown_ray()
    plot_path = out / "staleness_rewards.png"
    plot(runs, plot_path)
    result: dict[str, Any] = {arm: summarise(by_seed) for arm, by_seed in runs.items()}
    if all(arm in runs for arm in ("sync", "none", "tis")):
        result["targets"] = targets(runs)
    if all(arm in runs for arm in ("sync", "none", "mis")):
        result["targets_mis"] = targets(runs, "mis")
    result["config"] = {"steps": args.steps, "steps_per_generation": args.steps_per_generation, "lr": args.lr,
                        "mask_truncated": args.mask_truncated,
                        "scale_s": args.scale, "seeds": args.seeds,
                        "groups_per_step": GROUPS_PER_STEP, "group_size": GROUP_SIZE, "max_staleness": 2,
                        "warmup_steps": args.warmup_steps, "warmups": warmups}
    result["plot"] = str(plot_path)
    result["total_seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
