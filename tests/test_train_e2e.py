"""`raygrpo train` end to end through Ray: sync and async steps with the tiny model, resume, mixtures, weight sync.

Every run uses real ORS environments served on 127.0.0.1 by raygrpo, real env pool actors, the learner actor with
TRL's GRPOTrainer on the CPU and (except the scripted mixture run) the transformers engine with the tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raygrpo.config import load_config
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
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return load_config(data=data)


def _train_lines(out: Path) -> list[dict]:
    return [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]


def test_sync_steps_then_resume_continue_with_the_same_optimizer_state_version_and_task_position(
    ray_local, tiny_model_dir, tmp_path
):
    import torch

    from raygrpo.train.learner import optimizer_fingerprint
    from raygrpo.train.run import train

    out = tmp_path / "run"
    summary = train(_config(tiny_model_dir), out, progress=False)
    lines = _train_lines(out)
    assert [r["step"] for r in lines] == [1, 2]
    assert [r["generated_by_version"] for r in lines] == [0, 1]  # sync: each step's rollouts use that step's weights
    assert all(r["staleness_max"] == 0 and r["groups"] == 2 and r["rollouts"] == 4 for r in lines)
    assert summary["steps"] == 2 and summary["leaked_envs"] == 0 and summary["task_position"] == 4
    ckpt = out / "checkpoints" / "checkpoint-2"
    assert json.loads((ckpt / "raygrpo_state.json").read_text())["schedule"] == {"position": 4}
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


def test_async_steps_drop_stale_groups_and_count_them(ray_local, tiny_model_dir, tmp_path):
    from raygrpo.train.run import train

    out = tmp_path / "run"
    # max_staleness 0: the look-ahead generated while step 1 trains (version 0) is stale at step 2 (version 1).
    cfg = _config(tiny_model_dir, train={"mode": "async", "max_staleness": 0}, trainer={"max_steps": 3})
    summary = train(cfg, out, progress=False)
    lines = _train_lines(out)
    assert [r["step"] for r in lines] == [1, 2, 3]
    assert all(r["staleness_max"] == 0 and r["groups"] == 2 for r in lines)
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
        rollout={"max_turns": 8, "max_total_tokens": 2048},
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
