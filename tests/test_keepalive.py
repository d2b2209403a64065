"""Keepalive: an ORS session idle for ~30 s mid-episode survives because the SDK pings it, and dies without pings.

Two servers with their idle timeout patched from 900 s down to 20 s (`patch_ors_idle_timeout`: the server's reaper deletes
sessions with no ping/request for longer than that). Two arith rollouts run at once through `ORSAdapter`, each idle
30 s after its first tool call. The SDK's ping loop (`openreward.api._session.ping.ping`, run on the SDK's ping
thread every 10 s) is left alone for server A and suppressed for server B (negative control):

- A: the session is still in the server's registry after the gap, was pinged recently, and the episode finishes
  with reward 1.0;
- B: the server reaps the session during the gap and the next tool call raises `EnvError`.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from raygrpo.envs.base import EnvError
from raygrpo.envs.ors.adapter import ORSProvider
from raygrpo.envs.ors.listing import list_ors_tasks
from raygrpo.core.imports import load_object
from raygrpo.specs.ors import ORSSpec
from tests.ors_utils import ARITH, ors_server, run_episode

IDLE_TIMEOUT_S = 20.0
IDLE_GAP_S = 30.0


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_pings_keep_an_idle_session_alive_and_their_absence_loses_it(monkeypatch):
    from openreward.api._session import ping as ping_module

    right = load_object("examples/arith/policies.py:right")
    real_ping = ping_module.ping

    with ors_server([ARITH], idle_timeout_s=IDLE_TIMEOUT_S) as kept, \
            ors_server([ARITH], idle_timeout_s=IDLE_TIMEOUT_S) as control:

        async def selective_ping(url, sid, *args, **kwargs):
            if url.startswith(control.url):
                await asyncio.Event().wait()  # negative control: this server never hears a ping
            return await real_ping(url, sid, *args, **kwargs)

        monkeypatch.setattr(ping_module, "ping", selective_ping)

        async def rollout(server):
            spec = ORSSpec(url=server.url, indices=[3])
            [task] = list_ors_tasks(spec, "arith")
            provider = ORSProvider(spec, name="arith")
            adapter = provider.adapter()
            observed = {}

            async def pause(turn: int) -> None:
                if turn == 0:
                    await asyncio.sleep(IDLE_GAP_S)
                    observed["live_after_gap"] = server.live_sessions()
                    last = server.server._last_ping.get(adapter.sid)
                    observed["since_last_ping"] = None if last is None else time.monotonic() - last

            try:
                score, messages, results = await run_episode(adapter, task, right, pause=pause)
                return {"score": score, "error": None, "turns": len(results), **observed}
            except EnvError as exc:
                return {"score": await adapter.score(), "error": str(exc), **observed}
            finally:
                await adapter.close()
                await provider.aclose()

        async def both():
            return await asyncio.gather(rollout(kept), rollout(control))

        start = time.monotonic()
        with_pings, without_pings = asyncio.run(both())
        elapsed = time.monotonic() - start
        print(f"\nkeepalive: {elapsed:.1f} s; with pings: {with_pings}; without pings: {without_pings}")

        # With the SDK's pings the session outlives a gap longer than the server's idle timeout.
        assert with_pings["error"] is None, with_pings
        assert with_pings["score"] == 1.0
        assert with_pings["live_after_gap"] == 1
        assert with_pings["since_last_ping"] is not None and with_pings["since_last_ping"] < 12.0

        # Without them the server reaps it during the gap, and the rollout ends with an environment error.
        assert without_pings["live_after_gap"] == 0, without_pings
        assert without_pings["error"] is not None and "session is gone" in without_pings["error"], without_pings
        assert without_pings["score"] is None

        assert elapsed >= IDLE_GAP_S
        assert kept.live_sessions() == 0 and control.live_sessions() == 0
