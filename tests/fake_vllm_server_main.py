"""A runnable stand-in for `vllm serve`: `python -m tests.fake_vllm_server_main MODEL --host H --port P [flags]`
(from the repository root, or with it on PYTHONPATH).

It serves `tests/fake_vllm.py`'s fake `/v1/completions` (and `/health`) with uvicorn, plus the read-only endpoints
TRL 1.16's `VLLMClient` calls before any weight transfer, shaped from what TRL reads of them: `/v1/models` (from
`tests/fake_vllm.py`), `/server_info` (404 unless `VLLM_SERVER_DEV_MODE=1`, as in vLLM; `weight_transfer_config` and
`model_config.logprobs_mode` come from the command-line flags) and `/get_world_size`. Every `vllm serve` flag it
does not know is accepted and ignored, so raygrpo's real command line can be handed to it unchanged.

Test-only flags: `--fake-exit CODE` (print a message and exit at once), `--fake-startup-delay S` (sleep before
listening), `--fake-spawn-child` (start a long-sleeping child process, as vLLM starts its engine core),
`--fake-continuation 1,2,3` (the token ids every completion answers with).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import uvicorn

from tests.fake_vllm import FakeVLLM


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--weight-transfer-config", default=None)
    parser.add_argument("--logprobs-mode", default="raw_logprobs")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--fake-exit", type=int, default=None)
    parser.add_argument("--fake-startup-delay", type=float, default=0.0)
    parser.add_argument("--fake-spawn-child", action="store_true")
    parser.add_argument("--fake-continuation", default="101,102,103,104,2")
    args, unknown = parser.parse_known_args(argv)
    print(f"fake vllm serve: argv={sys.argv[1:]} ignored={unknown}", flush=True)
    print(f"fake vllm serve: VLLM_SERVER_DEV_MODE={os.environ.get('VLLM_SERVER_DEV_MODE')}", flush=True)
    if args.fake_exit is not None:
        print(f"fake vllm serve: failing on purpose with exit code {args.fake_exit}", flush=True)
        sys.exit(args.fake_exit)
    if args.fake_spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"fake vllm serve: child pid {child.pid}", flush=True)
    time.sleep(args.fake_startup_delay)

    name = args.served_model_name or args.model
    fake = FakeVLLM([int(t) for t in args.fake_continuation.split(",")], model=name, root=args.model,
                    max_model_len=args.max_model_len)
    dev_mode = os.environ.get("VLLM_SERVER_DEV_MODE") == "1"

    if dev_mode:  # vLLM registers its development endpoints only in dev mode

        @fake.app.get("/server_info")
        async def server_info() -> dict:
            wtc = json.loads(args.weight_transfer_config) if args.weight_transfer_config else None
            return {"weight_transfer_config": wtc, "model_config": {"logprobs_mode": args.logprobs_mode}}

        @fake.app.get("/get_world_size")
        async def world_size() -> dict:
            return {"world_size": args.tensor_parallel_size}

    uvicorn.run(fake.app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
