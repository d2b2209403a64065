"""Command line: `raygrpo rollout CONFIG ...` (collect trajectories) and `raygrpo train CONFIG ...` (GRPO)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
import traceback
from pathlib import Path

from raygrpo.config import ConfigError, load_config
from raygrpo.environ import apply_process_env
from raygrpo.errors import ResolveError, describe
from raygrpo.outcome import report, verdict


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raygrpo", description="Ray-distributed rollouts and GRPO for LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log at INFO level, and print the traceback of a failed run")
    sub = parser.add_subparsers(dest="command", required=True)
    rollout = sub.add_parser("rollout", help="collect trajectories for every task of a run config")
    train = sub.add_parser("train", help="train the run config's model with GRPO on its environments")
    for command in (rollout, train):
        command.add_argument("config", help="run config (YAML)")
        command.add_argument("--out", help="output folder (default: runs/<config name>-<time>)")
        command.add_argument(
            "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
            help="override a config field, e.g. --set policy.kind=transformers (repeatable)",
        )
        command.add_argument("--no-progress", action="store_true", help="no progress output")
    train.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    return parser


#: The signal that interrupted the run: SIGINT unless SIGTERM came (Ray may re-raise an interruption as a plain
#: KeyboardInterrupt, so the exception alone does not tell which).
_interrupted_by = signal.SIGINT


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM (what `ray job stop` and `kill` send) stops the run as cleanly as Ctrl-C."""
    global _interrupted_by
    _interrupted_by = signal.Signals(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    apply_process_env()
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"raygrpo: {exc}", file=sys.stderr)
        return 2
    if args.command == "train" and args.resume and not args.out:
        print("raygrpo: --resume needs --out (the run folder to continue)", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    # `ray job stop` and `kill` send SIGTERM: stop as cleanly as on Ctrl-C (exit 143 instead of 130).
    signal.signal(signal.SIGTERM, _terminate)
    progress = False if args.no_progress else ("bar" if sys.stderr.isatty() else "log")
    try:
        if args.command == "train":
            from raygrpo.train.run import train

            summary = train(cfg, out, resume=args.resume, progress=progress)
        else:
            from raygrpo.collect import collect

            summary = collect(cfg, out, progress=progress)
    except ResolveError as exc:
        # Something the config names cannot be used: found before Ray started.
        print(f"raygrpo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"raygrpo: interrupted; partial results in {out}", file=sys.stderr)
        return 128 + _interrupted_by
    except Exception as exc:  # noqa: BLE001 - one clear line for the user; the traceback with -v
        if args.verbose:
            traceback.print_exc()
        print(f"raygrpo: {describe(exc, limit=2000)}" + ("" if args.verbose else " (run with -v for the traceback)"),
              file=sys.stderr)
        return 1
    if args.command == "train":
        keys = ("steps", "reward_first5_mean", "reward_last5_mean", "reward_gain", "eval_reward_first",
                "eval_reward_last", "dropped_groups_total", "wall_seconds", "leaked_envs")
        written = f"{out / 'metrics.jsonl'}, {out / 'reward_curve.png'}, {out / 'model'} and {out / 'summary.json'}"
    else:
        keys = ("requested", "completed", "scored", "reward_mean", "status_counts", "wall_seconds",
                "max_concurrent_envs", "leaked_envs")
        written = f"{out / 'trajectories.jsonl'} and {out / 'summary.json'}"
    print(json.dumps({k: summary.get(k) for k in keys}, indent=2))
    print(report(summary.get("status_counts") or {}, summary.get("failure_causes") or []))
    print(f"wrote {written}")
    judged = verdict(summary.get("status_counts") or {}, summary.get("scored") or 0, cfg.fail_fraction)
    if judged.failed:
        print(f"raygrpo: the run failed: {judged.reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
