"""GPU check: raygrpo's learner path on one GPU, without Ray, in one process; prints one JSON object last.

TRL's `GRPOTrainer` (raygrpo's `RolloutGRPOTrainer`) trains a model on the sums task family
(`examples/smol_sums/tasks.py`, run in process: no ORS server) with the `rollout_func` of
`raygrpo.train.InProcessRollouts`: the plain-asyncio agent loop, the transformers engine and the learner in one
process, weights pushed to the engine before every batch. It measures steps, seconds per step, completion tokens per
second, the held-out eval reward before and after (with 95% intervals), the engine-vs-learner log-prob gap after the
weight sync, and the peak GPU memory.

It imports only what the device machine has (torch, transformers, accelerate, tokenizers) plus wheels carried in the
git-ignored `.gpu-wheels/` folder and installed into `.gpu-wheels/site` (`scripts/gpu_wheels.sh`); see
docs/gpu_check.md.

    python scripts/gpu_check.py                      # on the GPU: SmolLM2 (or --model), ~5 minutes at most
    python scripts/gpu_check.py --dry-run            # the same code on the CPU at tiny sizes (the test suite runs it)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / ".gpu-wheels" / "site"
if SITE.is_dir():
    sys.path.insert(0, str(SITE))  # trl, datasets, pydantic, ... carried to the device machine
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "smol_sums"))

logger = logging.getLogger("gpu_check")


class SumsAdapter:
    """One episode of a sums task, in process: the `submit` tool scores and ends it. With `plain_answers`, a final
    answer in plain text is scored too (its last integer); with `graded`, the reward is dense (1.0 when right, less the
    further off). Both give a model that has not learned the tool format yet rewards that differ within a group."""

    def __init__(self, tasks_by_index: list[dict], plain_answers: bool = False, graded: bool = False) -> None:
        self.tasks = tasks_by_index
        self.plain_answers = plain_answers
        self.graded = graded
        self.task: dict | None = None
        self.reward: float | None = None

    async def start(self, task):
        import tasks as sums
        from raygrpo.core.types import Observation

        self.task = self.tasks[task.index]
        text = sums.prompt_text(self.task["a"], self.task["op"], self.task["b"])
        return Observation(messages=[{"role": "user", "content": text}], tools=[sums.SUBMIT_TOOL])

    async def call(self, name, arguments):
        from raygrpo.core.types import ToolResult

        self.reward = self._reward(arguments.get("answer"))
        return ToolResult(text="correct" if self.reward else "wrong", reward=self.reward, finished=True)

    async def answer(self, text):
        if not self.plain_answers:
            return None
        import tasks as sums
        from raygrpo.core.types import ToolResult

        self.reward = self._reward(sums.text_answer(text))
        return ToolResult(text="", reward=self.reward, finished=True)

    def _reward(self, answer) -> float:
        import tasks as sums

        return (sums.graded_reward if self.graded else sums.reward)(self.task, answer)

    async def score(self):
        return self.reward

    async def close(self):
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny model, tiny sizes (the test suite's run)")
    p.add_argument("--model", default=None, help="model folder, .gguf file, 'smollm2-135m' or 'tiny'")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--groups", type=int, default=None, help="groups per step")
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks evaluated before and after")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--warmup-steps", type=int, default=None, help="supervised format warm-up steps (0: none)")
    p.add_argument("--warmup-batch", type=int, default=8, help="conversations per warm-up step")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--out", default=None, help="scratch folder for TRL's output_dir")
    p.add_argument("--device", default=None, help="cuda (default) or cpu; --dry-run means cpu")
    p.add_argument("--plain-answers", action="store_true", help="also score answers given in plain text")
    p.add_argument("--graded", action="store_true", help="dense reward: 1.0 when right, less the further off")
    p.add_argument("--seed", type=int, default=0, help="sampling, the task order and TRL's seed")
    args = p.parse_args(argv)
    small = args.dry_run
    defaults = dict(model="tiny" if small else "smollm2-135m", steps=2 if small else 20, groups=2 if small else 8,
                    group_size=2 if small else 8, eval_tasks=4 if small else 200, max_tokens=16 if small else 64,
                    warmup_steps=0 if small else 60, lr=1e-3 if small else 2e-6)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def run(args: argparse.Namespace) -> dict:
    import tempfile

    import torch

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    device = "cpu" if args.dry_run else (args.device or "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device (--dry-run or --device cpu for the CPU form)")
    import tasks as sums
    from datasets import Dataset
    from trl import GRPOConfig

    from raygrpo.config.rollout import RolloutConfig
    from raygrpo.policy.tiny import resolve_model_path
    from raygrpo.policy.transformers_engine import TransformersEngine
    from raygrpo.train.inprocess import InProcessRollouts
    from raygrpo.train.correction import Correction
    from raygrpo.train.trainer import RolloutGRPOTrainer
    from raygrpo.core.types import SamplingParams, TaskRef

    started = time.perf_counter()
    model_path = resolve_model_path(args.model)
    all_tasks = sums.questions()
    train = [TaskRef(env="sums", index=i, split="train") for i in range(len(all_tasks["train"]))]
    test = [TaskRef(env="sums", index=i, split="test") for i in range(min(args.eval_tasks, len(all_tasks["test"])))]
    by_split = {"train": all_tasks["train"], "test": all_tasks["test"]}

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    warmup = None
    if args.warmup_steps:
        from raygrpo.config.train import WarmupConfig
        from raygrpo.train.warmup import warm_up_on

        cfg = WarmupConfig(examples=str(ROOT / "examples" / "smol_sums" / "warmup.py") + ":format_examples",
                           steps=args.warmup_steps, num_examples=400, batch_size=args.warmup_batch,
                           learning_rate=1e-4, log_every=2)
        warmup = warm_up_on(device, model, tokenizer, cfg)  # the learner's warm-up, on its GPU

    engine = TransformersEngine(model_path, device=device, max_batch_size=64, seed=args.seed, num_threads=None)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=args.seed)
    limits = RolloutConfig(group_size=args.group_size, max_turns=2, max_total_tokens=1024)
    rollouts = InProcessRollouts(engine, lambda task: SumsAdapter(by_split[task.split], args.plain_answers,
                                                                  args.graded),
                                 train, sampling, limits, args.group_size, seed=args.seed)
    out = args.out or tempfile.mkdtemp(prefix="raygrpo-gpu-check-")
    grpo = GRPOConfig(
        output_dir=out, use_cpu=device == "cpu", use_vllm=False, num_generations=args.group_size,
        per_device_train_batch_size=args.groups * args.group_size, max_steps=args.steps, learning_rate=args.lr,
        beta=0.0, report_to="none", logging_steps=1, save_strategy="no", max_completion_length=args.max_tokens * 2,
        temperature=1.0, disable_dropout=True, bf16=False, seed=args.seed, gradient_checkpointing=False,
    )
    dataset = Dataset.from_dict({"prompt": [f"raygrpo group slot {i}" for i in range(args.groups)]})
    trainer = RolloutGRPOTrainer(model=model, reward_funcs=[_env_reward], args=grpo, train_dataset=dataset,
                                 processing_class=tokenizer, rollout_func=rollouts.rollout_func,
                                 correction=Correction("behaviour"))
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    try:
        learner_model = trainer.accelerator.unwrap_model(trainer.model)
        before_weights = {k: v.detach().clone() for k, v in list(learner_model.named_parameters())[:4]}
        rollouts.sync_weights(learner_model, 0)
        eval_before = rollouts.evaluate(test)
        train_started = time.perf_counter()
        trainer.train()
        train_s = time.perf_counter() - train_started
        version = trainer.state.global_step
        rollouts.sync_weights(learner_model, version)
        eval_after = rollouts.evaluate(test)
        changed = any(not torch.equal(before_weights[k], v.detach()) for k, v in learner_model.named_parameters()
                      if k in before_weights)
        sync_gap = _logprob_gap(rollouts, learner_model, tokenizer, by_split["test"][0])
    finally:
        rollouts.close()  # and the engine
        if args.out is None:  # TRL's output_dir in a folder of its own; nothing is saved there (save_strategy "no")
            shutil.rmtree(out, ignore_errors=True)
    tokens = sum(b["completion_tokens"] for b in rollouts.batches)
    return {
        "kind": "raygrpo-gpu-check", "dry_run": args.dry_run, "device": _device_name(device), "model": args.model,
        "parameters": sum(p.numel() for p in learner_model.parameters()),
        "torch": torch.__version__, "transformers": _version("transformers"), "trl": _version("trl"),
        "steps": trainer.state.global_step, "groups_per_step": args.groups, "group_size": args.group_size,
        "s_per_step": train_s / max(1, trainer.state.global_step),
        "tokens_per_s": tokens / train_s if train_s > 0 else None,
        "completion_tokens": tokens,
        "train_reward_by_step": [b["reward_mean"] for b in rollouts.batches],
        "train_reward_std_by_step": [b["reward_std"] for b in rollouts.batches],
        "train_tool_call_fraction_by_step": [b["tool_call_fraction"] for b in rollouts.batches],
        "eval_tasks": len(test),
        "eval_before": _eval_summary(eval_before), "eval_after": _eval_summary(eval_after),
        "plain_answers": args.plain_answers, "graded": args.graded, "seed": args.seed,
        "weights_changed": changed, "sync_logprob_max_abs_diff": sync_gap,
        "warmup": warmup,
        "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated() if device.startswith("cuda") else None,
        "wall_s": time.perf_counter() - started,
    }


def _env_reward(prompts, completions, env_reward, **kwargs):
    return list(env_reward)


def _eval_summary(stats: dict) -> dict:
    keep = ("reward_mean", "reward_ci95", "solved_fraction", "scored_fraction", "tool_call_fraction", "rollouts",
            "policy_version")
    return {k: stats.get(k) for k in keep}


def _logprob_gap(rollouts, model, tokenizer, task: dict) -> float:
    """Largest |engine - learner| log-prob over a fixed completion, after the weight sync."""
    import tasks as sums
    import torch

    from raygrpo.agent.toolcalls import format_tool_call

    prompt = rollouts.renderer.prompt_ids([{"role": "user", "content": sums.prompt_text(task["a"], task["op"],
                                                                                         task["b"])}],
                                          [sums.SUBMIT_TOOL])
    completion = rollouts.renderer.encode(format_tool_call("submit", {"answer": task["answer"]}))
    engine_lp = rollouts._run(rollouts.engine.logprobs_of(prompt, completion, 1.0))
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion], device=device)).logits[0, len(prompt) - 1 : -1].float()
        own = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion, device=device)[:, None]).squeeze(-1)
    return max(abs(a - b) for a, b in zip(engine_lp, own.tolist()))


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    result = run(parse_args(argv))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
