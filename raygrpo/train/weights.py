"""Weight sync from the learner to the transformers engine actors.

The learner's full `state_dict` (moved to the CPU, so a GPU learner can feed CPU engines and the tensors pickle
without CUDA) goes to every engine with the policy version it stands for; each engine swaps it in between generation
batches and reports that version on every turn it generates afterwards. With vLLM, TRL syncs the server itself.
"""

from __future__ import annotations

from typing import Any


def cpu_state_dict(model: Any) -> dict[str, Any]:
    """The model's parameters and buffers, detached and on the CPU."""
    return {k: v.detach().to("cpu") for k, v in model.state_dict().items()}


def push_weights(model: Any, engines: list[Any], version: int, timeout_s: float = 300.0) -> list[int]:
    """Send `model`'s weights to every engine actor as `version`; returns the versions the engines report."""
    import ray

    if not engines:
        return []
    state = ray.put(cpu_state_dict(model))  # one copy in the object store for all engines
    return ray.get([e.set_weights.remote(state, version) for e in engines], timeout=timeout_s)
