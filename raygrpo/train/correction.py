"""Which correction of stale groups a run's learner applies, resolved from its config (no torch, no TRL).

See `raygrpo.train.trainer` for what each mode does to a generation batch and `raygrpo.train.off_policy` for the
importance weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raygrpo.config import RunConfig


@dataclass(frozen=True)
class Correction:
    """How a run corrects for stale groups (resolved from `train.off_policy` and `train.behaviour_ratio`).

    Args:
        mode: `"none"`, `"behaviour"`, `"tis"` or `"mis"` (see the module docstring).
        low: Lower bound of the importance weight (`tis`, `mis`).
        high: Upper bound of the importance weight (`tis`, `mis`).
        proximal_decay: The proximal policy (`tis`, `mis`) as a moving average of the learner's weights with this
            decay (`raygrpo.train.proximal`); 0: the learner's weights at the start of the batch.
    """

    mode: Literal["none", "behaviour", "tis", "mis"] = "none"
    low: float = 0.0
    high: float = 2.0
    proximal_decay: float = 0.0


def reports_sampling_logprobs(cfg: RunConfig) -> bool:
    """Whether the run's policy reports the real log-probs it sampled with: its engine actors do, and so does a vLLM
    server; a scripted policy reports 0.0 for every token (its turns are certain)."""
    return cfg.policy.engine_actors or cfg.policy.kind == "vllm"


def correction_for(cfg: RunConfig) -> Correction:
    """The run's `Correction`: the mode `RunConfig.correction_mode` resolves (`tis` by default in async mode on
    engine actors and with a vLLM server, `behaviour` for engine actors otherwise; the figures behind that default are
    in docs/training.md), with `train.off_policy`'s bounds. Engine actors' `tis`/`mis` get `proximal_decay` (the
    proximal policy as a moving average of the learner's weights); a vLLM server's TRL computes its own proximal
    log-probs, so 0 there."""
    mode = cfg.correction_mode
    if mode in ("tis", "mis"):
        off_policy = cfg.train.off_policy
        return Correction(mode, *off_policy.bounds(mode), off_policy.decay() if cfg.policy.engine_actors else 0.0)
    return Correction(mode)
