"""GRPO groups: assembling the G trajectories of one task, their staleness, and the batch TRL's `rollout_func` returns.

A group is complete when all G of its rollouts have a final trajectory (the orchestrator yields exactly one per
rollout, scored or not), and only complete groups are trained on. Groups map to TRL's prompts by position: TRL
passes `rollout_func` its batch's prompts already repeated G times (`[p0]*G + [p1]*G + ...`) and computes the
advantage over each run of G consecutive entries, so the k-th returned group fills entries `k*G .. k*G+G-1`. The
prompts TRL passes are placeholders (raygrpo's `TaskSchedule` picks the tasks); every entry carries the real
templated prompt of its trajectory as `prompt_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raygrpo.core.types import Trajectory


@dataclass
class Group:
    """The G trajectories of one task, in sample order once complete."""

    group_id: str
    size: int
    trajectories: list[Trajectory] = field(default_factory=list)
    dispatched_version: int = 0

    @property
    def complete(self) -> bool:
        return len(self.trajectories) >= self.size

    @property
    def env(self) -> str:
        return self.trajectories[0].task.env if self.trajectories else ""

    def min_version(self) -> int | None:
        """The lowest policy version over all turns of all trajectories (None if no turn was generated)."""
        versions = [v for v in map(self.version_of, self.trajectories) if v is not None]
        return min(versions) if versions else None

    def version_of(self, traj: Trajectory) -> int | None:
        """The lowest policy version over the turns of one of the group's trajectories (None if it has none). Turns of
        policies whose versions are unknown (`UNVERSIONED`) count as the learner's version at dispatch."""
        versions = [v if v >= 0 else self.dispatched_version for v in traj.policy_versions]
        return min(versions) if versions else None

    def staleness(self, current_version: int) -> int:
        """Current policy version minus the oldest version that generated any turn of the group (0 if none)."""
        oldest = self.min_version()
        return 0 if oldest is None else max(0, current_version - oldest)

    def rewards(self) -> list[float | None]:
        return [t.reward for t in self.trajectories]

    @property
    def zero_variance(self) -> bool:
        """Whether its scored rewards are all equal (unscored members aside; none or one scored counts too): every
        advantage is then 0 and the group teaches GRPO nothing (what dynamic sampling drops)."""
        return len({t.reward for t in self.trajectories if t.reward is not None}) <= 1


class GroupAssembler:
    """Collects trajectories by `group_id` and hands out each group once all G have arrived."""

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self._open: dict[str, Group] = {}
        self._dispatched: dict[str, int] = {}

    def dispatched(self, group_id: str, version: int) -> None:
        """Record the learner's policy version when the group was dispatched."""
        self._dispatched[group_id] = version

    def add(self, traj: Trajectory) -> Group | None:
        if traj.group_id not in self._open:
            version = self._dispatched.pop(traj.group_id, 0)
            self._open[traj.group_id] = Group(traj.group_id, self.group_size, dispatched_version=version)
        group = self._open[traj.group_id]
        group.trajectories.append(traj)
        if not group.complete:
            return None
        del self._open[traj.group_id]
        group.trajectories.sort(key=lambda t: t.sample)
        return group

    @property
    def incomplete(self) -> int:
        return len(self._open)


def to_rollout_output(groups: list[Group], fallback_id: int) -> dict[str, list[Any]]:
    """The dict `rollout_func` returns for TRL: one entry per trajectory, groups in order.

    Keys: `prompt_ids`, `completion_ids`, `logprobs`, `env_mask` (TRL's tool mask: 1 = model token), and extra
    fields TRL forwards to the reward functions: `env_reward` (None = unscored), `status`, `env`, `policy_version`
    (lowest over the trajectory's turns, unversioned turns counting as the group's dispatch version, as for its
    staleness; None without turns). A rollout that failed before generating anything still needs tokens: it
    gets its group's prompt and a single masked `fallback_id` (usually the eos), so it trains nothing and, being
    unscored, gets advantage 0.
    """
    out: dict[str, list[Any]] = {
        k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward", "status", "env",
                        "policy_version")
    }
    for group in groups:
        group_prompt = next((t.prompt_ids for t in group.trajectories if t.prompt_ids), [fallback_id])
        for traj in group.trajectories:
            if traj.completion_ids:
                completion, logprobs, mask = traj.completion_ids, traj.logprobs, traj.env_mask
            else:
                completion, logprobs, mask = [fallback_id], [0.0], [0]
            out["prompt_ids"].append(list(traj.prompt_ids or group_prompt))
            out["completion_ids"].append(list(completion))
            out["logprobs"].append(list(logprobs))
            out["env_mask"].append(list(mask))
            out["env_reward"].append(traj.reward)
            out["status"].append(traj.status.value)
            out["env"].append(traj.task.env)
            out["policy_version"].append(group.version_of(traj))
    return out
