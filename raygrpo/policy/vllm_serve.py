"""How raygrpo launches a vLLM server that TRL's `vllm_mode="server"` can push weights into.

What TRL 1.16's server mode talks to (read from `trl/generation/vllm_client.py`, `trl/generation/vllm_generation.py`,
`trl/scripts/vllm_serve.py`): vLLM's own OpenAI-compatible server, `vllm serve`, with its native weight-transfer
endpoints. `trl vllm-serve` is no longer a separate FastAPI server: in 1.16 it is deprecated and only `execve`s
`python -m vllm.entrypoints.cli.main serve MODEL ...` with the flags below and `VLLM_SERVER_DEV_MODE=1`. raygrpo
therefore launches that same command directly (no deprecation warning, one process less), with the flags built by
TRL's own `trl.scripts.vllm_serve.build_command`, so they stay what TRL expects:

- `--weight-transfer-config '{"backend": "nccl"}'`: the NCCL weight-transfer engine TRL pushes the weights through;
- `--logprobs-mode processed_logprobs`: log-probabilities after temperature scaling, which the importance-sampling
  correction (and raygrpo's `VLLMClient`) need;
- `--max-logprobs -1`; and the environment variable `VLLM_SERVER_DEV_MODE=1`, without which vLLM does not register
  the development endpoints (`/server_info`, `/init_weight_transfer_engine`, `/update_weights`, ...).

The trainer's `trl.generation.vllm_client.VLLMClient` then calls, on the main process only:

- at start-up: `GET /health` (polled until 200, up to `vllm_server_timeout`), `GET /v1/models` (the served model id),
  `GET /server_info?config_format=json` (must show a `weight_transfer_config`; 404 means no dev mode),
  `GET /get_world_size`, then `POST /init_weight_transfer_engine {"init_info": {master_address, master_port=
  vllm_group_port, rank_offset: 1, world_size, ...}}` concurrently with the trainer joining the NCCL group as rank 0;
  the trainer then reads `GET /server_info` again to warn if `logprobs_mode` is not `processed_logprobs`;
- at every weight sync: `POST /start_weight_update`, `POST /update_weights {"update_info": {names, dtype_names,
  shapes}}` concurrently with the NCCL broadcast of the tensors, `POST /finish_weight_update`, then
  `POST /reset_prefix_cache`.

The NCCL group is opened by the trainer on its own IP (vLLM's `get_ip()`) at `vllm_group_port`: the server's workers
must reach that address, the trainer process must have vLLM installed and a CUDA device, and it must not share the
server's GPU (NCCL refuses two ranks on one device).
"""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import urlparse

from raygrpo.config.policy import VLLMServeConfig

#: The launcher `trl vllm-serve` execs in TRL 1.16 (with this process's Python): vLLM's CLI, sub-command `serve`.
VLLM_SERVE_LAUNCHER: tuple[str, ...] = ("-m", "vllm.entrypoints.cli.main", "serve")

#: Environment every launched server gets: TRL's weight-sync endpoints live behind vLLM's dev mode.
SERVER_ENV: dict[str, str] = {"VLLM_SERVER_DEV_MODE": "1"}


def launcher(cfg: VLLMServeConfig) -> list[str]:
    """The command prefix the model path follows: `cfg.command`, or `python -m vllm.entrypoints.cli.main serve`."""
    return list(cfg.command) if cfg.command is not None else [sys.executable, *VLLM_SERVE_LAUNCHER]


def build_command(cfg: VLLMServeConfig, model_path: str, port: int) -> list[str]:
    """The full server command line: the launcher, then `MODEL --host H --port P ...` as TRL 1.16 builds it.

    The flags come from `trl.scripts.vllm_serve.build_command` (the weight-transfer engine, processed logprobs,
    uncapped logprobs, and `--enable-scale-out` where the installed vLLM has it), followed by raygrpo's own
    (`--served-model-name`; `--generation-config vllm` unless `cfg.extra_args` names a `--generation-config`) and
    `cfg.extra_args`. `--generation-config vllm` keeps the model's `generation_config.json` (Qwen3: top_k 20,
    top_p 0.95, temperature 0.6) from filling the sampling fields a request leaves out: raygrpo's client sends them
    all, but TRL's generation and any other client of the server then sample as asked too.
    """
    from trl.scripts.vllm_serve import ScriptArguments
    from trl.scripts.vllm_serve import build_command as trl_build_command

    args = ScriptArguments(
        model=model_path,
        host=cfg.host,
        port=int(port),
        tensor_parallel_size=cfg.tensor_parallel_size,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        dtype=cfg.dtype,
        max_model_len=cfg.max_model_len,
        enable_prefix_caching=cfg.enable_prefix_caching,
        enforce_eager=cfg.enforce_eager,
        trust_remote_code=cfg.trust_remote_code,
    )
    extra = ["--served-model-name", cfg.served_model_name] if cfg.served_model_name else []
    if not any(a == "--generation-config" or a.startswith("--generation-config=") for a in cfg.extra_args):
        extra += ["--generation-config", "vllm"]
    trl_command = trl_build_command(args, extra + list(cfg.extra_args))
    # TRL's command starts `python -m vllm.entrypoints.cli.main serve`; keep what follows `serve`.
    return launcher(cfg) + trl_command[trl_command.index("serve") + 1 :]


def server_env(cfg: VLLMServeConfig) -> dict[str, str]:
    """Variables set on top of the launching process's environment."""
    return {**SERVER_ENV, **cfg.env}


def trl_server_kwargs(url: str, group_port: int = 51216, timeout_s: float = 240.0) -> dict[str, Any]:
    """The `trl.GRPOConfig` keyword arguments that point the learner's vLLM server mode at `url`.

    TRL then generates through the server (when it generates itself) and, at every optimizer step that changed the
    weights, pushes them over NCCL (see the module docstring for the endpoints).

    Args:
        url: The server's base URL, as `start_vllm_server` returns it.
        group_port: Port the trainer opens, on its own node, for the NCCL weight-transfer group.
        timeout_s: How long the trainer waits for `/health` at start-up.
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    kwargs: dict[str, Any] = {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": url.rstrip("/"),
        "vllm_server_host": parsed.hostname,
        "vllm_group_port": int(group_port),
        "vllm_server_timeout": float(timeout_s),
    }
    if parsed.port is not None:
        kwargs["vllm_server_port"] = parsed.port
    return kwargs
