"""The run's latest pushed weights, kept where a restarted engine actor finds them.

An engine actor that dies is restarted by Ray from its constructor's arguments, i.e. with the weights it was first
built from. So that it comes back with the learner's latest weights (and their version), every push leaves its object
reference in this small named actor, and an engine asks it in its constructor. One store per Ray job, named after
the job: the driver that starts the engines and the learner that pushes to them are one job and find the same store.
"""

from __future__ import annotations

import time
from typing import Any

import ray

#: The store of the current Ray job is named `<prefix><job id>`.
NAME_PREFIX = "raygrpo-weights-"


class WeightStore:
    """Holds the object references of the latest pushed state dict and its policy version: one whole state dict, and
    after it the latest partial one (a LoRA run's adapted weights, `raygrpo.train.lora`) if any."""

    def __init__(self) -> None:
        self._refs: list[Any] = []
        self._version = 0

    def put(self, refs: list[Any], version: int, partial: bool = False) -> None:
        """Keep `refs[0]` (passed inside a list, so that Ray hands over the reference, not the tensors): in place of
        everything kept, or (`partial`) of the partial one kept after the whole one."""
        if version >= self._version:
            self._refs = [*self._refs[:1], *refs] if partial and self._refs else list(refs)
            self._version = int(version)

    def reset(self) -> None:
        """Forget the pushes of an earlier run in this job."""
        self._refs, self._version = [], 0

    def latest(self) -> tuple[list[Any], int]:
        """`(refs, version)` of the latest push (the whole state dict, then the partial one over it), or `([], 0)`
        before the first."""
        return list(self._refs), self._version


def store_name() -> str:
    """This Ray job's store name."""
    return NAME_PREFIX + ray.get_runtime_context().get_job_id()


#: `(name, handle)` of the store this process created: a named actor lives only while its creator's handle does.
_created: tuple[str, Any] | None = None


def ensure_store() -> Any:
    """This job's store, created on first use (a CPU-free actor); this process keeps it alive until `drop_store`."""
    global _created
    name = store_name()
    if _created is None or _created[0] != name:  # one handle per process and job: the store goes with it
        handle = ray.remote(WeightStore).options(name=name, get_if_exists=True, num_cpus=0).remote()
        _created = (name, handle)
    return _created[1]


def find_store() -> Any | None:
    """This job's store if engines were started with one, else None."""
    try:
        return ray.get_actor(store_name())
    except ValueError:
        return None


def drop_store(timeout_s: float = 10.0) -> None:
    """Stop this job's store, if any (the engines are gone)."""
    global _created
    _created = None
    store = find_store()
    if store is None:
        return
    try:
        ray.kill(store)
    except Exception:  # noqa: BLE001 - already gone
        return
    deadline = time.monotonic() + timeout_s
    while find_store() is not None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the name is free: the next run's `ensure_store` must not get the dying actor


def latest_weights(name: str | None, timeout_s: float = 300.0) -> tuple[dict[str, Any], int] | None:
    """`(state_dict, version)` of the latest push recorded in the store `name`; None before the first push, or
    without a store (an engine's `initial_weights`)."""
    if name is None:
        return None
    try:
        store = ray.get_actor(name)
    except ValueError:
        return None
    refs, version = ray.get(store.latest.remote(), timeout=timeout_s)
    if not refs:
        return None
    state: dict[str, Any] = {}
    for part in ray.get(refs, timeout=timeout_s):
        state.update(part)
    return state, version
