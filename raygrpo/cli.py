"""Command line: `raygrpo rollout CONFIG [--out DIR] [--set key=value ...]`."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raygrpo", description="Ray-distributed rollouts and GRPO for LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    rollout = sub.add_parser("rollout", help="collect trajectories for every task of a run config")
    rollout.add_argument("config", help="run config (YAML)")
    rollout.add_argument("--out", help="output folder (default: runs/<config name>-<time>)")
    rollout.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config field, e.g. --set policy.kind=transformers (repeatable)",
    )
    rollout.add_argument("--no-progress", action="store_true", help="no progress output")
    return parser


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from raygrpo.config import ConfigError, load_config
    from raygrpo.runtime import apply_process_env

    apply_process_env()
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"raygrpo: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    # `ray job stop` and `kill` send SIGTERM: stop as cleanly as on Ctrl-C.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    from raygrpo.collect import collect

    try:
        progress = False if args.no_progress else ("bar" if sys.stderr.isatty() else "log")
        summary = collect(cfg, out, progress=progress)
    except KeyboardInterrupt:
        print(f"raygrpo: interrupted; partial results in {out}", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one clear line for the user, the traceback in the log
        logging.getLogger("raygrpo").debug("run failed", exc_info=True)
        print(f"raygrpo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    keys = ("requested", "completed", "scored", "reward_mean", "status_counts", "wall_seconds",
            "max_concurrent_envs", "leaked_envs")
    print(json.dumps({k: summary[k] for k in keys}, indent=2))
    print(f"wrote {out / 'trajectories.jsonl'} and {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
