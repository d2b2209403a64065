"""The transformers engine as a Ray actor, and starting and stopping a run's engines (transformers or vLLM).

`PolicyEngineActor` is a thin async actor around `TransformersEngine`: its methods share the actor's event loop, so
concurrent `generate` calls from many env pool actors are batched together by the engine. Env pool actors reach it
through `raygrpo.policy.engine_client.EngineClient`.
"""

from __future__ import annotations

import logging
from typing import Any

import ray

from raygrpo.actors.engine_actor import EngineActor
from raygrpo.actors.weight_store import drop_store, ensure_store, latest_weights, store_name
from raygrpo.config.policy import PolicyConfig
from raygrpo.core.environ import PROCESS_ENV
from raygrpo.policy.transformers_engine import TransformersEngine

logger = logging.getLogger(__name__)


class PolicyEngineActor(EngineActor):
    """Serves a `TransformersEngine` from a Ray actor (create it with `start_policy_engine(...)`).

    A restarted actor comes back with the latest pushed weights (from the run's `WeightStore`).

    Args:
        model_path: Model directory or `"tiny"`.
        weight_store: Name of the run's `WeightStore` actor (None: start from `model_path`'s weights only).
        **engine_kwargs: `TransformersEngine`'s keyword arguments (`device`, `max_batch_size`, `batch_wait_s`, `seed`,
            `dtype`, `num_threads`).
    """

    def __init__(self, model_path: str, weight_store: str | None = None, **engine_kwargs: Any):
        self.engine = TransformersEngine(model_path, initial_weights=latest_weights(weight_store), **engine_kwargs)

    async def logprobs_of(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
        return await self.engine.logprobs_of(prompt_ids, completion_ids, temperature)


#: How often Ray restarts an engine actor that dies, and how often it re-sends a call that the death interrupted (or
#: that arrived while the actor restarted) to the restarted actor. Past either, the call fails with `PolicyError` and
#: the orchestrator retries the rollout.
ENGINE_MAX_RESTARTS = 4
ENGINE_MAX_TASK_RETRIES = 3


def start_policy_engine(
    model_path: str,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    name: str | None = None,
    resources: dict[str, float] | None = None,
    engine: str = "transformers",
    weight_store: str | None = None,
    **engine_kwargs: Any,
):
    """Create an engine actor and return its handle; it loads the model in the background (await `ready`).

    Args:
        model_path: Model directory or `"tiny"` (resolved on the actor's node); for vLLM a resolved directory.
        num_cpus: CPUs reserved for the actor; also its torch thread count (rounded, at least 1) unless
            `num_threads` is given.
        num_gpus: GPUs reserved for the actor (pass `device="cuda"` with it for transformers).
        name: Optional actor name.
        resources: Custom resources the actor asks for.
        engine: `"transformers"` (`PolicyEngineActor`) or `"vllm"` (`raygrpo.actors.vllm_engine.VLLMEngineActor`).
        weight_store: Name of the run's `WeightStore`, where a restarted actor finds the latest weights.
        **engine_kwargs: The engine's keyword arguments (`TransformersEngine`'s or `VLLMEngine`'s).
    """
    engine_kwargs.setdefault("num_threads", max(1, int(round(num_cpus))))
    options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_concurrency": 1000,
                               "resources": resources or None, "max_restarts": ENGINE_MAX_RESTARTS,
                               "max_task_retries": ENGINE_MAX_TASK_RETRIES}
    if name is not None:
        options["name"] = name
    if engine == "vllm":
        from raygrpo.actors.vllm_engine import VLLMEngineActor

        cls: type = VLLMEngineActor
        options["runtime_env"] = {"env_vars": {**PROCESS_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}}
    elif engine == "transformers":
        cls = PolicyEngineActor
    else:
        raise ValueError(f"unknown engine {engine!r}: 'transformers' or 'vllm'")
    return ray.remote(cls).options(**options).remote(model_path, weight_store, **engine_kwargs)


def engine_seed(run_seed: int, index: int) -> int:
    """The sampling seed of engine `index` of a run seeded `run_seed`: distinct per engine, and a run with another
    seed samples other rollouts."""
    return run_seed * 1_000 + index


def start_engines(cfg: PolicyConfig, model_path: str, ready_timeout_s: float = 600.0, seed: int = 0) -> list:
    """Start `cfg.num_engines` engine actors (transformers, or vLLM's) and wait until each has loaded the model.

    Returns an empty list unless the policy generates with engine actors (`cfg.engine_actors`). The engines share
    the run's `WeightStore`, created here.

    Args:
        cfg: The run's policy settings.
        model_path: Model directory (already resolved, e.g. by `resolve_model_path`) or `"tiny"`.
        ready_timeout_s: How long to wait for the engines to load their model.
        seed: The run's seed (each engine's sampling seed is `engine_seed(seed, index)`).
    """
    if not cfg.engine_actors:
        return []
    num_gpus = 1.0 if cfg.device.startswith("cuda") else 0.0
    ray.get(ensure_store().reset.remote(), timeout=60)  # a new run starts from the model's own weights
    if cfg.kind == "vllm":
        from raygrpo.policy.tiny import resolve_model_path

        model_path = resolve_model_path(model_path)  # vLLM reads a folder; "tiny" is built once, here
        kind_kwargs: dict[str, Any] = {"engine": "vllm", "max_num_seqs": cfg.max_batch_size,
                                       "engine_kwargs": dict(cfg.vllm)}
    else:
        kind_kwargs = {"device": cfg.device, "max_batch_size": cfg.max_batch_size}
    handles = [
        start_policy_engine(
            model_path,
            num_cpus=cfg.engine_num_cpus,
            num_gpus=num_gpus,
            resources=cfg.engine_resources,
            weight_store=store_name(),
            seed=engine_seed(seed, i),
            **kind_kwargs,
        )
        for i in range(cfg.num_engines)
    ]
    try:
        ray.get([h.ready.remote() for h in handles], timeout=ready_timeout_s)
    except BaseException:
        stop_engines(handles)
        raise
    logger.info("started %d %s engine(s) for %s", len(handles), "vLLM" if cfg.kind == "vllm" else "transformers",
                model_path)
    for ip in ray.get([h.node_ip.remote() for h in handles], timeout=60):
        logger.info("placed engine on %s", ip)
    return handles


def stop_engines(handles: list) -> None:
    """Stop engine actors started by `start_engines` (best effort; safe on dead actors)."""
    if not handles:
        return
    for handle in handles:
        try:
            ray.kill(handle, no_restart=True)
        except Exception as exc:  # noqa: BLE001 - already dead is fine
            logger.debug("stopping engine %s: %s", handle, exc)
    drop_store()
