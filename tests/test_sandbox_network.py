"""A sandbox's network follows its task's network mode, on the local and the docker backend, and never includes
the host: `public` reaches an address beyond the host (a test host in a network namespace, `tests.outside_host`)
and nothing of the host; `no-network` (and the older `allow_internet = false`) has loopback only; `allowlist`, which
neither backend can enforce here, is refused by name. The verifier's commands run under the same rule."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

import psutil
import pytest
from harbor.verifier.verifier import Verifier

from raygrpo.envs.harbor.provider import HarborProvider
from raygrpo.envs.harbor.tasks import list_harbor_tasks
from raygrpo.core.errors import TaskError
from raygrpo.governor.gate import reset_gates
from raygrpo.docker import guard as docker_guard
from raygrpo.sandbox.network import SLIRP4NETNS, host_addresses
from raygrpo.sandbox.os_probe import sandbox_processes
from raygrpo.specs.harbor import HarborSpec
from tests.docker_utils import docker_ready  # noqa: F401 - a fixture
from tests.harbor_utils import make_task
from tests.netns_cluster import require_netns
from tests.outside_host import Canary, OutsideHost, outside_host
from tests.sandbox_utils import make_env

pytestmark = pytest.mark.timeout(180)

#: The verifier's test: reward 1 when it reaches the outside host, else 0.
FETCH_TEST = """#!/bin/bash
mkdir -p /logs/verifier
if python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=5)" "$OUTSIDE_URL"; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

MODES = {
    "public": "",
    "no-network": 'network_mode = "no-network"',
    "legacy-offline": "allow_internet = false",
}


def fetch(url: str) -> str:
    return (f"python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read()"
            f".decode())' {url} 2>&1 | tail -1")


def connect(addr: str, port: int) -> str:
    return f"(echo > /dev/tcp/{addr}/{port}) 2>/dev/null && echo open || echo closed"


@pytest.fixture
def outside() -> OutsideHost:
    with outside_host() as host:
        yield host


@pytest.fixture
def canary():
    """A service on every address of the host; counts its connections."""
    service = Canary()
    yield service
    service.close()


def interfaces(proc_net_dev: str) -> set[str]:
    return {line.split(":")[0].strip() for line in proc_net_dev.splitlines()[2:] if ":" in line}


def slirp_processes() -> list[int]:
    return [p.pid for p in psutil.process_iter(["exe"]) if p.info["exe"] == SLIRP4NETNS]


async def test_a_local_sandboxs_network_follows_its_task(tmp_path: Path, outside: OutsideHost, canary):
    port = canary.port
    sroot = tmp_path / "sbx"
    slirps_before = set(slirp_processes())
    for mode, toml in MODES.items():
        task_dir = make_task(tmp_path / "tasks", mode, environment=toml, test_sh=FETCH_TEST)
        env, task, paths = make_env(task_dir, tmp_path / "trials", sroot,
                                    kwargs={"persistent_env": {"OUTSIDE_URL": outside.url}})
        await env.start(force_build=False)
        try:
            seen = interfaces((await env.exec("cat /proc/net/dev")).stdout)
            got = (await env.exec(fetch(outside.url))).stdout.strip()
            host = {addr: (await env.exec(connect(addr, port))).stdout.strip()
                    for addr in ["127.0.0.1", *host_addresses()]}
            reward = (await Verifier(task=task, trial_paths=paths, environment=env).verify()).rewards
            if mode == "public":
                # Through slirp4netns: the test host sees the host's end of its link, not a sandbox address.
                assert seen == {"lo", "tap0"} and got == f"from {outside.host_side}"
                assert len(set(slirp_processes()) - slirps_before) == 1
                assert reward == {"reward": 1.0}
            else:
                assert seen == {"lo"} and "Network is unreachable" in got
                assert reward == {"reward": 0.0}
            assert set(host.values()) == {"closed"}, host
        finally:
            await env.stop(delete=True)
        assert sandbox_processes(sroot) == [] and set(slirp_processes()) <= slirps_before
    assert canary.accepted == 0


async def test_public_sandboxes_leave_the_hosts_mounts_alone(tmp_path: Path):
    """A network namespace of the host (`ip netns add`: a bind mount under the shared /run/netns) still works after
    public sandboxes started and stopped beside it. slirp4netns's `--enable-sandbox`, run as root, unmounted such
    mounts by propagation (the multi-node cluster tests failed beside this module until it was dropped)."""
    require_netns()
    ns = f"rgkeep{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        task_dir = make_task(tmp_path / "tasks", "public")
        envs = [make_env(task_dir, tmp_path / "trials", tmp_path / "sbx")[0] for _ in range(4)]
        for env in envs:
            await env.start(force_build=False)
        for env in envs:
            await env.stop(delete=True)
        inside = subprocess.run(["ip", "netns", "exec", ns, "ip", "-o", "link"], capture_output=True, text=True)
        assert inside.returncode == 0 and inside.stdout.split(":")[1].strip() == "lo", inside.stderr
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


async def test_an_allowlist_task_is_refused_by_name_on_the_local_backend(tmp_path: Path):
    make_task(tmp_path / "tasks", "allow", environment='network_mode = "allowlist"\nallowed_hosts = ["example.com"]')
    with pytest.raises(ValueError, match="network_mode='allowlist' is not supported by raygrpo-local"):
        make_env(tmp_path / "tasks" / "allow", tmp_path / "trials", tmp_path / "sbx")
    reset_gates()
    spec = HarborSpec.model_validate({"path": str(tmp_path / "tasks"),
                                      "environment_kwargs": {"sandbox_root": str(tmp_path / "sbx")}})
    provider = HarborProvider(spec, name="suite")
    try:
        with pytest.raises(TaskError, match="allowlist"):
            await provider.adapter().start(list_harbor_tasks(spec, "suite")[0])
    finally:
        await provider.aclose()


@pytest.mark.docker
async def test_a_docker_sandboxs_network_follows_its_task(docker_ready, tmp_path: Path, outside: OutsideHost,
                                                          canary):
    port = canary.port
    for mode, toml in {**MODES, "allowlist": 'network_mode = "allowlist"\nallowed_hosts = ["example.com"]'}.items():
        make_task(tmp_path / mode, mode, environment=toml)
    for mode in [*MODES, "allowlist"]:
        reset_gates()
        spec = HarborSpec(path=str(tmp_path / mode), environment_type="docker")
        provider = HarborProvider(spec, name="suite")
        adapter = provider.adapter()
        try:
            if mode == "allowlist":
                with pytest.raises(TaskError, match="'allowlist' cannot be enforced on docker"):
                    await adapter.start(list_harbor_tasks(spec, "suite")[0])
                continue
            await adapter.start(list_harbor_tasks(spec, "suite")[0])
            env = adapter.env
            seen = interfaces((await env.exec("cat /proc/net/dev")).stdout)
            got = (await env.exec(fetch(outside.url))).stdout.strip()
            host = {addr: (await env.exec(connect(addr, port))).stdout.strip()
                    for addr in ["127.0.0.1", *host_addresses()]}
            if mode == "public":
                # Its bridge is guarded: the host's address on it is among host_addresses(), and closed below.
                assert seen == {"lo", "eth0"} and got.startswith("from "), got
            else:
                assert seen == {"lo"} and "Network is unreachable" in got, got
            assert set(host.values()) == {"closed"}, host
        finally:
            await adapter.close()
            await provider.aclose()
    assert canary.accepted == 0


def test_the_guards_shell_script_installs_what_ensure_checks():
    """`docker_guard.shell_script()` (what the KubeRay sidecar runs) builds the chain that `installed()` accepts, and
    again on a second run (idempotent); checked in a network namespace of its own, so the host's firewall is not
    touched."""
    require_netns()
    ns = f"rgguard{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        def in_ns(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=60)

        assert in_ns(sys.executable, "-m", "raygrpo.docker.guard", "status").returncode == 1
        for _ in range(2):
            assert in_ns("sh", "-c", docker_guard.shell_script()).returncode == 0
            status = in_ns(sys.executable, "-m", "raygrpo.docker.guard", "status")
            assert status.returncode == 0 and "installed" in status.stdout
        assert in_ns("iptables", "-S", "INPUT").stdout.count(docker_guard.CHAIN) == 1
        assert in_ns(sys.executable, "-m", "raygrpo.docker.guard", "remove").returncode == 0
        assert docker_guard.CHAIN not in in_ns("iptables", "-S").stdout
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_the_guard_mode_is_checked(monkeypatch):
    monkeypatch.setattr(docker_guard, "_ensured", threading.Event())
    monkeypatch.setenv(docker_guard.MODE_ENV, "off")
    with pytest.raises(docker_guard.GuardError, match="RAYGRPO_DOCKER_GUARD='off': expected one of auto, external"):
        docker_guard.ensure()
    monkeypatch.setenv(docker_guard.MODE_ENV, "external")
    monkeypatch.setattr(docker_guard, "_iptables", None)  # external: the node's set-up installed it, nothing is run
    docker_guard.ensure()
