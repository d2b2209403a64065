"""Format warm-up of a model for the sums example, saved as a model folder (for `raygrpo rollout`).

`raygrpo train` runs the same warm-up itself (`train.warmup` in train.yaml); this script runs only the warm-up, so
that rollouts can show what the warmed-up base model does before any GRPO:

    python examples/smol_sums/save_warmed_model.py --out runs/smol-warm            # ~2-4 min on 2 CPU cores
    raygrpo rollout examples/smol_sums/rollout.yaml --set model=runs/smol-warm --set policy.kind=transformers
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from raygrpo.config.train import WarmupConfig
    from raygrpo.policy.tiny import resolve_model_path
    from raygrpo.train.warmup import run_warmup

    path = resolve_model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    cfg = WarmupConfig(examples=str(Path(__file__).with_name("warmup.py")) + ":format_examples", steps=args.steps,
                       batch_size=args.batch_size, learning_rate=args.lr, num_examples=400, log_every=2)
    stats = run_warmup(model, tok, cfg)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    print(json.dumps({"out": args.out, **stats}))


if __name__ == "__main__":
    main()
