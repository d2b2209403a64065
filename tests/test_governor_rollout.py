"""A 429 storm through the whole rollout path: Harbor suites on the fake provider, env pool actors, the governor.

The provider starts at the limits the suite is configured with and, a few seconds into the run, lowers them (a
429 storm). Every rollout must still end `ok` with its reward: a refused create is backed off and retried by the
governor, never turned into an `env_error` (which would spend the rollout's retries) or a lost rollout. The provider's
log says how many creates it refused and that nothing is left alive.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from raygrpo.driver.collect import collect
from raygrpo.config import load_config
from raygrpo.testing.fake_provider.audit import audit
from raygrpo.testing.fake_provider.service import FakeProviderProcess
from raygrpo.testing.fake_provider.state import Limits

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

HARBOR = "examples/harbor_local/rollout.yaml"
BACKEND = "raygrpo.testing.fake_provider.backend:FakeProviderEnvironment"


@pytest.mark.timeout(240)
def test_a_429_storm_mid_run_loses_no_rollout(tmp_path):
    rate, live = 4.0, 6
    limits = Limits(create_rate_per_s=rate, max_live=live, exec_delay_s=0.4)
    with FakeProviderProcess(tmp_path / "calls.jsonl", limits) as provider:
        cfg = load_config(HARBOR, [
            f"envs.local.import_path={BACKEND}",
            "envs.local.environment_kwargs=" + json.dumps({"url": provider.url, "reward": 1.0}),
            "envs.local.provider=fake", "envs.local.probe_verifier=false",
            "providers.fake=" + json.dumps({"create_rate_per_s": rate, "max_live": live,
                                            "rate_limit_backoff": {"initial_s": 0.3, "max_s": 3.0}}),
            "rollout.group_size=4", "workers.max_retries=1",
        ])

        def storm() -> None:
            time.sleep(4.0)
            httpx.put(f"{provider.url}/limits", json={"create_rate_per_s": rate / 2, "max_live": live // 2})

        lowering = threading.Thread(target=storm, daemon=True)
        lowering.start()
        summary = collect(cfg, tmp_path / "out", progress=False)
        lowering.join()
    figures = audit(provider.log_path)
    assert summary["completed"] == summary["requested"] == 9 * 4
    assert summary["status_counts"] == {"ok": 36} and summary["reward_mean"] == 1.0
    assert summary["leaked_envs"] == 0 and summary["retried_attempts"] == 0
    assert figures.rejected > 0, "the storm refused nothing: the test did not test anything"
    assert figures.creates == 36 and figures.live == 0 and figures.max_live <= live
