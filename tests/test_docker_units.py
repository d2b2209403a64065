"""The docker backend's parts that need no Docker engine: reading a failed build from Harbor's error, owner labels
and who is an orphan, the compose file raygrpo adds, and the wheelhouse (against a fake upstream index on
127.0.0.1, with a real pip downloading through it)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import subprocess
import sys
import zipfile

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from raygrpo.envs.harbor.docker import NodeLock, build_failure
from raygrpo.docker.engine import COMPOSE_PROJECT, DockerObject
from raygrpo.docker.owners import (
    RUN_LABEL,
    SANDBOX_LABEL,
    compose_overlay,
    orphaned,
    owner_labels,
    owner_of,
)
from raygrpo.sandbox.os_probe import proc_start_time
from raygrpo.sandbox.owners import HOSTNAME, owner_alive
from raygrpo.testing.wheelhouse import Wheelhouse, normalize

pytestmark = pytest.mark.timeout(60)

# ── failed builds ─────────────────────────────────────────────────────────────────────────────────────────────────

URLOPEN = 'RUN python3 -c "import urllib.request; urllib.request.urlopen(\\"https://example.com/data.tar.gz\\", timeout=10)"'

# What `docker compose build` printed here (classic builder, compose 5.6.1, dockerd 20.10), trimmed in the middle.
CLASSIC_OUTPUT = f"""time="2026-12-01T02:12:01Z" level=warning msg="buildx Docker CLI plugin not found: falling back to the classic builder."
 Image hb__x Building
Sending build context to Docker daemon     356B
Step 1/6 : FROM python:3.12-slim
 ---> d4eb612dcc71
Step 2/6 : WORKDIR /app
 ---> Using cache
 ---> 3296c3da1a54
Step 3/6 : RUN echo one
 ---> Running in d9752693c192
one
Removing intermediate container d9752693c192
 ---> 5c888702c9d8
Step 4/6 : {URLOPEN}
 ---> Running in 5816ea29a6a6
\x1b[91mTraceback (most recent call last):
\x1b[0m\x1b[91m  File "/usr/lib/python3.11/socket.py", line 962, in getaddrinfo
socket.gaierror: [Errno -2] Name or service not known
urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>
\x1b[0mThe command '/bin/sh -c python3 -c "import urllib.request"' returned a non-zero code: 1
"""

# BuildKit's form of the same failure (docker with buildx).
BUILDKIT_OUTPUT = """#5 [2/3] RUN python3 -c "import urllib.request; urllib.request.urlopen('https://example.com')"
#5 0.412 urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>
#5 ERROR: process "/bin/sh -c python3 -c ..." did not complete successfully: exit code: 1
------
 > [2/3] RUN python3 -c "import urllib.request; urllib.request.urlopen('https://example.com')":
0.412 urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>
------
Dockerfile:3
--------------------
   3 | >>> RUN python3 -c "import urllib.request; urllib.request.urlopen('https://example.com')"
--------------------
ERROR: failed to solve: process "/bin/sh -c python3 -c ..." did not complete successfully: exit code: 1
"""

MISSING_BASE_OUTPUT = """Sending build context to Docker daemon     263B
Step 1/3 : FROM nosuch/image:1
Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on 10.255.255.53:53: no such host
"""


def harbor_error(command: str, output: str) -> str:
    """A failed compose command as Harbor 0.25's docker backend words it."""
    return (f"Docker compose command failed for environment t. Command: docker compose --project-name t__x__env "
            f"-f /a.yaml {command}. Return code: 1. Stdout: {output}. Stderr: None. ")


def test_a_classic_build_failure_names_the_step_its_exit_code_and_why():
    failure = build_failure(harbor_error("build", CLASSIC_OUTPUT))
    assert failure is not None
    assert (failure.step, failure.instruction, failure.exit_code) == ("4/6", URLOPEN, 1)
    assert failure.detail == "urllib.error.URLError: <urlopen error [Errno -2] Name or service not known>"
    assert failure.container == "5816ea29a6a6"  # the failed step's container, which the classic builder keeps
    assert str(failure).startswith(f"step 4/6 `{URLOPEN}` exited with code 1: urllib.error.URLError")


def test_a_buildkit_build_failure_and_a_missing_base_image():
    failure = build_failure(harbor_error("build", BUILDKIT_OUTPUT))
    assert failure is not None and (failure.step, failure.exit_code, failure.container) == ("2/3", 1, None)
    assert failure.instruction.startswith("RUN python3 -c") and "Name or service not known" in failure.detail
    failure = build_failure(harbor_error("build", MISSING_BASE_OUTPUT))
    assert failure is not None and failure.exit_code is None
    assert str(failure).startswith("step 1/3 `FROM nosuch/image:1` failed: Get ") and "no such host" in str(failure)


def test_failures_that_are_not_a_broken_image():
    # No step ran: the daemon or compose failed (infrastructure, retried).
    no_daemon = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    assert build_failure(harbor_error("build", no_daemon)) is None
    # A later compose command failed.
    assert build_failure(harbor_error("up --detach --wait", CLASSIC_OUTPUT)) is None
    assert build_failure("RuntimeError: something else") is None


# ── owner labels ──────────────────────────────────────────────────────────────────────────────────────────────────


def test_owner_labels_round_trip_and_this_process_is_alive(monkeypatch):
    monkeypatch.setenv("RAYGRPO_RUN_ID", "run-abc")
    labels = owner_labels()
    assert labels[SANDBOX_LABEL] == "true" and labels[RUN_LABEL] == "run-abc"
    assert all(isinstance(v, str) for v in labels.values())
    owner = owner_of(labels)
    assert owner["pid"] == os.getpid() and owner["hostname"] == HOSTNAME
    assert owner["pid_start"] == proc_start_time(os.getpid())  # exact: the float survives its label
    assert owner_alive(owner)
    assert owner_labels("run-explicit")[RUN_LABEL] == "run-explicit"


def _sandbox(project: str, labels: dict[str, str]) -> DockerObject:
    return DockerObject("container", f"id-{project}", f"{project}-main-1", {**labels, COMPOSE_PROJECT: project})


def test_orphans_are_sandboxes_of_dead_owners_on_this_host():
    mine = owner_labels("r")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child_start = proc_start_time(child.pid)
    child.wait()
    dead = {**mine, "io.raygrpo.owner.pid": str(child.pid), "io.raygrpo.owner.pid-start": repr(child_start)}
    reused = {**mine, "io.raygrpo.owner.pid-start": repr(float(mine["io.raygrpo.owner.pid-start"]) - 1.0)}
    elsewhere = {**dead, "io.raygrpo.owner.host": HOSTNAME + "-other"}
    other_boot = {**mine, "io.raygrpo.owner.boot": "another-boot"}
    objects = [_sandbox("alive", mine), _sandbox("dead", dead), _sandbox("reused-pid", reused),
               _sandbox("elsewhere", elsewhere), _sandbox("rebooted", other_boot)]
    assert orphaned(objects) == {"dead", "reused-pid", "rebooted"}


def test_the_compose_overlay_runs_an_init_and_labels_containers_and_network():
    labels = owner_labels("r")
    overlay = compose_overlay(labels)
    assert overlay == {"services": {"main": {"init": True, "labels": labels}}, "networks": {"default": {"labels": labels}}}
    assert compose_overlay(labels, image="hb__abc")["services"]["main"]["image"] == "hb__abc"
    # A start that builds the image builds it once: `up` must not build it again (Harbor says `pull_policy: build`).
    assert compose_overlay(labels, image="hb__abc", built_once=True)["services"]["main"]["pull_policy"] == "missing"
    assert "pull_policy" not in compose_overlay(labels, image="hb__abc")["services"]["main"]


def test_a_tasks_own_compose_services_volumes_and_networks_are_labelled_and_their_images_named_once():
    from raygrpo.docker.sidecars import declares_volumes, sidecar_overlay

    compose = {"services": {"main": {"volumes": ["shared:/shared"]}, "vault": {"build": {"context": "./vault"}},
                            "db": {"image": "postgres:16"}, "Web_UI": {"build": "."}},
               "volumes": {"shared": None, "outside": {"external": True}},
               "networks": {"back": {}, "default": {}}}
    labels = owner_labels("r")
    sidecars = sidecar_overlay(compose, labels, "hb__abc")
    assert sidecars == {
        "services": {"vault": {"labels": labels, "image": "hb__abc-vault"}, "db": {"labels": labels},
                     "Web_UI": {"labels": labels, "image": "hb__abc-web_ui"}},
        "volumes": {"shared": {"labels": labels}},  # not the external one: it is not the sandbox's
        "networks": {"back": {"labels": labels}},
    }
    merged = compose_overlay(labels, image="hb__abc", sidecars=sidecars)
    assert merged["services"]["main"]["init"] is True and merged["networks"]["default"] == {"labels": labels}
    assert declares_volumes(compose) and not declares_volumes({"volumes": {"x": {"external": True}}})


# ── the wheelhouse ────────────────────────────────────────────────────────────────────────────────────────────────


def tiny_wheel(name: str, version: str) -> bytes:
    """A minimal valid pure-Python wheel (what pip checks when it downloads one)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for path, data in {**files, f"{dist}/RECORD": record.encode()}.items():
            zf.writestr(path, data)
    return buffer.getvalue()


@pytest.fixture
async def upstream():
    """A fake simple index on 127.0.0.1: project `demo-pkg`, one wheel linked by absolute URL with its hash."""
    wheel = tiny_wheel("demo_pkg", "1.0")
    digest = hashlib.sha256(wheel).hexdigest()
    hits: dict[str, int] = {}

    async def page(request: web.Request) -> web.Response:
        hits["page"] = hits.get("page", 0) + 1
        if request.match_info["project"] != "demo-pkg":
            raise web.HTTPNotFound()
        base = f"http://{request.host}"
        return web.Response(content_type="text/html", text=(
            f'<html><body><a href="{base}/packages/demo_pkg-1.0-py3-none-any.whl#sha256={digest}">'
            f"demo_pkg-1.0-py3-none-any.whl</a></body></html>"))

    async def file(request: web.Request) -> web.Response:
        hits["file"] = hits.get("file", 0) + 1
        return web.Response(body=wheel, content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/simple/{project}/", page)
    app.router.add_get("/packages/demo_pkg-1.0-py3-none-any.whl", file)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield server, hits, wheel
    await server.close()


@pytest.fixture
async def wheelhouse(upstream, tmp_path):
    server, _, _ = upstream
    house = Wheelhouse(tmp_path / "cache", f"http://127.0.0.1:{server.port}/simple")
    front = TestServer(house.app(), host="127.0.0.1")
    await front.start_server()
    yield f"http://127.0.0.1:{front.port}", house
    await front.close()


async def test_the_wheelhouse_rewrites_links_caches_files_and_survives_its_upstream(upstream, wheelhouse):
    server, hits, wheel = upstream
    url, house = wheelhouse
    async with httpx.AsyncClient() as client:
        page = (await client.get(f"{url}/simple/Demo_Pkg/")).text  # names are normalized (PEP 503)
        link = f"/files/127.0.0.1:{server.port}/packages/demo_pkg-1.0-py3-none-any.whl#sha256="
        assert f'href="{link}{hashlib.sha256(wheel).hexdigest()}"' in page
        for _ in range(2):
            got = await client.get(url + link.split("#")[0])
            assert got.status_code == 200 and got.content == wheel
        assert hits["file"] == 1  # fetched once, then served from the cache
        # Only hosts the index links to are fetched from: the wheelhouse is no open proxy.
        assert (await client.get(f"{url}/files/example.com/x.whl")).status_code == 403
        assert (await client.get(f"{url}/simple/nope/")).status_code == 404
        await server.close()
        # The upstream is gone: the last good page is still served, unknown projects are a gateway error.
        assert link in (await client.get(f"{url}/simple/demo-pkg/")).text
        assert (await client.get(f"{url}/simple/other/")).status_code == 502
    assert normalize("Pytest_JSON.ctrf") == "pytest-json-ctrf"


async def test_pip_downloads_through_the_wheelhouse(wheelhouse, tmp_path):
    url, _ = wheelhouse
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    env.pop("PIP_FIND_LINKS", None)
    # In a thread: the wheelhouse answers pip on this test's event loop.
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pip", "download", "--no-deps", "--index-url", f"{url}/simple", "-d", str(tmp_path / "d"),
         "demo-pkg==1.0"],
        capture_output=True, text=True, env=env, timeout=50,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [p.name for p in (tmp_path / "d").iterdir()] == ["demo_pkg-1.0-py3-none-any.whl"]


# ── the per-node build lock ───────────────────────────────────────────────────────────────────────────────────────


async def test_node_lock_is_exclusive_across_holders_and_a_wait_for_it_can_be_cancelled(tmp_path):
    path = tmp_path / "locks" / "hb__x.lock"
    fds = len(os.listdir("/proc/self/fd"))
    first, second, third = NodeLock(path), NodeLock(path), NodeLock(path)
    await first.acquire()
    waiting = asyncio.create_task(second.acquire())
    await asyncio.sleep(0.3)
    assert not waiting.done()  # another holder (a separate open file, as another process has) waits
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    first.release()
    first.release()  # releasing twice is harmless
    await asyncio.wait_for(third.acquire(), 2)  # the cancelled waiter holds nothing
    third.release()
    assert len(os.listdir("/proc/self/fd")) == fds  # no lock file left open
