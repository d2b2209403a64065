"""Evaluation during training: every task of the eval environments once, with the weights of the moment."""

from __future__ import annotations

from typing import Any

from raygrpo.driver.orchestrator import Orchestrator, make_groups
from raygrpo.train.metrics import per_env_stats, reward_stats
from raygrpo.core.types import UNVERSIONED, TaskRef


def evaluate(orchestrator: Orchestrator, tasks: list[TaskRef]) -> dict[str, Any]:
    """Run each task once (a group of 1) and return `eval_reward_mean` (and its 95% interval `eval_reward_ci95`), `eval_scored_fraction`, `eval_rollouts`,
    per-environment figures under `eval_envs`, and `eval_generated_by`: the policy versions the engines reported for
    the eval's turns (empty for policies without versions).

    Uses its own orchestrator so it can run while an async producer keeps the training rollouts going.
    """
    trajectories = list(orchestrator.run(make_groups(tasks, 1)))
    stats = reward_stats(trajectories)
    return {
        "eval_reward_mean": stats["reward_mean"],
        "eval_reward_ci95": stats["reward_ci95"],
        "eval_scored_fraction": stats["scored_fraction"],
        "eval_rollouts": stats["rollouts"],
        "eval_envs": per_env_stats(trajectories),
        "eval_generated_by": sorted({v for t in trajectories for v in t.policy_versions if v != UNVERSIONED}),
    }
