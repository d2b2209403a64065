"""The built-in `oracle` and `noop` policies on real Harbor task folders, through the real agent loop
(`run_rollout`) on the local sandbox backend, no Ray: the oracle does what Harbor's oracle agent does (uploads
`solution/` to `/solution`, runs `solve.sh` from the working directory as the agent user with the task's
`[solution] env`), noop leaves the sandbox untouched; what the oracle did is a step of the trajectory, and what the
model cannot have caused is never a 0.0. Config and resolve refusals are checked here too (no Ray starts)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from raygrpo.config import ConfigError, load_config
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.adapter import HarborAdapter
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.core.errors import ResolveError
from raygrpo.core.imports import load_object
from raygrpo.policy.acting import NoopPolicy, OraclePolicy
from raygrpo.policy.base import SamplingParams
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.governor.gate import reset_gates
from raygrpo.driver.resolve import resolve_run
from raygrpo.agent.rollout import run_rollout
from raygrpo.sandbox.os_probe import sandbox_mounts, sandbox_processes
from raygrpo.sandbox.owners import live_sandboxes
from raygrpo.specs.harbor import HarborSpec
from raygrpo.core.types import SOLUTION_STEP, Status
from tests.harbor_utils import EXAMPLE_DIR, make_task

pytestmark = pytest.mark.timeout(120)

CONFIG = RolloutConfig(max_turns=4, max_total_tokens=4096)


@pytest.fixture
def root(tmp_path):
    reset_gates()
    yield str(tmp_path / "sbx")
    reset_gates()


def spec_for(path, root: str, **fields) -> HarborSpec:
    return HarborSpec.model_validate({"path": str(path), "environment_kwargs": {"sandbox_root": root}, **fields})


def nothing_left(root: str) -> None:
    state = (sandbox_processes(root), sandbox_mounts(root), [s.sandbox_id for s in live_sandboxes(root)])
    assert state == ([], [], []), state


def add_solution_file(task: Path, rel: str, text: str, executable: bool = False) -> None:
    path = task / "solution" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


async def rollout(spec: HarborSpec, policy, renderer=None, adapter: HarborAdapter | None = None,
                  provider: HarborProvider | None = None):
    provider = provider or HarborProvider(spec, name="suite")
    try:
        return await run_rollout(list_harbor_tasks(spec, "suite")[0], adapter or provider.adapter(), policy, renderer,
                                 SamplingParams(max_tokens=1024), CONFIG)
    finally:
        await provider.aclose()


COPIED_TEST = """#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ] && [ "$(python3 /app/helper.py)" = "helped" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def copying_task(root: Path) -> Path:
    """A task whose reference solution copies `/solution/<file>` into place, as most public tasks' do."""
    task = make_task(root, "copies", test_sh=COPIED_TEST,
                     solve_sh="cp /solution/answer.txt /app/answer.txt\ncp /solution/lib/helper.py ./helper.py")
    add_solution_file(task, "answer.txt", "42\n")
    add_solution_file(task, "lib/helper.py", "print('helped')\n")
    return task


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    from transformers import AutoTokenizer

    from raygrpo.agent.chat import ChatRenderer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


async def test_oracle_uploads_the_solution_folder_and_noop_leaves_the_sandbox_alone(root, tmp_path, renderer):
    copying_task(tmp_path / "suite")
    spec = spec_for(tmp_path / "suite", root)
    oracle = await rollout(spec, OraclePolicy())
    assert oracle.status is Status.OK and oracle.reward == 1.0, oracle.error
    (step,) = oracle.steps
    assert step["tool"] == SOLUTION_STEP and step["finished"] is True
    assert step["metadata"]["exit_code"] == 0 and step["metadata"]["script"] == "/solution/solve.sh"
    assert oracle.turns == 0 and oracle.completion_ids == [] and oracle.messages[-1]["role"] == "user"
    noop = await rollout(spec, NoopPolicy())
    assert noop.status is Status.OK and noop.reward == 0.0 and noop.steps == []
    # Pasting the script's text into the bash tool (the example's scripted `right`) finds no /solution: 0.0.
    pasted = await rollout(spec, ScriptedPolicy(renderer.tokenizer, load_object(f"{EXAMPLE_DIR}/policies.py:right")),
                           renderer)
    assert pasted.status is Status.OK and pasted.reward == 0.0
    nothing_left(root)


ENV_TEST = """#!/bin/bash
if [ "$(cat /tmp/where.txt)" = "/srv/work" ] && [ "$(cat /tmp/who.txt)" = "nobody" ] \\
   && [ "$(cat /tmp/token.txt)" = "from-task-toml" ] && [ "$(cat /tmp/frontend.txt)" = "noninteractive" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


async def test_oracle_runs_from_the_workdir_as_the_agent_user_with_the_solution_env(root, tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGRPO_TEST_TOKEN", "from-task-toml")
    task = make_task(
        tmp_path / "suite", "env", test_sh=ENV_TEST,
        dockerfile="FROM python:3.12-slim\nWORKDIR /srv/work\n",
        solve_sh=("pwd > /tmp/where.txt; id -un > /tmp/who.txt; echo \"$TOKEN\" > /tmp/token.txt; "
                  "echo \"$DEBIAN_FRONTEND\" > /tmp/frontend.txt"),
    )
    with open(task / "task.toml", "a") as toml:
        toml.write('\n[agent]\nuser = "nobody"\n\n[solution]\nenv = { TOKEN = "${RAYGRPO_TEST_TOKEN}" }\n')
    traj = await rollout(spec_for(tmp_path / "suite", root), OraclePolicy())
    assert traj.status is Status.OK and traj.reward == 1.0, (traj.error, traj.steps)
    nothing_left(root)


async def test_a_failing_solution_is_left_to_the_verifier_with_its_exit_code_and_output(root, tmp_path):
    make_task(tmp_path / "suite", "fails", solve_sh="echo working on it\necho 'boom: no such file' >&2\nexit 3")
    traj = await rollout(spec_for(tmp_path / "suite", root), OraclePolicy())
    assert traj.status is Status.OK and traj.reward == 0.0
    meta = traj.steps[0]["metadata"]
    assert meta["exit_code"] == 3 and "boom: no such file" in meta["output_tail"]
    nothing_left(root)


async def test_a_missing_solve_sh_is_a_task_error_naming_the_file(root, tmp_path):
    task = make_task(tmp_path / "suite", "nosolution")
    (task / "solution" / "solve.sh").unlink()
    traj = await rollout(spec_for(tmp_path / "suite", root), OraclePolicy())
    assert traj.status is Status.TASK_ERROR and traj.reward is None
    assert str(task / "solution" / "solve.sh") in traj.error and "missing" in traj.error
    nothing_left(root)


async def test_a_solution_past_the_agent_timeout_is_unscored_timeout(root, tmp_path):
    task = make_task(tmp_path / "suite", "slow", solve_sh="sleep 60")
    with open(task / "task.toml", "a") as toml:
        toml.write("\n[agent]\ntimeout_sec = 1.0\n")
    traj = await rollout(spec_for(tmp_path / "suite", root), OraclePolicy())
    assert traj.status is Status.TIMEOUT and traj.reward is None
    assert "timeout_sec=1" in traj.error
    nothing_left(root)


SOLUTION_UPLOAD_FAILS = """
from raygrpo.sandbox.local import LocalSandboxEnvironment


class SolutionUploadFails(LocalSandboxEnvironment):
    async def upload_dir(self, source_dir, target_dir):
        if str(target_dir) == "/solution":
            raise OSError("No space left on device")
        return await super().upload_dir(source_dir, target_dir)
"""


async def test_a_solution_the_sandbox_cannot_run_is_env_error_not_zero(root, tmp_path):
    make_task(tmp_path / "suite", "t")
    (tmp_path / "backend.py").write_text(SOLUTION_UPLOAD_FAILS)
    spec = spec_for(tmp_path / "suite", root, import_path=f"{tmp_path}/backend.py:SolutionUploadFails")
    traj = await rollout(spec, OraclePolicy())
    assert traj.status is Status.ENV_ERROR and traj.reward is None
    assert "could not upload the reference solution" in traj.error and "No space left" in traj.error
    nothing_left(root)


async def test_a_sandbox_that_dies_under_the_solution_is_env_error(root, tmp_path):
    make_task(tmp_path / "suite", "t", solve_sh="sleep 30")
    spec = spec_for(tmp_path / "suite", root)
    provider = HarborProvider(spec, name="suite")
    adapter = provider.adapter()

    class KillsTheSandbox(OraclePolicy):
        async def act(self, adapter):
            import asyncio
            import signal

            async def kill():
                await asyncio.sleep(1.0)
                os.kill(adapter.env.init_pid, signal.SIGKILL)

            killer = asyncio.create_task(kill())
            try:
                return await super().act(adapter)
            finally:
                await killer

    traj = await rollout(spec, KillsTheSandbox(), adapter=adapter, provider=provider)
    assert traj.status is Status.ENV_ERROR and traj.reward is None, (traj.status, traj.error)
    nothing_left(root)


# ── config and resolve: refused before Ray starts ─────────────────────────────────────────────────────────────────


def test_train_refuses_oracle_and_noop_naming_policy_kind(tmp_path):
    for kind in ("oracle", "noop"):
        cfg = load_config(EXAMPLE_DIR / "rollout.yaml", [f"policy.kind={kind}"])
        with pytest.raises(ResolveError, match=rf"^policy\.kind: '{kind}' writes no text.*raygrpo train"):
            resolve_run(cfg, train=True)
    from raygrpo.cli import main

    assert main(["train", str(EXAMPLE_DIR / "rollout.yaml"), "--out", str(tmp_path / "out")]) == 2


def test_oracle_on_an_ors_environment_is_refused_naming_it():
    cfg = load_config("examples/echo/rollout.yaml", ["policy.kind=oracle", "policy.script=null"])
    with pytest.raises(ResolveError, match=r"^envs\.echo: policy\.kind 'oracle' runs a task's reference solution"):
        resolve_run(cfg)


def test_a_script_with_an_acting_policy_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"policy\.script is set but policy\.kind is 'oracle'"):
        load_config(EXAMPLE_DIR / "rollout.yaml", ["policy.script=policies.py:wrong"])
    cfg = load_config(EXAMPLE_DIR / "rollout.yaml", ["policy.kind=scripted", "policy.script=policies.py:wrong"])
    assert cfg.policy.kind == "scripted"
