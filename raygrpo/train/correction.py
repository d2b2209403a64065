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
    """

    mode: Literal["none", "behaviour", "tis", "mis"] = "none"
    low: float = 0.0
    high: float = 2.0


def reports_sampling_logprobs(cfg: RunConfig) -> bool:
    """Whether the run's policy reports the real log-probs it sampled with: its engine actors do, and so does a vLLM
    server; a scripted policy reports 0.0 for every token (its turns are certain)."""
    return cfg.policy.engine_actors or cfg.policy.kind == "vllm"


def correction_for(cfg: RunConfig) -> Correction:
    """The run's `Correction`: `train.off_policy.mode` where set; unset, `tis` where the policy reports its sampling
    log-probs and they can differ from the learner's (stale data, or vLLM: its kernels are not the learner's);
    otherwise `behaviour` for engine actors unless `train.behaviour_ratio` is false, else `none`."""
    off_policy = cfg.train.off_policy
    mode = off_policy.mode
    if mode is None:
        differ = cfg.train.stale_data or cfg.policy.kind == "vllm"
        mode = "tis" if reports_sampling_logprobs(cfg) and differ else "none"
    if mode in ("tis", "mis"):
        return Correction(mode, *off_policy.bounds(mode))
    if cfg.policy.engine_actors and cfg.train.behaviour_ratio is not False:
        return Correction("behaviour")
    return Correction("none")
