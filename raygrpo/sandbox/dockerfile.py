"""What the local sandbox can honour of a task's `environment/Dockerfile` without building an image.

The local sandbox backend (`raygrpo.sandbox.local`) has no image builder: every sandbox sees the host's own
filesystem, read-only. So it applies only the parts of a Dockerfile that describe files and process state:

- `WORKDIR` (absolute or relative to the previous one): the working directory of every exec, made writable;
- `ENV` (both `ENV K=V ...` and the legacy `ENV K V`): the environment of every exec;
- `ARG` defaults: usable in later `$VAR` substitutions, as in a build;
- `COPY` / `ADD` of files and directories from the build context (the task's `environment/` folder), heredoc
  sources included; a relative destination is relative to `WORKDIR`; `--chown` is ignored, `--chmod` is applied
  (`raygrpo.sandbox.dockerfile_copy`); into `/` too (`COPY entrypoint.sh /entrypoint.sh`: each file bound in on its
  own, `split_at_root`).

- `RUN`: the commands that make files and folders run at every sandbox start; the ones that install software are
  skipped (the host and the verifier toolbox provide instead); see `raygrpo.sandbox.run_steps`.

- `ENTRYPOINT`: started in the background at every sandbox start, as the container's main process is, with the
  arguments Harbor's docker backend gives it in place of the image's `CMD` (`sh -c "sleep infinity"`,
  `HARBOR_COMMAND`): an `entrypoint.sh` that starts a service and then `exec "$@"` starts the service.

Everything else cannot be honoured and is skipped: `USER` (execs run as root unless a user is requested),
`COPY --from`, `ADD` of URLs and archives, `FROM`, `EXPOSE`, ...; `CMD` too, which Harbor's docker backend does not
run either (its compose file's `command` replaces it). Skipped steps are reported once per Dockerfile per process
with a `logging` warning (`report_skipped`), not once per sandbox; `CMD` (at info level) and image metadata
(`EXPOSE`, `LABEL`, ...) are not warned about. Only the final build stage counts (each `FROM` starts a new one).

A Dockerfile that cannot be parsed raises `DockerfileError`, whose message names the file and the line.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from raygrpo.sandbox.dockerfile_copy import ROOT, CopyStep, parse_copy, sandbox_path, split_at_root
from raygrpo.sandbox.dockerfile_syntax import NAME_RE, DockerfileError, LexError, lex, lex_one, read_instructions
from raygrpo.sandbox.run_steps import RunStep, plan_run

__all__ = ["DockerfileError", "DockerfilePlan", "SkippedStep", "load_plan", "parse_dockerfile", "report_skipped"]

logger = logging.getLogger(__name__)

#: The PATH a stock Linux image (e.g. `python:3.12-slim`) starts with; `$PATH` in `ENV` expands against it.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class SkippedStep:
    """An instruction the local sandbox did not apply, and why."""

    line: int
    instruction: str
    reason: str


@dataclass(frozen=True)
class DockerfilePlan:
    """What a sandbox applies of one Dockerfile: the final stage's working dir, environment and file copies.

    Args:
        path: the Dockerfile.
        context_dir: the build context (the task's `environment/` folder).
        workdir: the final `WORKDIR`, or None when the Dockerfile sets none.
        env: the final stage's `ENV` values in order (`$VAR` references already expanded).
        copies: the final stage's `COPY`/`ADD` steps, in order.
        user: the final `USER` (not applied; recorded for the warning).
        skipped: every instruction that was not applied (for a `RUN`: the install commands taken out of it).
        runs: the final stage's `RUN` commands that the sandbox runs at start (`raygrpo.sandbox.run_steps`).
        entrypoint: the final stage's `ENTRYPOINT` as the argv it starts (the shell form as `/bin/sh -c TEXT`), or
            None when it sets none; the sandbox starts it in the background (`LocalSandboxEnvironment`).
    """

    path: Path
    context_dir: Path
    workdir: str | None
    env: dict[str, str]
    copies: tuple[CopyStep, ...]
    user: str | None
    skipped: tuple[SkippedStep, ...]
    runs: tuple[RunStep, ...] = ()
    entrypoint: tuple[str, ...] | None = None

    def writable_dirs(self) -> list[PurePosixPath]:
        """Sandbox directories that must be writable: the `WORKDIR` and every copy destination but `/`."""
        dirs = [PurePosixPath(self.workdir)] if self.workdir else []
        dirs.extend(step.writable_dir for step in self.copies if step.writable_dir != ROOT)
        return dirs

    def root_files(self) -> list[PurePosixPath]:
        """Files copied straight into `/` (`COPY entrypoint.sh /entrypoint.sh`), each bound in on its own: the
        sandbox's `/` is a tmpfs, not a directory of the host it could write into."""
        return sorted({step.dest for step in self.copies if step.writable_dir == ROOT})


# --------------------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------------------


def parse_dockerfile(path: Path | str, context_dir: Path | str | None = None) -> DockerfilePlan:
    """Parse a Dockerfile into what the local sandbox applies.

    Args:
        path: the Dockerfile.
        context_dir: the build context; defaults to the Dockerfile's folder.

    Raises:
        DockerfileError: a syntax error, an unknown instruction, a `COPY` source missing from (or outside) the
            context; the message names the file and line.
    """
    path = Path(path)
    context = Path(context_dir) if context_dir is not None else path.parent
    try:
        text = path.read_text()
    except OSError as e:
        raise DockerfileError(path, 0, f"cannot read: {e}") from e
    instructions, escape = read_instructions(path, text)
    context_real = os.path.realpath(context)

    global_args: dict[str, str] = {}
    args: dict[str, str] = {}
    env: dict[str, str] = {}
    workdir: str | None = None
    user: str | None = None
    copies: list[CopyStep] = []
    skipped: list[SkippedStep] = []
    runs: list[RunStep] = []
    entrypoint: tuple[str, ...] | None = None
    seen_from = False

    for ins in instructions:
        subst = {"PATH": DEFAULT_PATH, **args, **env}
        try:
            if ins.keyword == "FROM":
                # A new build stage: nothing of the previous stage reaches the final image except via COPY --from.
                seen_from = True
                args, env, workdir, user, copies, skipped, runs = {}, {}, None, None, [], [], []
                entrypoint = None
                skipped.append(SkippedStep(ins.line, "FROM", f"{ins.args.strip()} is not pulled: the sandbox runs the "
                                           "host's own files and tools (its python3, its pytest, if any), not the "
                                           "image's"))
            elif ins.keyword == "ARG":
                for word in lex(ins.args, subst, split=True, escape=escape):
                    name, eq, default = word.partition("=")
                    if not NAME_RE.fullmatch(name):
                        raise LexError(f"bad ARG name {name!r}")
                    if eq:
                        (args if seen_from else global_args)[name] = default
                    elif name in global_args:
                        args[name] = global_args[name]
            elif ins.keyword == "ENV":
                if not ins.args:
                    raise LexError("ENV needs at least one variable")
                first = ins.args.split(None, 1)[0]
                if "=" not in first:
                    # Legacy form: `ENV KEY value with spaces`.
                    key, _, value = ins.args.partition(" ")
                    if not value.strip():
                        raise LexError(f"ENV {key} has no value")
                    env[key] = lex_one(value.strip(), subst, escape)
                else:
                    # Every pair sees the values before this instruction, as in Docker.
                    for word in lex(ins.args, subst, split=True, escape=escape):
                        key, eq, value = word.partition("=")
                        if not eq or not key:
                            raise LexError(f"ENV expects KEY=VALUE pairs, got {word!r}")
                        env[key] = value
            elif ins.keyword == "WORKDIR":
                value = lex_one(ins.args, subst, escape).strip()
                if not value:
                    raise LexError("WORKDIR needs a path")
                workdir = str(sandbox_path(value, workdir))
            elif ins.keyword == "USER":
                user = lex_one(ins.args, subst, escape).strip() or None
                skipped.append(SkippedStep(ins.line, "USER", "execs run as root unless a user is requested"))
            elif ins.keyword in ("COPY", "ADD"):
                step, reasons = parse_copy(ins, subst, escape, workdir, context, context_real)
                skipped.extend(SkippedStep(ins.line, ins.keyword, reason) for reason in reasons)
                if step is not None:
                    copies.extend(split_at_root(step))
            elif ins.keyword == "RUN":
                run = plan_run(ins.line, ins.args, workdir, {**args, **env}) if not ins.heredocs else None
                if run is None:
                    skipped.append(SkippedStep(ins.line, "RUN", "a here-document RUN is not run by the local sandbox"))
                else:
                    if run.command:
                        runs.append(run)
                    if run.skipped:
                        skipped.append(SkippedStep(ins.line, "RUN", "installs: " + "; ".join(run.skipped)))
            elif ins.keyword == "ENTRYPOINT":
                entrypoint = parse_entrypoint(ins.args)
            elif ins.keyword == "CMD":
                # Harbor's docker backend starts every container with `sh -c "sleep infinity"` in place of the
                # image's CMD: a CMD does not run there either.
                skipped.append(SkippedStep(ins.line, "CMD", CMD_REPLACED))
            else:
                # EXPOSE, LABEL, VOLUME, HEALTHCHECK, SHELL, STOPSIGNAL, ONBUILD, MAINTAINER: image metadata with no
                # effect on execs.
                skipped.append(SkippedStep(ins.line, ins.keyword, "image metadata"))
        except LexError as e:
            raise DockerfileError(path, ins.line, str(e)) from None
    return DockerfilePlan(
        path=path,
        context_dir=context,
        workdir=workdir,
        env=env,
        copies=tuple(copies),
        user=user,
        skipped=tuple(skipped),
        runs=tuple(runs),
        entrypoint=entrypoint,
    )


#: Why a Dockerfile's `CMD` is not run (logged, not warned about: Harbor's docker backend does not run it either).
CMD_REPLACED = "Harbor's docker backend runs `sh -c \"sleep infinity\"` in its place"
#: The arguments Harbor's docker backend gives the image's `ENTRYPOINT` in place of its `CMD` (its compose file's
#: `command`); an entrypoint that ends in `exec "$@"` keeps running them.
HARBOR_COMMAND = ("sh", "-c", "sleep infinity")


def parse_entrypoint(text: str) -> tuple[str, ...] | None:
    """An `ENTRYPOINT` instruction's argv, as Docker reads it: the exec form (a JSON array) as it is, the shell form
    as `/bin/sh -c TEXT`; None for an empty one (`ENTRYPOINT []` resets it).

    Raises:
        LexError: A JSON array that is not one of strings.
    """
    body = text.strip()
    if not body:
        return None
    if body.startswith("["):
        try:
            array = json.loads(body)
        except json.JSONDecodeError:
            array = None  # Docker runs what does not parse as JSON in the shell form
        if array is not None:
            if not isinstance(array, list) or not all(isinstance(a, str) for a in array):
                raise LexError("ENTRYPOINT's JSON form must be an array of strings")
            return tuple(array) if array and array[0] else None
    return ("/bin/sh", "-c", body)


# --------------------------------------------------------------------------------------------------------------
# Loading (cached per file version) and reporting skipped steps once
# --------------------------------------------------------------------------------------------------------------

_cache: dict[tuple[str, str], tuple[tuple[int, int], DockerfilePlan]] = {}
_reported: set[str] = set()
_lock = threading.Lock()


def load_plan(environment_dir: Path | str) -> DockerfilePlan | None:
    """The plan of `environment_dir/Dockerfile` (None when there is none), parsed once per file version."""
    environment_dir = Path(environment_dir)
    path = environment_dir / "Dockerfile"
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    key = (str(path.resolve()), str(environment_dir.resolve()))
    stamp = (st.st_mtime_ns, st.st_size)
    with _lock:
        hit = _cache.get(key)
        if hit and hit[0] == stamp:
            return hit[1]
    plan = parse_dockerfile(path, environment_dir)
    with _lock:
        _cache[key] = (stamp, plan)
    return plan


def report_skipped(plan: DockerfilePlan) -> None:
    """Warn (once per Dockerfile per process) about the steps the local sandbox does not apply."""
    key = str(plan.path.resolve())
    with _lock:
        if key in _reported:
            return
        _reported.add(key)
    installs = [s.line for s in plan.skipped if s.instruction == "RUN"]
    other = [s for s in plan.skipped if s.instruction != "RUN" and s.reason not in ("image metadata", CMD_REPLACED)]
    if installs:
        logger.warning(
            "%s: the install commands of %d RUN step(s) skipped (line%s %s): the local sandbox builds no image; the "
            "host and the verifier toolbox provide what the sandbox has",
            plan.path,
            len(installs),
            "s" if len(installs) > 1 else "",
            ", ".join(map(str, installs)),
        )
    for s in plan.skipped:
        if s.reason == CMD_REPLACED:
            logger.info("%s:%d: CMD not run: %s", plan.path, s.line, s.reason)
    if plan.entrypoint is not None:
        logger.info("%s: ENTRYPOINT %s started in the background at each sandbox start, with Harbor's arguments %s",
                    plan.path, list(plan.entrypoint), list(HARBOR_COMMAND))
    if plan.runs:
        logger.info("%s: %d RUN step(s) run at each sandbox start (line%s %s)", plan.path, len(plan.runs),
                    "s" if len(plan.runs) > 1 else "", ", ".join(str(r.line) for r in plan.runs))
    for s in other:
        logger.warning("%s:%d: %s not applied by the local sandbox: %s", plan.path, s.line, s.instruction, s.reason)


def report_run_failure(plan: DockerfilePlan, step: RunStep, exit_code: int, output: str) -> None:
    """Warn (once per `RUN` per Dockerfile per process) that a `RUN` step failed in a local sandbox."""
    key = f"{plan.path.resolve()}:{step.line}"
    with _lock:
        if key in _reported:
            return
        _reported.add(key)
    tail = " | ".join(output.strip().splitlines()[-3:])
    logger.warning("%s:%d: RUN failed in the local sandbox (exit %d), which starts anyway: %s: %s", plan.path,
                   step.line, exit_code, step.command[:200], tail[-500:])
