"""Command line: `raygrpo rollout CONFIG ...` (collect trajectories), `raygrpo train CONFIG ...` (GRPO),
`raygrpo check CONFIG | TASK_DIR` (does each Harbor task's verifier pass its reference solution and fail doing
nothing?), `raygrpo reap` (remove what crashed runs left: local and docker sandboxes on this machine or on every
node of a cluster, remote sandboxes through the lease ledger) and
`raygrpo export RUN_DIR --format parquet|hf|atif` (a run's trajectories as Parquet, a Hugging Face dataset or Harbor
ATIF files)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raygrpo.config import ConfigError, RunConfig, load_config
from raygrpo.core.environ import apply_process_env, configure_logging
from raygrpo.core.errors import ResolveError, describe
from raygrpo.core.outcome import report, verdict


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
    train.add_argument("--skip-broken", metavar="CHECK.json",
                       help="leave out the tasks a `raygrpo check --json` result marks broken (logged by name)")
    check = sub.add_parser(
        "check", help="run each Harbor task's reference solution (oracle) and nothing (noop) and judge its verifier",
        description="For each Harbor task: the oracle policy (the task's solution/solve.sh) must score at least "
                    "--pass-threshold and the noop policy (nothing done) less. Exit 0 when every task is sound, 1 "
                    "when any is broken, 2 for a bad config or argument.")
    check.add_argument("config", metavar="CONFIG | TASK_DIR",
                       help="a run config (YAML), or a folder: one Harbor task dir or a suite of them (checked on the "
                            "local sandbox backend)")
    check.add_argument("--pass-threshold", type=float, default=1.0,
                       help="the oracle must score at least this, the noop less (default 1.0)")
    check.add_argument("--json", dest="json_out", metavar="FILE", help="write the per-task verdicts to FILE")
    check.add_argument("--out", help="also write the check's trajectories to OUT/trajectories.jsonl")
    check.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field, e.g. --set envs.tasks.environment_type=docker (repeatable)")
    check.add_argument("--no-progress", action="store_true", help="no progress output")
    reap = sub.add_parser(
        "reap", help="remove what crashed runs left: local and docker sandboxes, on this machine or every node, and "
                     "remote sandboxes of stale leases",
        description="Remove the local sandboxes (folders, processes, mounts) and docker sandboxes of every run whose "
                    "owner is gone, and the run folders that leaves empty, under the sandbox root of this machine "
                    "or, with --address (or $RAY_ADDRESS), of every node of the cluster (a task per node); then go "
                    "through the lease ledger and stop, at its provider, the sandbox of every lease whose owner's "
                    "heartbeat is stale (or whose owner process on this host is dead). A live run, such as a "
                    "concurrent one, is never touched. Prints what it removed. Exit 0 when everything stale was "
                    "reaped, 1 when some could not be (listed; leases kept in the ledger), 2 for a bad argument.")
    reap.add_argument("--run", help="only this run's sandboxes and leases (its run id, e.g. run-0123456789ab)")
    reap.add_argument("--sandbox-root", help="the local sandboxes' root on every node reaped (default: each node's "
                                             "$RAYGRPO_SANDBOX_ROOT, else /tmp/raygrpo-sandboxes)")
    reap.add_argument("--address", help="reap every node of the Ray cluster at ADDRESS (default: $RAY_ADDRESS when "
                                        "set, else this machine only)")
    reap.add_argument("--lease-dir", help="the lease ledger (default: $RAYGRPO_LEASE_DIR, else ~/.raygrpo/leases)")
    reap.add_argument("--stale-after", type=float, default=None, metavar="S",
                      help="an owner whose heartbeat is older than S seconds is stale (default 30 for leases, 60 for "
                           "local sandboxes)")
    reap.add_argument("--json", dest="json_out", action="store_true",
                      help="print one JSON object (each stale lease's outcome and the sandboxes stopped) instead")
    export = sub.add_parser(
        "export", help="write a run's trajectories as Parquet, a Hugging Face dataset or Harbor ATIF files",
        description="Stream a run's trajectories.jsonl (or a training run's rollouts.jsonl, with each line's step) "
                    "into Parquet (one row per trajectory, every field a column), a Hugging Face dataset folder "
                    "(datasets.load_from_disk) or one Harbor ATIF .json file per trajectory. A cut-off last line (a "
                    "killed run) is left out and said so. Exit 0 when exported, 1 when the export broke, 2 for bad "
                    "input (no trajectories, a line that is not JSON, an existing --out) or a bad argument.")
    export.add_argument("run", metavar="RUN_DIR", help="a run folder, or the JSON lines file itself")
    export.add_argument("--format", required=True, choices=["parquet", "hf", "atif"], help="the output format")
    export.add_argument("--out", help="where to write (default: next to the JSON lines file, named after it: "
                                      "trajectories.parquet, trajectories.hf/, trajectories.atif/)")
    export.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    export.add_argument("--model-name", help="atif: the agent's model_name (a run folder does not record its model)")
    export.add_argument("--no-progress", action="store_true", help="no progress bar")
    for command in (rollout, train, check):
        command.add_argument(
            "--address", help="join the Ray cluster at ADDRESS (\"auto\", host:port, ray://...) instead of "
                              "ray.address; inside `ray job submit` the job's cluster is joined by default")
    return parser


#: The signal that interrupted the run: SIGINT unless SIGTERM came (Ray may re-raise an interruption as a plain
#: KeyboardInterrupt, so the exception alone does not tell which).
_interrupted_by = signal.SIGINT
#: Lines of a failure's message the one-line error keeps: a message's first line often only announces its fix.
CLI_ERROR_LINES = 4


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM (what `ray job stop` and `kill` send) stops the run as cleanly as Ctrl-C."""
    global _interrupted_by
    _interrupted_by = signal.Signals(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.verbose)
    apply_process_env()
    if args.command == "reap":
        return _reap(args)
    if args.command == "export":
        return _export(args)
    try:
        if args.command == "check":
            from raygrpo.driver.check import load_target

            cfg = load_target(args.config, args.overrides)
        else:
            cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"raygrpo: {exc}", file=sys.stderr)
        return 2
    if args.address:
        cfg.ray.address = args.address
    if args.command == "check":
        return _check(args, cfg)
    if args.command == "train" and args.resume and not args.out:
        print("raygrpo: --resume needs --out (the run folder to continue)", file=sys.stderr)
        return 2
    out = Path(args.out or f"runs/{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    # `ray job stop` and `kill` send SIGTERM: stop as cleanly as on Ctrl-C (exit 143 instead of 130).
    signal.signal(signal.SIGTERM, _terminate)
    progress = False if args.no_progress else ("bar" if sys.stderr.isatty() else "log")
    def work() -> dict:
        if args.command == "train":
            from raygrpo.train.run import train

            return train(cfg, out, resume=args.resume, progress=progress, skip_broken=args.skip_broken)
        from raygrpo.driver.collect import collect

        return collect(cfg, out, progress=progress)

    summary, code = _guarded(work, args.verbose, f"partial results in {out}")
    if code is not None:
        return code
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


def _guarded(work: Callable[[], Any], verbose: bool, interrupted: str) -> tuple[Any, int | None]:
    """Run a command's work: its result and None, or None and the exit code of how it failed (2: something the
    config names cannot be used, found before Ray started; 130 / 143: interrupted; 1: the run broke, one line with
    the cause, the traceback too when `verbose`)."""
    try:
        return work(), None
    except ResolveError as exc:
        print(f"raygrpo: {exc}", file=sys.stderr)
        return None, 2
    except KeyboardInterrupt:
        print(f"raygrpo: interrupted; {interrupted}", file=sys.stderr)
        return None, 128 + _interrupted_by
    except Exception as exc:  # noqa: BLE001 - one clear line for the user; the traceback with -v
        if verbose:
            traceback.print_exc()
        print(f"raygrpo: {describe(exc, limit=2000, lines=CLI_ERROR_LINES)}"
              + ("" if verbose else " (run with -v for the traceback)"), file=sys.stderr)
        return None, 1


def _reap(args: argparse.Namespace) -> int:
    """`raygrpo reap`: a line per thing removed and a summary per kind on stdout (or one JSON object); exit 0 (all
    reaped), 1 (some could not be) or 2."""
    from raygrpo.driver.node_reaps import reap_cluster, reap_here
    from raygrpo.driver.runtime import target_address
    from raygrpo.leases.reaper import reap_leases
    from raygrpo.leases.ledger import STALE_AFTER_S, LeaseLedger

    if args.stale_after is not None and not args.stale_after > 0:
        print("raygrpo: --stale-after must be a positive number of seconds", file=sys.stderr)
        return 2
    address = target_address(args.address)
    kwargs = {"run": args.run, **({} if args.stale_after is None else {"stale_after_s": args.stale_after})}
    nodes = reap_cluster(address, args.sandbox_root, **kwargs) if address else reap_here(args.sandbox_root, **kwargs)
    ledger = LeaseLedger(args.lease_dir)
    leases = None
    if ledger.root.is_dir():
        leases = reap_leases(ledger, run=args.run, stale_after_s=args.stale_after or STALE_AFTER_S)
    if args.json_out:
        print(json.dumps({**(leases.to_dict() if leases else {}), **nodes.to_dict()}))
    else:
        for line in nodes.lines():
            print(line)
        for line in leases.lines() if leases else [f"no lease ledger at {ledger.root}: no remote sandbox to reap"]:
            print(line)
    code = 0
    if nodes.failed:
        print(f"raygrpo: {len(nodes.failed)} node(s) could not be reaped", file=sys.stderr)
        code = 1
    if leases and leases.kept:
        print(f"raygrpo: {len(leases.kept)} stale lease(s) could not be reaped; they stay in {ledger.root}",
              file=sys.stderr)
        code = 1
    return code


def _export(args: argparse.Namespace) -> int:
    """`raygrpo export`: what was written on stdout, notes on stderr; exit 0, 1 (the export broke) or 2 (bad input)."""
    from raygrpo.export import ExportError, ExportOptions, export_run

    signal.signal(signal.SIGTERM, _terminate)
    options = ExportOptions(path=args.run, format=args.format, out=args.out, overwrite=args.overwrite,
                            model_name=args.model_name, progress=not args.no_progress and sys.stderr.isatty())

    def work() -> Any:
        try:
            return export_run(options)
        except ExportError as exc:
            return exc

    result, code = _guarded(work, args.verbose, "nothing was written")
    if code is not None:
        return code
    if isinstance(result, ExportError):
        print(f"raygrpo: {result}", file=sys.stderr)
        return 2
    for note in result.notes():
        print(f"raygrpo: {note}", file=sys.stderr)
    unit = "file(s)" if result.format.value == "atif" else "row(s)"
    print(f"wrote {result.written} trajectory {unit} of {result.source} to {result.out} ({result.format.value}, "
          f"{result.seconds:.1f} s)")
    return 0


def _unwritable(path: Path) -> str | None:
    """Why a file cannot be written at `path` (checked before a long run, which would otherwise end in the error),
    or None. Missing parent folders are fine: they are created."""
    if path.is_dir():
        return "is a folder; give a file name, e.g. check.json inside it"
    if path.exists():
        return None if os.access(path, os.W_OK) else "the file is not writable"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a folder"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"cannot create files in {parent}"


def _check(args: argparse.Namespace, cfg: RunConfig) -> int:
    """`raygrpo check`: the table on stdout, `--json`, exit 0 (all sound), 1 (a task is broken) or 2."""
    from rich.console import Console

    from raygrpo.driver.check import render_table, run_check

    if not 0 <= args.pass_threshold:
        print("raygrpo: --pass-threshold must be a reward (>= 0)", file=sys.stderr)
        return 2
    unwritable = args.json_out and _unwritable(Path(args.json_out))
    if unwritable:
        print(f"raygrpo: --json {args.json_out}: {unwritable}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminate)
    progress = False if args.no_progress else ("bar" if sys.stderr.isatty() else "log")
    result, code = _guarded(lambda: run_check(cfg, args.pass_threshold, out_dir=args.out, progress=progress),
                            args.verbose, "the check did not finish")
    if code is not None:
        return code
    Console(width=max(120, Console().width)).print(render_table(result))
    if args.json_out:
        try:
            result.write(args.json_out)
        except OSError as exc:
            print(f"raygrpo: --json {args.json_out}: cannot write the verdicts: {exc.strerror or exc}",
                  file=sys.stderr)
            return 1
        print(f"wrote {args.json_out}")
    if result.leaked_envs:
        print(f"raygrpo: {result.leaked_envs} sandbox(es) still alive after the check", file=sys.stderr)
    broken = result.broken
    if broken:
        print(f"raygrpo: {len(broken)} of {len(result.verdicts)} task(s) broken: "
              + ", ".join(v.task for v in broken), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
