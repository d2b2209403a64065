"""`stop_agent_processes`: what the model left running cannot touch a shared verification, on the local sandbox and
on docker, while the sandbox's own services (a Dockerfile's ENTRYPOINT) keep running; and without it, Harbor's
behaviour: a detached process of the model's outlives its turn into the verification."""

from __future__ import annotations

import logging
import re

import pytest

from raygrpo.agent.chat import ChatRenderer
from raygrpo.agent.rollout import run_rollout
from raygrpo.config.rollout import RolloutConfig
from raygrpo.core.types import Status
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.governor.gate import reset_gates
from raygrpo.policy.base import SamplingParams
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.specs.harbor import HarborSpec
from tests.docker_utils import docker_ready  # noqa: F401 - a fixture
from tests.harbor_utils import bash_script, make_task

pytestmark = pytest.mark.timeout(180)

#: The model never writes /app/out.txt (test.sh writes 0) but leaves a loop that keeps putting reward 1 in place
#: (renamed over the file, so that a read never finds it half written).
TAMPER = ("nohup setsid bash -c 'end=$((SECONDS+60)); while [ $SECONDS -lt $end ]; do "
          "echo 1 > /logs/.r 2>/dev/null && mv -f /logs/.r /logs/verifier/reward.txt 2>/dev/null; sleep 0.005; "
          "done' >/dev/null 2>&1 & sleep 300 & echo started")
#: The verifier gives the tampering loop time to overwrite what it wrote.
SLOW_TEST = """#!/bin/bash
if [ "$(cat /app/out.txt 2>/dev/null)" = "ok" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
sleep 0.5
"""
#: A service the image starts (ENTRYPOINT) beats into /tmp/beat; the test checks it is still alive.
SERVICE_DOCKERFILE = """\
FROM python:3.12-slim
COPY entrypoint.sh /entrypoint.sh
RUN chmod +x /entrypoint.sh
WORKDIR /app
ENTRYPOINT ["/entrypoint.sh"]
"""
SERVICE_SH = """#!/bin/bash
(while true; do date +%s%N > /tmp/beat; sleep 0.05; done) &
exec "$@"
"""
SERVICE_TEST = """#!/bin/bash
a=$(cat /tmp/beat 2>/dev/null); sleep 0.5; b=$(cat /tmp/beat 2>/dev/null)
if [ -n "$a" ] && [ "$a" != "$b" ] && [ "$(cat /app/out.txt 2>/dev/null)" = "ok" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture(autouse=True)
def _gates():
    reset_gates()
    yield
    reset_gates()


async def _rollout(suite, renderer, commands, **fields):
    spec = HarborSpec.model_validate({"path": str(suite), "exec_timeout_s": 60, **fields})
    provider = HarborProvider(spec, name="suite")
    try:
        return await run_rollout(
            list_harbor_tasks(spec, "suite")[0], provider.adapter(),
            ScriptedPolicy(renderer.tokenizer, bash_script(*commands)), renderer, SamplingParams(max_tokens=1024),
            RolloutConfig(max_turns=len(commands) + 1, max_total_tokens=4096, max_tool_output_chars=8000))
    finally:
        await provider.aclose()


def _local(tmp_path):
    return {"environment_kwargs": {"sandbox_root": str(tmp_path / "sbx")}}


async def test_without_the_option_a_detached_process_of_the_model_rewrites_the_reward(renderer, tmp_path):
    """Harbor's behaviour, and the reason for the option: the shared verifier runs beside what the model left."""
    make_task(tmp_path / "suite", "t", test_sh=SLOW_TEST)
    traj = await _rollout(tmp_path / "suite", renderer, [TAMPER], **_local(tmp_path))
    assert traj.status is Status.OK and traj.reward == 1.0, traj.error


async def test_the_models_processes_are_stopped_before_the_verifier_runs(renderer, tmp_path, caplog):
    make_task(tmp_path / "suite", "t", test_sh=SLOW_TEST)
    caplog.set_level(logging.INFO, logger="raygrpo.envs.harbor.agent_processes")
    traj = await _rollout(tmp_path / "suite", renderer, [TAMPER], stop_agent_processes=True, **_local(tmp_path))
    assert traj.status is Status.OK and traj.reward == 0.0, traj.error
    assert traj.verifier["rewards"] == {"reward": 0.0}
    # The loop and `sleep 300`, and whichever of the loop's children were running when it was caught.
    stopped = [int(m.group(1)) for r in caplog.records
               if (m := re.search(r"stopped (\d+) process\(es\) the model left running", r.getMessage()))]
    assert stopped and stopped[0] >= 2, [r.getMessage() for r in caplog.records]


async def test_the_sandboxs_own_services_keep_running_and_a_right_answer_still_scores(renderer, tmp_path):
    make_task(tmp_path / "suite", "t", test_sh=SERVICE_TEST, dockerfile=SERVICE_DOCKERFILE,
              files={"entrypoint.sh": SERVICE_SH})
    traj = await _rollout(tmp_path / "suite", renderer, ["sleep 0.3; echo ok > /app/out.txt", TAMPER],
                          stop_agent_processes=True, **_local(tmp_path))
    assert traj.status is Status.OK and traj.reward == 1.0, (traj.error, traj.verifier)


@pytest.mark.docker
async def test_on_docker_too(renderer, tmp_path, docker_ready):
    make_task(tmp_path / "suite", "t", test_sh=SLOW_TEST)
    traj = await _rollout(tmp_path / "suite", renderer, [TAMPER], stop_agent_processes=True,
                          environment_type="docker")
    assert traj.status is Status.OK and traj.reward == 0.0, traj.error


#: What the model leaves running re-plants `reward.txt` as a link to a host file holding `1` after Harbor's `rm -f`
#: (a model would aim at a file it can guess: a pid file; the test plants its own).
RELINK = ("nohup setsid bash -c 'end=$((SECONDS+60)); while [ $SECONDS -lt $end ]; do "
          "ln -sfn {target} /logs/verifier/reward.txt 2>/dev/null; sleep 0.002; "
          "done' >/dev/null 2>&1 & echo started")
#: `test.sh` writes 0 (through the link where there is one, which fails) and takes a moment.
RELINK_TEST = """#!/bin/bash
sleep 0.3
echo 0 > /logs/verifier/reward.txt
sleep 0.3
"""


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
async def test_a_reward_file_planted_as_a_link_to_a_host_file_is_no_reward(renderer, tmp_path, backend, request):
    """A leftover process re-planting `reward.txt` as a link to a host file holding 1: on docker (/logs mounted)
    Harbor reads the reward on the host, through the link, unless the process is stopped first; the local backend
    never copies a link out of the sandbox (`raygrpo.core.nofollow`), so there it is no reward (`task_error`)."""
    if backend == "docker":
        request.getfixturevalue("docker_ready")
    host_file = tmp_path / "one.txt"
    host_file.write_text("1\n")
    make_task(tmp_path / "suite", "t", test_sh=RELINK_TEST)
    fields = {"environment_type": "docker"} if backend == "docker" else _local(tmp_path)
    attack = [RELINK.format(target=host_file)]
    if backend == "local":
        traj = await _rollout(tmp_path / "suite", renderer, attack, **fields)
        assert traj.status is Status.TASK_ERROR and "RewardFileNotFoundError" in traj.error, (traj.status, traj.error)
    else:
        traj = await _rollout(tmp_path / "suite", renderer, attack, **fields)
        assert traj.status is Status.OK and traj.reward == 1.0, (traj.status, traj.error)  # Harbor's own reading
    traj = await _rollout(tmp_path / "suite", renderer, attack, stop_agent_processes=True, **fields)
    assert traj.status is Status.OK and traj.reward == 0.0, (traj.status, traj.error)
    assert host_file.read_text() == "1\n"
