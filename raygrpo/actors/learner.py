"""The learner as a Ray actor: a thin shell around a learner object (raygrpo's is `raygrpo.train.learner.Learner`).

It is a threaded actor (two threads): `train()` runs for the whole training, while `progress()` answers the driver's
progress polls. It reserves the GPU the config asks for (`train.learner.num_gpus`), so on a cluster Ray places it on
a GPU node; the env pool actors it drives can be anywhere. The driver names the learner class by import path
(`"raygrpo.train.learner:Learner"`), so this shell knows nothing of training and the driver does not import it.
"""

from __future__ import annotations

from typing import Any, Protocol

import ray

from raygrpo.core.environ import PROCESS_ENV, apply_process_env, log_env
from raygrpo.core.imports import load_object


class Trainable(Protocol):
    """What the learner actor hosts: `train()` for the whole run, and a `progress` mapping it keeps current."""

    progress: dict[str, Any]

    def train(self) -> dict[str, Any]: ...


class LearnerActor:
    """Hosts one learner, built in the actor's process as `cls(*args, **kwargs)`.

    Args:
        learner: Import path of the learner class, `"pkg.module:Class"` (a `Trainable`).
        *args, **kwargs: Its constructor's arguments.
    """

    def __init__(self, learner: str, *args: Any, **kwargs: Any) -> None:
        apply_process_env()  # the log level of the driver's `-v`, among others
        cls = load_object(learner)
        self.learner: Trainable = cls(*args, **kwargs)

    def train(self) -> dict[str, Any]:
        return self.learner.train()

    def interrupt(self, timeout_s: float) -> dict[str, Any]:
        """Close what an interrupted `train()` holds before the actor is killed (see `Learner.interrupt`); {} for a
        learner without it."""
        interrupt = getattr(self.learner, "interrupt", None)
        return interrupt(timeout_s) if interrupt is not None else {}

    def progress(self) -> dict[str, Any]:
        return dict(self.learner.progress)

    def node_ip(self) -> str:
        """The address of the node the learner runs on (the driver logs where it was placed)."""
        return ray.util.get_node_ip_address()


def start_learner(learner: str, num_cpus: float, num_gpus: int, env_vars: dict[str, str] | None = None,
                  resources: dict[str, float] | None = None, **kwargs: Any):
    """Create the learner actor and return its handle; the learner is built in the actor's constructor (cheap:
    raygrpo's loads nothing until `train()` is called). `resources` are custom resources it asks for (e.g. the
    GPU nodes' `learner_gpu`)."""
    runtime_env = {"env_vars": {**PROCESS_ENV, **log_env(), **(env_vars or {})}}
    return (
        ray.remote(LearnerActor)
        .options(num_cpus=num_cpus, num_gpus=num_gpus, resources=resources or None, max_concurrency=2,
                 runtime_env=runtime_env)
        .remote(learner, **kwargs)
    )
