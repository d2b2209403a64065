"""Building the run's policy client from its `PolicyConfig`, and starting/stopping transformers engine actors.

`start_engines` runs on the driver (it starts actors); `build_policy_client` runs inside each env pool actor, on its
event loop, so loop-bound clients (httpx) are created where they are used.
"""

from __future__ import annotations

import logging
from typing import Any

from raygrpo.policy.base import PolicyClient
from raygrpo.policy.config import PolicyConfig

logger = logging.getLogger(__name__)


def build_policy_client(
    cfg: PolicyConfig,
    tokenizer: Any,
    engines: list | None = None,
    worker_index: int = 0,
    base_dir: str | None = None,
    model_name: str | None = None,
) -> PolicyClient:
    """The `PolicyClient` a worker generates with.

    Args:
        cfg: The run's policy settings.
        tokenizer: The run's tokenizer (the scripted policy encodes its text with it).
        engines: Engine actor handles from `start_engines` (required for `kind="transformers"`).
        worker_index: Index of the calling worker; workers are spread round-robin over the engines.
        base_dir: Folder that a relative `cfg.script` file path is resolved from (the config file's folder).
        model_name: The model name sent to vLLM when `cfg.served_model_name` is not set (the run's `model`).
    """
    if cfg.kind == "scripted":
        from raygrpo.imports import load_object
        from raygrpo.policy.scripted import ScriptedPolicy

        if not cfg.script:
            raise ValueError("policy.script is required when policy.kind is 'scripted'")
        script = load_object(cfg.script, base_dir=base_dir)
        if not callable(script):
            raise TypeError(f"policy.script {cfg.script!r} is a {type(script).__name__}, not a function")
        return ScriptedPolicy(tokenizer, script)
    if cfg.kind == "transformers":
        from raygrpo.actors.policy_engine import EngineClient

        if not engines:
            raise ValueError("policy.kind 'transformers' needs engine actors: call start_engines first")
        return EngineClient(engines[worker_index % len(engines)])
    if cfg.kind == "vllm":
        from raygrpo.policy.vllm_client import VLLMClient

        if not cfg.url:
            raise ValueError("policy.url is required when policy.kind is 'vllm'")
        name = cfg.served_model_name or model_name or getattr(tokenizer, "name_or_path", None)
        if not name:
            raise ValueError("policy.served_model_name is required: the vLLM server needs the model's name")
        return VLLMClient(cfg.url, name, timeout_s=cfg.request_timeout_s)
    raise ValueError(f"unknown policy.kind {cfg.kind!r}")


def start_engines(cfg: PolicyConfig, model_path: str, ready_timeout_s: float = 600.0) -> list:
    """Start `cfg.num_engines` transformers engine actors and wait until each has loaded the model.

    Returns an empty list unless `cfg.kind == "transformers"`.

    Args:
        cfg: The run's policy settings.
        model_path: Model directory (already resolved, e.g. by `resolve_model_path`) or `"tiny"`.
        ready_timeout_s: How long to wait for the engines to load their model.
    """
    if cfg.kind != "transformers":
        return []
    import ray

    from raygrpo.actors.policy_engine import start_policy_engine

    num_gpus = 1.0 if cfg.device.startswith("cuda") else 0.0
    handles = [
        start_policy_engine(
            model_path,
            num_cpus=cfg.engine_num_cpus,
            num_gpus=num_gpus,
            device=cfg.device,
            max_batch_size=cfg.max_batch_size,
            seed=i,
        )
        for i in range(cfg.num_engines)
    ]
    try:
        ray.get([h.ready.remote() for h in handles], timeout=ready_timeout_s)
    except BaseException:
        stop_engines(handles)
        raise
    logger.info("started %d transformers engine(s) for %s", len(handles), model_path)
    return handles


def stop_engines(handles: list) -> None:
    """Stop engine actors started by `start_engines` (best effort; safe on dead actors)."""
    if not handles:
        return
    import ray

    for handle in handles:
        try:
            ray.kill(handle, no_restart=True)
        except Exception as exc:  # noqa: BLE001 - already dead is fine
            logger.debug("stopping engine %s: %s", handle, exc)
