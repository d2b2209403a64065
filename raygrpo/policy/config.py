"""User-facing configuration of the policy (who writes the assistant turns) and of sampling."""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from raygrpo.policy.base import SamplingParams
from raygrpo.policy.vllm_serve import VLLMServeConfig


class PolicyConfig(BaseModel):
    """Which policy generates the assistant turns, and how to reach it.

    Args:
        kind: `"scripted"` (a Python function writes each turn: tests, benchmarks, environment debugging),
            `"transformers"` (Ray actors running the model with `transformers`: CPU runs and development) or
            `"vllm"` (an OpenAI-compatible vLLM server, given token ids: production on GPUs).
        script: For `kind="scripted"`: the function that writes a turn, as `"pkg.module:func"` or
            `"path/to/file.py:func"` (relative to the config file's folder). It receives a
            `raygrpo.policy.base.GenerationContext` and returns the assistant's text, or None to stop talking.
        num_engines: For `kind="transformers"`: how many engine actors to start; env pool actors are spread over them.
        engine_num_cpus: For `kind="transformers"`: CPUs reserved per engine actor (also its torch thread count).
        max_batch_size: For `kind="transformers"`: most requests an engine generates together.
        device: For `kind="transformers"`: torch device of the engines (`"cpu"`, `"cuda"`).
        url: For `kind="vllm"`: base URL of a running vLLM server, e.g. `"http://10.0.0.5:8000"`.
        serve: For `kind="vllm"` instead of `url`: raygrpo starts `vllm serve` on a GPU in a Ray actor for the run
            (with the weight-transfer endpoints TRL's server mode needs) and points the env pool actors and the
            learner at it.
        served_model_name: For `kind="vllm"`: the model name the server serves (its `--served-model-name`); defaults
            to the run's `model`.
        request_timeout_s: For `kind="vllm"`: deadline of one generation request.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["scripted", "transformers", "vllm"] = "transformers"
    script: str | None = None
    num_engines: int = Field(1, ge=1)
    engine_num_cpus: float = Field(1.0, gt=0)
    max_batch_size: int = Field(16, ge=1)
    device: str = "cpu"
    url: str | None = None
    serve: VLLMServeConfig | None = None
    served_model_name: str | None = None
    request_timeout_s: float = Field(120.0, gt=0)

    @model_validator(mode="after")
    def _check_kind_fields(self) -> PolicyConfig:
        if self.kind == "scripted" and not self.script:
            raise ValueError(
                "policy.script is required when policy.kind is 'scripted' "
                "(e.g. 'my_pkg.scripts:answer' or 'scripts/answer.py:answer')"
            )
        if self.kind == "vllm" and not (self.url or self.serve):
            raise ValueError(
                "policy.url (a running server, e.g. 'http://127.0.0.1:8000') or policy.serve (raygrpo starts one) "
                "is required when policy.kind is 'vllm'"
            )
        if self.url and self.serve:
            raise ValueError("give policy.url or policy.serve, not both")
        return self


class SamplingConfig(BaseModel):
    """Sampling settings of every generation in a run.

    Args:
        max_tokens: Most tokens the policy may generate in one turn.
        temperature: Sampling temperature; 0 means greedy. GRPO needs diverse samples: keep it near 1.
        top_p: Nucleus sampling mass.
        seed: Optional base seed; None leaves sampling unseeded. It must not be sent as is with every request: the G
            rollouts of a group share their prompt, and one seed would give them one sample (zero advantage). The
            agent loop derives a seed per request with `request_seed(seed, ...)`.
    """

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = None

    def to_params(self) -> SamplingParams:
        """The per-request `SamplingParams` these settings describe."""
        return SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed
        )


def request_seed(base_seed: int | None, *keys: object) -> int | None:
    """A seed for one request, derived from a run's base seed and keys naming the request (task, sample, turn).

    Deterministic across processes (no `hash()` randomisation); None when `base_seed` is None. The result fits
    in 63 bits, which vLLM and `torch.Generator.manual_seed` both accept.
    """
    if base_seed is None:
        return None
    text = "\x1f".join(str(k) for k in (base_seed, *keys))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1
