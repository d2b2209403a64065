"""The proximal policy of decoupled PPO as a moving average of the learner's weights (PPO-EWMA).

Decoupled PPO clips `pi_theta / pi_prox`. Where the proximal policy is the learner at the start of the generation
batch and a batch feeds one optimizer step, `pi_prox` is `pi_theta` itself at that step: the ratio is 1 and the clip
bounds nothing, so consecutive steps can push the same tokens as far as they like. Hilton, Cobbe and Schulman
("Batch size-invariance for policy optimization", 2022), who introduced decoupled PPO, take the proximal policy as an
exponential moving average of the learner's weights instead (PPO-EWMA): it lags the learner by about
`decay / (1 - decay)` optimizer steps, so the clip bounds how far the learner moves from where it was over the last
few, and the importance weight `pi_prox / pi_behaviour` is taken against a policy nearer the stale one that
sampled.

`ProximalWeights` keeps that average of the trainable parameters (a LoRA run's adapter weights only); the trainer
(`raygrpo.train.trainer`) starts it at the first generation batch, advances it after every optimizer step (as the
paper does, so the lag in steps does not change with the number of steps a batch feeds), and swaps it into the
model for the forward pass that computes each batch's proximal log-probs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: The file a checkpoint keeps the average in, beside TRL's.
PROXIMAL_FILE = "raygrpo_proximal.pt"


class ProximalWeights:
    """An exponential moving average of a model's trainable parameters: the proximal policy of PPO-EWMA.

    Args:
        decay: Weight of the average's previous value at each `advance`, in `(0, 1)`; the average lags the learner
            by `decay / (1 - decay)` advances.
    """

    def __init__(self, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.average: dict[str, torch.Tensor] | None = None

    @staticmethod
    def _trainable(model: Any) -> dict[str, torch.nn.Parameter]:
        return {name: p for name, p in model.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def advance(self, model: Any) -> None:
        """Move the average towards the model's current weights by `1 - decay` (the first call starts it there)."""
        params = self._trainable(model)
        if self.average is None:
            self.average = {name: p.detach().clone() for name, p in params.items()}
            return
        if params.keys() != self.average.keys():
            raise RuntimeError("the model's trainable parameters changed since the proximal average was started")
        for name, p in params.items():
            average = self.average[name].to(p.device)  # a loaded average comes on the CPU
            self.average[name] = average.lerp_(p.detach(), 1.0 - self.decay)

    @contextmanager
    def swapped_in(self, model: Any) -> Iterator[None]:
        """The model with the average in place of its trainable weights (no copy: the tensors are exchanged and
        exchanged back on exit, also on an error)."""
        if self.average is None:
            raise RuntimeError("advance() the proximal average before swapping it in")
        params = self._trainable(model)

        def exchange() -> None:
            for name, p in params.items():
                p.data, self.average[name] = self.average[name], p.data

        exchange()
        try:
            yield
        finally:
            exchange()

    def save(self, folder: Path) -> None:
        """Keep the average in a checkpoint `folder` (if the folder exists and the average has started)."""
        if self.average is not None and folder.is_dir():
            torch.save({"decay": self.decay, "average": self.average}, folder / PROXIMAL_FILE)

    def load(self, folder: Path) -> None:
        """Take the average a checkpoint `folder` kept. A checkpoint without one (saved without PPO-EWMA) restarts
        the average at the resumed weights, with a warning."""
        path = folder / PROXIMAL_FILE
        if not path.is_file():
            logger.warning("%s keeps no proximal average (train.off_policy.proximal_decay was not set when it was "
                           "saved); it restarts at the resumed weights", folder)
            self.average = None
            return
        saved = torch.load(path, map_location="cpu")
        if saved["decay"] != self.decay:
            logger.warning("the checkpoint's proximal average was kept with decay %s; continuing it with %s",
                           saved["decay"], self.decay)
        self.average = saved["average"]
