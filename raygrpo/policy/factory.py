"""Building the run's policy client from its `PolicyConfig`, inside each env pool actor, on its event loop (so
loop-bound clients such as httpx's are created where they are used); and finding a scripted policy's function."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from raygrpo.config.policy import PolicyConfig
from raygrpo.core.errors import ResolveError
from raygrpo.core.imports import load_function
from raygrpo.policy.acting import ActingPolicy, acting_policy
from raygrpo.policy.base import PolicyClient
from raygrpo.policy.engine_client import EngineClient
from raygrpo.policy.scripted import ScriptedPolicy
from raygrpo.policy.vllm_client import VLLMClient

logger = logging.getLogger(__name__)


def script_function(cfg: PolicyConfig) -> Callable[..., Any]:
    """The function `policy.script` names.

    Raises:
        ResolveError: It does not load or is not callable (the message starts with `policy.script`).
    """
    if not cfg.script:
        raise ResolveError("policy.script: required when policy.kind is 'scripted'")
    return load_function(cfg.script, "policy.script")


def build_policy_client(
    cfg: PolicyConfig,
    tokenizer: Any,
    engines: list | None = None,
    worker_index: int = 0,
    model_name: str | None = None,
) -> PolicyClient | ActingPolicy:
    """The `PolicyClient` a worker generates with, or the `ActingPolicy` of `kind: oracle | noop`.

    Args:
        cfg: The run's policy settings.
        tokenizer: The run's tokenizer (the scripted policy encodes its text with it); None for acting policies.
        engines: Engine actor handles (required where `cfg.engine_actors`; see `raygrpo.actors.policy_engine`).
        worker_index: Index of the calling worker; workers are spread round-robin over the engines.
        model_name: The model name sent to vLLM when `cfg.served_model_name` is not set (the run's `model`).
    """
    if cfg.acts:
        return acting_policy(cfg.kind)
    if cfg.kind == "scripted":
        return ScriptedPolicy(tokenizer, script_function(cfg))
    if cfg.engine_actors:
        if not engines:
            raise ValueError(f"policy.kind {cfg.kind!r} needs engine actors: start them first")
        return EngineClient(engines[worker_index % len(engines)], timeout_s=cfg.request_timeout_s)
    if cfg.kind == "vllm":
        if not cfg.url:
            raise ValueError("policy.url is required when policy.kind is 'vllm'")
        name = cfg.served_model_name or model_name or getattr(tokenizer, "name_or_path", None)
        if not name:
            raise ValueError("policy.served_model_name is required: the vLLM server needs the model's name")
        return VLLMClient(cfg.url, name, timeout_s=cfg.request_timeout_s)
    raise ValueError(f"unknown policy.kind {cfg.kind!r}")
