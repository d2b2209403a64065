"""The driver's resolve step: everything a run config names is found and checked here, before Ray starts.

Loading a config only validates its fields (`raygrpo.config`). Resolving then checks what those fields point at, in
this process, in one place: the task folders of Harbor suites, harness and backend classes, ORS environment classes,
that `url` and `catalog` servers answer (listing their tasks), scripted policy functions, the warm-up's example
function, and the model folder (building the tiny model if it is asked for; a folder must hold a `config.json` and
a tokenizer; not for `oracle` and `noop`, which need no model); that a vLLM server at `policy.url` answers and
serves the run's model; and that an episode (`rollout.max_total_tokens`) fits the context of the vLLM that generates
it. It also refuses what a policy cannot serve: `raygrpo train` with `oracle` or `noop`, and the oracle on
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
from raygrpo.policy.model_folder import declared_context
from raygrpo.policy.server_probe import probe_vllm_server
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
        check_vllm_engines(cfg, model_path)
    elif cfg.policy.kind == "vllm":
        check_vllm_server(cfg, model_path)
    elif cfg.policy.kind == "transformers":
        _warn_past_declared_context(cfg, model_path)
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


def check_vllm_engines(cfg: RunConfig, model_path: str) -> None:
    """vLLM engine actors need vLLM here, `policy.vllm` may only name its engine arguments, and an episode must fit
    the engines' context (see `check_context`).

    Raises:
        ResolveError: The message starts with `policy.kind` (vLLM missing), `policy.vllm.<field>` or
            `rollout.max_total_tokens`.
    """
    try:
        from raygrpo.policy.vllm_engine import check_engine_args, platform_defaults

        check_engine_args(cfg.policy.vllm)
        default = platform_defaults().get("max_model_len")
    except ImportError as exc:
        raise ResolveError(
            f"policy.kind: 'vllm' without policy.url or policy.serve starts vLLM engine actors, and vLLM does not "
            f"import here ({exc}): `make install-vllm` installs its CPU build, `pip install -e '.[vllm]'` the CUDA one"
        ) from None
    except ValueError as exc:
        raise ResolveError(str(exc)) from None
    given = cfg.policy.vllm.get("max_model_len")
    if given is not None:
        check_context(cfg, given, "policy.vllm.max_model_len")
    elif default:
        check_context(cfg, default, "the vLLM engines' context (policy.vllm.max_model_len, unset: raygrpo's default "
                      "on vLLM's CPU build)")
    else:
        _check_declared_context(cfg, model_path, "policy.vllm.max_model_len")


def check_vllm_server(cfg: RunConfig, model_path: str) -> None:
    """A server at `policy.url` must answer, serve the run's model name, and hold an episode in its context; a server
    raygrpo starts (`policy.serve`) must be given a context that holds one.

    Raises:
        ResolveError: The message starts with `policy.url`, `policy.served_model_name` or `rollout.max_total_tokens`.
    """
    policy = cfg.policy
    if policy.serve is not None:
        if policy.serve.max_model_len is not None:
            check_context(cfg, policy.serve.max_model_len, "policy.serve.max_model_len")
        else:
            _check_declared_context(cfg, model_path, "policy.serve.max_model_len")
        return
    assert policy.url is not None
    name = policy.served_model_name or cfg.model  # what `build_policy_client` sends
    field_name = ("policy.served_model_name" if policy.served_model_name
                  else f"policy.served_model_name (unset: the run's model, {cfg.model!r})")
    served = probe_vllm_server(policy.url, name, field_name, timeout_s=min(10.0, policy.request_timeout_s))
    if served.max_model_len is not None:
        check_context(cfg, served.max_model_len, f"the max_model_len of the vLLM server at policy.url ({policy.url})")


def check_context(cfg: RunConfig, context: object, source: str) -> None:
    """Refuse `rollout.max_total_tokens` over the context of the vLLM that generates: the agent loop ends an episode
    `truncated` at `max_total_tokens`, but vLLM refuses a prompt past its `max_model_len`, and that turn would fail
    as `policy_error` (retried, counted against `fail_fraction`) instead.

    Raises:
        ResolveError: The message starts with `rollout.max_total_tokens` and names `source`.
    """
    try:
        limit = int(context)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return  # not a number raygrpo can compare (vLLM's own check of its arguments speaks for it)
    wanted = cfg.rollout.max_total_tokens
    if wanted > limit:
        raise ResolveError(f"rollout.max_total_tokens: {wanted} tokens per episode is more than {source} = {limit}: "
                           f"a longer episode would fail in vLLM instead of ending truncated; set "
                           f"rollout.max_total_tokens to {limit} or less, or give vLLM a longer context")


def _check_declared_context(cfg: RunConfig, model_path: str, field_name: str) -> None:
    """`check_context` against the context the model's `config.json` declares, which vLLM uses without
    `max_model_len`."""
    declared = declared_context(model_path)
    if declared is not None:
        check_context(cfg, declared[0], f"the model's context ({declared[1]} in {model_path}/config.json; "
                                        f"{field_name} is unset)")


def _warn_past_declared_context(cfg: RunConfig, model_path: str) -> None:
    """The transformers engines run past a model's declared context (rotary positions extrapolate, quality drops)
    without an error: a warning only."""
    declared = declared_context(model_path)
    if declared is not None and cfg.rollout.max_total_tokens > declared[0]:
        logger.warning("rollout.max_total_tokens (%d) is more than the model's context (%s = %d in %s/config.json): "
                       "the transformers engines will generate past what the model was trained on",
                       cfg.rollout.max_total_tokens, declared[1], declared[0], model_path)


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
