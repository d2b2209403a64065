"""The learner: TRL's `GRPOTrainer` fed by raygrpo's env pool actors through a `rollout_func`.

Plain Python (no Ray actor here: `raygrpo.actors.learner` wraps it). What happens at each step:

1. TRL calls `rollout_func(prompts, trainer)` with its batch's placeholder prompts, already repeated G times.
2. The learner pushes its weights to the transformers engines when due (`train.weight_sync_every`; with vLLM, TRL
   syncs the server itself) and calls them policy version `global_step`.
3. Every `train.eval_every` policy versions (and before the first) the eval environments run once with those weights.
4. `RolloutSource.next_batch` returns `len(prompts) / G` complete groups (sync: generated now; async: streamed
   ahead, stale groups dropped), which fill TRL's entries group by group (see `raygrpo.train.groups`).
5. TRL scores them with `env_reward` (the environment's reward; None stays None, so TRL leaves unscored rollouts
   out of the group baseline and gives them advantage 0), masks tool tokens with `env_mask`, and steps; the trainer
   logs the sampling/learner log-prob mismatch of the fresh groups (`raygrpo.train.logp_mismatch`).

Task schedule: raygrpo's `TaskSchedule` picks each group's task, not TRL's sampler; its position is saved with every
checkpoint (`raygrpo_state.json`, see `raygrpo.train.checkpoint`) so a resumed run continues with the next task.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from raygrpo.core.compat import sync_vllm_weights
from raygrpo.config import RunConfig
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.core.outcome import Outcomes, starved_step
from raygrpo.policy.tiny import resolve_model_path
from raygrpo.driver.pools import ActorSpawner, PoolSet
from raygrpo.train.checkpoint import (REFERENCE_DIR, checkpoint_step, find_checkpoint, optimizer_fingerprint,
                                      read_state, uses_reference, write_state)
from raygrpo.train.evaluate import evaluate
from raygrpo.train.groups import to_rollout_output
from raygrpo.train.grpo_args import learner_grpo_config
from raygrpo.train.lora import lora_config, save_model
from raygrpo.train.metrics import MetricsLog, RolloutLog, plot_rewards
from raygrpo.train.schedule import TaskSchedule
from raygrpo.train.source import RolloutSource
from raygrpo.train.step_metrics import batch_fields, dispatch_fields, train_record, zero_variance_total
from raygrpo.train.correction import correction_for, reports_sampling_logprobs
from raygrpo.train.trainer import RolloutGRPOTrainer
from raygrpo.train.warmup import warm_up_on
from raygrpo.train.weights import engine_summary, push_weights
from raygrpo.core.types import TaskRef
from raygrpo.core.workdir import relocate

logger = logging.getLogger(__name__)


def env_reward(prompts: list, completions: list, env_reward: list[float | None], **kwargs: Any) -> list[float | None]:
    """The reward function TRL calls: the environment's own reward of each rollout (None = unscored)."""
    return list(env_reward)


def warn_half_precision(args: Any, engines: bool) -> None:
    """Warn when the learner trains in half precision (`bf16` or `fp16`) while engine actors sample in fp32: the
    log-probs differ by up to ~1e-2 nats per token, so a fresh group's ratio is not exactly 1."""
    half = [name for name in ("bf16", "fp16") if getattr(args, name, False)]
    if half and engines:
        logger.warning("trainer.%s is on while the transformers engines sample in fp32: their log-probs and the "
                       "learner's differ by up to ~1e-2 nats per token, so fresh groups' ratios are not exactly 1",
                       half[0])


class Learner:
    """Trains `cfg.model` with GRPO on rollouts from the env pool actors.

    Args:
        cfg: The validated run config.
        out_dir: Run folder: `metrics.jsonl`, `checkpoints/`, `model/` (the final export) go here.
        spawners: How to start each env pool of the run (`RolloutRuntime.spawners`): the learner owns the pools
            (`raygrpo.driver.pools`), sized from its rollout demand, and closes them when training ends.
        engines: Transformers engine actors that receive the weights (empty for vLLM or scripted policies).
        tasks_by_env: Training tasks per environment.
        eval_tasks: Tasks evaluated every `cfg.train.eval_every` policy versions.
        resume: Continue from the latest checkpoint in `out_dir/checkpoints` (if any).
        workdir: The driver's working_dir on a cluster: config paths under it are mapped into this node's copy.
    """

    def __init__(
        self,
        cfg: RunConfig,
        out_dir: str,
        spawners: list[ActorSpawner],
        engines: list[Any],
        tasks_by_env: dict[str, list[TaskRef]],
        eval_tasks: list[TaskRef],
        resume: bool = False,
        workdir: str | None = None,
    ) -> None:
        self.cfg = relocate(cfg, workdir)
        self.out = Path(out_dir)
        self.spawners = spawners
        self.pools: PoolSet | None = None
        self.engines = engines
        self.tasks_by_env = tasks_by_env
        self.eval_tasks = eval_tasks
        self.resume = resume
        self.group_size = cfg.rollout.group_size
        #: Optimizer steps per generation batch: one policy version spans this many (see `RunConfig`).
        self.steps_per_version = cfg.steps_per_version
        self._pushed_version: int | None = None
        self._evaluated: set[int] = set()
        self._step: dict[str, Any] = {}
        self.progress: dict[str, Any] = {"step": 0, "max_steps": None, "phase": "starting"}
        self.resumed: dict[str, Any] | None = None
        self.source = None
        self.metrics: MetricsLog | None = None
        self.rollouts: RolloutLog | None = None
        #: How the consumed training rollouts ended (for the run's exit code and its report).
        self.outcomes = Outcomes()
        self._interrupted = False

    # ------------------------------------------------------------------ set-up

    def _build(self, checkpoint: str | None):
        import torch
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(max(1, int(round(self.cfg.train.learner.num_cpus))))
        # Unscored rollouts are expected (a model that never calls the scoring tool) and counted in the metrics.
        logging.getLogger("trl.trainer.grpo_trainer").addFilter(_NoUnscoredWarning())
        args = learner_grpo_config(self.cfg, str(self.out / "checkpoints"))
        if args.generation_batch_size % self.group_size:
            raise ValueError(
                f"trainer: the generation batch ({args.generation_batch_size}) must be a multiple of "
                f"rollout.group_size ({self.group_size})"
            )
        groups_per_step = args.generation_batch_size // self.group_size
        warn_half_precision(args, bool(self.engines))
        self.warmup_stats: dict[str, Any] | None = None
        saved = read_state(checkpoint)
        # A resumed run continues the whole run's counts (a checkpoint older than them: its own part's only).
        self.outcomes = Outcomes.from_state(saved.get("outcomes"))
        if checkpoint and "outcomes" not in saved:
            logger.warning("%s predates raygrpo's rollout counts: status_counts cover the resumed part", checkpoint)
        reference = self.out / REFERENCE_DIR
        #: Whether GRPO starts from a warmed model saved in OUT/reference (also its KL reference): recorded in the
        #: checkpoint of a resumed run, not read off whatever folder a reused output directory holds.
        self.warmed = self.cfg.train.warmup is not None if checkpoint is None else uses_reference(saved, reference)
        model_path = str(reference) if checkpoint is not None and self.warmed else resolve_model_path(self.cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        if self.cfg.train.warmup is not None and checkpoint is None:
            self.progress["phase"] = "warm-up"
            self.warmup_stats = self._warm_up(model)
            logger.info("warm-up done: %s", self.warmup_stats)
            # TRL builds its KL reference from the files the policy was loaded from: make those the warmed model's,
            # so policy and reference both start from it (and a resumed run finds it again).
            model.save_pretrained(reference)
            self.tokenizer.save_pretrained(reference)
            model = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32)

        schedule = TaskSchedule(self.tasks_by_env, self.cfg.train.mixture, seed=self.cfg.seed)
        workers = self.cfg.workers
        if self._interrupted:  # `interrupt` came first: start no pool that nothing would close
            raise KeyboardInterrupt("interrupted")
        self.pools = PoolSet.from_spawners(self.spawners)
        self.pools.start()
        self.source = RolloutSource(
            Orchestrator(pools=self.pools, max_retries=workers.max_retries),
            schedule,
            self.group_size,
            self.cfg.train.mode,
            self.cfg.train.max_staleness,
            groups_per_step,
            self.cfg.train.weight_sync_every,
            self.cfg.train.dynamic_sampling.budget(groups_per_step),
        )
        if saved:
            self.source.load_state_dict(saved["schedule"])
        self.source.dropped_total = int(saved.get("dropped_groups_total", 0))
        self.source.zero_variance_total = int(saved.get("zero_variance_groups_total", 0))
        self._eval_orchestrator = Orchestrator(pools=self.pools, max_retries=workers.max_retries)
        # TRL's sampler only shapes the batches: one placeholder prompt per group slot (see raygrpo.train.groups).
        dataset = Dataset.from_dict({"prompt": [f"raygrpo group slot {i}" for i in range(groups_per_step)]})
        trainer = RolloutGRPOTrainer(
            model=model,
            peft_config=lora_config(self.cfg.train.peft) if self.cfg.train.peft is not None else None,
            correction=correction_for(self.cfg),
            sampling_logprobs=reports_sampling_logprobs(self.cfg),
            reward_funcs=[env_reward],
            args=args,
            train_dataset=dataset,
            processing_class=self.tokenizer,
            rollout_func=self._rollout_func,
            callbacks=[_StepCallback(self)],
        )
        trainer.checkpoint_state = self._save_state
        self.progress["max_steps"] = args.max_steps
        return trainer

    # ------------------------------------------------------------------ the step

    def _warm_up(self, model: Any) -> dict[str, Any]:
        """The supervised format warm-up, its prompts laid out as the agent loop lays out a rollout's, on the
        learner's GPU where it has one (the model goes back to the CPU for saving and for TRL to place)."""
        import torch

        device = "cuda" if self.cfg.train.learner.num_gpus and torch.cuda.is_available() else "cpu"
        return warm_up_on(device, model, self.tokenizer, self.cfg.train.warmup,
                          system_prompt=self.cfg.rollout.system_prompt,
                          chat_template_kwargs=self.cfg.rollout.chat_template_kwargs)

    def _push_weights(self, trainer, version: int, *, force: bool = False) -> None:
        """Give the engines the learner's weights as `version`: every `weight_sync_every` versions, or now when
        `force`d (an eval must run on the weights it is labelled with)."""
        if self.cfg.policy.kind == "vllm" and not self.cfg.policy.engine_actors:
            if force:
                sync_vllm_weights(trainer)  # TRL syncs the server itself before each generation batch
            return
        if not self.engines or self._pushed_version == version:
            return
        if not force and self._pushed_version is not None and version % self.cfg.train.weight_sync_every:
            return
        started = time.perf_counter()
        # LoRA changes only the adapted layers: transformers engines that hold the rest get just those.
        adapted_only = (self.cfg.train.peft is not None and self._pushed_version is not None
                        and self.cfg.policy.kind == "transformers")
        versions = push_weights(trainer.accelerator.unwrap_model(trainer.model), self.engines, version,
                                adapted_only=adapted_only)
        self._step["weight_push_s"] = self._step.get("weight_push_s", 0.0) + time.perf_counter() - started
        self._pushed_version = version
        logger.info("engines now at policy version %s", versions)

    def _save_state(self, folder: Path, step: int) -> None:
        """raygrpo's state at optimizer `step`, written into the checkpoint `folder` TRL has just saved."""
        source = self.source
        write_state(folder, step=step, policy_version=self.version_of(step), schedule=source.state_dict(),
                    dropped_groups_total=source.dropped_total, zero_variance_groups_total=source.zero_variance_total,
                    reference=self.warmed, outcomes=self.outcomes.state_dict())

    def version_of(self, step: int) -> int:
        """The policy version of the weights after `step` optimizer steps: one per generation batch."""
        return step // self.steps_per_version

    def _rollout_func(self, prompts: list, trainer) -> dict[str, list]:
        if len(prompts) % self.group_size:
            raise ValueError(f"TRL passed {len(prompts)} prompts, not a multiple of the group size {self.group_size}")
        step = trainer.state.global_step
        version = self.version_of(step)
        self._push_weights(trainer, version)
        every = self.cfg.train.eval_every
        if every and version % every == 0 and version not in self._evaluated:
            self.run_eval(trainer, version)
        self.progress["phase"] = "waiting for rollouts"
        batch = self.source.next_batch(len(prompts) // self.group_size, version)
        self.progress["phase"] = "training"
        trajs = [t for g in batch.groups for t in g.trajectories]
        for traj in trajs:
            self.outcomes.add(traj)
        starved = starved_step(trajs, self.cfg.fail_fraction)
        if starved is not None:  # e.g. an embedded ORS server died: stop before training on it or checkpointing it
            raise RuntimeError(f"training step {step + 1}: {starved}; stopping the run (no checkpoint is saved for "
                               "this step)")
        if self.rollouts is not None:
            for traj in trajs:
                self.rollouts.write(traj, step=step + 1)
        self._step.update(batch_fields(batch, trajs, version,
                                       dynamic_sampling=self.cfg.train.dynamic_sampling.enabled))
        trainer.policy_version = version  # its samples of this version are fresh (raygrpo.train.logp_mismatch)
        return to_rollout_output(batch.groups, fallback_id=int(self.tokenizer.eos_token_id))

    def run_eval(self, trainer, version: int) -> dict[str, Any]:
        """Evaluate the eval environments with the weights of `version` (pushed to the engines first)."""
        self._push_weights(trainer, version, force=True)
        self.progress["phase"] = "evaluating"
        start = time.perf_counter()
        result = evaluate(self._eval_orchestrator, self.eval_tasks)
        record = {"step": trainer.state.global_step, "kind": "eval", "policy_version": version,
                  "eval_s": time.perf_counter() - start, **result}
        self._evaluated.add(version)
        if self.metrics is not None:
            self.metrics.write(record)
        self.progress["eval_reward_mean"] = result["eval_reward_mean"]
        logger.info("eval at version %d: reward %s", version, result["eval_reward_mean"])
        return record

    def _step_done(self, state, logs: dict[str, Any]) -> None:
        step = self._step
        self._step = {}
        elapsed = time.perf_counter() - step.pop("started", time.perf_counter())
        record = train_record(step, logs, global_step=state.global_step,
                              policy_version=self.version_of(state.global_step), pushes_weights=bool(self.engines),
                              source=self.source, pools=self.pools,
                              dynamic_sampling=self.cfg.train.dynamic_sampling.enabled, elapsed=elapsed)
        assert self.metrics is not None
        self.metrics.write(record)
        self.progress.update(step=state.global_step, reward_mean=record.get("reward_mean"), phase="training")

    # ------------------------------------------------------------------ run

    def train(self) -> dict[str, Any]:
        """Warm up (fresh runs only), train for `trainer.max_steps`, export the final model; return a summary."""
        self.out.mkdir(parents=True, exist_ok=True)
        checkpoint = find_checkpoint(self.out / "checkpoints", self.resume)
        start = time.perf_counter()
        trainer = self._build(checkpoint)
        # A fresh run starts the files anew; a resumed one drops lines written after its checkpoint.
        keep = checkpoint_step(checkpoint) if checkpoint else -1
        self.metrics = MetricsLog(self.out / "metrics.jsonl", keep_until_step=keep)
        if self.cfg.train.save_rollouts:
            self.rollouts = RolloutLog(self.out / "rollouts.jsonl", keep_until_step=keep)
        try:
            trainer.train(resume_from_checkpoint=checkpoint)
            final_eval = None
            every = self.cfg.train.eval_every
            final_version = self.version_of(trainer.state.global_step)
            if every and final_version not in self._evaluated:
                final_eval = self.run_eval(trainer, final_version)
        finally:
            self.source.close()
            self._eval_orchestrator.cancel()
            dispatch = dispatch_fields(self.source.orchestrator.stats, self.pools)
            pool_snapshot = self.pools.snapshot() if self.pools is not None else {}
            actor_stats = self.pools.close() if self.pools is not None else []
            self.metrics.close()
            if self.rollouts is not None:
                self.rollouts.close()
        self.progress["phase"] = "saving"
        save_model(trainer, self.tokenizer, self.out / "model", self.out / "adapter")
        plot_rewards(self.out / "metrics.jsonl", self.out / "reward_curve.png")
        self.progress["phase"] = "done"
        return {
            "steps": trainer.state.global_step,
            "policy_version": self.version_of(trainer.state.global_step),
            "learner_seconds": time.perf_counter() - start,
            "dropped_groups_total": self.source.dropped_total,
            **zero_variance_total(self.source, dynamic_sampling=self.cfg.train.dynamic_sampling.enabled),
            "task_position": self.source.schedule.position,
            "warmup": self.warmup_stats,
            "resumed": self.resumed,
            "final_eval": final_eval,
            **self.outcomes.fields(),
            "rollouts_retried_total": dispatch["rollouts_retried_total"],
            "attempts_lost_to_actors_total": dispatch["attempts_lost_to_actors_total"],
            "attempts_abandoned_total": dispatch["attempts_abandoned_total"],
            "duplicates_discarded_total": dispatch["duplicates_discarded_total"],
            "pools": pool_snapshot,
            "env_actor_stats": actor_stats,
            "engines": engine_summary(self.cfg.policy, self.engines),
            "model_dir": str(self.out / "model"),
            "adapter_dir": str(self.out / "adapter") if self.cfg.train.peft is not None else None,
            "checkpoint_dir": str(self.out / "checkpoints"),
        }

    def interrupt(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Stop an interrupted run's rollouts and close its env pools (every ORS session and sandbox) while this
        process is alive to do it: the kill that follows runs no actor's `shutdown`. Returns what the summary of the
        interrupted run can say (`env_actor_stats` for its leak count)."""
        self._interrupted = True
        if self.source is not None:
            self.source.close()
            self._eval_orchestrator.cancel()
        stats = self.pools.close(timeout_s) if self.pools is not None else []
        return {"steps": self.progress["step"], **self.outcomes.fields(), "env_actor_stats": stats}


class _NoUnscoredWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "All reward functions returned None" not in str(record.msg)


class _StepCallback(TrainerCallback):
    """Times each step and writes its metrics line when TRL logs it (raygrpo's state is saved with each checkpoint
    by the trainer itself, `Learner._save_state`, before old checkpoints are rotated out)."""

    def __init__(self, learner: Learner) -> None:
        self.learner = learner

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        if state.global_step and optimizer is not None:
            self.learner.resumed = {
                "step": state.global_step,
                "task_position": self.learner.source.schedule.position,
                "optimizer_fingerprint": optimizer_fingerprint(optimizer.state_dict()["state"]),
            }

    def on_step_begin(self, args, state, control, **kwargs):
        self.learner._step = {"started": time.perf_counter()}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.learner._step_done(state, logs)

