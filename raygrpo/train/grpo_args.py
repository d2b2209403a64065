"""TRL's `GRPOConfig` from the run config's `trainer:` mapping, validated by `GRPOConfig` itself.

Every TRL option keeps its name, default and documentation; the fields raygrpo sets from the rest of the run config,
and those TRL never reads in a raygrpo run, are refused by name when the config loads, with the names and types of the
rest (`raygrpo.config.trainer`).
"""

from __future__ import annotations

from typing import Any

from raygrpo.config.trainer import TRAINER_DEFAULTS, check_trainer_mapping


def build_grpo_config(trainer: dict[str, Any], **owned: Any):
    """Validate the `trainer:` mapping with TRL's own `GRPOConfig`, adding raygrpo's defaults and owned fields.

    The names, types and batch sizes were checked when the config loaded (`raygrpo.config.trainer`); they are checked
    again here against the imported class (a mapping built in code skips the load). Raises `ValueError` naming
    `trainer.<field>` for an unknown field or a bad type, or quoting what `GRPOConfig` rejects.
    """
    from trl import GRPOConfig

    kwargs = {**TRAINER_DEFAULTS, **check_trainer_mapping(trainer), **owned}
    try:
        return GRPOConfig(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"trainer: GRPOConfig rejected the settings: {exc}") from exc


def trl_importance_sampling(correction: Any) -> dict[str, Any]:
    """`GRPOConfig`'s `vllm_importance_sampling_*` arguments for a run whose vLLM server TRL drives (`policy.url`),
    from its `raygrpo.train.correction.Correction`: token level with both bounds (`tis`: `token_truncate`, `mis`:
    `token_mask`), or off (`none`). TRL's own default, a sequence-level mask with no lower bound, lets one product of
    many per-token ratios mask or shrink a whole agentic rollout."""
    if correction.mode not in ("tis", "mis"):
        return {"vllm_importance_sampling_correction": False}
    return {
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": "token_truncate" if correction.mode == "tis" else "token_mask",
        "vllm_importance_sampling_clip_min": correction.low,
        "vllm_importance_sampling_clip_max": correction.high,
    }


#: `GRPOConfig.delta` for the `behaviour` correction where `trainer.delta` is unset: PPO's clip bounds a
#: positive-advantage token's ratio against the sampling policy at 1 + epsilon, but a negative-advantage token's term
#: grows with its ratio, which reached 3 at 1-2 versions of lag and ~380 for single tokens in benchmarks/staleness.py.
#: TRL's two-sided clip (the INTELLECT-2 report's delta, as dual-clip PPO's c) caps that term at 4x the advantage.
#: The same holds for `tis`/`mis` with a lagging proximal policy (`train.off_policy.proximal_decay`), whose ratio is
#: not 1 at a batch's first step either.
BEHAVIOUR_DELTA = 4.0

#: The loss types whose clipped surrogate reads `delta` (grpo_trainer.py `_compute_loss`).
_DELTA_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def learner_grpo_config(cfg: Any, output_dir: str):
    """The `GRPOConfig` of a run's learner: the `trainer:` mapping plus what raygrpo owns (group size, temperature,
    seed, vLLM server mode and its importance weight, checkpoints only between generation batches) and, for the
    `behaviour` correction and a lagging proximal policy, `delta` (`BEHAVIOUR_DELTA`) unless `trainer.delta` is set
    (`null` turns it off). Raises
    `ValueError` where TRL's generation batches would not span whole optimizer steps as raygrpo counts them
    (`RunConfig.steps_per_version`), or the off-policy correction does not fit the loss."""
    from raygrpo.policy.vllm_serve import trl_server_kwargs
    from raygrpo.train.correction import correction_for

    correction = correction_for(cfg)
    owned: dict[str, Any] = {
        "output_dir": output_dir,
        "num_generations": cfg.rollout.group_size,
        "temperature": cfg.sampling.temperature or 1.0,
        "use_cpu": cfg.train.learner.num_gpus == 0,
        "seed": cfg.seed,
        "logging_steps": 1,
    }
    if "save_steps" not in cfg.trainer:
        # Checkpoints only between generation batches (see RunConfig): raygrpo's default, rounded up to one.
        spv = cfg.steps_per_version
        owned["save_steps"] = -(-TRAINER_DEFAULTS["save_steps"] // spv) * spv
    if cfg.policy.kind == "vllm" and not cfg.policy.engine_actors:
        # TRL's server mode: it pushes the weights to the server before each rollout_func call, and applies the
        # importance weight of train.off_policy itself (token level, both bounds).
        server = trl_server_kwargs(cfg.policy.url)
        owned.update({k: v for k, v in server.items() if k not in cfg.trainer})  # group port, timeout
        owned.update(trl_importance_sampling(correction))
    else:
        owned["use_vllm"] = False
    args = build_grpo_config(cfg.trainer, **owned)
    lagging = correction.mode == "behaviour" or correction.proximal_decay > 0
    if lagging and "delta" not in cfg.trainer and args.loss_type in _DELTA_LOSSES:
        args.delta = BEHAVIOUR_DELTA
    per_generation = args.steps_per_generation * args.num_iterations
    if per_generation % args.gradient_accumulation_steps or \
            per_generation // args.gradient_accumulation_steps != cfg.steps_per_version:
        raise ValueError(
            f"trainer: TRL generates every {args.steps_per_generation} x {args.num_iterations} micro-batches over "
            f"{args.gradient_accumulation_steps} accumulation steps, which raygrpo cannot count as "
            f"{cfg.steps_per_version} optimizer steps per policy version: set steps_per_generation or "
            "generation_batch_size so that a generation batch spans whole optimizer steps"
        )
    if correction.mode in ("tis", "mis") and args.loss_type == "vespo":
        raise ValueError(f"train.off_policy.mode {correction.mode!r} weights the advantages, which "
                         "trainer.loss_type 'vespo' does not take linearly: set train.off_policy.mode to none")
    return args
