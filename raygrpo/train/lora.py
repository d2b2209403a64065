"""LoRA on the learner (`train.peft`): the adapter config TRL gets, the merged weights the engines get, the saved model.

TRL wraps the learner's model in a `PeftModel` from the `LoraConfig` built here and trains only the adapters. Engines
serve plain models, so they get the base weights with each adapter's update merged in (`W + B @ A * alpha / r`,
computed beside the model, which stays unmerged: merging in place and back would drift the base weights by rounding
at every push). Only the adapted layers' weights change during training: after a first whole push, a transformers
engine gets just those (`merged_state_dict(..., adapted_only=True)`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accelerate.utils import is_peft_model

from raygrpo.config.train import PeftConfig


def lora_config(peft: PeftConfig) -> Any:
    """PEFT's `LoraConfig` for a causal LM from raygrpo's `train.peft`."""
    from peft import LoraConfig

    return LoraConfig(r=peft.r, lora_alpha=peft.lora_alpha, lora_dropout=peft.dropout,
                      target_modules=peft.target_modules, task_type="CAUSAL_LM")


def _adapted_layers(base: Any) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}


def merged_state_dict(model: Any, adapted_only: bool = False) -> dict[str, Any]:
    """The state dict of `model` as a plain model of its base class would have it (Hugging Face names), on the CPU;
    for a `PeftModel`, every adapted layer's weight with its active adapters' update merged in. `adapted_only`: just
    those layers' weights (what training changes)."""
    import torch

    if not is_peft_model(model):
        return {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    base = model.get_base_model()
    layers = _adapted_layers(base)
    state: dict[str, Any] = {}
    with torch.no_grad():
        if not adapted_only:
            for name, tensor in base.state_dict().items():
                if ".lora_" in name:
                    continue
                state[name.replace(".base_layer.", ".")] = tensor.detach().to("cpu")
        for name, layer in layers.items():
            weight = layer.get_base_layer().weight
            if layer.merged:
                merged = weight  # merged in place already (PEFT's own merge): the weight is the merged one
            else:
                merged = weight.clone()
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A:
                        merged += layer.get_delta_weight(adapter).to(merged.dtype)
            state[f"{name}.weight"] = merged.detach().to("cpu")
    return state


def save_model(trainer: Any, tokenizer: Any, model_dir: Path, adapter_dir: Path) -> None:
    """Save the trained model to `model_dir` (merged: it serves like any model) and, for a LoRA run, the adapter
    alone to `adapter_dir`. Call it last: a LoRA model is merged in place (PEFT's `merge_and_unload`)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if not is_peft_model(model):
        trainer.save_model(str(model_dir))
        tokenizer.save_pretrained(str(model_dir))
        return
    model.save_pretrained(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    model.merge_and_unload().save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
