"""Multi-step Harbor tasks where raygrpo must do what Harbor's own `MultiStepTrial` does (the review of issue 44's
steps): a step's `[steps.verifier.env]` wins over the task's `[verifier.env]`; each step's agent phase (the model's
commands, the oracle's `solve.sh`) runs as the step's `[steps.agent] user`; `/tests` is emptied right before every
shared step verification; each step's own `test.sh` is probed for missing tooling; a step's `network_mode` is enforced
or refused, never widened; what a step's `setup.sh` starts survives `stop_agent_processes`; a `reward_key` one step
lacks is reduced after Harbor's aggregation.

Tasks are made by Harbor's own `harbor tasks init --steps N --verifier-mode shared` and filled in; episodes run
through the real agent loop (scripted policies, the tiny tokenizer) or the adapter's own calls (the oracle), on the
local sandbox backend.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from raygrpo.agent.toolcalls import format_tool_call
from raygrpo.core.types import Status
from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from tests.harbor_steps_utils import _from_base_image, harbor_init
from tests.harbor_utils import make_task
from tests.test_harbor_adapter import nothing_left, renderer, root, rollout, spec_for  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)


def make_steps_task(root: Path, name: str, tests: list[str], *, solutions: list[str] | None = None,
                    edit=None, setups: dict[int, str] | None = None) -> Path:
    """A task made by `harbor tasks init --steps N --verifier-mode shared --no-pytest` (N = len(tests)), its step
    k's `tests/test.sh` being `tests[k-1]`, its `solve.sh` `solutions[k-1]` (else `true`) and its `workdir/setup.sh`
    `setups[k]`; `edit(toml) -> toml` changes its task.toml."""
    task = harbor_init(root, name, "--steps", str(len(tests)), "--verifier-mode", "shared", "--no-pytest")
    _from_base_image(task / "environment" / "Dockerfile")
    for k, test in enumerate(tests, start=1):
        step = task / "steps" / f"step-{k}"
        (step / "instruction.md").write_text(f"Do step {k}.\n")
        (step / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test))
        solution = solutions[k - 1] if solutions else "true"
        (step / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solution}\n")
        if setups and k in setups:
            (step / "workdir").mkdir()
            (step / "workdir" / "setup.sh").write_text(f"#!/bin/bash\n{setups[k]}\n")
    if edit is not None:
        (task / "task.toml").write_text(edit((task / "task.toml").read_text()))
    return task


def in_step(k: int, text: str):
    """`text` (tables of its own) at the end of step k's `[[steps]]` entry (after its `[steps.verifier]` table)."""
    def edit(toml: str) -> str:
        end = toml.index("collect = []\n", toml.index(f'name = "step-{k}"\n')) + len("collect = []\n")
        return toml[:end] + text + toml[end:]
    return edit


def per_step(*commands: str):
    """A scripted policy that runs `commands[k-1]` with `bash` at the start of step k, then answers."""
    def script(ctx):
        if ctx.messages[-1].get("role") != "user":
            return "Done."
        step = sum(1 for m in ctx.messages if m.get("role") == "user")
        return format_tool_call("bash", {"command": commands[step - 1]})
    return script


def answers(ctx):
    return "Done."


REWARD_IF = """if {cond}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


# ── 1: the step's verifier env over the task's ───────────────────────────────────────────────────────────────────


async def test_a_steps_verifier_env_wins_over_the_tasks(renderer, root, tmp_path):  # noqa: F811
    """Harbor's `Verifier.verify` merges `[verifier.env]`, then `[steps.verifier.env]` (then the job's own env, which
    raygrpo has none of): a key both set is the step's; a step that sets none sees the task's, as a single step does."""
    test = REWARD_IF.format(cond='[ "$WHO" = "{who}" ]')
    make_steps_task(tmp_path / "suite", "env", [test.format(who="task"), test.format(who="step")],
                    edit=lambda t: in_step(2, '[steps.verifier.env]\nWHO = "step"\n')(
                        t.replace("[verifier.env]\n", '[verifier.env]\nWHO = "task"\n', 1)))
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, answers, max_turns=10)
    assert (traj.status, traj.step_rewards, traj.reward) == (Status.OK, [1.0, 1.0], 1.0), (traj.error, traj.verifier)
    make_task(tmp_path / "single", "t", test_sh="#!/bin/bash\n" + test.format(who="task"),
              metadata='\n[verifier.env]\nWHO = "task"')
    single = await rollout(spec_for(tmp_path / "single", root), renderer, answers)
    assert (single.status, single.reward) == (Status.OK, 1.0), single.verifier
    await nothing_left(root)


# ── 2: each step's agent phase as the step's user ────────────────────────────────────────────────────────────────


WHO_TEST = REWARD_IF.format(cond='[ "$(cat /tmp/who-{k})" = {user} ] && [ "$(stat -c %U /tmp/who-{k})" = {user} ]')


def user_task(root: Path) -> Path:
    return make_steps_task(root, "users", [WHO_TEST.format(k=1, user="root"), WHO_TEST.format(k=2, user="nobody")],
                           solutions=["id -un > /tmp/who-1", "id -un > /tmp/who-2"],
                           edit=in_step(2, '[steps.agent]\nuser = "nobody"\n'))


async def test_each_steps_model_turns_run_as_the_steps_user(renderer, root, tmp_path):  # noqa: F811
    user_task(tmp_path / "suite")
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer,
                         per_step("id -un > /tmp/who-1", "id -un > /tmp/who-2; id -un"), max_turns=10)
    assert (traj.status, traj.step_rewards) == (Status.OK, [1.0, 1.0]), (traj.error, traj.verifier)
    tools = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tools[1].startswith("nobody")
    await nothing_left(root)


async def test_each_steps_reference_solution_runs_as_the_steps_user(root, tmp_path):  # noqa: F811
    """The oracle's `solve.sh` of each step, as Harbor's oracle agent runs it inside `with_default_user(step user)`."""
    user_task(tmp_path / "suite")
    spec = spec_for(tmp_path / "suite", root)
    provider = HarborProvider(spec, name="suite")
    adapter = provider.adapter()
    try:
        await adapter.start(list_harbor_tasks(spec, "suite")[0])
        rewards = []
        while True:
            await adapter.run_solution()
            rewards.append(await adapter.score())
            if await adapter.next_step() is None:
                break
        assert rewards == [1.0, 1.0], adapter.verifier
    finally:
        await adapter.close()
        await provider.aclose()
    await nothing_left(root)


# ── 3: /tests emptied right before each shared step verification ─────────────────────────────────────────────────


# A runner that, as pytest does with a `conftest.py`, loads what it finds beside the tests.
CONFTEST_TEST = """[ -f /tests/conftest.sh ] && source /tests/conftest.sh
""" + REWARD_IF.format(cond='[ "$(cat /app/answer-{k} 2>/dev/null)" = ok ]')
PLANT = "mkdir -p /tests && printf 'echo 1 > /logs/verifier/reward.txt; exit 0\\n' > /tests/conftest.sh"


async def test_a_conftest_the_model_plants_in_tests_is_gone_before_each_step_is_verified(renderer, root,  # noqa: F811
                                                                                          tmp_path):
    make_steps_task(tmp_path / "suite", "plant", [CONFTEST_TEST.format(k=1), CONFTEST_TEST.format(k=2)])
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, per_step(PLANT, PLANT), max_turns=10)
    assert (traj.status, traj.step_rewards, traj.reward) == (Status.OK, [0.0, 0.0], 0.0), traj.verifier
    honest = await rollout(spec_for(tmp_path / "suite", root), renderer,
                           per_step("echo ok > /app/answer-1", "echo ok > /app/answer-2"), max_turns=10)
    assert (honest.status, honest.step_rewards) == (Status.OK, [1.0, 1.0]), honest.verifier
    await nothing_left(root)


# ── 4: each step's test.sh probed for missing tooling ────────────────────────────────────────────────────────────


async def test_a_steps_own_test_script_is_probed_for_missing_tooling(renderer, root, tmp_path):  # noqa: F811
    """Step 2's `test.sh` runs `check-out`, which the sandbox lacks: its 0.0 is not the model's (`verifier_error`),
    as for a single-step task; step 1 (which needs nothing missing) is scored as usual."""
    make_steps_task(tmp_path / "suite", "tooling", [
        REWARD_IF.format(cond="[ -f /app/out.txt ]"),
        "check-out /app/out.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"])
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer,
                         per_step("echo ok > /app/out.txt", "true"), max_turns=10)
    assert traj.status == Status.VERIFIER_ERROR and traj.reward is None, (traj.error, traj.verifier)
    assert traj.step_rewards == [1.0] and "the command `check-out`" in traj.error
    assert traj.verifier["tooling_missing"] == ["the command `check-out`"]
    await nothing_left(root)


# ── 5: a step's network_mode ─────────────────────────────────────────────────────────────────────────────────────


async def test_a_steps_restricted_network_mode_is_refused_as_harbor_refuses_it(renderer, root, tmp_path):  # noqa: F811
    """Step 2's `[steps.agent] network_mode = "no-network"` in a public sandbox: the local backend cannot switch the
    network after start, and Harbor refuses such a task; raygrpo refuses it by name (`task_error`), never runs the
    step with the public network."""
    test = REWARD_IF.format(cond="true")
    make_steps_task(tmp_path / "suite", "net", [test, test],
                    edit=in_step(2, '[steps.agent]\nnetwork_mode = "no-network"\n'))
    traj = await rollout(spec_for(tmp_path / "suite", root), renderer, answers, max_turns=10)
    assert traj.status == Status.TASK_ERROR and traj.reward is None and traj.step_rewards == [], traj.error
    assert "cannot make a restricted phase public" in traj.error
    await nothing_left(root)


# ── 6: stop_agent_processes spares what a step's setup.sh starts ─────────────────────────────────────────────────


SERVICE = "nohup setsid sh -c 'while :; do date +%s%N > /tmp/{name}; sleep 0.1; done' >/dev/null 2>&1 </dev/null &"
ALIVE = 'rm -f /tmp/{name}; sleep 1; [ -s /tmp/{name} ]'


def service_test(k: int) -> str:
    """Rewards 1 when step k's service still writes its file and the model's no longer does."""
    return REWARD_IF.format(cond=f"{ALIVE.format(name=f'service-{k}')} && ! {{ {ALIVE.format(name='model')}; }}")


async def test_stop_agent_processes_spares_what_each_steps_setup_starts(renderer, root, tmp_path):  # noqa: F811
    """Each step's `setup.sh` starts a service its tests need; the model starts one of its own. Before each
    verification the model's is killed and the setup's live on (step 1's into step 2 too)."""
    make_steps_task(tmp_path / "suite", "service", [service_test(1), service_test(2)],
                    setups={1: SERVICE.format(name="service-1"), 2: SERVICE.format(name="service-2")})
    model = SERVICE.format(name="model")
    traj = await rollout(spec_for(tmp_path / "suite", root, stop_agent_processes=True), renderer,
                         per_step(model, model), max_turns=10)
    assert (traj.status, traj.step_rewards) == (Status.OK, [1.0, 1.0]), (traj.error, traj.verifier)
    await nothing_left(root)


# ── 7: a reward_key one step lacks ───────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("key, step_rewards, reward", [("speed", [0.0, 0.5], 0.25),
                                                      ("correctness", [1.0, 1.0], 1.0)])
async def test_a_reward_key_one_step_lacks_is_reduced_after_harbors_aggregation(renderer, root, tmp_path,  # noqa: F811
                                                                                 key, step_rewards, reward):
    """Harbor aggregates `{correctness: 1}` and `{correctness: 1, speed: 0.5}` to their per-key mean (a key a step
    lacks counts 0): `{correctness: 1.0, speed: 0.25}`, reduced by `reward_key`; the step without the key counts 0.0
    there, and that is its step reward."""
    make_steps_task(tmp_path / "suite", "keys", [
        'echo \'{"correctness": 1}\' > /logs/verifier/reward.json\n',
        'echo \'{"correctness": 1, "speed": 0.5}\' > /logs/verifier/reward.json\n'])
    traj = await rollout(spec_for(tmp_path / "suite", root, reward_key=key), renderer, answers, max_turns=10)
    assert (traj.status, traj.step_rewards, traj.reward) == (Status.OK, step_rewards, reward), traj.error
    await nothing_left(root)
