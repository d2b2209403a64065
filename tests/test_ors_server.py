"""The embedded ORS server: in-thread serving, the server's own session registry, the idle-timeout patch, the Ray
actor wrapper, and the example environment files run as servers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from raygrpo.envs.base import EnvError
from raygrpo.envs.ors.adapter import ORSProvider
from raygrpo.envs.ors.listing import list_ors_tasks
from raygrpo.envs.ors.server import RunningORSServer, serve_environments, serving
from raygrpo.core.errors import ResolveError
from raygrpo.specs.ors import ORSSpec
from raygrpo.core.types import TaskRef
from tests.ors_utils import ARITH, ECHO, closed_port, ors_server, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(60)
def test_serve_by_file_path_and_count_sessions():
    with serving([ECHO, ARITH]) as running:
        assert isinstance(running, RunningORSServer)
        assert running.url.startswith("http://127.0.0.1:") and running.port > 0
        assert running.env_names == ["echoenvironment", "arithenvironment"]
        assert running.live_sessions() == 0

        async def main():
            provider = ORSProvider(ORSSpec(url=running.url, env_name="arithenvironment"), name="arith")
            adapters = [provider.adapter() for _ in range(3)]
            await asyncio.gather(*(a.start(TaskRef(env="arith", index=i)) for i, a in enumerate(adapters)))
            opened = running.live_sessions()
            ids = running.session_ids()
            await asyncio.gather(*(a.close() for a in adapters))
            await provider.aclose()
            return opened, ids, [a.sid for a in adapters]

        opened, ids, sids = asyncio.run(main())
        assert opened == 3 and sorted(ids) == sorted(sids)
        assert running.live_sessions() == 0
    assert not running.running
    running.stop()  # idempotent


@pytest.mark.timeout(30)
def test_bad_environment_specs_fail_clearly():
    with pytest.raises(ResolveError, match="no attribute 'Nope'"):
        serve_environments("examples/echo/env.py:Nope")
    with pytest.raises(ResolveError, match="not an openreward.environments.Environment subclass"):
        serve_environments("raygrpo.agent.toolcalls:format_tool_call")
    busy = serve_environments(ECHO)
    try:
        with pytest.raises(OSError, match=f"127.0.0.1:{busy.port}"):
            serve_environments(ECHO, port=busy.port)
    finally:
        busy.stop()


@pytest.mark.timeout(60)
def test_idle_timeout_patch_reaps_unpinged_sessions(monkeypatch):
    """With the SDK's pings suppressed, a session left idle past the (patched) idle timeout is deleted by the server's
    own reaper — the quick check that `patch_ors_idle_timeout` reaches the reaper; test_keepalive.py does the long run."""
    from openreward.api._session import ping as ping_module

    async def no_ping(*args, **kwargs):
        await asyncio.Event().wait()

    monkeypatch.setattr(ping_module, "ping", no_ping)
    with ors_server([ECHO], idle_timeout_s=1.0) as running:

        async def main():
            provider = ORSProvider(ORSSpec(url=running.url), name="echo")
            adapter = provider.adapter()
            try:
                await adapter.start(TaskRef(env="echo", index=0))
                assert running.live_sessions() == 1
                reaped = await asyncio.to_thread(wait_until, lambda: running.live_sessions() == 0, 10, 0.1)
                with pytest.raises(EnvError, match="session is gone"):
                    await adapter.call("echo", {"text": "hello"})
                return reaped
            finally:
                await adapter.close()
                await provider.aclose()

        start = time.monotonic()
        assert asyncio.run(main())
        assert time.monotonic() - start < 8


@pytest.mark.timeout(90)
@pytest.mark.parametrize("example, name, targets", [
    ("examples/echo/env.py", "echoenvironment", 8),
    ("examples/arith/env.py", "arithenvironment", 8),
])
def test_example_runs_as_a_server(example, name, targets):
    port = closed_port()
    env = {**os.environ, "OPENREWARD_DISABLE_UPDATE_CHECK": "1", "PYTHONPATH": REPO}
    proc = subprocess.Popen([sys.executable, example, "--port", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in proc.stdout:  # "... listening on URL" is printed once the server accepts connections
            seen.append(line)
            if "listening on" in line:
                break
        assert f"listening on http://127.0.0.1:{port}" in seen[-1], seen
        tasks = list_ors_tasks(ORSSpec(url=f"http://127.0.0.1:{port}", env_name=name), "ex")
        assert len(tasks) == targets
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_server_actor_serves_an_environment_spec(ray_local):
    import ray

    from raygrpo.actors.ors_server import start_embedded_server

    spec = ORSSpec(environment=ARITH, num_tasks=2)
    actor, url = start_embedded_server(spec, "arith")
    try:
        assert url.startswith("http://127.0.0.1:")
        # Its start-up heap is out of garbage collections (`raygrpo.actors.heap`); Ray itself freezes a few hundred.
        assert ray.get(actor.__ray_call__.remote(lambda self: __import__("gc").get_freeze_count()), timeout=30) > 10_000
        served = spec.served_at(url)
        tasks = list_ors_tasks(served, "arith")
        assert [t.index for t in tasks] == [0, 1] and tasks[1].metadata["answer"] == 42

        async def episode():
            provider = ORSProvider(served, name="arith")
            adapter = provider.adapter()
            try:
                await adapter.start(tasks[0])
                live = ray.get(actor.live_sessions.remote())
                result = await adapter.call("submit", {"answer": 42})
            finally:
                await adapter.close()
                await provider.aclose()
            return live, result

        live, result = asyncio.run(episode())
        assert live == 1 and result.reward == 1.0
        assert ray.get(actor.live_sessions.remote()) == 0
        assert ray.get(actor.env_names.remote()) == ["arithenvironment"]
    finally:
        ray.get(actor.stop.remote(), timeout=30)
        ray.kill(actor)

    nope = f"{REPO}/examples/nope.py:X"
    with pytest.raises(RuntimeError, match=rf"envs\.bad\.environment: cannot serve '{nope}'"):
        start_embedded_server(ORSSpec(environment=nope), "bad", startup_timeout_s=60)


@pytest.mark.timeout(60)
def test_several_servers_in_one_process(capfd):
    """Servers side by side and one after another in one process all serve SSE responses (`/create_session`, `/call`)
    without errors. sse-starlette 2.3.6 binds its shutdown event to the first server's loop, so without
    `patch_sse_exit_signal` the other servers' SSE responses crash server side ("bound to a different event loop");
    the SDK's retries hide it from the client, so the check reads the servers' own error output."""
    from tests.ors_utils import SleepEnvironment

    async def nap(url: str) -> float | None:
        provider = ORSProvider(ORSSpec(url=url), name="sleep")
        adapter = provider.adapter()
        try:
            await adapter.start(TaskRef(env="sleep", index=0))
            result = await adapter.call("nap", {"seconds": 0.3})
            assert result.text == "slept 0.3", result
            return await adapter.score()
        finally:
            await adapter.close()
            await provider.aclose()

    with ors_server([SleepEnvironment]) as first:
        assert asyncio.run(nap(first.url)) == 1.0
    with ors_server([SleepEnvironment]) as a, ors_server([SleepEnvironment]) as b:

        async def both():
            return await asyncio.gather(nap(a.url), nap(b.url), nap(a.url), nap(b.url))

        assert asyncio.run(both()) == [1.0] * 4
    out, err = capfd.readouterr()
    assert "bound to a different event loop" not in out + err
    assert "Exception in ASGI application" not in out + err
