"""The learner path in one process, without Ray: for the GPU check and for tests of a real model's training step.

`InProcessRollouts` gives TRL's `GRPOTrainer` (raygrpo's `RolloutGRPOTrainer`) a `rollout_func` that runs the
plain-asyncio agent loop (`raygrpo.agent.rollout.run_rollout`) against in-process environment adapters and an in-process
`TransformersEngine`, on an event loop of its own thread. Before each batch it gives the engine the trainer's
weights (as `raygrpo.train.learner.Learner` does through Ray), picks the batch's tasks with `TaskSchedule`, and returns
the groups laid out by `raygrpo.train.groups.to_rollout_output`: the same rollout records, weight sync and batch
layout as a distributed run, minus the actors.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from raygrpo.agent.chat import ChatRenderer
from raygrpo.config.rollout import RolloutConfig
from raygrpo.envs.base import EnvAdapter
from raygrpo.agent.rollout import run_rollout
from raygrpo.train.groups import Group, to_rollout_output
from raygrpo.train.metrics import reward_stats
from raygrpo.train.schedule import TaskSchedule
from raygrpo.train.lora import merged_state_dict
from raygrpo.core.types import SamplingParams, TaskRef, Trajectory

logger = logging.getLogger(__name__)


class InProcessRollouts:
    """Rollouts for GRPO in the trainer's own process: an engine, environments and the agent loop, no Ray.

    Args:
        engine: A `TransformersEngine` (or any object with its `generate`, `set_weights`, `close` and `tokenizer`);
            `close()` closes it.
        make_adapter: Returns a fresh, unstarted environment adapter for one rollout of a task.
        train_tasks: The tasks GRPO trains on (picked in a seeded order by `TaskSchedule`).
        sampling: Sampling settings of every turn.
        rollout: The agent loop's limits.
        group_size: Rollouts per task (TRL's `num_generations`).
        seed: Seed of the task order.
    """

    def __init__(
        self,
        engine: Any,
        make_adapter: Callable[[TaskRef], EnvAdapter],
        train_tasks: list[TaskRef],
        sampling: SamplingParams,
        rollout: RolloutConfig,
        group_size: int,
        seed: int = 0,
    ) -> None:
        self.engine = engine
        self.make_adapter = make_adapter
        self.sampling = sampling
        self.rollout = rollout
        self.group_size = group_size
        self.renderer = ChatRenderer(engine.tokenizer, rollout.chat_template_kwargs)
        self.schedule = TaskSchedule({t.env: [x for x in train_tasks if x.env == t.env] for t in train_tasks},
                                     None, seed)
        self.version = 0
        self.batches: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raygrpo-inprocess", daemon=True)
        self._thread.start()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _group(self, task: TaskRef, group_id: str) -> Group:
        trajs = await asyncio.gather(*(
            run_rollout(task, self.make_adapter(task), self.engine, self.renderer, self.sampling, self.rollout,
                        sample_key=f"{group_id}/{i}")
            for i in range(self.group_size)
        ))
        for i, traj in enumerate(trajs):
            traj.group_id, traj.sample = group_id, i
        return Group(group_id, self.group_size, list(trajs), dispatched_version=self.version)

    def run_groups(self, tasks: list[TaskRef], prefix: str) -> list[Group]:
        """One complete group per task, all generated concurrently (the engine batches their turns)."""

        async def all_groups() -> list[Group]:
            return list(await asyncio.gather(*(self._group(t, f"{prefix}-{i}") for i, t in enumerate(tasks))))

        return self._run(all_groups())

    def sync_weights(self, model: Any, version: int) -> None:
        """Give the engine `model`'s weights as policy `version` (the learner's weight push, in process)."""
        self._run(self.engine.set_weights(merged_state_dict(model), version))
        self.version = version

    def rollout_func(self, prompts: list, trainer: Any) -> dict[str, list]:
        """TRL's `rollout_func`: `len(prompts) / group_size` groups generated with the trainer's current weights."""
        if len(prompts) % self.group_size:
            raise ValueError(f"TRL passed {len(prompts)} prompts, not a multiple of the group size {self.group_size}")
        version = trainer.state.global_step
        self.sync_weights(trainer.accelerator.unwrap_model(trainer.model), version)
        tasks = [self.schedule.next() for _ in range(len(prompts) // self.group_size)]
        groups = self.run_groups(tasks, f"step{version}")
        trajs = [t for g in groups for t in g.trajectories]
        self.batches.append({"version": version, **reward_stats(trajs), **tool_call_stats(trajs),
                             "completion_tokens": sum(sum(t.env_mask) for t in trajs)})
        return to_rollout_output(groups, fallback_id=int(self.renderer.eos_token_id))

    def evaluate(self, tasks: list[TaskRef]) -> dict[str, Any]:
        """One rollout per task with the engine's current weights: reward mean and its 95% interval, and the fraction
        of rollouts given the full reward of 1.0 (`solved_fraction`: under a dense reward, those exactly right)."""
        saved, self.group_size = self.group_size, 1
        try:
            trajs = [t for g in self.run_groups(tasks, f"eval{self.version}") for t in g.trajectories]
        finally:
            self.group_size = saved
        solved = sum(1 for t in trajs if t.reward == 1.0) / len(trajs) if trajs else None
        return {"policy_version": self.version, **reward_stats(trajs), **tool_call_stats(trajs),
                "solved_fraction": solved}

    def close(self) -> None:
        """Close the engine on this event loop (its batcher runs there), then stop the loop's thread."""

        async def close_engine() -> None:
            self.engine.close()

        if self._loop.is_running():
            self._run(close_engine())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()


def tool_call_stats(trajs: list[Trajectory]) -> dict[str, Any]:
    """The fraction of rollouts whose model made at least one parseable tool call."""
    return {"tool_call_fraction": sum(1 for t in trajs if t.tool_calls) / len(trajs) if trajs else None}

