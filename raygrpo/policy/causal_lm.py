"""The model side of `raygrpo.policy.transformers_engine`: a `transformers` causal LM that generates one batch of
prompts at a time (`CausalLMRunner`), with its sampling, log-probabilities and weight updates.

It is not thread-safe and knows nothing of asyncio: the engine calls it from its one worker thread, so that a weight
update never interleaves with a batch. What it computes (sampling per request, log-probabilities under
`logits / temperature`, stopping at eos) is said in the engine's module docstring.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from raygrpo.core.types import Turn
from raygrpo.policy.base import SamplingParams
from raygrpo.policy.tiny import resolve_model_path

logger = logging.getLogger("raygrpo.policy.transformers_engine")  # the engine's log lines, as they always were

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16"}


@dataclass
class Prompt:
    """One row of a batch: the prompt's token ids and how to sample its turn."""

    prompt_ids: list[int]
    sampling: SamplingParams


class CausalLMRunner:
    """A causal LM, its tokenizer and its sampling generator, run on one batch at a time.

    Args:
        model_path: A model directory (saved with `save_pretrained`, tokenizer included) or `"tiny"` for the built-in
            tiny test model.
        device: Torch device (`"cpu"`, `"cuda"`, `"cuda:1"`, ...).
        seed: Seed of the sampling generator shared by requests without their own seed.
        dtype: Model dtype, a key of `DTYPES`.
    """

    def __init__(self, model_path: str, device: str = "cpu", seed: int = 0, dtype: str = "float32") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_path = resolve_model_path(model_path)
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, DTYPES[dtype]))
        self.model.to(self.device).eval()
        stop = set()
        if self.tokenizer.eos_token_id is not None:
            stop.add(int(self.tokenizer.eos_token_id))
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        stop.update([gen_eos] if isinstance(gen_eos, int) else (gen_eos or []))
        if not stop:
            raise ValueError(f"model at {self.model_path} has no eos token: generation could never stop by itself")
        self.stop_token_ids: frozenset[int] = frozenset(stop)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id: int = int(pad if pad is not None else min(stop))
        # transformers 5.24 renamed the forward's `past_key_values` to `cache`; accept either.
        forward_params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in forward_params else "past_key_values"
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in forward_params else {}
        self._generator = torch.Generator(self.device).manual_seed(seed)
        #: Version of the weights it generates with (0 for the weights loaded from `model_path`).
        self.policy_version = 0
        self._stats_lock = threading.Lock()
        self._batch_sizes: Counter[int] = Counter()
        self._tokens_generated = 0
        self._busy_s = 0.0

    def stats(self) -> dict[str, Any]:
        """Counters since start: batches run, histogram of batch sizes, tokens generated, seconds spent generating
        (read from any thread)."""
        with self._stats_lock:
            batches = sum(self._batch_sizes.values())
            return {
                "batches": batches,
                "batch_sizes": dict(sorted(self._batch_sizes.items())),
                "requests": sum(k * v for k, v in self._batch_sizes.items()),
                "tokens_generated": self._tokens_generated,
                "busy_s": self._busy_s,
                "tokens_per_s": self._tokens_generated / self._busy_s if self._busy_s > 0 else 0.0,
            }

    def run_batch(self, batch: list[Prompt], record: bool = True) -> list[Turn]:
        """Generate one turn for each prompt of `batch`, together: one left-padded batch, token by token with a KV
        cache, each row dropped once it finished (`record`: count it in `stats`)."""
        import torch

        start = time.perf_counter()
        version = self.policy_version
        n = len(batch)
        dev = self.device
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for i, request in enumerate(batch):
            ids = request.prompt_ids
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[i, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(dev), attention.to(dev)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)

        temperatures = torch.tensor([max(r.sampling.temperature, 0.0) for r in batch], dtype=torch.float32, device=dev)
        top_ps = torch.tensor([r.sampling.top_p for r in batch], dtype=torch.float32, device=dev)
        generators = [
            torch.Generator(dev).manual_seed(int(r.sampling.seed)) if r.sampling.seed is not None else self._generator
            for r in batch
        ]
        outputs: list[list[int]] = [[] for _ in batch]
        logprobs: list[list[float]] = [[] for _ in batch]
        finish: list[str | None] = [None] * n
        rows = list(range(n))  # batch rows still generating -> request index
        generated = 0

        with torch.inference_mode():
            cache = self._new_cache()
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention,
                position_ids=positions,
                use_cache=True,
                **{self._cache_kw: cache},
                **self._last_logits_only,
            )
            logits = out.logits[:, -1, :].float()
            while True:
                idx = torch.tensor(rows, device=dev)
                tokens, token_logprobs = self._sample(
                    logits, temperatures[idx], top_ps[idx], [generators[i] for i in rows]
                )
                keep: list[int] = []
                for j, (i, token, token_logprob) in enumerate(zip(rows, tokens.tolist(), token_logprobs.tolist())):
                    outputs[i].append(token)
                    logprobs[i].append(token_logprob)
                    generated += 1
                    if token in self.stop_token_ids:
                        finish[i] = "stop"
                    elif len(outputs[i]) >= batch[i].sampling.max_tokens:
                        finish[i] = "length"
                    else:
                        keep.append(j)
                if not keep:
                    break
                if len(keep) < len(rows):
                    keep_t = torch.tensor(keep, device=dev)
                    cache.batch_select_indices(keep_t)
                    attention, positions, tokens = attention[keep_t], positions[keep_t], tokens[keep_t]
                    rows = [rows[j] for j in keep]
                attention = torch.cat([attention, attention.new_ones((len(rows), 1))], dim=1)
                positions = positions[:, -1:] + 1
                out = self.model(
                    input_ids=tokens[:, None],
                    attention_mask=attention,
                    position_ids=positions,
                    use_cache=True,
                    **{self._cache_kw: cache},
                )
                logits = out.logits[:, -1, :].float()

        elapsed = time.perf_counter() - start
        if not record:
            return []
        with self._stats_lock:
            self._batch_sizes[n] += 1
            self._tokens_generated += generated
            self._busy_s += elapsed
        logger.debug("batch of %d: %d tokens in %.3fs", n, generated, elapsed)
        return [Turn(outputs[i], logprobs[i], finish[i] or "length", version) for i in range(n)]

    def _sample(self, logits, temperatures, top_ps, generators):
        """Pick one token per row; return (tokens, their log-probs under the distribution they were drawn from: the
        softmax of logits / temperature, renormalised over the nucleus where `top_p < 1`)."""
        import torch

        greedy = temperatures <= 0
        scale = torch.where(greedy, torch.ones_like(temperatures), temperatures)
        logp = torch.log_softmax(logits / scale[:, None], dim=-1)
        tokens = logp.argmax(dim=-1)
        if not bool(greedy.all()):
            probs = logp.exp()
            if bool((top_ps < 1.0).any()):
                sorted_probs, order = probs.sort(dim=-1, descending=True)
                # Drop a token when the mass strictly before it already reaches top_p (the top token always stays).
                drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_ps[:, None]
                probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(drop, 0.0))
                # The behaviour policy is the renormalised nucleus: report the log-probs it sampled with.
                nucleus = (top_ps < 1.0) & ~greedy
                logp = torch.where(nucleus[:, None], torch.log(probs / probs.sum(dim=-1, keepdim=True)), logp)
            sampled = (~greedy).nonzero().flatten().tolist()
            shared = [row for row in sampled if generators[row] is self._generator]
            if shared:  # one draw for all rows on the engine's generator
                shared_t = torch.tensor(shared, device=logits.device)
                tokens[shared_t] = torch.multinomial(probs[shared_t], 1, generator=self._generator).squeeze(-1)
            for row in sampled:  # rows with their own seed draw from their own generator
                if generators[row] is not self._generator:
                    tokens[row] = torch.multinomial(probs[row], 1, generator=generators[row])[0]
        token_logp = logp.gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, token_logp

    def _new_cache(self):  # noqa: ANN202 - transformers' DynamicCache, imported lazily
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def warmup(self) -> None:
        """One short batch at start-up, so the first real request does not pay for lazy initialisation."""
        # Greedy, so the engine's sampling generator is not advanced.
        self.run_batch([Prompt([self.pad_token_id] * 4, SamplingParams(max_tokens=2, temperature=0.0))], record=False)

    def load_weights(self, state_dict: dict[str, Any], version: int, partial: bool = False) -> None:
        """Load a learner's weights (a full `state_dict`, tensors on any device) and call them `version`. `partial`:
        the state dict holds only some of the model's weights (the others stay), each of which must exist.

        Raises:
            ValueError: The state dict does not match the model (tied weights may be missing).
        """
        import torch

        tensors = {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(v)) for k, v in state_dict.items()}
        missing, unexpected = self.model.load_state_dict(tensors, strict=False)
        # Tied weights (lm_head = embed_tokens) may legitimately be absent from a learner's state dict.
        tied = set(getattr(self.model, "_tied_weights_keys", None) or [])
        missing = [] if partial else [k for k in missing if k not in tied]
        if missing or unexpected:
            raise ValueError(f"state_dict does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.policy_version = version
        logger.info("loaded weights version %d (%d tensors)", version, len(tensors))

    def logprobs_of(self, prompt_ids: list[int], completion_ids: list[int], temperature: float) -> list[float]:
        """Log-probabilities of `completion_ids` after `prompt_ids` under the current weights, one forward pass."""
        import torch

        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if not completion_ids:
            return []
        ids = torch.tensor([prompt_ids + completion_ids], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids).logits[0].float()
        scale = temperature if temperature > 0 else 1.0
        logp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1] / scale, dim=-1)
        target = torch.tensor(completion_ids, dtype=torch.long, device=self.device)
        return logp.gather(-1, target[:, None]).squeeze(-1).tolist()
