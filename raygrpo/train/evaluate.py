"""Evaluation during training: every task of the eval environments once, with the weights of the moment."""

from __future__ import annotations

from typing import Any

from raygrpo.driver.attempts import make_groups
from raygrpo.driver.orchestrator import Orchestrator
from raygrpo.train.metrics import mean_interval, per_env_stats, reward_stats
from raygrpo.core.types import UNVERSIONED, TaskRef


def evaluate(orchestrator: Orchestrator, tasks: list[TaskRef]) -> dict[str, Any]:
    """Run each task once (a group of 1) and return its figures.

    - `eval_reward_mean` (and its 95% interval `eval_reward_ci95`): over every rollout the model caused (its status
      is the model's doing: ok, no answer, truncated), unscored ones counting 0: with `rollout.unanswered_reward:
      null`, a model that stops answering must not score higher than one that answers wrong. Rollouts an
      environment or the infrastructure failed are left out.
    - `eval_scored_reward_mean`: over the scored rollouts only; `eval_scored_fraction`: their share of all.
    - `eval_rollouts`, per-environment figures under `eval_envs`, and `eval_generated_by`: the policy versions the
      engines reported for the eval's turns (empty for policies without versions).

    Uses its own orchestrator so it can run while an async producer keeps the training rollouts going.
    """
    trajectories = list(orchestrator.run(make_groups(tasks, 1)))
    stats = reward_stats(trajectories)
    caused = [t.reward if t.reward is not None else 0.0 for t in trajectories if t.status.is_models_doing]
    return {
        "eval_reward_mean": sum(caused) / len(caused) if caused else None,
        "eval_reward_ci95": mean_interval(caused),
        "eval_scored_reward_mean": stats["reward_mean"],
        "eval_scored_fraction": stats["scored_fraction"],
        "eval_rollouts": stats["rollouts"],
        "eval_envs": per_env_stats(trajectories),
        "eval_generated_by": sorted({v for t in trajectories for v in t.policy_versions if v != UNVERSIONED}),
    }
