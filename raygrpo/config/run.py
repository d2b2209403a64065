"""The run config: everything one run needs, as one pydantic model (`RunConfig`).

Pure data: validating it checks fields, ranges and combinations, and makes relative paths absolute against the
config file's folder; what those paths name is resolved by the driver before Ray starts (`raygrpo.driver.resolve`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from raygrpo.config.fields import given
from raygrpo.config.policy import PolicyConfig, SamplingConfig
from raygrpo.config.rollout import RolloutConfig
from raygrpo.config.train import OFF_POLICY_BOUNDS, TrainConfig
from raygrpo.config.trainer import (SERVER_TRAINER_FIELDS, TRAINER_DEFAULTS, check_precision, check_report_to,
                                    check_save_steps, check_trainer_mapping, generation_batch_size,
                                    generation_steps)
from raygrpo.specs import EnvSpec, ProviderSpec
from raygrpo.specs.pool import PoolSpec

logger = logging.getLogger(__name__)


def pool_bounds(fixed: int | None, low: int | None, high: int | None, default: int) -> tuple[int, int]:
    """A pool's (min, max) actors: a fixed count, or elastic bounds (min 0; max the larger of min and `default`)."""
    if fixed is not None and low is None and high is None:
        return fixed, fixed
    if low is None and high is None:
        return default, default
    low = 0 if low is None else low
    return low, max(low, default) if high is None else high


class WorkersConfig(BaseModel):
    """The env pool actors and how the orchestrator uses them.

    Args:
        num_env_actors: Env pool actors to start (N); each runs up to `max_concurrent_per_actor` rollouts (K).
        max_concurrent_per_actor: Rollouts, hence live environments, per actor at once.
        actor_num_cpus: CPUs Ray reserves per env pool actor (they mostly wait on I/O, so a fraction is fine).
        max_retries: Retries of one rollout after an infrastructure failure (env or policy error, a lost actor or
            node), then it is kept unscored with its status.
        min_env_actors: Makes the default pool elastic: actors kept even when idle (default 0 once `max_env_actors`
            is set). Not together with `num_env_actors`.
        max_env_actors: Makes the default pool elastic: most actors at once; the orchestrator starts them as
            rollouts queue up (`max_concurrent_per_actor` per actor) and drains idle ones.
        idle_timeout_s: An elastic pool's actor with nothing to run for this long is drained (stops taking work,
            closes its environments, exits), so an autoscaler can release its node.
        actor_start_timeout_s: A pool with no live actor fails the run when its actors have not started within this
            long (an autoscaler that cannot add the node they ask for). Lost actors are replaced meanwhile.
        node_cooldown_s: Seconds new env pool actors keep off the node of an actor that was lost or failed to start
            (while another node can take them): a dying node that Ray still counts alive, or one whose disk or
            sandbox root is unusable, would fail them too. 0 turns it off.
        heartbeat_s: Seconds between the driver's probes of each live env pool actor (one small Ray call each; see
            `raygrpo.driver.pools.reachability`). Must be less than `unreachable_after_s`.
        unreachable_after_s: An env pool actor whose probe has gone unanswered this long (its node cut off, its
            raylet dead, its process stuck) is unreachable: its rollouts in flight run again on other actors at once,
            instead of after Ray declares its node dead (~30 s by default), and it gets no more. If it answers again
            it is retired; results it still delivers count once (the first result of a rollout wins, later ones are
            `duplicates_discarded`). Lower detects sooner; too low retires actors whose loop was only busy.
    """

    model_config = ConfigDict(extra="forbid")

    num_env_actors: int = Field(2, ge=1)
    max_concurrent_per_actor: int = Field(64, ge=1)
    actor_num_cpus: float = Field(0.25, ge=0)
    max_retries: int = Field(2, ge=0)
    min_env_actors: int | None = Field(None, ge=0)
    max_env_actors: int | None = Field(None, ge=1)
    idle_timeout_s: float = Field(60.0, gt=0)
    actor_start_timeout_s: float = Field(600.0, gt=0)
    node_cooldown_s: float = Field(60.0, ge=0)
    heartbeat_s: float = Field(2.0, gt=0)
    unreachable_after_s: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _sizes(self) -> WorkersConfig:
        elastic = self.min_env_actors is not None or self.max_env_actors is not None
        if elastic and "num_env_actors" in self.model_fields_set:
            raise ValueError("set num_env_actors (a fixed pool) or min_env_actors / max_env_actors (an elastic "
                             "one), not both")
        if self.min_env_actors is not None and self.max_env_actors is not None \
                and self.min_env_actors > self.max_env_actors:
            raise ValueError(f"min_env_actors ({self.min_env_actors}) is larger than max_env_actors "
                             f"({self.max_env_actors})")
        if self.heartbeat_s >= self.unreachable_after_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s:g}) must be less than unreachable_after_s "
                             f"({self.unreachable_after_s:g}): an actor is probed every heartbeat_s and called "
                             "unreachable after unreachable_after_s without an answer")
        return self


class RayConfig(BaseModel):
    """Where Ray runs.

    Args:
        address: None joins the cluster named by the `RAY_ADDRESS` environment variable if it is set (a
            `ray job submit` job's entrypoint has it), else starts a local Ray on 127.0.0.1; `"auto"` joins the
            cluster this machine belongs to; any other value is passed to `ray.init(address=...)`. `--address`
            overrides it.
        num_cpus: CPUs a local Ray advertises (None: Ray's default, the machine's cores). A cluster's nodes advertise
            their own: joining one, a value here is reported in the log and not applied.
    """

    model_config = ConfigDict(extra="forbid")

    address: str | None = None
    num_cpus: int | None = Field(None, ge=1)


class RunConfig(BaseModel):
    """Everything one run needs.

    Args:
        envs: Environments by name: ORS environments (`kind: ors`, the default) and Harbor task suites
            (`kind: harbor`). A name appears in every trajectory's task reference.
        providers: The limits of the sandbox providers the Harbor suites name (`envs.<name>.provider`, by default the
            suite's backend: `local`, `docker`, `e2b`, ... or the import path), by provider: `{create_rate_per_s,
            max_live, rate_limit_backoff}` (`raygrpo.specs.provider.ProviderSpec`), enforced cluster-wide by one
            governor per provider. Suites naming one provider share its one entry. A provider without an entry has
            no limits; an entry that no environment (of `envs` or `eval_envs`) names is an error.
        model: Path to a Hugging Face model folder whose tokenizer (and, for the transformers engine, weights) the run
            uses, or `"tiny"` for a tiny random model built locally on first use.
        policy: Which policy writes the assistant turns (default: the transformers engine running `model`).
        sampling: Sampling settings of every generation.
        rollout: Limits of each rollout and the group size.
        workers: Env pool actors and retries.
        ray: Where Ray runs.
        seed: Seed for task order, the engines' own generators and training. Samples repeat from run to run only with
            `sampling.seed` set (each request then has a seed of its own, see `SamplingConfig`); unseeded requests
            share an engine's generator in the order they reach it. What a rerun repeats: docs/configuration.md.
        fail_fraction: A completed run fails (exit code 1) when more than this fraction of its rollouts ended failed
            (an environment or policy failure after retries, or a deadline), or when no rollout was scored and some
            failed. For `raygrpo train` the rollouts are those the learner consumed.
        train: `raygrpo train` settings: sync or async mode, mixture weights, evaluation, the learner, warm-up.
        trainer: Options of TRL's `GRPOConfig` for `raygrpo train` (learning rate, batch size, `max_steps`,
            `beta`, `save_steps`, ...): names, types and batch sizes checked here (`raygrpo.config.trainer`), the
            rest by `GRPOConfig` itself in the learner. The fields raygrpo sets, and those TRL never reads in a
            raygrpo run, are refused by name.
        eval_envs: Environments evaluated every `train.eval_every` policy versions (same schema as `envs`); names
            must differ from those in `envs`. Refused without `train.eval_every` (they would never run).
    """

    model_config = ConfigDict(extra="forbid")

    envs: dict[str, EnvSpec]
    providers: dict[str, ProviderSpec] = Field(default_factory=dict)
    model: str = "tiny"
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    seed: int = 0
    fail_fraction: float = Field(0.25, ge=0, le=1)
    train: TrainConfig = Field(default_factory=TrainConfig)
    trainer: dict[str, Any] = Field(default_factory=dict)
    eval_envs: dict[str, EnvSpec] = Field(default_factory=dict)

    _base_dir: str = PrivateAttr(default_factory=os.getcwd)

    @field_validator("envs")
    @classmethod
    def _at_least_one_env(cls, envs: dict[str, Any]) -> dict[str, Any]:
        if not envs:
            raise ValueError("at least one environment is needed")
        return envs

    @field_validator("providers")
    @classmethod
    def _provider_names(cls, providers: dict[str, ProviderSpec]) -> dict[str, ProviderSpec]:
        blank = [name for name in providers if not name.strip()]
        if blank:
            raise ValueError("a provider needs a name (the key envs.<name>.provider gives, or a backend's name)")
        return providers

    @field_validator("trainer")
    @classmethod
    def _trainer_fields(cls, trainer: dict[str, Any]) -> dict[str, Any]:
        return check_trainer_mapping(trainer)

    @model_validator(mode="after")
    def _train_names(self) -> RunConfig:
        clash = sorted(set(self.envs) & set(self.eval_envs))
        if clash:
            raise ValueError(f"eval_envs: names {clash} are already used in envs; give eval environments own names")
        unknown = sorted(set(self.train.mixture or {}) - set(self.envs))
        if unknown:
            raise ValueError(f"train.mixture: {unknown} are not environments in envs ({sorted(self.envs)})")
        self._check_providers()
        self._check_eval()
        self._check_engine_fields()
        self._check_batches()
        self._check_off_policy()
        check_save_steps(self.trainer, self.steps_per_version)
        check_precision(self.trainer, self.train.learner.num_gpus)
        self._check_peft()
        self._check_idle_timeouts()
        return self

    def _check_providers(self) -> None:
        """Every `providers:` entry is named by a suite, and suites on one provider agree on `max_concurrent_starts`:
        they share an actor's gate of it, where only one bound can hold (the other would be silently ignored)."""
        suites = {f"{section}.{name}": spec for section, specs in (("envs", self.envs), ("eval_envs", self.eval_envs))
                  for name, spec in specs.items()}
        named = {spec.provider_key for spec in suites.values()} - {None}
        unused = sorted(set(self.providers) - named)
        if unused:
            raise ValueError(f"providers: {unused} are named by no environment (theirs: {sorted(named)}); set "
                             "envs.<name>.provider to the entry, or name the entry after the suite's backend")
        first: dict[str, tuple[str, Any]] = {}
        for where, spec in suites.items():
            if "max_concurrent_starts" not in type(spec).model_fields:
                continue
            seen = first.setdefault(spec.provider_key, (where, spec.max_concurrent_starts))
            if seen[1] != spec.max_concurrent_starts:
                raise ValueError(f"{where}.max_concurrent_starts={spec.max_concurrent_starts} differs from "
                                 f"{seen[0]}.max_concurrent_starts={seen[1]}, on the same provider "
                                 f"{spec.provider_key!r}: its suites share one start bound per actor; set the same "
                                 "value on each")

    def _check_eval(self) -> None:
        """`eval_every` and `eval_envs` go together: one without the other evaluates nothing."""
        if self.train.eval_every and not self.eval_envs:
            raise ValueError("train.eval_every is set but eval_envs is empty: nothing to evaluate")
        if not self.eval_envs or self.train.eval_every:
            return
        names = sorted(self.eval_envs)
        if "eval_every" not in self.train.model_fields_set:
            raise ValueError(f"eval_envs {names} would never be evaluated: train.eval_every is unset (0, no "
                             "evaluation); set train.eval_every (e.g. 10: before the first step, every 10 policy "
                             "versions and at the end), or leave eval_envs out")
        logger.warning("train.eval_every is 0: eval_envs %s are served but never evaluated (set eval_envs={} as well "
                       "to leave them out)", names)

    def _check_engine_fields(self) -> None:
        """`train.behaviour_ratio` and `train.weight_sync_every` act on engine actors only: refused elsewhere, either
        value, so that e.g. `behaviour_ratio: false` cannot look like it turned off a vLLM server's correction; TRL's
        `vllm_group_port` and `vllm_server_timeout` act on a vLLM server TRL drives only: refused elsewhere."""
        server = self.policy.kind == "vllm" and not self.policy.engine_actors
        unread = [k for k in SERVER_TRAINER_FIELDS if k in self.trainer]
        if unread and not server:
            raise ValueError("; ".join(
                f"trainer.{k} is read only when TRL drives a vLLM server (policy.kind vllm with policy.url or "
                f"policy.serve); policy.kind {self.policy.kind!r} here"
                + (" runs engine actors, which take the weights through Ray" if self.policy.engine_actors else "")
                + ": leave it out" for k in unread))
        if self.policy.engine_actors:
            return
        if self.train.behaviour_ratio is not None:
            raise ValueError(f"train.behaviour_ratio needs the sampling log-probs of engine actors (transformers, or "
                             f"vLLM's without policy.url/serve); policy.kind {self.policy.kind!r} here reports none ("
                             + ("with a vLLM server TRL applies its own importance-sampling correction, which "
                                "train.off_policy.mode sets; none turns it off" if server else
                                "scripted turns are certain")
                             + "): leave it unset")
        if given(self.train, ["weight_sync_every"]):
            why = "TRL syncs a vLLM server before every generation batch" if server else \
                f"policy.kind {self.policy.kind!r} has no weights to push"
            raise ValueError(f"train.weight_sync_every sets how often the learner pushes its weights to engine actors; "
                             f"{why}: leave it out")

    def check_training(self) -> None:
        """What `raygrpo train` needs beyond a valid config, checked before Ray starts (a rollout run trains nothing,
        so its group size need not fit a training batch): GRPO's group of at least 2 rollouts, a generation batch
        of whole groups, and the packages of the `trainer.report_to` integrations. Raises `ValueError` naming the
        fields (TRL and transformers would refuse them in the learner, after Ray and the engines started)."""
        check_report_to(self.trainer)
        batch, group = generation_batch_size(self.trainer), self.rollout.group_size
        if group < 2:
            raise ValueError(f"rollout.group_size ({group}): GRPO needs at least 2 rollouts per group to compute "
                             "advantages (TRL's num_generations)")
        if batch % group:
            raise ValueError(f"trainer: the generation batch ({batch} rollouts: trainer.generation_batch_size, or "
                             f"per_device_train_batch_size x steps per generation) must be a multiple of "
                             f"rollout.group_size ({group}): a step trains on whole groups")

    def _check_batches(self) -> None:
        """A generation batch spans whole optimizer steps (raygrpo counts one policy version per batch)."""
        generation, iterations, accumulation = generation_steps(self.trainer)
        if (generation * iterations) % accumulation:
            raise ValueError(f"trainer: steps per generation ({generation}, from steps_per_generation or "
                             f"generation_batch_size / per_device_train_batch_size) times trainer.num_iterations must "
                             f"be a multiple of trainer.gradient_accumulation_steps ({accumulation}): raygrpo counts "
                             "one policy version per generation batch, which must span whole optimizer steps")

    def _check_idle_timeouts(self) -> None:
        """An idle timeout drains actors of an elastic pool down to its minimum: refused where a pool is fixed (its
        minimum is its maximum), so it can never apply."""
        workers = self.workers
        specs = {**self.envs, **self.eval_envs}
        for name, spec in specs.items():
            pool = spec.pool
            if pool is not None and pool.idle_timeout_s is not None and not self._elastic(pool):
                where = "envs" if name in self.envs else "eval_envs"
                raise ValueError(f"{where}.{name}.pool.idle_timeout_s drains idle actors of an elastic pool, but this "
                                 f"pool is fixed ({self._pool_size(pool)} actors): set min_actors / max_actors, or "
                                 "leave idle_timeout_s out")
        if not given(workers, ["idle_timeout_s"]):
            return
        shared = any(spec.pool is None for spec in specs.values())
        readers = [spec.pool for spec in specs.values()
                   if spec.pool is not None and spec.pool.idle_timeout_s is None and self._elastic(spec.pool)]
        if not readers and not (shared and self._elastic(None)):
            raise ValueError(f"workers.idle_timeout_s drains idle actors of elastic pools, but every pool here is "
                             f"fixed (workers: {self._pool_size(None)} actors): set workers.min_env_actors / "
                             "max_env_actors (or an environment's pool min_actors / max_actors), or leave "
                             "idle_timeout_s out")

    def _elastic(self, pool: PoolSpec | None) -> bool:
        """Whether a pool (None: the default one, `workers:`) can shrink: its minimum is below its maximum."""
        low, high = self._bounds(pool)
        return low < high

    def _pool_size(self, pool: PoolSpec | None) -> str:
        """A pool's actor count for a message: `2`, or `0-4` for an elastic one."""
        low, high = self._bounds(pool)
        return str(low) if low == high else f"{low}-{high}"

    def _bounds(self, pool: PoolSpec | None) -> tuple[int, int]:
        """A pool's (min, max) actors as the driver will start it (`pool_bounds`)."""
        workers = self.workers
        if pool is None:
            return pool_bounds(None, workers.min_env_actors, workers.max_env_actors, workers.num_env_actors)
        return pool_bounds(pool.num_actors, pool.min_actors, pool.max_actors, workers.num_env_actors)

    def _check_peft(self) -> None:
        peft = self.train.peft
        if peft is None or not peft.dropout:
            return
        if self.trainer.get("disable_dropout", TRAINER_DEFAULTS["disable_dropout"]):
            raise ValueError(f"train.peft.dropout ({peft.dropout}) would be turned off by trainer.disable_dropout "
                             "(raygrpo's default: true); set trainer.disable_dropout: false to keep it")

    def _check_off_policy(self) -> None:
        off_policy = self.train.off_policy
        mode = off_policy.mode
        if mode in ("tis", "mis") and not (self.policy.engine_actors or self.policy.kind == "vllm"):
            raise ValueError(f"train.off_policy.mode {mode!r} weights tokens by the log-probs the policy sampled "
                             f"with; policy.kind {self.policy.kind!r} reports none (scripted turns are certain): set "
                             "it to none or leave it out")
        weightless = [f"train.off_policy.{name}" for name in ("low", "high", "proximal_decay")
                      if getattr(off_policy, name) is not None]
        resolved = self.correction_mode
        if weightless and resolved not in ("tis", "mis"):
            raise ValueError(f"{', '.join(weightless)} set the importance weight of mode tis or mis, but this run "
                             f"corrects with {resolved!r} (mode unset: tis in async mode on engine "
                             "actors and with a vLLM server, else the behaviour ratio): set train.off_policy.mode")
        if resolved in ("tis", "mis"):
            low, high = off_policy.bounds(resolved)
            if low >= high:
                default = dict(zip(("low", "high"), OFF_POLICY_BOUNDS[resolved]))
                unset = [f"{k} defaults to {v:g}" for k, v in default.items() if getattr(off_policy, k) is None]
                raise ValueError(f"train.off_policy.low ({low:g}) must be below train.off_policy.high ({high:g}) for "
                                 f"mode {resolved!r}" + (f" ({', '.join(unset)} there)" if unset else "")
                                 + ": every token's weight would be cut or masked")
        if off_policy.proximal_decay and not self.policy.engine_actors:
            raise ValueError("train.off_policy.proximal_decay sets the proximal policy the learner computes for "
                             "engine actors' rollouts; with a vLLM server (policy.url/serve) TRL computes it from the "
                             "current weights: leave it out")

    @property
    def correction_mode(self) -> str:
        """The correction of stale groups this run's learner applies: `train.off_policy.mode` where it is tis or mis.

        Unset, it is `tis` where the data can be stale and its sampling log-probs are real: async mode on engine
        actors, unless `train.behaviour_ratio` is set (true keeps the PPO ratio against the sampling policy, false
        turns correction off), and always with a vLLM server (TRL weights its samples anyway; raygrpo makes that
        token level with both bounds). Otherwise (sync mode, or `mode: none`) engine actors take PPO's ratio
        against the sampling policy, `behaviour`, unless `train.behaviour_ratio` is false, and the rest `none`.
        See `raygrpo.train.correction` and docs/training.md for the figures behind the default."""
        mode = self.train.off_policy.mode
        engines = self.policy.engine_actors
        if mode in ("tis", "mis"):
            return mode
        if mode is None and (not engines and self.policy.kind == "vllm"
                             or engines and self.train.mode == "async" and self.train.behaviour_ratio is None):
            return "tis"
        return "behaviour" if engines and self.train.behaviour_ratio is not False else "none"

    @property
    def steps_per_version(self) -> int:
        """Optimizer steps between two generation batches (TRL's `steps_per_generation * num_iterations /
        gradient_accumulation_steps`, `steps_per_generation` derived from `generation_batch_size` where that is
        given; 1 by default): one policy version spans this many steps. The learner checks it against the
        arguments TRL built."""
        generation, iterations, accumulation = generation_steps(self.trainer)
        return generation * iterations // accumulation

    @property
    def base_dir(self) -> str:
        """Folder that relative paths in the config are resolved against (the config file's folder)."""
        return self._base_dir
