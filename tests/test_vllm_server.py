"""The vLLM server actor, launched with a fake `vllm serve` (vLLM cannot run on CPU-only machines), and TRL wiring.

`tests/fake_vllm_server_main.py` takes the real command line (TRL's flags included) and serves the endpoints raygrpo
and TRL read before any weight transfer. A `vllm`-marked test launches the real server where vLLM and a GPU exist.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time

import httpx
import psutil
import pytest

from raygrpo.actors.vllm_server import _WATCHER_TAG, start_vllm_server, stop_vllm_server
from raygrpo.config.policy import VLLMServeConfig
from raygrpo.policy.base import SamplingParams
from raygrpo.policy.vllm_client import VLLMClient
from raygrpo.policy.vllm_serve import build_command, server_env, trl_server_kwargs
from raygrpo.core.types import Turn
from tests.fake_vllm import have_vllm_and_gpu

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_vllm_server_main.py")
CONTINUATION = [101, 102, 103, 104, 2]


def fake_cfg(log_dir: os.PathLike | str, *extra: str, **kwargs) -> VLLMServeConfig:
    """The fake server's config: no GPU, logs under the test's `tmp_path`, `extra` appended to its command."""
    base = dict(command=[sys.executable, FAKE], num_gpus=0, num_cpus=0, startup_timeout_s=60, stop_timeout_s=5)
    base["log_dir"] = str(log_dir)
    return VLLMServeConfig(**{**base, "extra_args": list(extra), **kwargs})


def group_processes(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group `pgid`, and raygrpo watchers of that group."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = proc.info["cmdline"] or []
            watcher = _WATCHER_TAG in cmdline and str(pgid) in cmdline
            if watcher or os.getpgid(proc.pid) == pgid:
                found.append(proc)
        except (psutil.Error, ProcessLookupError):
            pass
    return found


def wait_gone(pgid: int, timeout_s: float = 20.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while (left := group_processes(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


async def generate_once(client: VLLMClient, prompt: list[int], max_tokens: int, seed: int | None = None) -> Turn:
    try:
        return await client.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed))
    finally:
        await client.aclose()


def refuses(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return False
    except OSError:
        return True


@pytest.mark.timeout(30)
def test_build_command_is_trls_vllm_serve_command():
    cfg = VLLMServeConfig(
        host="0.0.0.0", max_model_len=4096, served_model_name="tiny", extra_args=["--seed", "3"], enforce_eager=True
    )
    cmd = build_command(cfg, "/models/qwen", 8123)
    assert cmd[:5] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "/models/qwen"]
    pairs = dict(zip(cmd, cmd[1:]))
    assert pairs["--host"] == "0.0.0.0" and pairs["--port"] == "8123" and pairs["--max-model-len"] == "4096"
    assert json.loads(pairs["--weight-transfer-config"]) == {"backend": "nccl"}
    assert pairs["--logprobs-mode"] == "processed_logprobs" and pairs["--max-logprobs"] == "-1"
    assert "--enforce-eager" in cmd and pairs["--served-model-name"] == "tiny" and cmd[-2:] == ["--seed", "3"]
    assert server_env(cfg) == {"VLLM_SERVER_DEV_MODE": "1"}
    custom = build_command(VLLMServeConfig(command=["vllm", "serve"]), "m", 1)
    assert custom[:3] == ["vllm", "serve", "m"]


@pytest.mark.timeout(30)
def test_served_model_samples_as_asked_not_as_its_generation_config_says():
    """`policy.serve` starts vLLM with `--generation-config vllm` (the model's generation_config.json would otherwise
    set top_k, top_p, temperature for what a request leaves out), unless the user's extra_args choose one."""
    cmd = build_command(VLLMServeConfig(), "/models/qwen3", 8123)
    assert dict(zip(cmd, cmd[1:]))["--generation-config"] == "vllm"
    for extra in (["--generation-config", "auto"], ["--generation-config=/cfg"]):
        cmd = build_command(VLLMServeConfig(extra_args=extra), "/models/qwen3", 8123)
        assert [a for a in cmd if a.startswith("--generation-config")] == extra[:1] and cmd[-len(extra):] == extra


@pytest.mark.timeout(30)
def test_config_is_checked():
    with pytest.raises(ValueError, match="extra"):
        VLLMServeConfig(gpus=1)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        VLLMServeConfig(tensor_parallel_size=2, num_gpus=1)
    with pytest.raises(ValueError, match="empty"):
        VLLMServeConfig(command=[])


@pytest.mark.timeout(60)
def test_trl_server_kwargs_make_a_valid_grpo_config(tmp_path):
    from trl import GRPOConfig

    url = "http://10.1.2.3:8123"
    kwargs = trl_server_kwargs(url, group_port=51300, timeout_s=30)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", **kwargs)
    assert args.use_vllm and args.vllm_mode == "server" and args.vllm_server_base_url == url
    assert (args.vllm_server_host, args.vllm_server_port) == ("10.1.2.3", 8123)
    assert args.vllm_group_port == 51300 and args.vllm_server_timeout == 30
    with pytest.raises(ValueError):
        trl_server_kwargs("10.1.2.3:8123")


@pytest.mark.timeout(120)
def test_actor_serves_the_url_and_stop_ends_the_process_group(ray_local, tmp_path):
    import ray

    from raygrpo.config.policy import PolicyConfig
    from raygrpo.policy.factory import build_policy_client

    handle, url = start_vllm_server(fake_cfg(tmp_path, "--fake-spawn-child", served_model_name="tiny"), "/models/tiny")
    try:
        pgid = ray.get(handle.pid.remote())
        assert ray.get(handle.alive.remote()) and ray.get(handle.model_name.remote()) == "tiny"
        assert len(group_processes(pgid)) == 3  # the server, its child, the watcher
        # What TRL's VLLMClient reads before it opens the NCCL group: health, model id, dev-mode server info.
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny"
        info = httpx.get(f"{url}/server_info", params={"config_format": "json"}).json()
        assert info["weight_transfer_config"] == {"backend": "nccl"}
        assert info["model_config"]["logprobs_mode"] == "processed_logprobs"
        assert httpx.get(f"{url}/get_world_size").json() == {"world_size": 1}

        # An env pool actor's client, built from the policy config, generates through the URL.
        @ray.remote(num_cpus=0)
        def generate(policy: PolicyConfig) -> list[int]:
            client = build_policy_client(policy, tokenizer=None, model_name="ignored")
            return asyncio.run(generate_once(client, [1, 2, 3], 8)).output_ids

        policy = PolicyConfig(kind="vllm", url=url, served_model_name="tiny")
        assert ray.get(generate.remote(policy), timeout=30) == CONTINUATION
        turn = asyncio.run(generate_once(VLLMClient(url, "tiny"), [7], 2))
        assert turn.output_ids == CONTINUATION[:2] and turn.finish_reason == "length"

        assert ray.get(handle.stop.remote(), timeout=30) is not None
        assert not ray.get(handle.alive.remote())
        assert wait_gone(pgid) == [] and refuses(url)
    finally:
        stop_vllm_server(handle, timeout_s=30)


@pytest.mark.timeout(120)
def test_killing_the_actor_ends_the_server_and_its_children(ray_local, tmp_path):
    import ray

    handle, url = start_vllm_server(fake_cfg(tmp_path, "--fake-spawn-child"), "/models/tiny")
    pgid = ray.get(handle.pid.remote())
    try:
        assert len(group_processes(pgid)) == 3 and not refuses(url)
    finally:
        ray.kill(handle, no_restart=True)
    assert wait_gone(pgid, timeout_s=30) == [] and refuses(url)


@pytest.mark.timeout(120)
def test_a_server_that_exits_fails_with_its_log(ray_local, tmp_path):
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 3.*failing on purpose with exit code 3"):
        start_vllm_server(fake_cfg(tmp_path, "--fake-exit", "3"), "/models/tiny")


@pytest.mark.timeout(120)
def test_a_server_that_never_answers_times_out_and_is_ended(ray_local, tmp_path):
    cfg = fake_cfg(tmp_path, "--fake-startup-delay", "60", "--fake-spawn-child", startup_timeout_s=3)
    with pytest.raises(RuntimeError, match=r"(?s)did not answer .*/health within 3s.*fake vllm serve: child pid"):
        start_vllm_server(cfg, "/models/tiny")
    log = next(tmp_path.glob("vllm-serve-*.log")).read_text()
    child = int(log.split("child pid ")[1].split()[0])
    deadline = time.monotonic() + 20
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the server's child outlived the failed start"
        time.sleep(0.2)


@pytest.mark.vllm
@pytest.mark.gpu
@pytest.mark.timeout(1200)
@pytest.mark.skipif(not have_vllm_and_gpu(), reason="needs vLLM installed and a CUDA GPU")
def test_real_vllm_server(ray_local, tiny_model_dir, tmp_path):
    """Launch real `vllm serve` (the tiny model, or $RAYGRPO_VLLM_TEST_MODEL) through the actor; generate; check the
    dev-mode endpoints TRL's server mode needs. The NCCL weight push itself needs a second GPU for the trainer."""
    model = os.environ.get("RAYGRPO_VLLM_TEST_MODEL", tiny_model_dir)
    cfg = VLLMServeConfig(
        served_model_name="tiny", max_model_len=2048, gpu_memory_utilization=0.3, enforce_eager=True,
        startup_timeout_s=900, log_dir=str(tmp_path),
    )
    handle, url = start_vllm_server(cfg, model)
    try:
        info = httpx.get(f"{url}/server_info", params={"config_format": "json"}, timeout=30).json()
        assert info["weight_transfer_config"] is not None
        assert info["model_config"]["logprobs_mode"] == "processed_logprobs"
        turn = asyncio.run(generate_once(VLLMClient(url, "tiny", timeout_s=120), [5, 6, 7, 8], 16, seed=3))
        assert 1 <= len(turn.output_ids) <= 16 and len(turn.logprobs) == len(turn.output_ids)
    finally:
        stop_vllm_server(handle, timeout_s=120)
    assert refuses(url)


@pytest.mark.timeout(240)
def test_rollout_run_serves_vllm_and_env_pools_generate_through_it(ray_local, tiny_model_dir, tmp_path):
    """`policy: {kind: vllm, serve: ...}` end to end against the fake server (vLLM cannot run here): raygrpo starts
    the server actor, env pool actors generate through its URL, and the server is gone after the run."""
    from raygrpo.driver.collect import collect
    from raygrpo.config import load_config

    echo = os.path.abspath(os.path.join(os.path.dirname(FAKE), "..", "examples", "echo", "env.py"))
    serve = fake_cfg(tmp_path / "logs").model_dump()
    cfg = load_config(data={
        "envs": {"echo": {"kind": "ors", "environment": echo + ":EchoEnvironment"}},
        "model": tiny_model_dir,
        "policy": {"kind": "vllm", "serve": serve},
        "rollout": {"group_size": 1, "max_turns": 1},
        "workers": {"num_env_actors": 1, "max_concurrent_per_actor": 4},
    })
    summary = collect(cfg, tmp_path / "out", progress=False)
    assert summary["completed"] == summary["requested"] == 8 and summary["leaked_envs"] == 0
    lines = [json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    assert all(t["completion_ids"][:4] == CONTINUATION[:4] for t in lines)
    assert all(t["policy_versions"] == [-1] for t in lines)  # TRL syncs the server: versions are not tracked
    servers = [p for p in psutil.process_iter(["cmdline"]) if FAKE in (p.info["cmdline"] or [])]
    assert servers == [] or all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in servers)


def test_learner_points_trl_server_mode_at_the_served_url(tmp_path):
    from raygrpo.config import load_config
    from raygrpo.train.grpo_args import learner_grpo_config

    cfg = load_config(data={
        "envs": {"e": {"kind": "ors", "url": "http://127.0.0.1:1"}},
        "policy": {"kind": "vllm", "url": "http://127.0.0.1:8123"},
        "trainer": {"vllm_server_timeout": 30},
    })
    args = learner_grpo_config(cfg, str(tmp_path))
    assert args.use_vllm and args.vllm_mode == "server"
    assert args.vllm_server_base_url == "http://127.0.0.1:8123" and args.vllm_server_timeout == 30
