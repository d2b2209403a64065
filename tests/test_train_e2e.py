"""`raygrpo train` end to end through Ray: sync and async steps with the tiny model, resume, mixtures, weight sync.

Every run uses real ORS environments served on 127.0.0.1 by raygrpo, real env pool actors, the learner actor with
TRL's GRPOTrainer on the CPU and (except the scripted mixture run) the transformers engine with the tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygrpo.config import load_config
from raygrpo.core.types import TaskRef
from raygrpo.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent
ECHO = str(ROOT / "examples" / "echo" / "env.py") + ":EchoEnvironment"
ARITH = str(ROOT / "examples" / "arith" / "env.py") + ":ArithEnvironment"

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def _config(model: str, **sections):
    data = {
        "envs": {"echo": {"kind": "ors", "environment": ECHO, "split": "train"}},
        "model": model,
        "policy": {"kind": "transformers", "max_batch_size": 8},
        "sampling": {"max_tokens": 16, "temperature": 1.0, "seed": 0},
        "rollout": {"group_size": 2, "max_turns": 2, "max_total_tokens": 512},
        "workers": {"num_env_actors": 1, "max_concurrent_per_actor": 8},
        "trainer": {"per_device_train_batch_size": 4, "max_steps": 2, "save_steps": 2, "learning_rate": 1e-3},
    }
    for key, value in sections.items():
        # A policy replaces the default one: the engine actors' settings mean nothing to a scripted policy.
        merge = isinstance(value, dict) and key != "policy"
        data[key] = {**data.get(key, {}), **value} if merge else value
    return load_config(data=data)


def _train_lines(out: Path) -> list[dict]:
    return [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]


def test_sync_steps_then_resume_continue_with_the_same_optimizer_state_version_and_task_position(
    ray_local, tiny_model_dir, tmp_path
):
    import torch

    from raygrpo.train.checkpoint import optimizer_fingerprint
    from raygrpo.train.run import train

    out = tmp_path / "run"
    summary = train(_config(tiny_model_dir), out, progress=False)
    lines = _train_lines(out)
    assert [r["step"] for r in lines] == [1, 2]
    assert [r["generated_by_version"] for r in lines] == [0, 1]  # sync: each step's rollouts use that step's weights
    assert all(r["staleness_max"] == 0 and r["groups"] == 2 and r["rollouts"] == 4 for r in lines)
    # Every group is fresh and the engine samples with the learner's own fp32 weights: its log-probs and TRL's differ
    # only by numerics (measured: 2.8e-7 and 2.2e-7 nats per token).
    assert all(0 <= r["logp_mismatch_mean"] < 1e-3 and 0 <= r["logp_mismatch_k3"] < 1e-6 for r in lines), lines
    assert summary["steps"] == 2 and summary["leaked_envs"] == 0 and summary["task_position"] == 4
    ckpt = out / "checkpoints" / "checkpoint-2"
    assert json.loads((ckpt / "raygrpo_state.json").read_text())["schedule"] == {"position": 4, "pending": []}
    saved_fp = optimizer_fingerprint(torch.load(ckpt / "optimizer.pt", weights_only=False)["state"])
    assert (out / "model" / "model.safetensors").exists() and (out / "reward_curve.png").exists()
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 8 and {r["step"] for r in rollouts} == {1, 2}

    resumed = train(_config(tiny_model_dir, trainer={"max_steps": 3}), out, resume=True, progress=False)
    lines = _train_lines(out)
    assert [r["step"] for r in lines] == [1, 2, 3]  # appended, not restarted
    assert resumed["resumed"] == {"step": 2, "task_position": 4, "optimizer_fingerprint": saved_fp}
    assert lines[-1]["generated_by_version"] == 2 and lines[-1]["policy_version"] == 3
    assert resumed["task_position"] == 6 and resumed["policy_version"] == 3 and resumed["leaked_envs"] == 0
    assert len((out / "rollouts.jsonl").read_text().splitlines()) == 12
    # The counts of the summary cover the whole run, as steps and the reward windows do, not the resumed part only.
    assert sum(summary["status_counts"].values()) == 8
    assert sum(resumed["status_counts"].values()) == 12 and resumed["scored"] >= summary["scored"]


def test_async_steps_with_the_tiny_model_stay_within_max_staleness(ray_local, tiny_model_dir, tmp_path):
    from raygrpo.train.run import train

    out = tmp_path / "run"
    cfg = _config(tiny_model_dir, train={"mode": "async", "max_staleness": 1}, trainer={"max_steps": 3})
    summary = train(cfg, out, progress=False)
    lines = _train_lines(out)
    assert [r["step"] for r in lines] == [1, 2, 3]
    assert all(r["staleness_max"] <= 1 and r["groups"] == 2 and r["rollouts"] == 4 for r in lines)
    # Groups per staleness: every consumed group counted once, under a staleness within the bound.
    assert all(sum(r["staleness_counts"].values()) == 2 and set(r["staleness_counts"]) <= {"0", "1"} for r in lines)
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    # Each consumed rollout was generated by weights at most one version older than the step that used it.
    assert all(r["step"] - 1 - min(r["policy_versions"]) <= 1 for r in rollouts if r["policy_versions"])
    assert summary["dropped_groups_total"] == sum(r["dropped_groups"] for r in lines)
    assert summary["leaked_envs"] == 0


def test_async_generation_batches_of_two_steps_consume_their_groups_and_a_resume_keeps_the_schedule(
    ray_local, tiny_model_dir, tmp_path
):
    """`trainer.generation_batch_size` spanning two optimizer steps: one policy version per generation batch, so
    the async producer's groups arrive within max_staleness and none is dropped (counted one version per step, every
    prefetched group was). With `off_policy: tis`, stale groups get truncated importance weights, whose figures and
    TRL's own reach metrics.jsonl; its proximal policy, a moving average of the weights (`proximal_decay` 0.5 by
    default), is kept with each checkpoint. A resume dispatches the groups the checkpoint left pending: over both runs, the tasks
    consumed plus those still pending are exactly the schedule's first places."""
    from raygrpo.train.proximal import PROXIMAL_FILE
    from raygrpo.train.run import train
    from raygrpo.train.schedule import TaskSchedule

    out = tmp_path / "run"
    sections = {"train": {"mode": "async", "max_staleness": 1, "off_policy": {"mode": "tis"}},
                "envs": {"echo": {"kind": "ors", "environment": ECHO, "split": "train", "indices": [0, 1, 2, 3, 4]}}}
    trainer = {"per_device_train_batch_size": 4, "generation_batch_size": 8, "save_steps": 2}
    summary = train(_config(tiny_model_dir, trainer={**trainer, "max_steps": 4}, **sections), out, progress=False)
    lines = _train_lines(out)
    assert [r["policy_version"] for r in lines] == [0, 1, 1, 2]  # after steps 1-4: one version per two steps
    assert summary["dropped_groups_total"] == 0 and all(r.get("staleness_max", 0) <= 1 for r in lines)
    generating = [r for r in lines if r.get("generated_by_version") is not None]
    assert [r["step"] for r in generating] == [1, 3] and all(r["groups"] == 4 for r in generating)
    assert all(r["is_weight/mean"] is not None and r["is_weight/truncated_frac"] is not None for r in generating)
    assert all({"clip_ratio/region_mean", "entropy"} <= set(r) for r in lines)  # TRL's, logged with every step
    assert all(r["frac_reward_zero_std"] is not None for r in generating)  # and with each generation batch
    assert (out / "checkpoints" / "checkpoint-4" / PROXIMAL_FILE).is_file()

    summary = train(_config(tiny_model_dir, trainer={**trainer, "max_steps": 8}, **sections), out, resume=True,
                    progress=False)
    assert summary["resumed"]["step"] == 4 and summary["dropped_groups_total"] == 0
    state = json.loads((out / "checkpoints" / "checkpoint-8" / "raygrpo_state.json").read_text())["schedule"]
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    consumed = {r["group_id"]: r["task"]["index"] for r in rollouts}
    assert len(consumed) == 16  # 8 steps of 2 groups
    schedule = TaskSchedule({"echo": [TaskRef("echo", i) for i in range(5)]}, None, seed=0)
    expected = sorted(schedule.task_at(p).index for p in range(state["position"]))
    pending = [schedule.task_at(p).index for p in state["pending"]]
    assert sorted([*consumed.values(), *pending]) == expected


def test_async_drops_a_group_that_comes_back_too_stale_and_counts_it(ray_local, tiny_model_dir, tmp_path):
    from raygrpo.train.run import train

    out = tmp_path / "run"
    # Task 0's rollouts take 3 s while the others return at once: by the time its group completes, the learner is
    # several versions past the one it was dispatched under (scripted turns carry no version of their own).
    cfg = _config(
        tiny_model_dir,
        envs={"echo": {"kind": "ors", "environment": str(ROOT / "tests" / "e2e_support.py") + ":NapEnvironment",
                       "split": "train", "indices": [0, 1, 2, 3]}},
        policy={"kind": "scripted", "script": str(ROOT / "tests" / "train_policies.py") + ":nap_task0"},
        sampling={"max_tokens": 64},
        train={"mode": "async", "max_staleness": 1},
        trainer={"max_steps": 14, "save_steps": 100},
    )
    summary = train(cfg, out, progress=False)
    lines = _train_lines(out)
    assert len(lines) == 14 and all(r["staleness_max"] <= 1 for r in lines)
    assert summary["dropped_groups_total"] >= 1
    assert sum(r["dropped_groups"] for r in lines) == summary["dropped_groups_total"] == lines[-1]["dropped_groups_total"]
    assert summary["leaked_envs"] == 0


def test_mixture_shares_rewards_and_tool_masks_reach_trl(ray_local, tiny_model_dir, tmp_path):
    from raygrpo.train.run import train

    out = tmp_path / "run"
    cfg = _config(
        tiny_model_dir,
        envs={"arith": {"kind": "ors", "environment": ARITH, "split": "train"}},
        eval_envs={"echo_test": {"kind": "ors", "environment": ECHO, "split": "test"}},
        policy={"kind": "scripted", "script": str(ROOT / "tests" / "train_policies.py") + ":mixed"},
        sampling={"max_tokens": 96},
        # The `silent` quarter of echo rollouts answers nothing: left unscored here, to see None reach TRL as such.
        rollout={"max_turns": 8, "max_total_tokens": 2048, "unanswered_reward": None},
        workers={"max_concurrent_per_actor": 16},
        train={"mixture": {"echo": 0.75, "arith": 0.25}, "eval_every": 5},
        trainer={"per_device_train_batch_size": 8, "max_steps": 10, "save_steps": 100},
    )
    summary = train(cfg, out, progress=False)
    records = read_metrics(out / "metrics.jsonl")
    lines = [r for r in records if r["kind"] == "train"]
    groups = {env: sum(r["envs"].get(env, {}).get("groups", 0) for r in lines) for env in ("echo", "arith")}
    assert sum(groups.values()) == 40
    assert abs(groups["echo"] / 40 - 0.75) <= 0.10 and abs(groups["arith"] / 40 - 0.25) <= 0.10
    assert all(set(r["envs"]) <= {"echo", "arith"} and "reward_mean" in r["envs"][e] for r in lines for e in r["envs"])
    # TRL's reward function saw the environment rewards: its logged mean over scored rollouts is ours.
    for r in lines:
        assert r["trl_reward"] == pytest.approx(r["reward_mean"], abs=1e-5)
    assert any(r["scored_fraction"] < 1.0 for r in lines)  # unscored (None) rollouts stayed unscored
    # A script's log-probs are 0.0, not a sampler's: no log-prob mismatch to report.
    assert all(r["logp_mismatch_mean"] is None and r["logp_mismatch_k3"] is None for r in lines)
    # Evaluations before step 0, at 5 and at the end, on the eval environment only.
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 5, 10] and all(set(r["eval_envs"]) == {"echo_test"} for r in evals)
    # Tool-result tokens are masked out: arith completions hold them, and exactly those positions are 0.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    arith = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    arith = [r for r in arith if r["task"]["env"] == "arith" and r["tool_calls"] > 1]
    assert arith
    for r in arith:
        env_tokens = [t for t, m in zip(r["completion_ids"], r["env_mask"]) if m == 0]
        model_tokens = [t for t, m in zip(r["completion_ids"], r["env_mask"]) if m == 1]
        assert "<tool_response>" in tok.decode(env_tokens) and "<tool_response>" not in tok.decode(model_tokens)
        assert "<tool_call>" in tok.decode(model_tokens) and "<tool_call>" not in tok.decode(env_tokens)
    assert summary["leaked_envs"] == 0


def test_weights_reach_the_engine(ray_local, tiny_model_dir):
    import ray
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from raygrpo.actors.policy_engine import start_policy_engine
    from raygrpo.train.weights import push_weights

    engine = start_policy_engine(tiny_model_dir, num_cpus=0.5)
    try:
        ray.get(engine.ready.remote(), timeout=120)
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        prompt = tok.encode("Echo 'hello' to win.")
        completion = tok.encode('<tool_call>\n{"name": "echo", "arguments": {"text": "hello"}}\n</tool_call>')

        def learner_logprobs() -> torch.Tensor:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
            return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)

        with torch.no_grad():  # stands in for a training step: the learner's weights move away from the engine's
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        before = torch.tensor(ray.get(engine.logprobs_of.remote(prompt, completion)))
        assert (before - learner_logprobs()).abs().max() > 1e-2
        assert push_weights(model, [engine], version=7) == [7]
        after = torch.tensor(ray.get(engine.logprobs_of.remote(prompt, completion)))
        assert torch.allclose(after, learner_logprobs(), atol=1e-4)
        assert ray.get(engine.policy_version.remote()) == 7
    finally:
        ray.kill(engine, no_restart=True)


WARMUP = str(ROOT / "examples" / "echo" / "warmup.py") + ":format_examples"


def test_with_a_kl_term_policy_and_reference_both_start_from_the_warmed_up_model(ray_local, tiny_model_dir, tmp_path):
    """beta > 0 after a warm-up: the KL reference is the warmed model (not the files it was loaded from), so the KL of
    the first step is 0, and stays so after --resume. The learning rate is 0 to keep the policy where it started."""
    from raygrpo.train.run import train

    out = tmp_path / "run"
    warmup = {"examples": WARMUP, "num_examples": 64, "steps": 20, "batch_size": 8, "learning_rate": 1e-2}
    trainer = {"beta": 0.04, "learning_rate": 0.0, "max_steps": 1, "save_steps": 1}
    train(_config(tiny_model_dir, train={"warmup": warmup}, trainer=trainer), out, progress=False)
    [first] = _train_lines(out)
    assert first["kl"] is not None and first["kl"] < 1e-4, first["kl"]
    assert (out / "reference" / "model.safetensors").exists()

    train(_config(tiny_model_dir, train={"warmup": warmup}, trainer={**trainer, "max_steps": 2}), out, resume=True,
          progress=False)
    lines = _train_lines(out)
    assert [r["step"] for r in lines] == [1, 2] and lines[-1]["kl"] < 1e-4, lines[-1]["kl"]


def test_every_eval_runs_on_the_weights_it_is_labelled_with(ray_local, tiny_model_dir, tmp_path):
    """Weights go to the engines every 2 versions, evals run every version: each eval pushes first."""
    from raygrpo.train.run import train

    out = tmp_path / "run"
    cfg = _config(tiny_model_dir, eval_envs={"echo_test": {"kind": "ors", "environment": ECHO, "split": "test"}},
                  train={"eval_every": 1, "weight_sync_every": 2}, trainer={"max_steps": 3, "save_steps": 100})
    train(cfg, out, progress=False)
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["policy_version"] for r in evals] == [0, 1, 2, 3]
    assert [r["eval_generated_by"] for r in evals] == [[0], [1], [2], [3]]


def test_with_num_iterations_2_a_version_spans_two_steps(ray_local, tiny_model_dir, tmp_path):
    """Each generation batch is trained on twice: one policy version (and one weight push) per batch."""
    from raygrpo.train.run import train

    out = tmp_path / "run"
    train(_config(tiny_model_dir, trainer={"num_iterations": 2, "max_steps": 4, "save_steps": 100}), out,
          progress=False)
    lines = _train_lines(out)
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert [r["policy_version"] for r in lines] == [0, 1, 1, 2]
    assert [r.get("generated_by_version") for r in lines] == [0, None, 1, None]
    # The mismatch is a generation batch's (from the old log-probs TRL computes itself here); none on the second pass.
    assert [r["logp_mismatch_mean"] is not None for r in lines] == [True, False, True, False]
    assert [r["logp_mismatch_k3"] is not None for r in lines] == [True, False, True, False]
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rollouts} == {1, 3}
    assert all(set(r["policy_versions"]) == {(r["step"] - 1) // 2} for r in rollouts)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dynamic_sampling_trains_full_batches_of_groups_that_carry_signal(ray_local, tiny_model_dir, tmp_path, mode):
    from raygrpo.train.run import train

    out = tmp_path / "run"
    cfg = _config(
        tiny_model_dir,
        policy={"kind": "scripted", "script": str(ROOT / "tests" / "train_policies.py") + ":half_flat"},
        sampling={"max_tokens": 64},
        rollout={"group_size": 4},
        train={"mode": mode, "dynamic_sampling": {"enabled": True, "max_extra_groups": 16}},
        trainer={"per_device_train_batch_size": 8, "max_steps": 3, "save_steps": 100},
    )
    summary = train(cfg, out, progress=False)
    lines = _train_lines(out)
    assert [r["groups"] for r in lines] == [2, 2, 2]  # every step's batch full
    assert summary["zero_variance_groups_total"] == lines[-1]["zero_variance_groups_total"] > 0
    assert sum(r["zero_variance_groups"] for r in lines) == summary["zero_variance_groups_total"]
    assert all(r["zero_variance_groups_trained"] == 0 for r in lines)
    # What TRL trained on: no group with all-equal rewards, by its own measure and by the rollouts consumed.
    assert all(r["frac_reward_zero_std"] == 0.0 for r in lines)
    groups: dict[str, set] = {}
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        record = json.loads(line)
        groups.setdefault(record["group_id"], set()).add(record["reward"])
    assert len(groups) == 6 and all(len(rewards) > 1 for rewards in groups.values())
    assert summary["leaked_envs"] == 0


def test_a_lora_run_pushes_merged_adapted_layers_resumes_and_its_model_serves(ray_local, tiny_model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    from raygrpo.driver.collect import collect
    from raygrpo.train.checkpoint import optimizer_fingerprint
    from raygrpo.train.run import train

    out = tmp_path / "run"
    # A short warm-up makes the tiny model call echo with a random word, so groups' rewards differ and the adapters
    # learn something (a fresh random model scores 0 everywhere: no gradient); dynamic sampling keeps only groups
    # that differ.
    lora = {"peft": {"r": 4}, "dynamic_sampling": {"enabled": True, "max_extra_groups": 8},
            "warmup": {"examples": WARMUP, "num_examples": 256, "steps": 150, "batch_size": 8, "learning_rate": 1e-2}}
    sections = {"sampling": {"max_tokens": 48}, "rollout": {"group_size": 8}}
    trainer = {"learning_rate": 1e-2, "per_device_train_batch_size": 16}
    summary = train(_config(tiny_model_dir, train=lora, trainer=trainer, **sections), out, progress=False)
    lines = _train_lines(out)
    assert [r["step"] for r in lines] == [1, 2] and all(r["weight_push_s"] > 0 for r in lines)
    # The engine generated step 2's rollouts with the merged weights of version 1: the learner's own log-probs
    # (PEFT model, adapters on) match the engine's to numerics, as in a full fine-tuning run.
    assert all(0 <= r["logp_mismatch_mean"] < 1e-3 for r in lines), lines
    assert summary["adapter_dir"] == str(out / "adapter")
    assert (out / "adapter" / "adapter_config.json").exists()
    ckpt = out / "checkpoints" / "checkpoint-2"
    assert (ckpt / "adapter_model.safetensors").exists()
    saved_fp = optimizer_fingerprint(torch.load(ckpt / "optimizer.pt", weights_only=False)["state"])

    assert all(r["zero_variance_groups_trained"] == 0 and r["frac_reward_zero_std"] == 0.0 for r in lines)
    position = summary["task_position"]
    resumed = train(_config(tiny_model_dir, train=lora, trainer={**trainer, "max_steps": 3}, **sections), out,
                    resume=True, progress=False)
    assert resumed["resumed"] == {"step": 2, "task_position": position, "optimizer_fingerprint": saved_fp}
    assert [r["step"] for r in _train_lines(out)] == [1, 2, 3] and resumed["leaked_envs"] == 0
    assert 0 <= _train_lines(out)[-1]["logp_mismatch_mean"] < 1e-3  # the resumed adapter reached the engine

    # OUT/model is a plain merged model: adapted layers changed, the rest (embeddings) as GRPO started (warmed).
    trained = load_file(out / "model" / "model.safetensors")
    start = load_file(out / "reference" / "model.safetensors")
    assert not any(".lora_" in k or "base_layer" in k for k in trained)
    assert torch.equal(trained["model.embed_tokens.weight"], start["model.embed_tokens.weight"])
    assert not torch.equal(trained["model.layers.0.self_attn.q_proj.weight"],
                           start["model.layers.0.self_attn.q_proj.weight"])
    served = collect(load_config(str(ROOT / "examples" / "echo" / "rollout.yaml"),
                                 [f"model={out / 'model'}", "policy.kind=transformers", "sampling.max_tokens=16"]),
                     tmp_path / "served", progress=False)
    assert served["completed"] == served["requested"] > 0 and served["leaked_envs"] == 0
