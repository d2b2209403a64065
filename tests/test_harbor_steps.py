"""Harbor multi-step tasks (`[[steps]]`, issue 44), made with Harbor's own `harbor tasks init --steps N` and filled
in, and the public-shaped fixtures of `tests/harbor_wild/multi_step/`: the steps share one sandbox, each step's
instruction is a new user turn, each step is verified with its own tests merged over the task's shared ones, a
`min_reward` ends the episode, and the episode's reward is what Harbor's own aggregation gives.

Driven through the real agent loop (scripted policies and the tiny tokenizer), `raygrpo check` (oracle and noop) on
the local backend and on docker, and `raygrpo train`. Leftovers are asked of the OS (`/proc`) and of docker itself.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from raygrpo.agent.toolcalls import format_tool_call
from raygrpo.core.types import Status
from raygrpo.driver.check import load_target, run_check
from raygrpo.envs.harbor.steps import aggregate_rewards
from raygrpo.envs.harbor.tasks import load_task
from tests.docker_utils import docker_ready, sandbox_objects  # noqa: F401 - a fixture
from tests.harbor_steps_policies import progress, stalls
from tests.harbor_steps_utils import make_counter_task
from tests.test_check import no_sandboxes_left
from tests.test_harbor_adapter import nothing_left, renderer, root, rollout, spec_for  # noqa: F401 - fixtures

WILD_STEPS = Path(__file__).with_name("harbor_wild") / "multi_step"


def harbors_episode_reward(task_dir: Path, step_rewards: list[dict]) -> dict | None:
    """What Harbor's own trial computes for the episode from its steps' rewards: `Trial._select_multi_step_reward`
    over `StepResult`s, as `MultiStepTrial._run` calls it."""
    from harbor.models.task.task import Task
    from harbor.models.trial.result import StepResult
    from harbor.models.verifier.result import VerifierResult
    from harbor.trial.trial import Trial

    task = Task(task_dir)
    results = [StepResult(step_name=step.name, verifier_result=VerifierResult(rewards=rewards))
               for step, rewards in zip(task.config.steps, step_rewards)]
    trial = SimpleNamespace(task=task, result=SimpleNamespace(step_results=results))
    trial._aggregate_step_rewards = lambda: Trial._aggregate_step_rewards(trial)
    selected = Trial._select_multi_step_reward(trial)
    return None if selected is None else selected.rewards


@pytest.mark.timeout(60)
def test_the_episode_reward_is_harbors_aggregation(tmp_path):
    mean = load_task(str(make_counter_task(tmp_path, "mean", steps=3)))
    final = load_task(str(make_counter_task(tmp_path, "final", steps=3, strategy="final")))
    steps = [{"reward": 1.0}, {"reward": 0.0, "style": 1.0}, {"reward": 0.5}]
    assert aggregate_rewards(mean, steps) == harbors_episode_reward(mean.paths.task_dir, steps)
    assert aggregate_rewards(mean, steps) == {"reward": 0.5, "style": 1 / 3}  # missing keys count as 0
    assert aggregate_rewards(final, steps) == harbors_episode_reward(final.paths.task_dir, steps) == {"reward": 0.5}
    assert aggregate_rewards(mean, []) is None


# ── the agent loop on the local backend ──────────────────────────────────────────────────────────────────────────


@pytest.mark.timeout(120)
async def test_each_step_is_a_new_user_turn_of_one_sandbox(renderer, root, tmp_path):  # noqa: F811
    make_counter_task(tmp_path / "suite", "counter", steps=3)
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, progress, max_turns=10)
    assert (traj.status, traj.reward, traj.step_rewards) == (Status.OK, 1.0, [1.0, 1.0, 1.0]), traj.error
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert [u.split("`")[1] for u in users] == ["step 1", "step 2", "step 3"]
    assert traj.turns == 6 and traj.tool_calls == 3  # one call and one answer per step
    # The steps' instructions are environment tokens (not trained on); the model's turns are.
    text = renderer.tokenizer.decode([t for t, m in zip(traj.completion_ids, traj.env_mask) if m == 0])
    model = renderer.tokenizer.decode([t for t, m in zip(traj.completion_ids, traj.env_mask) if m == 1])
    assert "`step 2`" in text and "`step 3`" in text and "`step 2`" not in model
    assert len(traj.completion_ids) == len(traj.env_mask) == len(traj.logprobs)
    await nothing_left(root)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy, expected", [("mean", 0.5), ("final", 0.0)])
async def test_min_reward_ends_the_episode_after_the_step_that_missed_it(renderer, root, tmp_path, strategy,  # noqa: F811
                                                                         expected):
    task = make_counter_task(tmp_path / "suite", "gated", steps=3, min_reward={2: 1.0}, strategy=strategy)
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, stalls, max_turns=10)
    assert traj.status == Status.OK and traj.step_rewards == [1.0, 0.0], traj.error
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert len(users) == 2  # step 3 never started
    harbor = harbors_episode_reward(task, [{"reward": 1.0}, {"reward": 0.0}])
    assert traj.reward == harbor["reward"] == expected
    await nothing_left(root)


@pytest.mark.timeout(120)
async def test_a_step_whose_setup_fails_is_a_task_error_never_a_score(renderer, root, tmp_path):  # noqa: F811
    task = make_counter_task(tmp_path / "suite", "setup-fails", steps=2)
    workdir = task / "steps" / "step-2" / "workdir"
    workdir.mkdir()
    (workdir / "setup.sh").write_text("echo 'cannot prepare step 2' >&2\nexit 3\n")
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, progress, max_turns=10)
    assert traj.status == Status.TASK_ERROR and traj.reward is None and traj.step_rewards == [1.0]
    assert "step 'step-2': setup.sh exited 3: cannot prepare step 2" in traj.error
    await nothing_left(root)


def _sleeps_in_step_one(ctx):
    """`progress`, but in step 1, after its line, a command that outlasts the step's agent timeout."""
    if ctx.messages[-1].get("role") == "tool" and sum(1 for m in ctx.messages if m.get("role") == "user") == 1:
        return format_tool_call("bash", {"command": "sleep 40"})
    return progress(ctx)


@pytest.mark.timeout(120)
async def test_a_steps_agent_timeout_stops_its_turns_then_the_step_is_verified(renderer, root, tmp_path):  # noqa: F811
    """Harbor's `MultiStepTrial`: a step's agent that times out (the step's `[agent] timeout_sec`, else the task's)
    is stopped, the step is verified, and the next step follows."""
    task = make_counter_task(tmp_path / "suite", "deadline", steps=2)
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(toml.replace('name = "step-1"\n', 'name = "step-1"\n[steps.agent]\n'
                                                 'timeout_sec = 2.0\n', 1))
    began = time.monotonic()
    traj = await rollout(spec_for(tmp_path / "suite", root, exec_timeout_s=60), renderer, _sleeps_in_step_one,
                         max_turns=10)
    assert time.monotonic() - began < 30
    assert (traj.status, traj.reward, traj.step_rewards) == (Status.OK, 1.0, [1.0, 1.0]), traj.error
    assert "agent timeout (2 s)" in traj.error
    await nothing_left(root)


# ── raygrpo check ────────────────────────────────────────────────────────────────────────────────────────────────


def write_init_suite(root: Path) -> Path:
    """Two tasks made by `harbor tasks init --steps 3`: one sound, one whose step 2 solution is wrong with
    `min_reward` on step 2."""
    suite = root / "suite"
    suite.mkdir()
    make_counter_task(suite, "counter", steps=3)
    make_counter_task(suite, "gated", steps=3, min_reward={2: 1.0}, broken_step=2)
    return suite


def check_and_read(target: Path, out: Path, overrides: list[str]) -> tuple[dict, dict]:
    """`raygrpo check` of `target`: the verdicts and the trajectories (oracle, noop) by task folder."""
    result = run_check(load_target(target, overrides), out_dir=out)
    assert result.leaked_envs == 0
    verdicts = {Path(v.task_dir).name: v for v in result.verdicts}
    trajs: dict = {}
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        traj = json.loads(line)
        kind = "oracle" if any(s["tool"] == "(solution)" for s in traj["steps"]) else "noop"
        trajs.setdefault(Path(traj["task"]["metadata"]["task_dir"]).name, {})[kind] = traj
    return verdicts, trajs


def assert_init_suite(verdicts: dict, trajs: dict, suite: Path) -> None:
    ok = verdicts["counter"]
    assert (ok.status, ok.oracle_reward, ok.noop_reward) == ("ok", 1.0, 0.0), ok
    assert trajs["counter"]["oracle"]["step_rewards"] == [1.0, 1.0, 1.0]
    assert [s["tool"] for s in trajs["counter"]["oracle"]["steps"]] == ["(solution)"] * 3  # each step's solve.sh
    assert trajs["counter"]["noop"]["step_rewards"] == [0.0, 0.0, 0.0]  # no min_reward: every step runs
    gated = verdicts["gated"]
    harbor = harbors_episode_reward(suite / "gated", [{"reward": 1.0}, {"reward": 0.0}])["reward"]
    assert (gated.status, gated.oracle_reward) == ("oracle_below_threshold", harbor) and harbor == 0.5, gated
    assert trajs["gated"]["oracle"]["step_rewards"] == [1.0, 0.0]  # ended after step 2
    assert trajs["gated"]["noop"]["step_rewards"] == [0.0, 0.0]


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_check_of_harbor_init_multi_step_tasks_on_the_local_backend(ray_local, tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGRPO_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    suite = write_init_suite(tmp_path)
    verdicts, trajs = check_and_read(suite, tmp_path / "out", [])
    assert_init_suite(verdicts, trajs, suite)
    assert no_sandboxes_left(tmp_path / "sandboxes")


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_check_of_the_public_shaped_multi_step_tasks_on_the_local_backend(ray_local, tmp_path, monkeypatch):
    """The wordfreq-cli fixture (per-step tests sourcing shared helpers, a per-step workdir, setup.sh, verifier env
    and healthcheck, `min_reward` on its first step) and multi-step-notes (Harbor's uvx test template)."""
    monkeypatch.setenv("RAYGRPO_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    verdicts, trajs = check_and_read(WILD_STEPS, tmp_path / "out", ["envs.tasks.offline_tooling=true"])
    for name in ("wordfreq-cli", "multi-step-notes"):
        assert (verdicts[name].status, verdicts[name].oracle_reward, verdicts[name].noop_reward) == ("ok", 1.0, 0.0)
    assert trajs["wordfreq-cli"]["oracle"]["step_rewards"] == [1.0, 1.0, 1.0]
    assert trajs["wordfreq-cli"]["noop"]["step_rewards"] == [0.0]  # its first step's min_reward ended it
    assert "FAIL top 3 of the corpus" in trajs["wordfreq-cli"]["noop"]["verifier"]["output_tail"]
    assert trajs["multi-step-notes"]["oracle"]["step_rewards"] == [1.0, 1.0]
    assert no_sandboxes_left(tmp_path / "sandboxes")


@pytest.mark.ray
@pytest.mark.docker
@pytest.mark.timeout(600)
def test_check_of_multi_step_tasks_on_docker(docker_ready, ray_local, tmp_path):  # noqa: F811
    suite = write_init_suite(tmp_path)
    for fixture in WILD_STEPS.iterdir():
        (suite / fixture.name).symlink_to(fixture, target_is_directory=True)
    verdicts, trajs = check_and_read(suite, tmp_path / "out", ["envs.tasks.environment_type=docker",
                                                               "envs.tasks.offline_tooling=true"])
    assert_init_suite(verdicts, trajs, suite)
    for name in ("wordfreq-cli", "multi-step-notes"):
        assert (verdicts[name].status, verdicts[name].oracle_reward, verdicts[name].noop_reward) == ("ok", 1.0, 0.0)
    assert sandbox_objects() == []  # docker's own listing: no container or network of a sandbox is left


# ── raygrpo train ────────────────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_train_on_a_multi_step_suite_writes_step_rewards_per_rollout(ray_local, tiny_model_dir, tmp_path,
                                                                     monkeypatch):
    from raygrpo.config import load_config
    from raygrpo.train.run import train

    monkeypatch.setenv("RAYGRPO_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    suite = tmp_path / "suite"
    make_counter_task(suite, "counter", steps=3)
    make_counter_task(suite, "gated", steps=3, min_reward={2: 1.0})
    policies = Path(__file__).with_name("harbor_steps_policies.py")
    cfg = load_config(data={
        "envs": {"steps": {"kind": "harbor", "path": str(suite)}},
        "model": tiny_model_dir,
        "policy": {"kind": "scripted", "script": f"{policies}:stalls"},
        "rollout": {"group_size": 2, "max_turns": 10, "max_total_tokens": 4096},
        "sampling": {"max_tokens": 256},
        "workers": {"num_env_actors": 1, "max_concurrent_per_actor": 4},
        "trainer": {"per_device_train_batch_size": 4, "max_steps": 1, "save_steps": 100, "learning_rate": 1e-3},
    })
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["leaked_envs"] == 0
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 4 and all(r["schema_version"] == 6 for r in rollouts)
    by_task = {Path(r["task"]["metadata"]["task_dir"]).name: r for r in rollouts}
    # `stalls` passes step 1 only: the ungated task runs all three steps (mean 1/3), the gated one stops after 2.
    assert by_task["counter"]["step_rewards"] == [1.0, 0.0, 0.0]
    assert by_task["counter"]["reward"] == pytest.approx(1 / 3)
    assert by_task["gated"]["step_rewards"] == [1.0, 0.0] and by_task["gated"]["reward"] == 0.5
    assert no_sandboxes_left(tmp_path / "sandboxes")
