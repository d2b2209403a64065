"""The driver's resolve step: everything a run config names is found and checked here, before Ray starts.

Loading a config only validates its fields (`raygrpo.config`). Resolving then checks what those fields point at, in
this process, in one place: the task folders of Harbor suites, harness and backend classes, ORS environment classes,
that `url` and `catalog` servers answer (listing their tasks), scripted policy functions, the warm-up's example
function, and the model folder (building the tiny model if it is asked for; not for `oracle` and `noop`, which need
no model). It also refuses what a policy cannot serve: `raygrpo train` with `oracle` or `noop`, and the oracle on
an ORS environment. The first failure raises a `ResolveError` whose message starts with the config field; no Ray
session has been started by then.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from raygrpo.config import RunConfig
from raygrpo.envs.harbor.refusals import Refusal, TaskRefusals
from raygrpo.envs.kinds import kind_of
from raygrpo.core.errors import ResolveError
from raygrpo.core.imports import load_function
from raygrpo.policy.factory import script_function
from raygrpo.policy.tiny import resolve_model_path
from raygrpo.core.types import TaskRef

logger = logging.getLogger(__name__)


@dataclass
class ResolvedRun:
    """What resolving a run config found.

    Args:
        cfg: The config that was resolved.
        tasks_by_env: Tasks of every environment the run serves (its `envs`, and `eval_envs` when training); None
            for an `environment` spec, whose tasks are listed once raygrpo serves it.
        model_path: The model folder (the tiny model's cache folder for `"tiny"`).
        skipped: Tasks left out because they were asked to be skipped (`raygrpo train --skip-broken`).
        refused: Tasks that cannot be loaded or run, by environment (only with `resolve_run(keep_refused=True)`;
            otherwise they fail the resolve).
    """

    cfg: RunConfig
    tasks_by_env: dict[str, list[TaskRef] | None]
    model_path: str
    skipped: list[TaskRef] = field(default_factory=list)
    refused: dict[str, list[Refusal]] = field(default_factory=dict)


def resolve_run(cfg: RunConfig, *, train: bool = False, skip_task_dirs: Collection[str] = (),
                keep_refused: bool = False) -> ResolvedRun:
    """Resolve what `cfg` names (see the module docstring).

    Args:
        cfg: The validated run config.
        train: Resolve for `raygrpo train`: the `eval_envs` and the warm-up too.
        skip_task_dirs: Task folders to leave out of every environment (the broken tasks of a `raygrpo check`);
            each one left out is logged by name.
        keep_refused: Tasks that cannot be loaded or run are kept in `ResolvedRun.refused` instead of failing the
            resolve (`raygrpo check` judges them); without it, the resolve fails naming every one of them, of every
            environment, at once.

    Raises:
        ResolveError: Something the config names cannot be used; the message starts with the config field.
    """
    envs = {**cfg.envs, **(cfg.eval_envs if train else {})}
    check_policy(cfg, train=train)
    tasks_by_env: dict[str, list[TaskRef] | None] = {}
    refused: dict[str, list[Refusal]] = {}
    for name, spec in envs.items():
        kept: list[Refusal] = []
        tasks_by_env[name] = kind_of(spec).resolve(spec, name, kept)
        if kept:
            refused[name] = kept
    if skip_task_dirs:
        _skip_refused(refused, skip_task_dirs)
    if refused and not keep_refused:
        raise ResolveError("\n".join(f"{envs[name].field_path(name)}: {TaskRefusals(kept)}"
                                     for name, kept in refused.items()))
    skipped = _skip_tasks(tasks_by_env, skip_task_dirs) if skip_task_dirs else []
    if cfg.policy.kind == "scripted":
        script_function(cfg.policy)
    if train and cfg.train.warmup is not None:
        load_function(cfg.train.warmup.examples, "train.warmup.examples")
    model_path = cfg.model
    if not cfg.policy.acts:  # oracle and noop write no text: they need no model or tokenizer
        try:
            model_path = resolve_model_path(cfg.model)
        except (OSError, ValueError, ImportError, RuntimeError) as exc:  # ImportError: a missing extra (gguf);
            raise ResolveError(f"model: {exc}") from None                 # RuntimeError: a model pip cannot fetch
    if cfg.policy.kind == "vllm" and cfg.policy.engine_actors:
        check_vllm_engines(cfg)
    logger.info("resolved %d environment(s): %s", len(envs), ", ".join(envs))
    return ResolvedRun(cfg=cfg, tasks_by_env=tasks_by_env, model_path=model_path, skipped=skipped, refused=refused)


def _skip_tasks(tasks_by_env: dict[str, list[TaskRef] | None], task_dirs: Collection[str]) -> list[TaskRef]:
    """Drop the tasks whose folder is in `task_dirs` from `tasks_by_env` (in place), log them, return them.

    Raises:
        ResolveError: Every task of an environment would be left out.
    """
    wanted = {str(Path(d).resolve()) for d in task_dirs if d}
    skipped: list[TaskRef] = []
    for name, tasks in tasks_by_env.items():
        if not tasks:
            continue
        out = [t for t in tasks if str(Path(str(t.metadata.get("task_dir") or "")).resolve()) in wanted]
        if not out:
            continue
        if len(out) == len(tasks):
            raise ResolveError(f"envs.{name}: --skip-broken leaves no task to run (all {len(tasks)} are broken)")
        tasks_by_env[name] = [t for t in tasks if t not in out]
        skipped.extend(out)
        logger.warning("--skip-broken: leaving out %d broken task(s) of envs.%s: %s", len(out), name,
                       ", ".join(str(t.metadata.get("task_name") or t.index) for t in out))
    return skipped


def _skip_refused(refused: dict[str, list[Refusal]], task_dirs: Collection[str]) -> None:
    """Drop the refused tasks whose folder is in `task_dirs` from `refused` (in place) and log them: a check result
    lists them as broken (`status: refused`), and `--skip-broken` leaves them out like the others."""
    wanted = {str(Path(d).resolve()) for d in task_dirs if d}
    for name in list(refused):
        out = [r for r in refused[name] if str(Path(r.task_dir).resolve()) in wanted]
        if out:
            logger.warning("--skip-broken: leaving out %d refused task(s) of envs.%s: %s", len(out), name,
                           ", ".join(r.task for r in out))
        refused[name] = [r for r in refused[name] if r not in out]
        if not refused[name]:
            del refused[name]


def check_vllm_engines(cfg: RunConfig) -> None:
    """vLLM engine actors need vLLM here, and `policy.vllm` may only name its engine arguments.

    Raises:
        ResolveError: The message starts with `policy.kind` (vLLM missing) or `policy.vllm.<field>`.
    """
    try:
        from raygrpo.policy.vllm_engine import check_engine_args

        check_engine_args(cfg.policy.vllm)
    except ImportError as exc:
        raise ResolveError(
            f"policy.kind: 'vllm' without policy.url or policy.serve starts vLLM engine actors, and vLLM does not "
            f"import here ({exc}): `make install-vllm` installs its CPU build, `pip install -e '.[vllm]'` the CUDA one"
        ) from None
    except ValueError as exc:
        raise ResolveError(str(exc)) from None


def check_policy(cfg: RunConfig, *, train: bool = False) -> None:
    """Refuse what a policy cannot serve: training with a policy that writes no text (`oracle`, `noop`), and the
    oracle on an environment without reference solutions (ORS).

    Raises:
        ResolveError: The message starts with `policy.kind`, or with the environment's field.
    """
    kind = cfg.policy.kind
    if train:
        try:
            cfg.check_training()
        except ValueError as exc:
            raise ResolveError(str(exc)) from None
    if train and cfg.policy.acts:
        raise ResolveError(
            f"policy.kind: {kind!r} writes no text, so raygrpo train has nothing to train on: train with "
            "policy.kind scripted, transformers or vllm (oracle and noop serve raygrpo rollout and raygrpo check)"
        )
    if kind == "oracle":
        for name, spec in cfg.envs.items():
            if spec.kind != "harbor":
                raise ResolveError(
                    f"envs.{name}: policy.kind 'oracle' runs a task's reference solution, and this "
                    f"{spec.kind.upper()} environment has none (the oracle runs Harbor tasks)"
                )
