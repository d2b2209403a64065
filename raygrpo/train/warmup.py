"""Supervised "format warm-up": teach a fresh model the tool-call format before GRPO, in place, on the CPU.

A random-init model never emits a `<tool_call>`, so GRPO on it sees no reward and learns nothing. The warm-up
fine-tunes it on conversations from a user function (`examples`) whose tasks are DISJOINT from the training tasks
and that never show a training task's solution: afterwards the model calls tools in the right format but has not
been told how to solve the tasks GRPO is scored on. Each sequence is laid out as the agent loop sees it: prompt ids
from `ChatRenderer.prompt_ids(messages, tools)` (the run's system prompt first, if any), then the completion as an
engine returns it (the tokenised assistant text, then the eos `<|im_end|>`); only completion tokens are in the loss.
"""

from __future__ import annotations

import inspect
import logging
import random
import time
from typing import Any

from raygrpo.agent.chat import ChatRenderer
from raygrpo.config.train import WarmupConfig
from raygrpo.core.imports import load_function

logger = logging.getLogger(__name__)


def _check_example(i: int, ex: Any) -> None:
    where = f"warmup.examples: example {i}"
    if not isinstance(ex, dict):
        raise ValueError(f"{where} is a {type(ex).__name__}, expected a dict with messages, tools, completion")
    missing = [k for k in ("messages", "tools", "completion") if k not in ex]
    if missing:
        raise ValueError(f"{where} has no {', '.join(missing)}")
    msgs = ex["messages"]
    if not isinstance(msgs, list) or not msgs or any(not isinstance(m, dict) or m.get("role") == "assistant"
                                                     for m in msgs):
        raise ValueError(f"{where}: messages must be a non-empty list of chat messages without the assistant turn")
    if not isinstance(ex["tools"], list) or not isinstance(ex["completion"], str) or not ex["completion"]:
        raise ValueError(f"{where}: tools must be a list and completion a non-empty string")


def examples_function(cfg: WarmupConfig) -> Any:
    """The function `train.warmup.examples` names.

    Raises:
        ResolveError: It does not load or is not callable (the message starts with `train.warmup.examples`).
    """
    return load_function(cfg.examples, "train.warmup.examples")


def load_examples(cfg: WarmupConfig) -> list[dict[str, Any]]:
    """Call the configured `examples` function and check what it returns; errors name `warmup.examples`."""
    examples = examples_function(cfg)(n=cfg.num_examples, seed=cfg.seed)
    if not isinstance(examples, list) or not examples:
        raise ValueError(f"warmup.examples: {cfg.examples!r} is not a function returning a non-empty list")
    for i, ex in enumerate(examples):
        _check_example(i, ex)
    return examples


def encode_example(renderer: Any, ex: dict[str, Any], system_prompt: str | None = None) -> tuple[list[int], list[int]]:
    """`(prompt_ids, completion_ids)` of one example, as the agent loop would produce and the engine would sample."""
    messages = list(ex["messages"])
    if system_prompt and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    prompt = renderer.prompt_ids(messages, ex["tools"])
    completion = renderer.encode(ex["completion"]) + [renderer.eos_token_id]
    return prompt, completion


def run_warmup(model: Any, tokenizer: Any, cfg: WarmupConfig, *, system_prompt: str | None = None,
               chat_template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fine-tune `model` in place on the warm-up conversations; returns `{steps, examples, final_loss, seconds}`.

    Plain torch loop on the model's current device: AdamW, right-padded batches, cross-entropy on the completion
    tokens only (the prompt and the padding are masked). The model is left in the mode (train/eval) it came in.

    Args:
        model: A `transformers` causal LM; its weights change.
        tokenizer: Its tokenizer (with the chat template the agent loop renders with).
        cfg: The warm-up settings.
        system_prompt: The run's `rollout.system_prompt`, put first in every prompt as the agent loop does.
        chat_template_kwargs: The run's `rollout.chat_template_kwargs`, given to the template as the agent loop
            gives them (a warm-up on prompts rendered otherwise would teach a layout the rollouts never show).
    """
    import torch

    started = time.perf_counter()
    renderer = ChatRenderer(tokenizer, chat_template_kwargs)
    encoded = [encode_example(renderer, ex, system_prompt) for ex in load_examples(cfg)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else renderer.eos_token_id
    device = next(model.parameters()).device
    rng = random.Random(cfg.seed)
    order: list[int] = []

    # Logits only from the first completion position on: the LM head over the long shared prompt is wasted work.
    keep_kw = "logits_to_keep" in inspect.signature(model.forward).parameters

    def next_batch() -> tuple[Any, Any, Any, int]:
        rows = []
        for _ in range(cfg.batch_size):
            if not order:
                order.extend(rng.sample(range(len(encoded)), len(encoded)))
            rows.append(encoded[order.pop()])
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (p, c) in enumerate(rows):
            n = len(p) + len(c)
            ids[r, :n] = torch.tensor(p + c)
            labels[r, len(p) : n] = torch.tensor(c)
            mask[r, :n] = 1
        start = min(len(p) for p, _ in rows) - 1  # the first position that predicts a completion token
        return ids.to(device), labels.to(device), mask.to(device), start

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    ramp = max(1, cfg.steps // 10)

    def lr_factor(step: int) -> float:  # linear ramp over the first 10% of the steps, then linear decay to 10%
        return (step + 1) / ramp if step < ramp else 1.0 - 0.9 * (step - ramp) / max(1, cfg.steps - ramp)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    was_training = model.training
    model.train()
    logger.info("warm-up: %d examples, %d steps of %d, lr %g", len(encoded), cfg.steps, cfg.batch_size,
                cfg.learning_rate)
    running = loss_value = float("nan")
    try:
        for step in range(cfg.steps):
            ids, labels, mask, start = next_batch()
            keep = ids.shape[1] - start
            logits = model(input_ids=ids, attention_mask=mask, **({"logits_to_keep": keep} if keep_kw else {})).logits
            logits = logits[:, -keep:-1].float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels[:, start + 1 :].reshape(-1), ignore_index=-100
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            loss_value = float(loss.detach())
            running = loss_value if step == 0 else 0.9 * running + 0.1 * loss_value
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                logger.info("warm-up step %d/%d: loss %.4f (running %.4f), %.1f s", step + 1, cfg.steps,
                            loss_value, running, time.perf_counter() - started)
    finally:
        model.train(was_training)
        optimizer.zero_grad(set_to_none=True)
    return {"steps": cfg.steps, "examples": len(encoded), "final_loss": loss_value, "running_loss": running,
            "seconds": time.perf_counter() - started}


def warm_up_on(device: str, model: Any, tokenizer: Any, cfg: WarmupConfig, *, system_prompt: str | None = None,
               chat_template_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """`run_warmup` with the model on `device` (the learner's GPU where it has one: the warm-up is most of a short
    run's compute), moved back to the CPU afterwards for saving and for TRL to place; the stats say `device`."""
    model.to(device)
    try:
        stats = run_warmup(model, tokenizer, cfg, system_prompt=system_prompt,
                           chat_template_kwargs=chat_template_kwargs)
    finally:
        model.to("cpu")
    return {**stats, "device": device}
