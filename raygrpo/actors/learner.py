"""The learner as a Ray actor: a thin shell around `raygrpo.train.learner.Learner`.

It is a threaded actor (two threads): `train()` runs for the whole training, while `progress()` answers the driver's
progress polls. It reserves the GPU the config asks for (`train.learner.num_gpus`), so on a cluster Ray places it on
a GPU node; the env pool actors it drives can be anywhere.
"""

from __future__ import annotations

from typing import Any


class LearnerActor:
    """Hosts one `Learner` (same arguments)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from raygrpo.train.learner import Learner

        self.learner = Learner(*args, **kwargs)

    def train(self) -> dict[str, Any]:
        return self.learner.train()

    def progress(self) -> dict[str, Any]:
        return dict(self.learner.progress)


def start_learner(num_cpus: float, num_gpus: int, env_vars: dict[str, str] | None = None, **kwargs: Any):
    """Create the learner actor (it loads nothing until `train()` is called) and return its handle."""
    import ray

    runtime_env = {"env_vars": {"TRL_EXPERIMENTAL_SILENCE": "1", **(env_vars or {})}}
    return (
        ray.remote(LearnerActor)
        .options(name=None, num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=2, runtime_env=runtime_env)
        .remote(**kwargs)
    )
