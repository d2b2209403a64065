"""Weight sync from the learner to the engine actors (transformers or vLLM), through Ray's object store.

The learner's full `state_dict` (moved to the CPU, so a GPU learner can feed CPU engines and the tensors pickle
without CUDA), by Hugging Face parameter name, is put in the object store once and goes to every engine with the
policy version it stands for; each engine loads it in place between generation batches (the vLLM engine once its
requests in flight have finished) and reports that version on every turn it generates afterwards. The reference is
also left in the run's `WeightStore`, where a restarted engine finds it. With an external vLLM server
(`policy.url`, `policy.serve`), TRL syncs the server itself. A LoRA learner (`train.peft`) sends its weights with the
adapters merged in; to transformers engines, after a first whole push, only the adapted layers' (the rest never
changes), which the store keeps over the whole one (`raygrpo.train.lora`).
"""

from __future__ import annotations

from typing import Any

from raygrpo.train.lora import merged_state_dict


def push_weights(model: Any, engines: list[Any], version: int, timeout_s: float = 300.0,
                 adapted_only: bool = False) -> list[int]:
    """Send `model`'s weights to every engine actor as `version` (a LoRA model's merged, `raygrpo.train.lora`;
    `adapted_only`: just its adapted layers', to engines that hold the rest already); returns the versions the
    engines report."""
    import ray

    if not engines:
        return []
    from raygrpo.actors.weight_store import find_store

    state = ray.put(merged_state_dict(model, adapted_only))  # one copy in the object store for all engines
    store = find_store()
    if store is not None:
        ray.get(store.put.remote([state], version, partial=adapted_only), timeout=timeout_s)
    return ray.get([e.set_weights.remote(state, version, partial=adapted_only) for e in engines], timeout=timeout_s)


def engine_summary(policy: Any, engines: list[Any], timeout_s: float = 60.0) -> dict[str, Any]:
    """Which engines generated the run's turns (the policy kind: `"vllm"` and `"transformers"` run engine actors),
    with each engine actor's counters (None for one that does not answer)."""
    import ray

    stats: list[Any] = []
    for engine in engines:
        try:
            stats.append(ray.get(engine.stats.remote(), timeout=timeout_s))
        except Exception:  # noqa: BLE001 - a lost engine does not fail the summary
            stats.append(None)
    return {"kind": policy.kind, "count": len(engines), "stats": stats}
