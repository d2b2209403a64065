"""The vLLM engine as a Ray actor: a thin async shell around `raygrpo.policy.vllm_engine.VLLMEngine`.

Its methods share the actor's event loop, so `generate` calls from every env pool actor reach one vLLM engine and
batch together. It answers the same calls as the transformers engine actor (`raygrpo.actors.policy_engine`), so env
pool actors reach it through the same `EngineClient`, and the learner pushes weights to it the same way. Started by
`raygrpo.actors.policy_engine.start_engines` for `policy.kind: vllm` without `url` or `serve`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from raygrpo.actors.engine_actor import EngineActor
from raygrpo.actors.weight_store import latest_weights


def _exit_for_restart() -> None:
    """End this actor's process after vLLM's engine failed: Ray restarts the actor (`ENGINE_MAX_RESTARTS`) with a
    fresh engine and the latest weights, and the callers' rollouts are retried. A moment's grace lets the callers'
    failures leave the event loop first."""
    time.sleep(0.5)
    logging.getLogger(__name__).error("vLLM's engine failed: exiting the engine actor so that Ray restarts it")
    os._exit(1)


class VLLMEngineActor(EngineActor):
    """Serves a `VLLMEngine` from a Ray actor; a restarted actor comes back with the latest pushed weights.

    Args:
        model_path: Local model directory (resolved on the actor's node).
        weight_store: Name of the run's `WeightStore` actor (None: start from `model_path`'s weights only).
        **engine_kwargs: `VLLMEngine`'s keyword arguments (`max_num_seqs`, `seed`, `engine_kwargs`, `num_threads`).
    """

    def __init__(self, model_path: str, weight_store: str | None = None, **engine_kwargs: Any):
        from raygrpo.policy.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(model_path, initial_weights=latest_weights(weight_store), on_fatal=_exit_for_restart,
                                 **engine_kwargs)
