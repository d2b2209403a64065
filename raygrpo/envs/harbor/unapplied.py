"""What a suite's tasks set and raygrpo does not apply as written, warned about when the suite loads.

Nothing a task sets is ignored without a word: the task.toml fields the suite's backend does not apply
(`IGNORED_FIELDS`, once per suite per field, with a count and a few task names) and a suite's `verifier_timeout_s`
that replaces a task's own verifier timeout (once per task, with both values). Called by
`raygrpo.envs.harbor.tasks.scan_harbor_tasks` for the tasks a run selects.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from raygrpo.specs.harbor import HarborSpec

if TYPE_CHECKING:
    from harbor.models.task.task import Task

logger = logging.getLogger(__name__)


#: task.toml fields raygrpo does not apply: the field as a task's author writes it, the backends that ignore it (None:
#: every backend) and what happens instead, read after "which" (`{backend}`, `{start_timeout_s}`: the suite's).
IGNORED_FIELDS: dict[str, tuple[tuple[str, ...] | None, str]] = {
    "[environment] cpus": (("local",), "the {backend} backend does not enforce: the sandbox shares the host's CPUs"),
    "[environment] memory_mb (or memory)": (("local",), "the {backend} backend does not enforce: the sandbox has no "
                                                        "memory limit"),
    "[environment] storage_mb (or storage)": (("local", "docker"), "the {backend} backend does not enforce: the "
                                                                   "sandbox has no disk limit"),
    "[environment] build_timeout_sec": (None, "raygrpo does not apply: the suite's start_timeout_s={start_timeout_s:g} "
                                              "bounds each start, image build included"),
    "[environment] mcp_servers": (None, "raygrpo's agent is not given: its tools are the harness's"),
    "[environment] skills_dir": (None, "raygrpo's agent is not given"),
    "[[verifier.collect]]": (None, "raygrpo does not run: no hook runs before the verifier"),
    "artifacts": (None, "raygrpo collects only for a separate verifier: a task verified in its own sandbox has them "
                        "neither collected nor kept"),
}


def ignored_fields(config: Any, spec: HarborSpec) -> list[str]:
    """The `IGNORED_FIELDS` a parsed task.toml (Harbor's `TaskConfig`) sets away from Harbor's default and the
    suite's backend does not apply. Harbor's docker backend enforces `cpus` and `memory_mb` (compose limits); other
    backends built through Harbor's factory get the whole `[environment]` table and answer for it themselves."""
    from raygrpo.envs.harbor.separate import uses_separate_verifier

    environment = config.environment
    steps = config.steps or []
    set_here = {
        "[environment] cpus": _off_default(environment, "cpus"),
        "[environment] memory_mb (or memory)": _off_default(environment, "memory_mb"),
        "[environment] storage_mb (or storage)": _off_default(environment, "storage_mb"),
        "[environment] build_timeout_sec": _off_default(environment, "build_timeout_sec"),
        "[environment] mcp_servers": _off_default(environment, "mcp_servers"),
        "[environment] skills_dir": _off_default(environment, "skills_dir"),
        "[[verifier.collect]]": bool(config.verifier.collect) or any(step.verifier.collect for step in steps),
        "artifacts": ((bool(config.artifacts) or any(step.artifacts for step in steps))
                      and not uses_separate_verifier(config)),
    }
    return [field for field, is_set in set_here.items()
            if is_set and (IGNORED_FIELDS[field][0] is None or spec.backend in IGNORED_FIELDS[field][0])]


def _off_default(model: Any, field: str) -> bool:
    """Whether `model`'s `field` differs from the model's default for it."""
    default = type(model).model_fields[field].get_default(call_default_factory=True)
    return getattr(model, field) != default


#: Suites already warned about a field (once per suite per field per process).
_IGNORED_TOLD: set[tuple[str, str, str]] = set()


def warn_ignored_fields(spec: HarborSpec, env: str, ignored: Mapping[str, list[str]]) -> None:
    """Warn once per suite per field about the task.toml fields the suite's tasks set and raygrpo does not apply
    (`ignored`: field -> names of the tasks that set it), naming how many tasks set it, a few of them, and what
    happens instead: nothing a task sets is ignored without a word, and a suite of 500 tasks gets one line a field."""
    for field, names in ignored.items():
        key = (env, spec.path, field)
        if key in _IGNORED_TOLD:
            continue
        _IGNORED_TOLD.add(key)
        example = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
        instead = IGNORED_FIELDS[field][1].format(backend=spec.backend, start_timeout_s=spec.start_timeout_s)
        logger.warning("envs.%s: %d task%s set %s, which %s (e.g. task %s)", env, len(names),
                       "" if len(names) == 1 else "s", field, instead, example)


#: Tasks already warned about `verifier_timeout_s` replacing their own verifier timeout (once per task per process).
_TIMEOUT_OVERRIDES_TOLD: set[tuple[str, str, float]] = set()


def warn_verifier_timeout_override(spec: HarborSpec, env: str, task: Task) -> None:
    """Warn once per task when the suite's `verifier_timeout_s` replaces a different `[verifier] timeout_sec` of the
    task (or of one of its steps), saying both: it wins in both directions (`raygrpo.envs.harbor.grading`), which a
    task's author would not expect."""
    override = spec.verifier_timeout_s
    if override is None:
        return
    own = float(task.config.verifier.timeout_sec)
    replaced = [f"[verifier] timeout_sec={own:g}"] if own != override else []
    for step in task.config.steps or []:
        value = step.verifier.timeout_sec
        if value is not None and float(value) not in (override, own):
            replaced.append(f"step {step.name!r}'s timeout_sec={float(value):g}")
    key = (env, str(task.paths.task_dir), override)
    if not replaced or key in _TIMEOUT_OVERRIDES_TOLD:
        return
    _TIMEOUT_OVERRIDES_TOLD.add(key)
    logger.warning("%s=%g replaces task %s's %s (the suite's value wins, shorter or longer)",
                   spec.field_path(env, "verifier_timeout_s"), override, task.name, ", ".join(replaced))
