"""Which rollouts of a generation batch stay out of the loss, and taking them out.

TRL gives an unscored rollout (reward None) advantage 0 but keeps its tokens in the loss: in the normaliser (`dapo`,
`bnpo`: a batch with failures takes a smaller step) and, with `beta > 0`, in the KL term (the policy is trained
towards the reference on what an environment failure left). raygrpo takes them out entirely: a rollout that was not
scored is not evidence about the policy. With `trainer.mask_truncated_completions`, rollouts raygrpo marked
`truncated` leave the loss as well, also those whose last token happens to be an end of turn (TRL's own rule looks only
at the last token).

A row leaves the loss through TRL's tool mask (the loss mask is `completion_mask * tool_mask`), which keeps the
row's attention intact; `num_items_in_batch`, TRL's token count for the `dapo` normaliser, is counted again.
"""

from __future__ import annotations

from typing import Any

import torch

from raygrpo.core.types import Status


def rows_out_of_loss(inputs: list[dict[str, Any]], mask_truncated: bool) -> torch.Tensor:
    """(B,) bool: the rows of a batch that must not train: unscored ones (`env_reward` None), and `truncated` ones
    when `mask_truncated`. `inputs` are TRL's per-sample dicts with the `rollout_func`'s extra fields."""
    return torch.tensor([
        x.get("env_reward") is None or (mask_truncated and x.get("status") == Status.TRUNCATED.value) for x in inputs
    ], dtype=torch.bool)


def remove_rows_from_loss(output: dict[str, Any], rows: torch.Tensor) -> int:
    """Zero the loss mask of `rows` in TRL's generation output (in place) and recount `num_items_in_batch`; return
    how many rows were removed."""
    if not rows.any():
        return 0
    completion_mask = output["completion_mask"]
    rows = rows.to(completion_mask.device)
    tool_mask = output.get("tool_mask")
    if tool_mask is None:
        tool_mask = torch.ones_like(completion_mask)
    output["tool_mask"] = tool_mask * (~rows).unsqueeze(1).to(tool_mask.dtype)
    if "num_items_in_batch" in output:
        output["num_items_in_batch"] = (completion_mask * output["tool_mask"]).sum()
    return int(rows.sum())
