"""HarborAdapter / HarborProvider on the local sandbox backend, driven by the real agent loop (`run_rollout` with a
scripted policy and the tiny tokenizer): the example suite's correct and wrong replays, tool output limits, exec
timeouts, every verifier outcome (reward, reduced reward.json, timeout, missing reward, crash), failed starts, a
sandbox that dies, cancellation. Leaks are checked through the OS (`/proc`: sandbox processes and mounts), not
through raygrpo's bookkeeping."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import statistics
import time

import pytest

from raygrpo.agent.chat import ChatRenderer
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.base import EnvAdapter, EnvError, EnvProvider, RewardMissingError, refuse_call
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.adapter import HarborAdapter
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.envs.harbor.harness import BashHarness, clip_output
from raygrpo.envs.harbor.rewards import reduce_rewards
from raygrpo.core.imports import load_object
from raygrpo.policy.base import SamplingParams
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.governor.gate import reset_gates
from raygrpo.agent.rollout import run_rollout
from raygrpo.sandbox.os_probe import sandbox_mounts, sandbox_processes
from raygrpo.sandbox.owners import live_sandboxes
from raygrpo.specs.harbor import HarborSpec
from raygrpo.core.types import Status, TaskRef
from tests.harbor_utils import EXAMPLE_DIR, EXAMPLE_TASKS, bash_script, example_task_names, make_task, tool_texts

pytestmark = pytest.mark.timeout(120)

logger = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def renderer(tiny_model_dir):
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(tiny_model_dir))


@pytest.fixture
def root(tmp_path):
    """This test's sandbox root: the OS checks below look only at sandboxes under it."""
    reset_gates()
    path = tmp_path / "sbx"
    yield str(path)
    reset_gates()


def spec_for(path, root: str, **fields) -> HarborSpec:
    kwargs = {"sandbox_root": root, **fields.pop("environment_kwargs", {})}
    return HarborSpec.model_validate({"path": str(path), "environment_kwargs": kwargs, **fields})


async def nothing_left(root: str, timeout_s: float = 10.0) -> None:
    """No process, mount or live sandbox directory of this root remains (polled briefly: kills are asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = (sandbox_processes(root), sandbox_mounts(root), [s.sandbox_id for s in live_sandboxes(root)])
        if state == ([], [], []):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"sandboxes left under {root}: processes, mounts, dirs = {state}")
        await asyncio.sleep(0.1)


CONFIG = dict(max_turns=4, max_total_tokens=4096, max_tool_output_chars=8000)


async def rollout(spec: HarborSpec, renderer, script, ref=None, adapter=None, **config):
    """One rollout through the real agent loop; the provider is closed afterwards."""
    provider = HarborProvider(spec, name="suite")
    ref = ref or list_harbor_tasks(spec, "suite")[0]
    try:
        return await run_rollout(
            ref, adapter or provider.adapter(), ScriptedPolicy(renderer.tokenizer, script), renderer,
            SamplingParams(max_tokens=1024), RolloutConfig(**{**CONFIG, **config}),
        )
    finally:
        await provider.aclose()


# ── the example suite ──────────────────────────────────────────────────────────────────────────────────────────


async def test_example_suite_right_scores_one_and_wrong_zero(renderer, root):
    spec = spec_for(EXAMPLE_TASKS, root, max_concurrent_starts=4)
    provider = HarborProvider(spec, name="local")
    assert isinstance(provider, EnvProvider) and isinstance(provider.adapter(), EnvAdapter)
    refs = list_harbor_tasks(spec, "local")
    assert len(refs) == len(example_task_names()) >= 8
    policies = {name: load_object(f"{EXAMPLE_DIR}/policies.py:{name}") for name in ("right", "wrong", "silent")}
    config = RolloutConfig(**CONFIG)

    async def one(ref, policy):
        adapter = provider.adapter()
        traj = await run_rollout(ref, adapter, ScriptedPolicy(renderer.tokenizer, policies[policy]), renderer,
                                 SamplingParams(max_tokens=1024), config)
        return policy, ref, traj, adapter.timings

    runs = [(ref, policy) for ref in refs for policy in ("right", "wrong")] + [(refs[0], "silent")]
    try:
        results = await asyncio.gather(*(one(ref, policy) for ref, policy in runs))
    finally:
        await provider.aclose()
    for policy, ref, traj, _ in results:
        name = os.path.basename(ref.metadata["task_dir"])
        assert traj.status is Status.OK, (name, policy, traj.error)
        assert traj.reward == (1.0 if policy == "right" else 0.0), (name, policy, tool_texts(traj))
        assert traj.tool_calls == (0 if policy == "silent" else 1)
    # Per-phase seconds of one rollout on this machine, for the record (see the report in -s output).
    phases = {k: statistics.median(t[k] for *_, t in results if k in t) for k in ("start", "exec", "verify", "stop")}
    logger.warning("harbor local per-rollout medians (s): %s", {k: round(v, 3) for k, v in phases.items()})
    await nothing_left(root)


# ── tools ─────────────────────────────────────────────────────────────────────────────────────────────────────


async def test_bash_output_is_truncated_head_and_tail(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t")
    spec = spec_for(tmp_path / "suite", root, max_output_chars=300)
    traj = await rollout(spec, renderer, bash_script("python3 -c \"print('a' * 5000); print('END')\"; exit 3"))
    (text,) = tool_texts(traj)
    assert len(text) <= 300
    assert text.startswith("aaaa") and "characters omitted" in text and text.endswith("END\n[exit code 3]")
    assert traj.status is Status.OK and traj.reward == 0.0
    await nothing_left(root)


async def test_exec_timeout_is_an_error_message_and_the_rollout_goes_on(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t")
    spec = spec_for(tmp_path / "suite", root, exec_timeout_s=1)
    began = time.monotonic()
    traj = await rollout(spec, renderer, bash_script(
        "sleep 300 > /dev/null 2>&1 & echo started",  # a background process: it lives until the sandbox stops
        "echo partial; sleep 30; echo never",  # hangs: cut at the exec timeout
        "echo ok > /app/out.txt; ps -eo args",
    ))
    started, hung, listing = tool_texts(traj)
    assert started.startswith("started")
    assert hung.startswith("Error: the command did not finish within 1 s and was stopped: echo partial;")
    assert hung.endswith("Output before it was stopped:\npartial\n")
    assert "sleep 300" in listing and "sleep 30\n" not in listing  # the hung command's processes were killed
    assert traj.status is Status.OK and traj.reward == 1.0  # the episode went on after the timeout
    assert time.monotonic() - began < 20
    await nothing_left(root)  # the background sleep went with the sandbox


AGENT_DEADLINE_TOML = """schema_version = "1.4"

[task]
name = "tests/agent-deadline"

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 2.0
"""


async def test_the_tasks_agent_timeout_stops_the_model_then_the_verifier_judges(renderer, root, tmp_path):
    """As Harbor's trial does: at the task's `[agent] timeout_sec` the agent is stopped (its command in flight
    killed) and the verifier runs; its reward is the episode's, and the trajectory says the agent timed out."""
    make_task(tmp_path / "suite", "t", toml=AGENT_DEADLINE_TOML)
    spec = spec_for(tmp_path / "suite", root, exec_timeout_s=60)
    began = time.monotonic()
    traj = await rollout(spec, renderer, bash_script("echo ok > /app/out.txt", "sleep 40", "echo never"))
    assert time.monotonic() - began < 20
    assert traj.status is Status.OK and traj.reward == 1.0, traj.error
    assert "agent timeout (2 s)" in traj.error
    assert tool_texts(traj) == ["[exit code 0]"] and traj.verifier["exit_code"] == 0
    await nothing_left(root)


async def test_refused_calls_do_not_touch_the_sandbox(root, tmp_path):
    make_task(tmp_path / "suite", "t")
    provider = HarborProvider(spec_for(tmp_path / "suite", root))
    adapter = provider.adapter()
    try:
        await adapter.start(list_harbor_tasks(provider.spec, "s")[0])
        unknown = await adapter.call("python", {"code": "1"})
        assert unknown.error and "unknown tool 'python'" in unknown.text and "bash" in unknown.text
        missing = await adapter.call("bash", {})
        assert missing.error and "`command`" in missing.text
        extra = await adapter.call("bash", {"command": "ls", "timeout": 3})
        assert extra.error and "unexpected: timeout" in extra.text
        assert (await adapter.call("bash", {"command": "pwd"})).text == "/app\n[exit code 0]"  # Dockerfile WORKDIR
    finally:
        await adapter.close()
        await provider.aclose()
    await nothing_left(root)


async def test_reuploaded_copies_land_where_copy_puts_them(renderer, root, tmp_path):
    # The e2b workaround, run for real on the local backend: every COPY form ends up in place again.
    make_task(tmp_path / "suite", "t", files={"data/a.txt": "A\n", "data/sub/b.txt": "B\n", "one.txt": "1\n"},
              dockerfile="FROM python:3.12-slim\nWORKDIR /app\nCOPY data /app/data\nCOPY one.txt /opt/x/one.txt\n"
                         "COPY --chmod=755 <<EOF /app/run.sh\n#!/bin/sh\necho ran\nEOF\n")
    spec = spec_for(tmp_path / "suite", root, reupload_copied_files=True)
    provider = HarborProvider(spec)
    adapter = provider.adapter()
    try:
        await adapter.start(list_harbor_tasks(spec, "s")[0])
        listing = await adapter.call("bash", {"command": "ls /tmp | grep -c raygrpo-upload; "  # staging is gone
                                                         "cat data/a.txt data/sub/b.txt /opt/x/one.txt; ./run.sh"})
    finally:
        await adapter.close()
        await provider.aclose()
    assert listing.text == "0\nA\nB\n1\nran\n[exit code 0]"
    await nothing_left(root)


# ── scoring ───────────────────────────────────────────────────────────────────────────────────────────────────


async def test_verifier_timeout_is_status_timeout(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t", test_sh="#!/bin/bash\nsleep 60\necho 1 > /logs/verifier/reward.txt\n")
    spec = spec_for(tmp_path / "suite", root, verifier_timeout_s=1)
    began = time.monotonic()
    traj = await rollout(spec, renderer, bash_script("echo ok > /app/out.txt"))
    assert traj.status is Status.TIMEOUT and traj.reward is None
    assert 1 <= traj.timings["verify"] < 5 and time.monotonic() - began < 20
    await nothing_left(root)  # the hung test.sh went with the sandbox


async def test_task_verifier_timeout_applies_when_the_spec_sets_none(root, tmp_path):
    make_task(tmp_path / "suite", "t", verifier_timeout=1.0, test_sh="#!/bin/bash\nsleep 60\n")
    provider = HarborProvider(spec_for(tmp_path / "suite", root))
    adapter = provider.adapter()
    try:
        await adapter.start(list_harbor_tasks(provider.spec, "s")[0])
        with pytest.raises(TimeoutError, match="within 1 s"):
            await adapter.score()
    finally:
        await adapter.close()
        await provider.aclose()
    await nothing_left(root)


@pytest.mark.parametrize(
    "test_sh",
    [
        "#!/bin/bash\necho checked, but wrote no reward\n",
        "#!/bin/bash\n: > /logs/verifier/reward.txt\n",  # an empty reward file
        "#!/bin/bash\necho 'not a number' > /logs/verifier/reward.txt\n",
    ],
    ids=["no-file", "empty", "garbage"],
)
async def test_missing_reward_is_a_task_error(renderer, root, tmp_path, test_sh):
    make_task(tmp_path / "suite", "t", test_sh=test_sh)
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script("echo ok > /app/out.txt"))
    assert traj.status is Status.TASK_ERROR and traj.reward is None
    assert "no usable reward" in traj.error
    await nothing_left(root)


CRASHING_BACKEND = """
from raygrpo.sandbox.local import LocalSandboxEnvironment


class TestsUploadFails(LocalSandboxEnvironment):
    async def upload_dir(self, source_dir, target_dir):
        if str(target_dir) == "/tests":
            raise OSError("No space left on device")
        return await super().upload_dir(source_dir, target_dir)
"""


async def test_verifier_crash_is_env_error(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t")
    (tmp_path / "crashing.py").write_text(CRASHING_BACKEND)
    spec = spec_for(tmp_path / "suite", root, import_path=f"{tmp_path}/crashing.py:TestsUploadFails")
    traj = await rollout(spec, renderer, bash_script("echo ok > /app/out.txt"))
    assert traj.status is Status.ENV_ERROR and traj.reward is None
    assert "HarborVerifierError" in traj.error and "verifier crashed" in traj.error
    await nothing_left(root)


MULTI_REWARD = """#!/bin/bash
echo '{"correct": 1, "style": 0.5, "speed": 0}' > /logs/verifier/reward.json
"""


@pytest.mark.parametrize(
    "reduce, key, expected",
    [("key", "style", 0.5), ("mean", None, 0.5), ("sum", None, 1.5), ("min", None, 0.0), ("max", None, 1.0),
     ("key", None, None)],
)
async def test_reward_json_reductions(renderer, root, tmp_path, reduce, key, expected):
    make_task(tmp_path / "suite", "t", test_sh=MULTI_REWARD)
    spec = spec_for(tmp_path / "suite", root, reward_reduce=reduce, reward_key=key)
    traj = await rollout(spec, renderer, bash_script("true"))
    if expected is None:  # several entries, none named "reward", no key: reported, not guessed
        assert traj.status is Status.TASK_ERROR and "none is named 'reward'" in traj.error
    else:
        assert traj.status is Status.OK and traj.reward == pytest.approx(expected)


def test_reduce_rewards_rules():
    assert reduce_rewards({"reward": 0.25, "x": 1}, "key", None) == 0.25
    assert reduce_rewards({"only": 0.75}, "key", None) == 0.75
    assert reduce_rewards({"a": 1, "b": 0}, "key", "b") == 0.0
    with pytest.raises(RewardMissingError, match="has no 'c'"):
        reduce_rewards({"a": 1, "b": 0}, "key", "c")
    with pytest.raises(RewardMissingError, match="holds no rewards"):
        reduce_rewards({}, "mean", None)
    assert reduce_rewards({"a": 1, "b": 0, "c": 0.5}, "max", None) == 1.0


# ── failures and cleanup ──────────────────────────────────────────────────────────────────────────────────────

FAILING_HEALTHCHECK = """
[environment.healthcheck]
command = "test -f /app/never-there"
interval_sec = 0.1
timeout_sec = 5
start_period_sec = 0
retries = 2
"""


@pytest.mark.parametrize("how", ["healthcheck", "fault-after-start", "fault-before-start"])
async def test_failed_start_is_env_error_and_leaves_nothing(renderer, root, tmp_path, how):
    make_task(tmp_path / "suite", "t", environment=FAILING_HEALTHCHECK if how == "healthcheck" else "")
    faults = {"fault-after-start": {"post_start_failure_rate": 1.0},
              "fault-before-start": {"start_failure_rate": 1.0}}.get(how)
    spec = spec_for(tmp_path / "suite", root, faults=faults)
    traj = await rollout(spec, renderer, bash_script("echo ok > /app/out.txt"))
    assert traj.status is Status.ENV_ERROR and traj.reward is None
    assert "HarborStartError" in traj.error
    assert traj.turns == 0
    await nothing_left(root)


@pytest.mark.parametrize("how", ["environment-env", "verifier-env", "gpus", "copy-into-proc", "bad-dockerfile"])
async def test_a_task_that_cannot_run_as_it_is_is_a_task_error_before_any_episode(renderer, root, tmp_path,
                                                                                  monkeypatch, how):
    """What the load-time checks cannot see from the driver (a variable the actor lacks) or were not run on (a
    `TaskRef` made by hand) still fails as the task's, never as a retried `env_error`, and before the episode: a
    `[verifier.env]` variable the actor lacks no longer costs a whole episode first."""
    toml = {"environment-env": '[environment.env]\nURL = "${RAYGRPO_TEST_LATER_UNSET}"\n',
            "gpus": "gpus = 1\n"}.get(how, "")
    task = make_task(tmp_path / "suite", "t", environment=toml,
                     dockerfile={"copy-into-proc": "FROM x\nCOPY data.txt /proc/sys/x\n",
                                 "bad-dockerfile": "FROM x\nCOPY missing.txt /app/\n"}.get(how),
                     files={"data.txt": "x\n"} if how == "copy-into-proc" else None)
    if how == "verifier-env":
        (task / "task.toml").write_text((task / "task.toml").read_text().replace(
            "[verifier]\n", '[verifier.env]\nJUDGE = "${RAYGRPO_TEST_LATER_UNSET}"\n\n[verifier]\n', 1))
    monkeypatch.delenv("RAYGRPO_TEST_LATER_UNSET", raising=False)
    ref = TaskRef(env="suite", index=0, metadata={"task_dir": str(task), "task_name": "tests/t"})
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, bash_script("echo ok > /app/out.txt"), ref=ref)
    assert traj.status is Status.TASK_ERROR and traj.reward is None and traj.turns == 0, traj.error
    expected = {"environment-env": "[environment.env] URL = '${RAYGRPO_TEST_LATER_UNSET}': Environment variable",
                "verifier-env": "[verifier.env] JUDGE = '${RAYGRPO_TEST_LATER_UNSET}': Environment variable",
                "gpus": "Task requires 1 GPU(s) but raygrpo-local environment does not support GPU allocation",
                "copy-into-proc": "cannot make /proc/sys writable in the local sandbox",
                "bad-dockerfile": "Dockerfile:2: COPY source 'missing.txt' not found"}[how]
    assert expected in traj.error and "task tests/t" in traj.error
    await nothing_left(root)


async def test_sandbox_death_mid_episode_is_env_error(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t")
    spec = spec_for(tmp_path / "suite", root)
    provider = HarborProvider(spec, name="suite")
    adapter: HarborAdapter = provider.adapter()
    inner = bash_script("echo alive", "echo ok > /app/out.txt")

    def script(ctx):
        if sum(1 for m in ctx.messages if m.get("role") == "tool") == 1:
            os.kill(adapter.env.init_pid, signal.SIGKILL)  # the sandbox dies between two tool calls
        return inner(ctx)

    traj = await rollout(spec, renderer, script, adapter=adapter)
    assert tool_texts(traj) == ["alive\n[exit code 0]"]  # the first call ran; the second found the sandbox dead
    assert traj.status is Status.ENV_ERROR and traj.reward is None and traj.tool_calls == 1
    assert "sandbox" in traj.error
    await provider.aclose()
    await nothing_left(root)


async def test_cancelled_rollout_and_forgotten_adapter_are_stopped_by_the_provider(renderer, root, tmp_path):
    make_task(tmp_path / "suite", "t")
    spec = spec_for(tmp_path / "suite", root, exec_timeout_s=60)
    provider = HarborProvider(spec, name="suite")
    ref = list_harbor_tasks(spec, "suite")[0]
    forgotten = provider.adapter()
    await forgotten.start(ref)  # started, never closed by its user
    running = asyncio.create_task(run_rollout(
        ref, provider.adapter(), ScriptedPolicy(renderer.tokenizer, bash_script("sleep 120")), renderer,
        SamplingParams(max_tokens=1024), RolloutConfig(**CONFIG),
    ))
    deadline = time.monotonic() + 20
    while not any("sleep 120" in open(f"/proc/{p}/cmdline").read().replace("\0", " ")
                  for p in sandbox_processes(root) if os.path.exists(f"/proc/{p}")):
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.05)
    assert provider.live_sandboxes == 2 and len(live_sandboxes(root)) == 2
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await provider.aclose()
    assert forgotten.closed and provider.live_sandboxes == 0
    await nothing_left(root, timeout_s=2)  # gone when aclose returns (polled only for the kernel's reaping)


async def test_close_is_idempotent_and_safe_before_start(root, tmp_path):
    make_task(tmp_path / "suite", "t")
    provider = HarborProvider(spec_for(tmp_path / "suite", root))
    never_started = provider.adapter()
    await never_started.close()
    await never_started.close()
    adapter = provider.adapter()
    await adapter.start(list_harbor_tasks(provider.spec, "s")[0])
    host_dir = adapter._trial_dir
    await asyncio.gather(adapter.close(), adapter.close())
    await adapter.close()
    assert not os.path.exists(host_dir)
    with pytest.raises(EnvError, match="after close"):
        await adapter.call("bash", {"command": "ls"})
    await provider.aclose()
    with pytest.raises(EnvError, match="closed"):
        provider.adapter()
    await nothing_left(root)


# ── harness units ─────────────────────────────────────────────────────────────────────────────────────────────


def test_clip_output_keeps_head_and_tail():
    text = "".join(f"line {i}\n" for i in range(1000))
    clipped = clip_output(text, 200)
    assert len(clipped) <= 200 and clipped.startswith("line 0\n") and clipped.endswith("line 999\n")
    assert f"of {len(text)} characters omitted" in clipped
    assert clip_output("short", 200) == "short"


async def test_bash_harness_refuses_bad_arguments_without_a_sandbox():
    harness = BashHarness(exec_timeout_s=1, max_output_chars=100)
    assert (await harness.call(None, "bash", {"command": "  "})).error
    assert (await harness.call(None, "bash", {"command": 3})).error
    # Unknown tools never reach a harness: the adapter refuses them with the shared check first.
    assert refuse_call("sh", {"command": "ls"}, [t["function"]["name"] for t in harness.tools]).error
    assert [t["function"]["name"] for t in harness.tools] == ["bash"]
