"""TRL's own `trl.experimental.openreward.OpenRewardSpec` (sync SDK) works against our example echo server: the
same server serves TRL's serial tool loop and raygrpo's adapters."""

from __future__ import annotations

import pytest

from tests.ors_utils import ECHO, ors_server


@pytest.mark.timeout(180)
def test_trl_openreward_spec_against_echo_server(monkeypatch):
    from trl.experimental.openreward import OpenRewardSpec  # ~13 s import

    with ors_server([ECHO]) as running:
        # A single-host self-hosted server: TRL's guide sets both URLs so the SDK does not use api./sessions.<host>.
        monkeypatch.setenv("OPENREWARD_API_URL", running.url)
        monkeypatch.setenv("OPENREWARD_SESSION_URL", running.url)
        spec = OpenRewardSpec(running.url, env_name="echoenvironment")

        dataset = spec.train_dataset
        assert len(dataset) == 8
        assert {"prompt", "task_index", "target"} <= set(dataset.column_names)
        assert dataset[0]["target"] == "hello" and dataset["task_index"] == list(range(8))

        env = spec.environment_factory()
        try:
            prompt = env.reset(task_index=0)
            assert "Echo 'hello' to win" in prompt
            assert running.live_sessions() == 1
            assert env.echo(text="hello") == "match"
            assert env.reward == 1.0 and env.finished
            assert spec.reward_funcs(environments=[env]) == [1.0]

            env.reset(task_index=1)
            assert env.reward is None
            assert env.echo(text="hello") == "no match"
            assert env.reward == 0.0
        finally:
            env._close()
            spec._sdk_client.close()
        assert running.live_sessions() == 0
