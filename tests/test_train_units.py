"""Training pieces without Ray: task schedule and mixtures, groups and TRL's batch, the async source, configs."""

from __future__ import annotations

import json
import threading
import time

import pytest

from raygrpo.config import ConfigError, load_config
from raygrpo.train.groups import GroupAssembler, to_rollout_output
from raygrpo.train.metrics import MetricsLog, RolloutLog, plot_rewards, read_metrics
from raygrpo.train.schedule import TaskSchedule
from raygrpo.train.source import RolloutSource
from raygrpo.core.types import Status, TaskRef, Trajectory
from tests.ors_utils import wait_until

pytestmark = pytest.mark.timeout(120)


def _tasks(env: str, n: int) -> list[TaskRef]:
    return [TaskRef(env=env, index=i) for i in range(n)]


def test_mixture_shares_follow_weights_and_each_env_cycles_its_tasks():
    schedule = TaskSchedule({"a": _tasks("a", 5), "b": _tasks("b", 3)}, {"a": 0.75, "b": 0.25}, seed=1)
    picks = [schedule.next() for _ in range(40)]
    share_a = sum(t.env == "a" for t in picks) / len(picks)
    assert abs(share_a - 0.75) <= 0.10
    assert all(abs(sum(t.env == "a" for t in picks[:k]) / k - 0.75) <= 0.25 for k in range(4, 41, 4))
    first_pass = [t.index for t in picks if t.env == "a"][:5]
    assert sorted(first_pass) == list(range(5))  # every task once per pass, in a shuffled order


def test_schedule_resumes_at_its_position_and_default_weights_are_equal():
    tasks = {"a": _tasks("a", 4), "b": _tasks("b", 4)}
    full = TaskSchedule(tasks, None, seed=3)
    sequence = [full.next() for _ in range(12)]
    assert sum(t.env == "a" for t in sequence) == 6
    resumed = TaskSchedule(tasks, None, seed=3)
    resumed.load_state_dict({"position": 7})
    assert resumed.position == 7
    assert [resumed.next() for _ in range(5)] == sequence[7:]


def test_schedule_errors_name_the_problem():
    with pytest.raises(ValueError, match="no training tasks"):
        TaskSchedule({"a": []}, None, seed=0)
    with pytest.raises(ValueError, match="weight 0"):
        TaskSchedule({"a": _tasks("a", 1)}, {"a": 0.0}, seed=0)


def _traj(group: str, sample: int, reward, versions=(0,), completion=(5, 6, 7), mask=(1, 0, 1), env="e"):
    return Trajectory(
        task=TaskRef(env=env, index=0), prompt_ids=[1, 2] if completion else [], completion_ids=list(completion),
        logprobs=[-0.5] * len(completion), env_mask=list(mask), reward=reward,
        status=Status.OK if completion else Status.ENV_ERROR, policy_versions=list(versions),
        group_id=group, sample=sample,
    )


def test_groups_complete_in_sample_order_and_map_onto_trl_entries():
    assembler = GroupAssembler(group_size=3)
    assert assembler.add(_traj("g", 2, 1.0)) is None
    assert assembler.add(_traj("g", 0, None)) is None
    group = assembler.add(_traj("g", 1, 0.0, completion=(), mask=()))
    assert group is not None and assembler.incomplete == 0
    assert [t.sample for t in group.trajectories] == [0, 1, 2]
    out = to_rollout_output([group], fallback_id=99)
    assert out["env_reward"] == [None, 0.0, 1.0]  # None stays None, 0.0 stays 0.0
    assert out["env_mask"][0] == [1, 0, 1]  # tool tokens stay masked
    # A rollout that failed before generating gets its group's prompt and one masked token.
    assert out["prompt_ids"][1] == [1, 2] and out["completion_ids"][1] == [99] and out["env_mask"][1] == [0]
    assert out["status"] == ["ok", "env_error", "ok"]
    assert {len(v) for v in out.values()} == {3}


def test_staleness_is_measured_from_the_oldest_turn_of_the_group():
    assembler = GroupAssembler(group_size=2)
    assembler.add(_traj("g", 0, 1.0, versions=(3, 4)))
    group = assembler.add(_traj("g", 1, 1.0, versions=(2, 4)))
    assert group.min_version() == 2 and group.staleness(5) == 3 and group.staleness(1) == 0


def test_each_entry_carries_its_lowest_version_unversioned_turns_counting_from_dispatch():
    """A vLLM server's (or a script's) turns carry no version: the group's dispatch version stands for them, in the
    entries' `policy_version` (what tells the learner's fresh samples apart) as in the group's staleness."""
    assembler = GroupAssembler(group_size=3)
    assembler.dispatched("g", 4)
    assembler.add(_traj("g", 0, 1.0, versions=(3, 5)))
    assembler.add(_traj("g", 1, 1.0, versions=(-1, -1)))
    group = assembler.add(_traj("g", 2, None, versions=(), completion=(), mask=()))
    assert to_rollout_output([group], fallback_id=99)["policy_version"] == [3, 4, None]
    assert group.min_version() == 3


class _ScriptedOrchestrator:
    """Stands in for the Ray orchestrator in these unit tests: finishes each enqueued rollout on the next poll with
    the policy version `version(n)` returns for the n-th rollout produced, so the test controls staleness exactly."""

    def __init__(self, version):
        self.version = version
        self.queue = []
        self.enqueued = 0
        self.produced = 0
        self.min_versions = []

    @property
    def outstanding(self):
        return len(self.queue)

    def enqueue(self, requests):
        self.min_versions.append(requests[0].min_version)
        self.queue.extend(requests)
        self.enqueued += len(requests)

    def poll(self, timeout=1.0):
        time.sleep(0.01)
        done, self.queue = self.queue, []
        out = []
        for r in done:
            out.append(Trajectory(task=r.task, completion_ids=[1], logprobs=[0.0], env_mask=[1], reward=1.0,
                                  policy_versions=[self.version(self.produced)], group_id=r.group_id,
                                  sample=r.sample))
            self.produced += 1
        return out

    def run(self, requests, stop=None):
        self.enqueue(requests)
        yield from self.poll()

    def cancel(self):
        self.queue = []


def test_async_source_drops_stale_groups_and_counts_them():
    # The first 4 groups (8 rollouts: the first batch and the look-ahead, n * (max_staleness + 1) groups) are
    # generated by version 0; later ones by version 2.
    orchestrator = _ScriptedOrchestrator(lambda n: 0 if n < 8 else 2)
    schedule = TaskSchedule({"e": _tasks("e", 4)}, None, seed=0)
    source = RolloutSource(orchestrator, schedule, group_size=2, mode="async", max_staleness=1, groups_per_step=2)
    try:
        batch = source.next_batch(2, current_version=0)
        assert len(batch.groups) == 2 and batch.dropped == 0 and batch.staleness == [0, 0]
        # The producer refills 2 groups, destined for step 2: they may generate with version 1. It dispatches from
        # its own thread, so wait for the sixth dispatch rather than a fixed time a loaded machine can outrun.
        wait_until(lambda: len(orchestrator.min_versions) >= 6)
        time.sleep(0.2)  # room for a dispatch too many to show up
        assert list(orchestrator.min_versions) == [0, 0, 0, 0, 1, 1]
        batch = source.next_batch(2, current_version=2)
        assert batch.dropped == 2 and source.dropped_total == 2  # staleness 2 > max_staleness 1
        assert batch.staleness == [0, 0] and len(batch.groups) == 2
        assert orchestrator.enqueued == 2 * schedule.position
    finally:
        source.close()


class _OneGroupPerPoll(_ScriptedOrchestrator):
    """Finishes one group per poll, so the learner waits in the middle of a batch."""

    def __init__(self, version, group_size):
        super().__init__(version)
        self.group_size = group_size

    def poll(self, timeout=1.0):
        time.sleep(0.05)
        head, rest = self.queue[: self.group_size], self.queue[self.group_size :]
        self.queue = head
        out = super().poll(timeout)
        self.queue = rest
        return out


def test_async_groups_dispatched_mid_batch_are_destined_past_the_batch_in_progress():
    # Batch 0 takes the first two groups, batch 1 the next two. A group dispatched after the learner took one group
    # of batch 0 sits behind batch 1 in the queue, so it is consumed at version 2 and may generate with version 1.
    orchestrator = _OneGroupPerPoll(lambda n: 0, group_size=2)
    schedule = TaskSchedule({"e": _tasks("e", 4)}, None, seed=0)
    source = RolloutSource(orchestrator, schedule, group_size=2, mode="async", max_staleness=1, groups_per_step=2)
    try:
        batch = source.next_batch(2, current_version=0)
        assert len(batch.groups) == 2 and batch.dropped == 0
        # The source dispatches from its own thread: wait for the last dispatch instead of a fixed sleep, which a
        # loaded machine outran (the list was complete only by the time the failure message was built).
        wait_until(lambda: len(orchestrator.min_versions) >= 6)
        time.sleep(0.2)  # room for a dispatch too many to show up
        assert list(orchestrator.min_versions) == [0, 0, 0, 0, 1, 1]
    finally:
        source.close()


def test_sync_source_returns_groups_in_schedule_order():
    orchestrator = _ScriptedOrchestrator(lambda n: 4)
    schedule = TaskSchedule({"e": _tasks("e", 8)}, None, seed=0)
    expected = TaskSchedule({"e": _tasks("e", 8)}, None, seed=0)
    source = RolloutSource(orchestrator, schedule, group_size=2, mode="sync", max_staleness=0, groups_per_step=3)
    batch = source.next_batch(3, current_version=4)
    assert [g.trajectories[0].task for g in batch.groups] == [expected.next() for _ in range(3)]
    assert batch.staleness == [0, 0, 0] and batch.dropped == 0


def test_trainer_mapping_refuses_fields_raygrpo_owns():
    base = {"envs": {"e": {"kind": "ors", "url": "http://127.0.0.1:1"}}}
    with pytest.raises(ConfigError, match="trainer.*num_generations is set by raygrpo from rollout.group_size"):
        load_config(data={**base, "trainer": {"num_generations": 4}})
    with pytest.raises(ConfigError, match="train.mixture"):
        load_config(data={**base, "train": {"mixture": {"nope": 1.0}}})
    with pytest.raises(ConfigError, match="eval_every is set but eval_envs is empty"):
        load_config(data={**base, "train": {"eval_every": 2}})
    with pytest.raises(ConfigError, match="max_staleness .* must be at least train.weight_sync_every - 1"):
        load_config(data={**base, "train": {"mode": "async", "max_staleness": 0, "weight_sync_every": 2}})
    assert load_config(data=base, overrides=["trainer.learning_rate=1e-3"]).trainer == {"learning_rate": 0.001}
    with pytest.raises(ConfigError, match="train.mode"):
        load_config(data={**base, "train": {"mode": "sometimes"}})


def test_grpo_config_validates_the_trainer_mapping(tmp_path):
    from raygrpo.train.grpo_args import build_grpo_config

    args = build_grpo_config({"learning_rate": 0.01, "max_steps": 3}, output_dir=str(tmp_path), use_cpu=True,
                             num_generations=2)
    assert args.learning_rate == 0.01 and args.max_steps == 3 and args.report_to == []
    with pytest.raises(ValueError, match="trainer.learning_rat: not a GRPOConfig field"):
        build_grpo_config({"learning_rat": 0.01}, output_dir=str(tmp_path))
    # YAML 1.1 reads 1e-3 as a string: numeric fields take it as the number; other strings fail by name.
    coerced = build_grpo_config({"learning_rate": "1e-3", "max_steps": "4"}, output_dir=str(tmp_path),
                                use_cpu=True, num_generations=2)
    assert coerced.learning_rate == 0.001 and coerced.max_steps == 4
    with pytest.raises(ValueError, match="trainer.learning_rate: expected a number"):
        build_grpo_config({"learning_rate": "fast"}, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="trainer: GRPOConfig rejected"):
        build_grpo_config({"per_device_train_batch_size": 3}, output_dir=str(tmp_path), use_cpu=True,
                          num_generations=2)


def test_metrics_log_drops_lines_after_the_resumed_checkpoint_and_plots(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, keep_until_step=-1)
    for step in range(1, 5):
        log.write({"step": step, "kind": "train", "reward_mean": step / 10, "envs": {"a": {"reward_mean": 0.1},
                                                                                     "b": {"reward_mean": None}}})
    log.write({"step": 4, "kind": "eval", "eval_reward_mean": 0.5})
    log.close()
    MetricsLog(path, keep_until_step=2).close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    plot_rewards(path, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    rollouts = RolloutLog(tmp_path / "rollouts.jsonl", keep_until_step=-1)
    rollouts.write(_traj("g", 0, None), step=3)
    rollouts.close()
    line = json.loads((tmp_path / "rollouts.jsonl").read_text())
    assert line["step"] == 3 and line["reward"] is None and line["status"] == "ok"


def test_a_fresh_run_removes_a_previous_runs_verifier_logs_and_a_resume_keeps_them(tmp_path, caplog):
    """`verifier_logs/` goes with the `rollouts.jsonl` lines that name it: a fresh run with the same --out starts it
    anew (saying so), a resumed run keeps it."""
    logs = tmp_path / "verifier_logs" / "step1-g-0-0" / "verifier"
    logs.mkdir(parents=True)
    (logs / "test-stdout.txt").write_text("previous run\n")
    RolloutLog(tmp_path / "rollouts.jsonl", keep_until_step=3).close()
    assert (logs / "test-stdout.txt").exists()
    with caplog.at_level("WARNING"):
        RolloutLog(tmp_path / "rollouts.jsonl", keep_until_step=-1).close()
    assert not (tmp_path / "verifier_logs").exists()
    assert "holds the verifier logs of 1 rollout(s) of a previous run" in caplog.text


def test_a_resume_drops_a_cut_off_last_line_and_names_a_bad_line_elsewhere(tmp_path, monkeypatch, caplog):
    """A run killed while writing leaves its last line cut off: `--resume` drops it (and says so) instead of failing
    on it; a bad line elsewhere is an error naming the file and line; the kept lines replace the file through a
    temporary file (a crash during the rewrite leaves the old file whole)."""
    import os

    rollouts = tmp_path / "rollouts.jsonl"
    log = RolloutLog(rollouts, keep_until_step=-1)
    for step in (1, 2, 3):
        log.write(_traj("g", step, 1.0), step=step)
    log.close()
    whole = rollouts.read_text()
    rollouts.write_text(whole + whole.splitlines()[0][:40])  # killed while writing step 4's first line
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "kind": "train"}\n{"step": 2, "kind": "train"}\n{"step": 3, "ki')
    with caplog.at_level("WARNING"):
        RolloutLog(rollouts, keep_until_step=2).close()
        MetricsLog(metrics, keep_until_step=2).close()
    assert [json.loads(line)["step"] for line in rollouts.read_text().splitlines()] == [1, 2]
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2]
    assert "rollouts.jsonl: line 4, the last, is cut off" in caplog.text
    assert "metrics.jsonl: line 3, the last, is cut off" in caplog.text
    # Appending after a cut-off line (keep_until_step None) drops it first: no line is glued onto it.
    metrics.write_text(metrics.read_text() + '{"step": 3, "ki')
    log = MetricsLog(metrics)
    log.write({"step": 3, "kind": "train"})
    log.close()
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2, 3]

    from raygrpo.core.jsonl import JsonLinesError

    metrics.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')  # not the last line: not a cut-off
    with pytest.raises(JsonLinesError, match="metrics.jsonl: line 2 is not valid JSON"):
        MetricsLog(metrics, keep_until_step=3)
    assert metrics.read_text().count("\n") == 3  # left as it was

    metrics.write_text('{"step": 1}\n{"step": 2}\n')
    def crash(*args):
        raise OSError("killed during the rewrite")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed during the rewrite"):
        MetricsLog(metrics, keep_until_step=1)
    assert metrics.read_text() == '{"step": 1}\n{"step": 2}\n'  # the old file whole, no temporary file left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "rollouts.jsonl"]


def test_env_reward_passes_rewards_through_unchanged():
    from raygrpo.train.learner import env_reward

    assert env_reward(["p"] * 3, ["c"] * 3, env_reward=[1.0, None, 0.0], status=["ok"] * 3) == [1.0, None, 0.0]


def test_threads_are_not_left_behind_by_a_closed_source():
    orchestrator = _ScriptedOrchestrator(lambda n: 0)
    source = RolloutSource(orchestrator, TaskSchedule({"e": _tasks("e", 2)}, None, seed=0), 2, "async", 1, 1)
    source.next_batch(1, current_version=0)
    source.close()
    assert not any(t.name == "raygrpo-rollout-producer" for t in threading.enumerate())


@pytest.mark.parametrize("mode, per_env", [("async", {"a": 6, "b": 2}), ("sync", {"a": 3, "b": 1})])
def test_the_source_sizes_the_pools_for_what_its_steps_will_ask(mode, per_env):
    """Sync: a step's groups; async: the look-ahead (groups_per_step × (max_staleness + 1)); split by the mixture
    weights, in rollouts (× group size)."""

    class _Expecting(_ScriptedOrchestrator):
        def expect(self, per_env):
            self.expected = per_env

    orchestrator = _Expecting(lambda n: 0)
    schedule = TaskSchedule({"a": _tasks("a", 4), "b": _tasks("b", 4)}, {"a": 3.0, "b": 1.0}, seed=0)
    RolloutSource(orchestrator, schedule, group_size=1, mode=mode, max_staleness=1, groups_per_step=4)
    assert orchestrator.expected == {"a": per_env["a"], "b": per_env["b"]}


def test_the_reward_interval_stays_within_the_rewards():
    from raygrpo.train.metrics import mean_interval

    low, high = mean_interval([1.0] + [0.0] * 7)  # mean 0.125: the normal approximation alone reaches -0.12
    assert low == 0.0 and 0.125 < high < 0.4
    assert mean_interval([0.0] * 8) == [0.0, 0.0]
    low, high = mean_interval([0.4, 0.6] * 50)
    assert 0.45 < low < 0.5 < high < 0.55
    assert mean_interval([1.0]) is None


def test_an_async_resume_neither_skips_nor_repeats_a_task_of_the_schedule():
    """A checkpoint taken while the producer has groups running or waiting: the resumed source runs those first.
    Across the two runs every place of the schedule up to the last dispatched is consumed once or still pending."""
    tasks = {"e": _tasks("e", 200)}  # the first 200 places are distinct tasks: a task names its place
    order = TaskSchedule(tasks, None, seed=3)
    place_of = {order.next(): i for i in range(200)}
    consumed: list[int] = []

    def run(state, steps):
        source = RolloutSource(_ScriptedOrchestrator(lambda n: 100), TaskSchedule(tasks, None, seed=3), group_size=2,
                               mode="async", max_staleness=2, groups_per_step=2)
        if state is not None:
            source.load_state_dict(state)
        try:
            for version in range(steps):
                batch = source.next_batch(2, current_version=version)
                consumed.extend(place_of[g.trajectories[0].task] for g in batch.groups)
            # The producer fills its look-ahead from its own thread: groups dispatched, not consumed.
            wait_until(lambda: bool(source.state_dict()["pending"]))
            time.sleep(0.1)
            return source.state_dict()
        finally:
            source.close()

    first = run(None, 3)
    assert first["pending"] and first["position"] > len(consumed)  # what the old checkpoint skipped
    last = run(first, 3)
    assert len(consumed) == len(set(consumed)) == 12  # nothing ran twice
    assert sorted(consumed + last["pending"]) == list(range(last["position"]))  # nothing skipped


def test_eval_reward_counts_every_rollout_the_model_caused():
    """A model that stops answering (no_answer, unscored with rollout.unanswered_reward: null) must not score higher
    than one that answers wrong; an environment's failure is not the model's and is left out."""
    from raygrpo.train.evaluate import evaluate

    class Done:
        def __init__(self, trajectories):
            self.trajectories = trajectories

        def run(self, requests):
            return iter(self.trajectories)

    def traj(reward, status):
        return Trajectory(task=TaskRef("e", 0), reward=reward, status=status)

    result = evaluate(Done([traj(1.0, Status.OK), traj(None, Status.NO_ANSWER), traj(None, Status.ENV_ERROR),
                            traj(0.0, Status.TRUNCATED)]), [TaskRef("e", i) for i in range(4)])
    assert result["eval_reward_mean"] == pytest.approx(1 / 3)
    assert result["eval_scored_reward_mean"] == pytest.approx(0.5)
    assert result["eval_scored_fraction"] == 0.5 and result["eval_rollouts"] == 4


def test_the_kl_reference_of_a_resumed_run_is_what_the_run_recorded(tmp_path, caplog):
    from raygrpo.train.checkpoint import uses_reference

    stale = tmp_path / "reference"
    stale.mkdir()  # another run's warm-up, left in a reused output folder
    assert uses_reference({"reference": False}, stale) is False
    assert uses_reference({"reference": True}, stale) is True
    with pytest.raises(FileNotFoundError, match="started GRPO from a warmed-up model"):
        uses_reference({"reference": True}, tmp_path / "gone")
    assert uses_reference({}, stale) is True and "does not record" in caplog.text  # a checkpoint from before


def _run_cfg(**kwargs):
    return load_config(data={"envs": {"e": {"kind": "ors", "url": "http://127.0.0.1:1"}}, **kwargs})


def test_policy_versions_count_the_generation_batch_trl_builds_from_generation_batch_size(tmp_path):
    from raygrpo.train.grpo_args import learner_grpo_config

    cfg = _run_cfg(trainer={"generation_batch_size": 16, "per_device_train_batch_size": 8})
    assert cfg.steps_per_version == 2  # TRL generates every two optimizer steps
    args = learner_grpo_config(cfg, str(tmp_path))
    assert args.steps_per_generation == 2 and args.save_steps == 10
    cfg = _run_cfg(trainer={"generation_batch_size": 24, "per_device_train_batch_size": 8})
    assert cfg.steps_per_version == 3 and learner_grpo_config(cfg, str(tmp_path)).save_steps == 12  # on a batch's end
    with pytest.raises(ConfigError, match=r"trainer.save_steps \(5\) must be a multiple .* \(2\)"):
        _run_cfg(trainer={"generation_batch_size": 16, "per_device_train_batch_size": 8, "save_steps": 5})
    with pytest.raises(ConfigError, match=r"trainer.generation_batch_size \(12\) must be a multiple"):
        _run_cfg(trainer={"generation_batch_size": 12, "per_device_train_batch_size": 8})


def test_the_behaviour_correction_bounds_negative_advantage_ratios_unless_trainer_delta_is_set(tmp_path):
    from raygrpo.train.correction import correction_for
    from raygrpo.train.grpo_args import BEHAVIOUR_DELTA, learner_grpo_config

    engine = {"kind": "transformers"}
    cfg = _run_cfg(policy=engine, train={"mode": "async", "behaviour_ratio": True})
    assert correction_for(cfg).mode == "behaviour"
    assert learner_grpo_config(cfg, str(tmp_path)).delta == BEHAVIOUR_DELTA == 4.0
    # What the user sets is kept, `null` included (TRL's one-sided clip).
    assert learner_grpo_config(_run_cfg(policy=engine, trainer={"delta": 6}), str(tmp_path)).delta == 6
    assert learner_grpo_config(_run_cfg(policy=engine, trainer={"delta": None}), str(tmp_path)).delta is None
    # Decoupled PPO against a lagging proximal policy (tis's default): its ratio is not 1 at a batch's first step.
    lagging = _run_cfg(policy=engine, train={"mode": "async", "off_policy": {"mode": "tis"}})
    assert learner_grpo_config(lagging, str(tmp_path)).delta == BEHAVIOUR_DELTA
    # Not the behaviour correction nor a lagging proximal policy, or a loss that does not read delta: TRL's default.
    for cfg in (_run_cfg(policy=engine, train={"mode": "async", "off_policy": {"mode": "tis", "proximal_decay": 0}}),
                _run_cfg(policy=engine, train={"behaviour_ratio": False}),
                _run_cfg(policy=engine, trainer={"loss_type": "cispo"})):
        assert learner_grpo_config(cfg, str(tmp_path)).delta is None


def test_a_vllm_server_gets_token_level_importance_weights_with_both_bounds(tmp_path):
    from raygrpo.train.grpo_args import learner_grpo_config

    url = {"kind": "vllm", "url": "http://127.0.0.1:1"}
    args = learner_grpo_config(_run_cfg(policy=url, train={"mode": "async"}), str(tmp_path))
    assert args.vllm_importance_sampling_correction
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max) == ("token_truncate", 0.0, 2.0)  # TRL's own: sequence_mask, 3
    args = learner_grpo_config(_run_cfg(policy=url, train={"off_policy": {"mode": "mis"}}), str(tmp_path))
    assert (args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min) == ("token_mask", 0.5)
    args = learner_grpo_config(_run_cfg(policy=url, train={"off_policy": {"mode": "none"}}), str(tmp_path))
    assert not args.vllm_importance_sampling_correction
    with pytest.raises(ConfigError, match="vllm_importance_sampling_mode is set by raygrpo from train.off_policy"):
        _run_cfg(policy=url, trainer={"vllm_importance_sampling_mode": "sequence_mask"})


def test_an_eval_does_not_send_the_weights_trl_already_sent_this_step():
    from types import SimpleNamespace

    from raygrpo.core.compat import sync_vllm_weights

    sent = []
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=4), _last_loaded_step=4,
                              vllm_generation=SimpleNamespace(sync_weights=lambda: sent.append(1)))
    sync_vllm_weights(trainer)  # TRL pushed step 4's weights before calling the rollout_func
    assert sent == []
    trainer.state.global_step = 5  # the final eval, after the last step: not sent yet
    sync_vllm_weights(trainer)
    assert sent == [1] and trainer._last_loaded_step == 5


def _checkpoint(root, step, *files):
    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", *files):
        (folder / name).write_text("{}")
    return folder


def test_resume_takes_the_newest_complete_checkpoint_and_names_each_cut_short(tmp_path, caplog):
    """A kill inside a save leaves model and optimizer without trainer_state.json / raygrpo_state.json: --resume
    skips that folder (with a warning) for the newest complete one, and refuses when none is complete."""
    from raygrpo.core.errors import ResolveError
    from raygrpo.train.checkpoint import find_checkpoint

    root = tmp_path / "checkpoints"
    assert find_checkpoint(root, resume=False) is None
    assert find_checkpoint(root, resume=True) is None and "no checkpoint under" in caplog.text
    _checkpoint(root, 9, "trainer_state.json")  # killed before raygrpo's state
    with pytest.raises(ResolveError) as err:
        find_checkpoint(root, resume=True)
    assert f"--resume: no complete checkpoint under {root}: checkpoint-9 lacks raygrpo_state.json" in str(err.value)
    complete = _checkpoint(root, 4, "trainer_state.json", "raygrpo_state.json")
    _checkpoint(root, 10)  # killed before either
    (root / "checkpoint-12.tmp").mkdir()  # no checkpoint folder of transformers'
    caplog.clear()
    assert find_checkpoint(root, resume=True) == str(complete)
    assert f"skipping {root / 'checkpoint-10'}, a save cut short (no trainer_state.json or raygrpo_state.json)" \
        in caplog.text
    assert f"skipping {root / 'checkpoint-9'}, a save cut short (no raygrpo_state.json)" in caplog.text
    caplog.clear()
    assert find_checkpoint(root, resume=True, warn=False) == str(complete) and caplog.text == ""


def test_raygrpo_state_appears_only_whole(tmp_path):
    """Its presence marks a checkpoint complete: it is written through a temporary file."""
    from raygrpo.train.checkpoint import STATE_FILE, read_state, write_state

    write_state(tmp_path, step=4, policy_version=2, schedule={"position": 3}, dropped_groups_total=1, reference=False)
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE]
    assert read_state(str(tmp_path))["schedule"] == {"position": 3}


@pytest.mark.parametrize("half", ["bf16", "fp16"])
def test_a_half_precision_learner_beside_fp32_engines_warns(half, caplog):
    from types import SimpleNamespace

    from raygrpo.train.learner import warn_half_precision

    args = SimpleNamespace(bf16=half == "bf16", fp16=half == "fp16")
    caplog.clear()  # importing the learner logs warnings of its own
    warn_half_precision(args, engines=False)
    assert not [r for r in caplog.records if r.name == "raygrpo.train.learner"]
    warn_half_precision(args, engines=True)
    assert f"trainer.{half} is on while the transformers engines sample in fp32" in caplog.text


def _learner_given(trajectories, fail_fraction=0.25):
    """A `Learner` reduced to what `_rollout_func` reads, whose source returns one group of `trajectories`."""
    from types import SimpleNamespace

    from raygrpo.core.outcome import Outcomes
    from raygrpo.train.groups import Group
    from raygrpo.train.source import Batch
    from raygrpo.train.learner import Learner

    learner = Learner.__new__(Learner)
    group = Group("g0", len(trajectories), list(trajectories))
    learner.__dict__.update(
        group_size=len(trajectories), cfg=_run_cfg(fail_fraction=fail_fraction), progress={}, outcomes=Outcomes(),
        rollouts=None, _step={}, _evaluated=set(), steps_per_version=1, engines=[], _pushed_version=0,
        tokenizer=SimpleNamespace(eos_token_id=0),
        source=SimpleNamespace(next_batch=lambda n, version: Batch(groups=[group], wait_s=0.0)))
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=3))
    return learner, trainer


def test_a_step_with_nothing_scored_because_infrastructure_failed_stops_the_run():
    """An embedded ORS server that died mid-training: every rollout env_error. Training stepped on empty batches to
    max_steps and checkpointed tasks as done; now the step raises before it trains or saves. A few failures among
    unscored answers (within fail_fraction), or any scored rollout, still train."""
    few = [Trajectory(task=TaskRef("e", 0), status=Status.ENV_ERROR, error="x"),
           *[Trajectory(task=TaskRef("e", 0), status=Status.NO_ANSWER, reward=None) for _ in range(3)]]
    scored = [Trajectory(task=TaskRef("e", 0), status=Status.ENV_ERROR, error="x"),
              Trajectory(task=TaskRef("e", 0), status=Status.OK, reward=1.0, prompt_ids=[1], completion_ids=[2],
                         logprobs=[0.0], env_mask=[1])]
    for trajs in (few, scored):
        learner, trainer = _learner_given(trajs)
        assert learner._rollout_func(["p"] * len(trajs), trainer)
    dead = [Trajectory(task=TaskRef("e", i), status=Status.ENV_ERROR, error="ORS server: connection refused")
            for i in range(2)]
    learner, trainer = _learner_given(dead)
    with pytest.raises(RuntimeError, match=r"training step 4: no rollout of the step's batch was scored and 2 of 2 "
                                           r"failed.*connection refused"):
        learner._rollout_func(["p", "p"], trainer)
