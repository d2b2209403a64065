"""The `trainer:` mapping (TRL's `GRPOConfig` options), checked when the config loads.

At load, before Ray starts (exit 2 on a bad one): the fields raygrpo sets itself are refused naming the run-config
field that owns each (a run cannot train with a group size, temperature or vLLM mode that differs from what its
rollouts used), and so are the options TRL never reads in a raygrpo run; every name must be a `GRPOConfig` field
(`raygrpo.config.trl_fields`), every numeric or boolean option must have that type (a numeric string such as YAML
1.1's `1e-3` becomes the number), and the batch options must be positive and fit together. The learner then builds
the real `GRPOConfig` (`raygrpo.train.grpo_args.build_grpo_config`), which checks the values TRL checks.
"""

from __future__ import annotations

import importlib.util
import math
import re
from typing import Any

from raygrpo.config.trl_fields import grpo_config_fields

#: `GRPOConfig` fields raygrpo sets itself, and the run-config field (or option) that owns each.
OWNED_TRAINER_FIELDS: dict[str, str] = {
    "num_generations": "rollout.group_size",
    "num_generations_eval": "rollout.group_size",
    "temperature": "sampling.temperature (TRL rescales logits by it: it must be the sampling temperature)",
    "use_vllm": "policy.kind",
    "vllm_mode": "policy.kind (vLLM runs as a server)",
    "vllm_server_base_url": "policy.url / policy.serve",
    "vllm_server_host": "policy.url / policy.serve",
    "vllm_server_port": "policy.url / policy.serve",
    "output_dir": "the --out option (checkpoints go to OUT/checkpoints)",
    "use_cpu": "train.learner.num_gpus",
    "seed": "seed",
    "logging_steps": "raygrpo (one metrics line per step)",
    "resume_from_checkpoint": "the --resume option",
    "eval_strategy": "train.eval_every",
    "do_eval": "train.eval_every",
    "vllm_importance_sampling_correction": "train.off_policy.mode",
    "vllm_importance_sampling_mode": "train.off_policy.mode",
    "vllm_importance_sampling_clip_min": "train.off_policy.low",
    "vllm_importance_sampling_clip_max": "train.off_policy.high",
    "vllm_importance_sampling_cap": "train.off_policy.high (TRL's deprecated name of vllm_importance_sampling_clip_max)",
    "chat_template_kwargs": "rollout.chat_template_kwargs (raygrpo renders every prompt itself, so TRL's never reach "
                            "the template)",
}

#: `GRPOConfig` options TRL never reads in a raygrpo run, and why. Generation goes through raygrpo's `rollout_func`,
#: which TRL calls instead of generating (grpo_trainer.py: `if self.rollout_func is not None`), so its sampling
#: options are bypassed; and raygrpo always sets `max_steps`, which TRL lets override `num_train_epochs`.
UNREAD_TRAINER_FIELDS: dict[str, str] = {
    **{name: "TRL does not generate in a raygrpo run (raygrpo's rollout_func does), so it never reads it: raygrpo "
             "samples with sampling.* (max_tokens, temperature, top_p, seed)"
       for name in ("top_p", "top_k", "min_p", "repetition_penalty", "generation_kwargs")},
    "num_train_epochs": "raygrpo trains trainer.max_steps optimizer steps (default 20), which TRL lets override "
                        "num_train_epochs; TRL's dataset here is placeholder prompts, so an epoch is no pass over your "
                        "tasks: set trainer.max_steps instead",
    **{name: "TRL does not generate in a raygrpo run (raygrpo's rollout_func does), so it never reads it"
       for name in ("vllm_structured_outputs_regex", "use_transformers_continuous_batching",
                    "transformers_continuous_batching_config", "cache_implementation")},
    "max_tool_calling_iterations": "TRL runs no tool calls in a raygrpo run (raygrpo's agent loop does): set "
                                   "rollout.max_turns",
    "shuffle_dataset": "TRL's dataset here is placeholder prompts, one per group slot; raygrpo's task schedule "
                       "picks each group's task (shuffled by seed, weighted by train.mixture)",
    "save_only_model": "a checkpoint without the optimizer, scheduler and RNG states would make --resume restart "
                       "the optimizer and the learning-rate schedule; raygrpo resumes with the same optimizer state "
                       "(the final model/ folder holds the weights alone)",
    # TRL reads these only in its colocate mode (an engine inside the trainer), which raygrpo never runs.
    **{name: f"applies to TRL's colocate vLLM mode, which raygrpo does not run: set {where}"
       for name, where in (("vllm_gpu_memory_utilization", "policy.vllm.gpu_memory_utilization (engine actors) or "
                                                            "policy.serve.gpu_memory_utilization"),
                           ("vllm_max_model_length", "policy.vllm.max_model_len (engine actors) or "
                                                     "policy.serve.max_model_len"),
                           ("vllm_tensor_parallel_size", "policy.vllm.tensor_parallel_size (engine actors) or "
                                                         "policy.serve.tensor_parallel_size"),
                           ("vllm_enable_sleep_mode", "policy.vllm.enable_sleep_mode (engine actors)"),
                           ("vllm_model_impl", "policy.vllm.model_impl (engine actors) or policy.serve.extra_args"))},
}

#: `GRPOConfig` options TRL reads only when it drives a vLLM server (`policy.kind: vllm` with `url` or `serve`).
SERVER_TRAINER_FIELDS: tuple[str, ...] = ("vllm_group_port", "vllm_server_timeout")

#: Defaults raygrpo gives `GRPOConfig` unless the `trainer:` mapping says otherwise (docs/training.md lists where they
#: differ from TRL's).
TRAINER_DEFAULTS: dict[str, Any] = {
    "report_to": "none",
    "save_strategy": "steps",
    "save_steps": 10,
    "max_steps": 20,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "bf16": False,
    "disable_tqdm": True,
    # Dropout makes a fresh group's ratio differ from 1 and clips it spuriously; TRL leaves it on by default.
    "disable_dropout": True,
}

#: The packages each `report_to` integration of transformers needs (its `is_<name>_available` in
#: `transformers.integrations.integration_utils`): any one of a tuple's for tensorboard, every one for the rest.
#: Integrations that need no package of their own (`kubeflow`), and `all` / `none`, are left to transformers.
REPORT_TO_PACKAGES: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
    "clearml": ("clearml",),
    "comet_ml": ("comet_ml",),
    "mlflow": ("mlflow",),
    "dagshub": ("dagshub", "mlflow"),
    "neptune": ("neptune",),
    "codecarbon": ("codecarbon",),
    "flyte": ("flytekit",),
    "dvclive": ("dvclive",),
    "swanlab": ("swanlab",),
    "azure_ml": ("azureml",),
}

#: Batch and step counts that must be whole numbers of at least 1 where they are given.
POSITIVE_TRAINER_FIELDS: tuple[str, ...] = ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                                            "num_iterations", "steps_per_generation", "generation_batch_size")


def check_trainer_mapping(trainer: dict[str, Any]) -> dict[str, Any]:
    """The `trainer:` mapping with numeric strings as numbers; raises `ValueError` naming each field raygrpo owns or
    TRL would not read, each name that is no `GRPOConfig` field, and each value of the wrong type or out of range."""
    lines = [f"trainer.{k} is set by raygrpo from {OWNED_TRAINER_FIELDS[k]}" for k in trainer
             if k in OWNED_TRAINER_FIELDS]
    lines += [f"trainer.{k}: {UNREAD_TRAINER_FIELDS[k]}" for k in trainer if k in UNREAD_TRAINER_FIELDS]
    if lines:
        raise ValueError("; ".join(lines))
    fields = grpo_config_fields() if trainer else None
    if fields is not None:
        unknown = sorted(set(trainer) - set(fields))
        if unknown:
            raise ValueError("; ".join(f"trainer.{k}: not a GRPOConfig field" for k in unknown))
        trainer = {k: _typed(k, v, fields[k]) for k, v in trainer.items()}
    low = [k for k in POSITIVE_TRAINER_FIELDS if trainer.get(k) is not None and not _whole(trainer[k]) >= 1]
    if low:
        raise ValueError("; ".join(f"trainer.{k}: must be a whole number of at least 1, got {trainer[k]!r}"
                                   for k in low))
    if trainer.get("generation_batch_size") is not None and trainer.get("steps_per_generation") is not None:
        raise ValueError("trainer.generation_batch_size and trainer.steps_per_generation both set the generation "
                         "batch (TRL refuses both): give one")
    if trainer.get("max_completion_length") is not None and trainer.get("loss_type") != "dr_grpo":
        raise ValueError("trainer.max_completion_length caps nothing in a raygrpo run (raygrpo generates: cap a "
                         "turn with sampling.max_tokens, a whole rollout with rollout.max_total_tokens); TRL reads it "
                         "only as the constant divisor of trainer.loss_type dr_grpo's loss, and loss_type here is "
                         + (repr(trainer["loss_type"]) if trainer.get("loss_type") else "TRL's default, dapo")
                         + ": leave it out")
    return trainer


def check_save_steps(trainer: dict[str, Any], steps_per_version: int) -> None:
    """Raises `ValueError` when `trainer.save_steps` would put a checkpoint inside a generation batch (which a
    resumed run would generate again, shifting every later policy version label): every `save_steps` optimizer
    steps must end a batch of `steps_per_version`. A fraction of the run is resolved as transformers resolves it
    (`ceil(max_steps * fraction)`, `TrainerState.compute_steps`) and checked the same way."""
    strategy = trainer.get("save_strategy", TRAINER_DEFAULTS["save_strategy"])
    save_steps = trainer.get("save_steps")  # unset: raygrpo's default, rounded up by the learner
    if steps_per_version <= 1 or str(strategy) != "steps" or not isinstance(save_steps, (int, float)) \
            or save_steps <= 0:
        return
    steps, what = save_steps, f"trainer.save_steps ({save_steps})"
    if save_steps < 1:
        max_steps = _setting(trainer, "max_steps")
        steps = math.ceil(max_steps * save_steps)
        what = f"trainer.save_steps ({save_steps} of trainer.max_steps {max_steps}: every {steps} steps)"
    if int(steps) % steps_per_version:
        raise ValueError(f"{what} must be a multiple of the optimizer steps of one generation batch "
                         f"({steps_per_version}): a checkpoint inside a generation batch would make a resumed run "
                         "generate again and shift every later policy version")


def check_precision(trainer: dict[str, Any], learner_gpus: float) -> None:
    """Raises `ValueError` for `trainer.fp16` on a learner without a GPU: accelerate skips fp16 mixed precision on
    a CPU, so the run would train in fp32 while its config says fp16."""
    if trainer.get("fp16") and not learner_gpus:
        raise ValueError("trainer.fp16 needs a GPU learner, but train.learner.num_gpus is 0 (accelerate ignores fp16 "
                         "on a CPU and trains in fp32): set train.learner.num_gpus, or leave trainer.fp16 out")


def check_report_to(trainer: dict[str, Any]) -> None:
    """Raises `ValueError` naming `trainer.report_to` when an integration it names lacks its package here
    (`REPORT_TO_PACKAGES`): transformers would fail only in the learner, after Ray and the engines started."""
    named = trainer.get("report_to")
    names = [named] if isinstance(named, str) else list(named or [])
    missing = []
    for name in names:
        packages = REPORT_TO_PACKAGES.get(str(name))
        if packages is None:
            continue
        found = [p for p in packages if importlib.util.find_spec(p) is not None]
        if not found if name == "tensorboard" else len(found) < len(packages):
            need = " or ".join(packages) if name == "tensorboard" else ", ".join(packages)
            missing.append(f"{name!r} needs {need}")
    if missing:
        raise ValueError(f"trainer.report_to: {'; '.join(missing)}, not installed in this Python "
                         f"environment: install it, or take the integration out of trainer.report_to")


def _typed(name: str, value: Any, annotation: str) -> Any:
    """`value` checked against a `GRPOConfig` field's annotation (GRPOConfig checks no types): numbers for numeric
    fields (a numeric string becomes the number it spells, as YAML 1.1 reads `1e-3` as a string), booleans for
    boolean ones. Fields that also take strings, mappings or anything are left to TRL."""
    words = set(re.findall(r"[A-Za-z_]+", annotation)) - {"None", "Optional", "class", "typing"}
    if value is None or words & {"str", "dict", "list", "Any", "Union"}:
        return value
    if words == {"bool"}:
        if not isinstance(value, bool):
            raise ValueError(f"trainer.{name}: expected true or false, got {value!r}")
        return value
    if not words or not words <= {"int", "float"}:
        return value
    number = _number(value)
    if number is None:
        raise ValueError(f"trainer.{name}: expected a number, got {value!r}")
    if "float" not in words:
        if not float(number).is_integer():
            raise ValueError(f"trainer.{name}: expected a whole number, got {value!r}")
        return int(number)
    return number


def _number(value: Any) -> int | float | None:
    """`value` as a number (numeric strings included), or None; booleans are not numbers here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _whole(value: Any) -> float:
    """A whole number as such, anything else as -inf (so that `>= 1` fails for it)."""
    number = _number(value)
    return float(number) if number is not None and float(number).is_integer() else float("-inf")


def generation_steps(trainer: dict[str, Any]) -> tuple[int, int, int]:
    """`(steps_per_generation, num_iterations, gradient_accumulation_steps)` as `GRPOConfig` will derive them from a
    checked `trainer:` mapping (one process): `steps_per_generation` is given, or `generation_batch_size /
    per_device_train_batch_size`, or `gradient_accumulation_steps`. Raises `ValueError` naming the field when
    `generation_batch_size` is not a whole number of per-device batches (GRPOConfig refuses it too)."""
    accumulation = _setting(trainer, "gradient_accumulation_steps")
    iterations = int(trainer.get("num_iterations") or 1)
    if trainer.get("generation_batch_size") is not None:
        batch = _setting(trainer, "per_device_train_batch_size")
        size = int(trainer["generation_batch_size"])
        if size % batch:
            raise ValueError(f"trainer.generation_batch_size ({size}) must be a multiple of "
                             f"trainer.per_device_train_batch_size ({batch})")
        return size // batch, iterations, accumulation
    return int(trainer.get("steps_per_generation") or accumulation), iterations, accumulation


def generation_batch_size(trainer: dict[str, Any]) -> int:
    """Rollouts of one generation batch, as `GRPOConfig` derives it (one process): `generation_batch_size`, or
    `per_device_train_batch_size * steps_per_generation`."""
    if trainer.get("generation_batch_size") is not None:
        return int(trainer["generation_batch_size"])
    return _setting(trainer, "per_device_train_batch_size") * generation_steps(trainer)[0]


def _setting(trainer: dict[str, Any], name: str) -> int:
    """A checked whole-number `trainer:` setting, at raygrpo's default where unset."""
    value = trainer.get(name)
    return int(TRAINER_DEFAULTS[name] if value is None else value)
