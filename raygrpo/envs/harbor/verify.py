"""Running a Harbor task's verifier and keeping what it left behind: the exit code of `tests/test.sh`, the end of its
output, the raw rewards before reduction, and (for failed verifications) the sandbox's `/logs`.

A reward of 0.0 says nothing about why the tests failed: a wrong answer, or a `pytest: command not found`. The
evidence gathered here goes into every Harbor trajectory (`Trajectory.verifier`) so that anyone reading a run can
tell the two apart, and is what `verifier_error` verdicts are checked against.

Harbor's `Verifier` discards the exit code of `test.sh` (its output goes to `/logs/verifier/test-stdout.txt`), so
the verifier is given the sandbox behind a thin observer that records it.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raygrpo.envs.harbor import verify_missing
from raygrpo.envs.harbor.missing_commands import missing_commands
from raygrpo.envs.harbor.offline import SERVED, SERVED_URL_PART, install_shims, with_shims
from raygrpo.envs.harbor.tooling import probe_command, read_probe, scan_test_script, set_aside_named
from raygrpo.core.errors import describe
from raygrpo.core.nofollow import read_file, regular_files

if TYPE_CHECKING:
    from harbor.environments.base import BaseEnvironment
    from harbor.models.task.config import StepConfig
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

logger = logging.getLogger(__name__)

#: Characters of `test.sh`'s output kept in every trajectory.
OUTPUT_TAIL_CHARS = 2000
#: Deadline for gathering the evidence after a verification (reading the output, downloading `/logs`).
GATHER_TIMEOUT_S = 30.0


@dataclass
class VerifierEvidence:
    """What one verification left behind.

    Args:
        exit_code: The exit status of `tests/test.sh`; None when it never ran to an end (it was not reached, or
            ran past its deadline).
        output_tail: The end of what `test.sh` printed (stdout and stderr), as Harbor saved it.
        rewards: The verifier's rewards as written (`reward.txt` as `{"reward": x}`, `reward.json` as is), before
            `reward_reduce`; None when none could be read.
        logs: The sandbox's `/logs` files kept for this rollout (path relative to `/logs` -> text), when kept.
        logs_omitted: Files of `/logs` left out because the `keep_logs_kib` budget was spent.
        tooling_missing: What `test.sh` needs and the sandbox lacked when it started, before the model acted
            (`raygrpo.envs.harbor.tooling`); empty when nothing was missing or nothing was probed.
        missing_at_verify: The commands the verifier's shell could not find while it ran (looked for only when the
            probe found commands missing; `raygrpo.envs.harbor.verify_missing`).
    """

    exit_code: int | None = None
    output_tail: str | None = None
    rewards: dict[str, Any] | None = None
    logs: dict[str, str] | None = None
    logs_omitted: list[str] = field(default_factory=list)
    tooling_missing: list[str] = field(default_factory=list)
    missing_at_verify: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"exit_code": self.exit_code, "output_tail": self.output_tail, "rewards": self.rewards}
        if self.tooling_missing:
            out["tooling_missing"] = self.tooling_missing
        if self.missing_at_verify:
            out["missing_at_verify"] = self.missing_at_verify
        if self.logs is not None:
            out["logs"] = self.logs
            if self.logs_omitted:
                out["logs_omitted"] = self.logs_omitted
        return out


class _RecordingEnvironment:
    """What Harbor's verifier is given instead of the sandbox: the sandbox itself for everything, except that the
    exit code of the `exec` running `test_command` is kept in `evidence`. The sandbox is not modified."""

    def __init__(self, env: BaseEnvironment, test_command: str, evidence: VerifierEvidence, offline: bool,
                 watch: bool = False) -> None:
        self._env = env
        self._test_command = test_command
        self._evidence = evidence
        self._offline = offline
        self._watch = watch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    async def exec(self, command: str, *args: Any, **kwargs: Any) -> Any:
        if command != self._test_command:
            return await self._env.exec(command, *args, **kwargs)
        if self._offline:
            command = with_shims(command)
        if self._watch:
            command = verify_missing.watched(command)
        result = await self._env.exec(command, *args, **kwargs)
        self._evidence.exit_code = result.return_code
        return result


async def run_verifier(env: BaseEnvironment, task: Task, trial_paths: TrialPaths, evidence: VerifierEvidence, *,
                       offline_tooling: bool = False, watch_missing: bool = False,
                       step: StepConfig | None = None, skip_tests_upload: bool = False) -> Any:
    """Run Harbor's verifier for `task` in `env` as the task's verifier user, recording the exit code and the raw
    rewards in `evidence` (with `offline_tooling`, `test.sh` runs with `raygrpo.envs.harbor.offline`'s shims first on
    its `PATH`; with `watch_missing`, bash records the commands it cannot find: `missing_at_verify` reads them);
    returns Harbor's `VerifierResult` and raises what Harbor raises.

    With `step` (a multi-step task's current step), the step's tests are merged over the task's shared `tests/`,
    and the step's `[steps.verifier]` env and user apply, as in Harbor's `MultiStepTrial`. With `skip_tests_upload`
    (a separate verifier environment whose image bakes its tests in), the tests are not uploaded."""
    if offline_tooling:
        await install_shims(env, trial_paths.trial_dir)
    if watch_missing:
        await env.exec(verify_missing.install_command(), user="root", timeout_sec=int(GATHER_TIMEOUT_S))
    from harbor.models.trial.config import VerifierConfig
    from harbor.verifier.factory import VerifierFactory

    recording = _RecordingEnvironment(env, _test_command(env, task, trial_paths, step), evidence, offline_tooling,
                                      watch_missing)
    verifier = VerifierFactory.create_verifier_from_config(
        VerifierConfig(),
        task=task,
        trial_paths=trial_paths,
        environment=recording,  # type: ignore[arg-type] - the sandbox, observed
        # Harbor's `Verifier` merges the task's `[verifier.env]`, then the step's, then `override_env` (a job's CLI
        # env, which raygrpo has none of): passing the task's env there would let it override the step's.
        override_env=None,
        logger=logger,
        verifier_env=(step.verifier.env or None) if step is not None else None,
        step_name=step.name if step is not None else None,
        skip_tests_upload=skip_tests_upload,
    )
    # test.sh runs as the task's (or the step's) verifier user, as in a Harbor trial.
    with env.with_default_user(verifier_user(task, step)):
        result = await verifier.verify()
    evidence.rewards = dict(result.rewards or {})
    return result


#: `_test_command`'s answers by (task dir, OS): every verification of a task runs the same command, and building
#: it (a directory listing and path arithmetic) was a tenth of a rollout's CPU on a remote backend.
_TEST_COMMANDS: dict[tuple[str, str, str], str] = {}
_TEST_COMMANDS_KEPT = 4096


def _test_command(env: BaseEnvironment, task: Task, trial_paths: TrialPaths, step: StepConfig | None = None) -> str:
    """The command Harbor's verifier runs `test.sh` with (as `harbor.verifier.verifier.Verifier.verify` builds it;
    for a step, its own `tests/test.sh` where it has one, else the task's shared one).

    Made once per task, step and OS: the task (parsed once per provider) does not change, and every trial dir has
    Harbor's one layout."""
    key = (str(task.paths.task_dir), str(env.os), step.name if step is not None else "")
    command = _TEST_COMMANDS.get(key)
    if command is None:
        from harbor.models.trial.paths import EnvironmentPaths
        from harbor.utils.scripts import build_execution_command

        paths = EnvironmentPaths.for_os(env.os)
        tests_dir = task.paths.tests_dir
        host_test = None
        if step is not None:
            host_test = task.paths.discovered_step_test_path_for(step.name, env.os)
            tests_dir = task.paths.step_tests_dir(step.name) if host_test is not None else tests_dir
        host_test = host_test or task.paths.discovered_test_path_for(env.os)
        if host_test is None:
            return ""
        script = paths.tests_dir / host_test.relative_to(tests_dir).as_posix()
        stdout = paths.verifier_dir / trial_paths.test_stdout_path.relative_to(trial_paths.verifier_dir).as_posix()
        command = build_execution_command(str(script), stdout_path=str(stdout), task_os=env.os)
        if len(_TEST_COMMANDS) >= _TEST_COMMANDS_KEPT:
            _TEST_COMMANDS.clear()
        _TEST_COMMANDS[key] = command
    return command


async def probe_tooling(env: BaseEnvironment, task: Task, *, offline_tooling: bool = False,
                        step: StepConfig | None = None) -> list[str]:
    """What the task's `tests/test.sh` (for a multi-step task's `step`: the step's own, else the shared one, as
    Harbor's verifier picks it) needs and the sandbox `env` lacks, checked as the task's (the step's) verifier user
    (`raygrpo.envs.harbor.tooling`); with `offline_tooling`, what the shims serve is not looked for, but what they
    need (the packages `uvx` is asked for) is; the commands the task's instructions name are the model's to provide,
    not looked for (`raygrpo.envs.harbor.tooling.set_aside_named`). Call it before the model acts. Empty when nothing
    is missing."""
    host_test = task.paths.discovered_step_test_path_for(step.name, env.os) if step is not None else None
    host_test = host_test or task.paths.discovered_test_path_for(env.os)
    if host_test is None:
        return []
    needs = scan_test_script(host_test.read_text(errors="replace"))
    instructions = [task.instruction, *(task.step_instruction(step.name) for step in task.config.steps or [])]
    named = set_aside_named(needs, instructions)
    if named:
        logger.info("task %s: its instruction names %s: the model's to provide, not looked for before it acts",
                    task.name, ", ".join(f"`{c}`" for c in named))
    if offline_tooling:
        needs.urls = [u for u in needs.urls if SERVED_URL_PART not in u]
    command = probe_command(needs, served=SERVED if offline_tooling else ())
    if command is None:
        return []
    with env.with_default_user(verifier_user(task, step)):
        result = await env.exec(command, timeout_sec=int(GATHER_TIMEOUT_S))
    return read_probe(result.stdout or "")


def verifier_user(task: Task, step: StepConfig | None = None) -> str | int | None:
    """The user a verification runs as (Harbor's `_step_verifier_user`): the step's `[steps.verifier] user`, else the
    task's `[verifier] user`."""
    if step is not None and step.verifier.user is not None:
        return step.verifier.user
    return task.config.verifier.user


async def missing_at_verify(env: BaseEnvironment, trial_paths: TrialPaths) -> list[str]:
    """The commands the verifier's shell could not find (`raygrpo.envs.harbor.verify_missing`: bash's record of a
    watched verification, and the `not found` lines of `test.sh`'s output). Never raises: what cannot be read is
    logged and left out."""
    found: list[str] = []
    try:
        async with asyncio.timeout(GATHER_TIMEOUT_S):
            result = await env.exec(verify_missing.read_command(), user="root")
            found += verify_missing.read_record(result.stdout)
            found += missing_commands(await _output_tail(env, trial_paths))
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - evidence is best effort
        logger.warning("could not read the commands the verifier missed: %s", describe(exc))
    return list(dict.fromkeys(found))


async def gather(
    env: BaseEnvironment,
    trial_paths: TrialPaths,
    evidence: VerifierEvidence,
    *,
    keep_logs: bool,
    keep_logs_kib: int,
    label: str,
) -> None:
    """Fill in the output tail (and the kept `/logs`, when `keep_logs`) after a verification, however it ended.
    Bounded by `GATHER_TIMEOUT_S`; never raises (missing evidence is logged, not fatal)."""
    try:
        async with asyncio.timeout(GATHER_TIMEOUT_S):
            evidence.output_tail = await _output_tail(env, trial_paths)
            if keep_logs:
                evidence.logs, evidence.logs_omitted = await _kept_logs(env, trial_paths, keep_logs_kib * 1024)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - evidence is best effort; the verdict stands without it
        logger.warning("%s: could not gather the verifier's output: %s", label, describe(exc))


async def _output_tail(env: BaseEnvironment, trial_paths: TrialPaths) -> str | None:
    from harbor.models.trial.paths import EnvironmentPaths

    host = trial_paths.test_stdout_path
    # Downloaded (or mounted) by the verifier. Read without following a link: the model can plant one at this name
    # (`-> /proc/self/environ`), and on the host it would lead to the host's files.
    data = read_file(host, max_bytes=OUTPUT_TAIL_CHARS * 4, tail=True)
    if data is not None:
        return _tail(data, OUTPUT_TAIL_CHARS)
    if host.is_symlink():
        return None
    # The verifier did not get to download it (it ran past its deadline, or crashed): ask the sandbox.
    sandbox_path = EnvironmentPaths.for_os(env.os).verifier_dir / host.name
    result = await env.exec(f"tail -c {OUTPUT_TAIL_CHARS * 4} {shlex.quote(str(sandbox_path))}", user="root")
    if result.return_code != 0:
        return None
    return _tail((result.stdout or "").encode(), OUTPUT_TAIL_CHARS)


async def _kept_logs(env: BaseEnvironment, trial_paths: TrialPaths, budget: int) -> tuple[dict[str, str], list[str]]:
    """The sandbox's `/logs` as `{relative path: text}` within `budget` bytes (each file keeps its end; the test
    output first), and the files left out. Regular files only: a link the model planted in `/logs` (say
    `agent/env.txt -> /proc/self/environ`) is neither followed nor kept, whatever the backend's download made of
    it (docker's keeps links as links)."""
    from harbor.models.trial.paths import EnvironmentPaths

    with tempfile.TemporaryDirectory(dir=trial_paths.trial_dir, prefix="kept-logs-") as tmp:
        await env.download_dir(source_dir=str(EnvironmentPaths.for_os(env.os).logs_dir), target_dir=Path(tmp))
        files = sorted(regular_files(tmp),
                       key=lambda p: (p.name != trial_paths.test_stdout_path.name, str(p)))
        kept: dict[str, str] = {}
        omitted: list[str] = []
        for path in files:
            rel = path.relative_to(tmp).as_posix()
            if budget <= 0:
                omitted.append(rel)
                continue
            data = read_file(path)
            if data is None:
                continue
            text = _tail(data, budget)
            kept[rel] = text
            budget -= min(len(data), budget)
        return kept, omitted


def _tail(data: bytes, chars: int) -> str:
    """The last `chars` characters of `data` (UTF-8, undecodable bytes replaced), marked when cut."""
    text = data.decode("utf-8", errors="replace")
    if len(text) <= chars:
        return text
    return "[...]\n" + text[-chars:]
