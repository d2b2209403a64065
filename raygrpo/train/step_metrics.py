"""What the learner writes about a training step: the figures of the step's batch of groups (`batch_fields`), the
dispatch counters so far (`dispatch_fields`), and the step's `metrics.jsonl` line (`train_record`), which joins them
with what TRL logged.

The learner (`raygrpo.train.learner`) gathers a step's figures while it runs the step and writes the line when TRL
logs it; which fields the line has, under which names and in which order (`docs/outputs.md` describes them), is set
here, apart from the learner's running of the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raygrpo.train.logp_mismatch import FIELDS as LOGP_FIELDS
from raygrpo.train.metrics import per_env_stats, reward_stats, sandbox_stats
from raygrpo.train.off_policy import FIELDS as IS_WEIGHT_FIELDS

if TYPE_CHECKING:
    from raygrpo.core.types import Trajectory
    from raygrpo.driver.orchestrator import DispatchStats
    from raygrpo.driver.pools import PoolSet
    from raygrpo.train.source import Batch, RolloutSource


def batch_fields(batch: Batch, trajs: list[Trajectory], version: int, *, dynamic_sampling: bool) -> dict[str, Any]:
    """The figures of a step's batch: the policy version it was generated for, the wait for it, the groups dropped
    (and all-equal ones, with dynamic sampling on), staleness (mean, max, and groups per staleness:
    `staleness_counts` `{"0": 3, "2": 1}`), rewards, sandbox timings and the same per environment;
    `trajs` are the batch's trajectories."""
    return dict(
        generated_by_version=version,
        wait_s=batch.wait_s,
        dropped_groups=batch.dropped,
        **({"zero_variance_groups": batch.zero_variance, "zero_variance_groups_trained": batch.zero_variance_trained}
           if dynamic_sampling else {}),
        staleness_mean=sum(batch.staleness) / len(batch.staleness) if batch.staleness else 0.0,
        staleness_max=max(batch.staleness, default=0),
        staleness_counts={str(lag): batch.staleness.count(lag) for lag in sorted(set(batch.staleness))},
        groups=len(batch.groups),
        **reward_stats(trajs),
        **sandbox_stats(trajs),
        envs={env: {**s, "groups": sum(1 for g in batch.groups if g.env == env)}
              for env, s in per_env_stats(trajs).items()},
    )


def zero_variance_total(source: RolloutSource, *, dynamic_sampling: bool) -> dict[str, int]:
    """`zero_variance_groups_total` where dynamic sampling is on (nothing otherwise)."""
    if not dynamic_sampling:
        return {}
    return {"zero_variance_groups_total": source.zero_variance_total}


def dispatch_fields(stats: DispatchStats, pools: PoolSet | None) -> dict[str, Any]:
    """Retries, actor losses and pool sizes so far, for the step's metrics line."""
    snapshot = pools.snapshot() if pools is not None else {}
    return {
        "rollouts_retried_total": stats.retried,
        "attempts_lost_to_actors_total": stats.lost_to_actors,
        "attempts_abandoned_total": stats.abandoned,
        "duplicates_discarded_total": stats.duplicates_discarded,
        "attempts_by_status": dict(sorted(stats.by_status.items())),
        "pools": {name: {k: snap[k] for k in ("actors", "starting", "target", "live_envs", "started", "drained",
                                             "lost")} for name, snap in snapshot.items()},
    }


def train_record(step: dict[str, Any], logs: dict[str, Any], *, global_step: int, policy_version: int,
                 pushes_weights: bool, source: RolloutSource, pools: PoolSet | None, dynamic_sampling: bool,
                 elapsed: float) -> dict[str, Any]:
    """The `metrics.jsonl` line of a training step: `step` (the figures the learner gathered: `batch_fields`, the
    weight push), what TRL logged (`logs`), the totals so far and the step's times (`elapsed`: the whole step)."""
    return {
        "step": global_step,
        "kind": "train",
        "policy_version": policy_version,
        "weight_push_s": 0.0 if pushes_weights else None,
        **step,
        "trl_reward": logs.get("reward"),
        "loss": logs.get("loss"),
        "kl": logs.get("kl"),
        "grad_norm": logs.get("grad_norm"),
        "learning_rate": logs.get("learning_rate"),
        # Logged by the trainer on generating steps (None on the others).
        **{name: logs.get(name) for name in (*LOGP_FIELDS, *IS_WEIGHT_FIELDS)},
        # Everything else TRL logged (clip_ratio/*, entropy, frac_reward_zero_std, ...), under TRL's names.
        **{k: v for k, v in logs.items() if k != "reward"},
        "dropped_groups_total": source.dropped_total,
        **zero_variance_total(source, dynamic_sampling=dynamic_sampling),
        **dispatch_fields(source.orchestrator.stats, pools),
        "task_position": source.schedule.position,
        "step_s": elapsed,
        "train_s": max(0.0, elapsed - step.get("wait_s", 0.0)),
    }
