"""Off-policy correction of stale groups: decoupled PPO with a bounded, token-level importance weight.

Three policies meet in one generation batch: the behaviour policy mu (the weights that sampled a rollout, up to
`train.max_staleness` versions old; its log-probs come with the rollout), the proximal policy pi_prox (the learner's
weights when the batch is consumed) and pi_theta (the weights being optimised). Decoupled PPO clips
`pi_theta / pi_prox`, so each update is bounded from where the learner is however stale the group, and weights each
token's loss by `w = pi_prox / mu`, the importance weight that makes the stale sample count as one of pi_prox.

`w` is bounded so that one token the behaviour policy found unlikely cannot dominate a step:

- `tis` (truncated importance sampling): `clamp(w, low, high)`.
- `mis` (masked importance sampling, IcePop): `w` inside `[low, high]`, 0 outside (the token trains nothing).

The weight is constant (no gradient flows through it) and non-negative, so it multiplies the advantage: the batch's
advantages become per token, `A * w`, which TRL's loss takes as it is (`min(r * A w, clip(r) * A w) = w min(r A,
clip(r) A)` for `w >= 0`). Padding and tool-result tokens are left out of the figures (they are out of the loss).

Figures per generation batch, over its model tokens (None when it has none):

- `is_weight/mean`, `is_weight/max`: of `w` before the bound (how far the data is from the learner).
- `is_weight/truncated_frac`: the share of tokens whose `w` the `tis` bound changed.
- `is_weight/masked_frac`: the share of tokens `mis` gave weight 0.
"""

from __future__ import annotations

from typing import Literal

import torch

#: The metrics.jsonl fields, in the order they are written.
FIELDS: tuple[str, ...] = ("is_weight/mean", "is_weight/max", "is_weight/truncated_frac", "is_weight/masked_frac")


def importance_weights(
    proximal_logps: torch.Tensor,
    behaviour_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: Literal["tis", "mis"],
    low: float,
    high: float,
) -> tuple[torch.Tensor, dict[str, float | None]]:
    """The bounded per-token weights `w = pi_prox / mu` of a batch, and their figures.

    Args:
        proximal_logps: (B, T) the learner's log-probs of the completion tokens at the start of the batch.
        behaviour_logps: (B, T) the log-probs the engine sampled them with; NaN (a token the engine could not score)
            gets weight 1.
        mask: (B, T) 1 on the tokens the loss trains (model tokens of completions), 0 elsewhere.
        mode: `"tis"` (truncate to `[low, high]`) or `"mis"` (0 outside `[low, high]`).
        low: Lower bound.
        high: Upper bound.

    Returns:
        The (B, T) weights (1 outside `mask`) in `proximal_logps`' dtype, and the figures named in `FIELDS`.
    """
    if mode not in ("tis", "mis"):
        raise ValueError(f"unknown off-policy mode {mode!r}: expected 'tis' or 'mis'")
    log_ratio = torch.nan_to_num(proximal_logps.double() - behaviour_logps.double(), nan=0.0)
    raw = torch.exp(log_ratio.clamp(max=50.0))
    outside = (raw < low) | (raw > high)
    bounded = raw.clamp(min=low, max=high) if mode == "tis" else raw.masked_fill(outside, 0.0)
    keep = mask.bool()
    weights = torch.where(keep, bounded, torch.ones_like(bounded)).to(proximal_logps.dtype)
    if not keep.any():
        return weights, dict.fromkeys(FIELDS)
    share = outside[keep].double().mean().item()
    figures = {
        "is_weight/mean": raw[keep].mean().item(),
        "is_weight/max": raw[keep].max().item(),
        "is_weight/truncated_frac": share if mode == "tis" else 0.0,
        "is_weight/masked_frac": share if mode == "mis" else 0.0,
    }
    return weights, figures


def weighted_advantages(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per-token advantages `A * w`: (B,) or (B, T) advantages times (B, T) weights."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    return advantages * weights.to(advantages.dtype)
