"""Training settings: raygrpo's own (`train:`) and the checks on the `trainer:` mapping handed to TRL's `GRPOConfig`.

The `trainer:` mapping is validated by `GRPOConfig` itself when the learner builds it
(`raygrpo.train.grpo_args.build_grpo_config`); here, at load, the fields raygrpo sets from the rest of the run config
are refused by name, with the run-config field that owns them: a run cannot silently train with a group size,
temperature or vLLM mode that differs from what its rollouts used.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from raygrpo.core.imports import ImportSpecError, is_file_spec, resolve_file, split_spec
from raygrpo.specs.base import base_dir_of
from raygrpo.specs.moved_fields import refuse_moved_fields

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
}

#: Defaults raygrpo gives `GRPOConfig` unless the `trainer:` mapping says otherwise.
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



class WarmupConfig(BaseModel):
    """Settings of the supervised format warm-up.

    Args:
        examples (`str`):
            The function that makes the warm-up conversations, `"pkg.module:func"` or `"path/to/file.py:func"`
            (relative to the config file's folder). Called as `func(n=num_examples, seed=seed)`, it returns a list of
            `{"messages": [...], "tools": [...], "completion": str}`: `messages` the opening chat messages (no
            assistant turn), `tools` the OpenAI-format tool schemas the environment would list, `completion` the
            assistant's text (tool calls written with `raygrpo.agent.toolcalls.format_tool_call`), without the eos; other
            keys are ignored. Its tasks must be disjoint from the training tasks (`examples/echo/warmup.py`).
        num_examples (`int`, *optional*, defaults to `2000`):
            How many conversations to ask `examples` for.
        steps (`int`, *optional*, defaults to `500`):
            Optimizer steps (batches are drawn by cycling through shuffled epochs of the examples).
        batch_size (`int`, *optional*, defaults to `8`):
            Conversations per optimizer step.
        learning_rate (`float`, *optional*, defaults to `1e-2`):
            Peak AdamW learning rate: linear warm-up over the first 10% of the steps, linear decay to 10% of it.
        weight_decay (`float`, *optional*, defaults to `0.0`):
            AdamW weight decay.
        max_grad_norm (`float`, *optional*, defaults to `1.0`):
            Gradient norm clipping; 0 turns it off.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the examples and of the batch order.
        log_every (`int`, *optional*, defaults to `25`):
            Log the running loss every this many steps.
    """

    model_config = ConfigDict(extra="forbid")

    examples: str
    num_examples: int = Field(2000, ge=1)
    steps: int = Field(500, ge=1)
    batch_size: int = Field(8, ge=1)
    learning_rate: float = Field(1e-2, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, ge=0)
    seed: int = 0
    log_every: int = Field(25, ge=1)

    @field_validator("examples")
    @classmethod
    def _check_spec(cls, value: str, info: ValidationInfo) -> str:
        try:
            target, attr = split_spec(value.strip())
        except ImportSpecError as exc:
            raise ValueError(str(exc)) from None
        return f"{resolve_file(target, base_dir_of(info))}:{attr}" if is_file_spec(target) else value.strip()


#: The bounds of each off-policy mode when `train.off_policy` leaves them out (see `OffPolicyConfig`).
OFF_POLICY_BOUNDS: dict[str, tuple[float, float]] = {"tis": (0.0, 2.0), "mis": (0.5, 2.0)}
#: `train.off_policy.proximal_decay` where it is left out (see `OffPolicyConfig`).
PROXIMAL_DECAY = 0.5


class OffPolicyConfig(BaseModel):
    """How the learner corrects for rollouts generated by older weights than it trains (decoupled PPO).

    PPO's ratio is taken against the learner's own log-probs at the start of the generation batch (the proximal
    policy), so its clipping (`trainer.epsilon`) bounds each update from where the learner is, however stale the
    group; each token's loss is then weighted by `w = pi_proximal / pi_behaviour` (the behaviour policy: the log-probs
    the engine sampled with), bounded so that one very unlikely token cannot dominate a step. Token level throughout.
    See `raygrpo.train.off_policy`.

    Args:
        mode (`str`, *optional*):
            `"none"`: no importance weight (PPO against the proximal policy only, or `train.behaviour_ratio`).
            `"tis"`: truncated importance sampling, `w` clamped to `[low, high]`. `"mis"`: masked importance sampling
            (IcePop), tokens whose `w` falls outside `[low, high]` get weight 0 and the others `w`. Unset: `"tis"`
            in async mode on engine actors (unless `train.behaviour_ratio` is set) and where TRL drives a vLLM
            server (`policy.url`: TRL weights its samples anyway; raygrpo makes it token level with both bounds);
            otherwise `"none"` (engine actors then clip against the sampling policy: `behaviour_ratio`).
            `RunConfig.correction_mode` resolves it. `tis` is async's default because on the echo task at lr 1e-3
            it kept the most of sync's reward per consumed group over six seeds (median 0.95, `behaviour` 0.89, no
            correction 0.54) and collapsed in none (docs/training.md). With a vLLM server TRL applies the weight
            itself (`vllm_importance_sampling_mode` `token_truncate` or `token_mask`, with these bounds). `low`,
            `high` and `proximal_decay` are refused where the run's resolved mode is neither `tis` nor `mis`.
        low (`float`, *optional*):
            Lower bound of `w`; defaults to 0.0 for `tis` (no lower truncation: a token the learner now finds unlikely
            keeps its small weight) and 0.5 for `mis`.
        high (`float`, *optional*):
            Upper bound of `w`; defaults to 2.0 for both (the truncation level of the TIS paper; IcePop masks
            outside [0.5, 2]).
        proximal_decay (`float`, *optional*):
            The proximal policy of `tis`/`mis` as an exponential moving average of the learner's weights (PPO-EWMA,
            `raygrpo.train.proximal`): each optimizer step moves the average towards the learner by
            `1 - proximal_decay`, so it lags by about `proximal_decay / (1 - proximal_decay)` steps and PPO's clip
            (with `trainer.delta` at 4 unless set) bounds how far the learner moves from it even with one optimizer
            step per generation batch. Defaults to 0.5 (one step behind). 0: the learner's weights at the start of
            the batch, where one optimizer step per batch leaves the clip inert (the proximal policy is the one being
            optimised) and `tis` collapsed in 1 of 3 seeds at lr 1e-3 on the echo task in async mode, against none of
            3 with 0.5 (docs/training.md). Costs one copy of the trained weights (the adapters only with `train.peft`) and one
            forward pass per batch. Engine actors only: with a vLLM server TRL computes the proximal log-probs.
    """

    model_config = ConfigDict(extra="forbid")

    mode: Literal["none", "tis", "mis"] | None = None
    low: float | None = Field(None, ge=0)
    high: float | None = Field(None, gt=0)
    proximal_decay: float | None = Field(None, ge=0, lt=1)

    @model_validator(mode="after")
    def _ordered(self) -> OffPolicyConfig:
        if self.mode == "none" and (self.low is not None or self.high is not None):
            raise ValueError("low and high bound the importance weight of mode tis or mis; mode none has none")
        if self.mode == "none" and self.proximal_decay is not None:
            raise ValueError("proximal_decay sets the proximal policy of mode tis or mis; mode none has none")
        if self.low is not None and self.high is not None and self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self

    def bounds(self, mode: str) -> tuple[float, float]:
        """`(low, high)` for `mode` (`tis` or `mis`), the unset ones at their defaults."""
        low, high = OFF_POLICY_BOUNDS[mode]
        return (low if self.low is None else self.low, high if self.high is None else self.high)

    def decay(self) -> float:
        """`proximal_decay`, at its default where unset."""
        return PROXIMAL_DECAY if self.proximal_decay is None else self.proximal_decay


class DynamicSamplingConfig(BaseModel):
    """DAPO's dynamic sampling: groups whose rewards are all equal are replaced before the step.

    A group whose scored rewards are all equal (all solved, all failed; unscored members aside) has advantage 0 for
    every member: it adds nothing to the policy gradient, yet takes a slot of the batch (and, with `beta > 0`, adds
    KL). With this on, such a group is dropped, counted (`zero_variance_groups_total` in `metrics.jsonl`, apart from
    the stale drops of `dropped_groups_total`), and another group of the schedule takes its place, so the step
    trains on a full batch of groups that carry signal. See `raygrpo.train.source`.

    Args:
        enabled (`bool`, *optional*, defaults to `False`):
            Drop and replace all-equal groups. Off: every complete group is trained on (TRL's behaviour).
        max_extra_groups (`int`, *optional*):
            The most groups replaced in one step. Once spent, the step trains on what it has: the all-equal groups
            fill the batch (counted as `zero_variance_groups_trained`, and logged). Unset: as many as a step's groups
            (at most twice a step's rollouts). Sync mode waits for the replacements; async mode dispatches them
            ahead.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    max_extra_groups: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _set_only_when_enabled(self) -> DynamicSamplingConfig:
        if not self.enabled and self.max_extra_groups is not None:
            raise ValueError("max_extra_groups bounds dynamic sampling, which is off: set enabled: true (or leave "
                             "max_extra_groups out)")
        return self

    def budget(self, groups_per_step: int) -> int | None:
        """Replacements per step (None: off)."""
        if not self.enabled:
            return None
        return groups_per_step if self.max_extra_groups is None else self.max_extra_groups


class PeftConfig(BaseModel):
    """LoRA adapters trained instead of the whole model (PEFT's `LoraConfig`, handed to `GRPOTrainer` as
    `peft_config`).

    The learner trains the adapters (their learning rate is `trainer.learning_rate`: LoRA usually wants a higher one
    than full fine-tuning); the engines get the base weights with the adapters merged in. A transformers engine gets
    them whole once, then only the weights of the adapted modules (the rest never changes); a vLLM engine actor gets
    them whole each time. `OUT/model` is the merged model (it serves like any model), `OUT/adapter` the adapter
    alone. See `raygrpo.train.lora`.

    Args:
        r (`int`, *optional*, defaults to `8`):
            The adapters' rank.
        alpha (`float`, *optional*):
            LoRA's scaling numerator (the update is scaled by `alpha / r`); defaults to `2 * r`.
        dropout (`float`, *optional*, defaults to `0.0`):
            Dropout on the adapters' input. Above 0 it needs `trainer.disable_dropout: false` (raygrpo's default
            turns every dropout off, as a fresh group's PPO ratio must start at 1).
        target_modules (`list[str]` or `"all-linear"`, *optional*, defaults to `"all-linear"`):
            The modules adapted: names (or name suffixes) of linear layers, or every linear layer but the output head.
    """

    model_config = ConfigDict(extra="forbid")

    r: int = Field(8, ge=1)
    alpha: float | None = Field(None, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"

    @field_validator("target_modules")
    @classmethod
    def _some_modules(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and not value:
            raise ValueError('name at least one module, or "all-linear"')
        return value

    @property
    def lora_alpha(self) -> float:
        return 2.0 * self.r if self.alpha is None else self.alpha


class LearnerConfig(BaseModel):
    """Where the learner actor runs.

    Args:
        num_gpus: GPUs of the learner actor: 0 trains on the CPU (`use_cpu=True`), 1 on one GPU.
        num_cpus: CPUs Ray reserves for the learner; also its torch thread count (rounded, at least 1).
        resources: Custom resources the learner asks for, e.g. `{learner_gpu: 1}` to place it on the GPU node type
            of `cluster/` (a resource no node offers and no autoscaler can add fails the run at start).
    """

    model_config = ConfigDict(extra="forbid")

    num_gpus: int = Field(0, ge=0, le=1)
    num_cpus: float = Field(1.0, gt=0)
    resources: dict[str, float] = Field(default_factory=dict)


class TrainConfig(BaseModel):
    """How `raygrpo train` feeds TRL's GRPOTrainer.

    Args:
        mode: `"sync"`: each step's rollouts are generated with the weights of that step (on-policy; the learner
            waits for the slowest rollout). `"async"`: rollouts keep streaming while the learner trains; a group
            is consumed if its staleness (current policy version minus the lowest version over all turns of its
            rollouts) is at most `max_staleness`, else it is dropped and counted.
        max_staleness: Async mode: the oldest policy lag a consumed group may have. The producer keeps
            `max_staleness + 1` steps' worth of groups outstanding; groups beyond what may generate now start their
            environments at once and wait for newer weights to generate (see `raygrpo.train.source`).
        weight_sync_every: Push the learner's weights to the transformers engines every this many steps (1 = before
            every generation batch, TRL's cadence). The engines report the version they generate with.
        mixture: Sampling weight of each training environment (by name in `envs`); groups are drawn in these
            proportions. Default: equal weights. Environments listed only in `eval_envs` are not trained on.
        eval_every: Evaluate every this many steps (and before the first step); 0 turns evaluation off. Each task of
            every `eval_envs` environment runs once with the current weights at the run's sampling settings.
        learner: Resources of the learner actor.
        warmup: Optional supervised warm-up run on the learner before GRPO (not on resume): teaches a fresh model
            the tool-call format on tasks disjoint from the training tasks.
        save_rollouts: Write every consumed trajectory (tokens, masks, messages, reward) to `OUT/rollouts.jsonl`.
        behaviour_ratio: Take PPO's ratio against the log-probs the engine sampled with (the behaviour policy)
            instead of what TRL assumes, so TRL's clipping (`trainer.epsilon`) bounds the update a stale group makes
            (async mode, `weight_sync_every > 1`, the later passes of `trainer.num_iterations`); a fresh group's
            ratio stays 1. None (the default) turns it on where the engine reports real sampling log-probs (engine
            actors) and `off_policy` applies no weight: sync mode, or `off_policy.mode: none` (async mode's default
            is `off_policy` `tis`; set this to true to keep the behaviour ratio there). A scripted policy reports
            none (its turns are certain), and with a vLLM server TRL applies its own importance-sampling
            correction: `true` is refused for both. See `raygrpo.train.trainer`.
            Off where `off_policy` applies an importance weight (they are two corrections of the same staleness:
            setting both is refused).
        off_policy: The off-policy correction of stale groups (decoupled PPO with a bounded importance weight).
        dynamic_sampling: Replace groups whose rewards are all equal before the step (DAPO's dynamic sampling).
        peft: Train LoRA adapters instead of the whole model (unset: full fine-tuning).
    """

    model_config = ConfigDict(extra="forbid")

    mode: Literal["sync", "async"] = "sync"
    max_staleness: int = Field(1, ge=0)
    weight_sync_every: int = Field(1, ge=1)
    mixture: dict[str, float] | None = None
    eval_every: int = Field(0, ge=0)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    warmup: WarmupConfig | None = None
    save_rollouts: bool = True
    behaviour_ratio: bool | None = None
    off_policy: OffPolicyConfig = Field(default_factory=OffPolicyConfig)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    peft: PeftConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_fields(cls, data: Any) -> Any:
        return refuse_moved_fields(data, {
            "unanswered_reward": "moved to rollout.unanswered_reward (it applies to `raygrpo rollout` too; default 0.0)",
        })

    @model_validator(mode="after")
    def _staleness_covers_sync_interval(self) -> TrainConfig:
        if self.mode == "async" and self.max_staleness < self.weight_sync_every - 1:
            raise ValueError(
                f"train.max_staleness ({self.max_staleness}) must be at least train.weight_sync_every - 1 "
                f"({self.weight_sync_every - 1}) in async mode: between weight pushes no group could be fresh enough"
            )
        if self.behaviour_ratio and self.off_policy.mode in ("tis", "mis"):
            raise ValueError(f"train.behaviour_ratio and train.off_policy.mode {self.off_policy.mode!r} are two "
                             "corrections of the same staleness: choose one")
        return self

    @field_validator("mixture")
    @classmethod
    def _positive_weights(cls, mixture: dict[str, float] | None) -> dict[str, float] | None:
        if mixture is None:
            return None
        if not mixture:
            raise ValueError("give at least one environment weight, or leave mixture out for equal weights")
        bad = {k: v for k, v in mixture.items() if not v >= 0}
        if bad:
            raise ValueError(f"weights must be >= 0, got {bad}")
        if sum(mixture.values()) <= 0:
            raise ValueError("at least one weight must be > 0")
        return mixture


def generation_steps(trainer: dict[str, Any]) -> tuple[int, int, int]:
    """`(steps_per_generation, num_iterations, gradient_accumulation_steps)` as `GRPOConfig` will derive them from the
    `trainer:` mapping (one process): `steps_per_generation` is given, or `generation_batch_size /
    per_device_train_batch_size`, or `gradient_accumulation_steps`. Raises `ValueError` naming the field when
    `generation_batch_size` is not a whole number of per-device batches (GRPOConfig refuses it too)."""
    accumulation = _int(trainer.get("gradient_accumulation_steps"), 1)
    iterations = _int(trainer.get("num_iterations"), 1)
    if trainer.get("generation_batch_size") is not None:
        batch = _int(trainer.get("per_device_train_batch_size"), TRAINER_DEFAULTS["per_device_train_batch_size"])
        size = _int(trainer.get("generation_batch_size"), batch)
        if size % batch:
            raise ValueError(f"trainer.generation_batch_size ({size}) must be a multiple of "
                             f"trainer.per_device_train_batch_size ({batch})")
        return size // batch, iterations, accumulation
    return _int(trainer.get("steps_per_generation"), accumulation), iterations, accumulation


def _int(value: Any, default: int) -> int:
    """A `trainer:` setting read as an integer (GRPOConfig validates it properly later)."""
    try:
        return default if value is None else max(1, int(float(value)))
    except (TypeError, ValueError):
        return default


def check_trainer_mapping(trainer: dict[str, Any]) -> dict[str, Any]:
    """Refuse the `GRPOConfig` fields raygrpo owns, naming the run-config field that sets each."""
    owned = [k for k in trainer if k in OWNED_TRAINER_FIELDS]
    if owned:
        lines = [f"{k} is set by raygrpo from {OWNED_TRAINER_FIELDS[k]}" for k in owned]
        raise ValueError("; ".join(lines))
    return trainer
