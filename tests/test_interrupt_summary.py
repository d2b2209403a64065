"""A Ctrl-C before the run's actors are up (Ray still starting, actors still starting) writes the partial summary
the CLI points to, with the rollouts that were requested counted as cancelled, not `requested: 0`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["ray start", "actors start"])
@pytest.mark.parametrize("example", ["harbor_local", "echo"])
def test_a_ctrl_c_before_the_actors_are_up_writes_an_honest_summary(tmp_path, monkeypatch, where, example):
    """harbor_local's suite is listed before Ray starts: its 9 tasks x 2 requested rollouts are all cancelled. echo's
    embedded server lists its tasks only once started: how many were requested is not known (null, not 0)."""
    import ray

    from raygrpo.config import load_config
    from raygrpo.driver import session
    from raygrpo.driver.collect import collect

    cfg = load_config(str(ROOT / "examples" / example / "rollout.yaml"))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # this run starts its own Ray, as the CLI's does
    if where == "ray start":
        monkeypatch.setattr(session, "init_ray", _interrupt)
    else:
        monkeypatch.setattr(session, "init_ray", lambda **kw: None)
        monkeypatch.setattr(session.RolloutRuntime, "_start", _interrupt)
    with pytest.raises(KeyboardInterrupt):
        collect(cfg, tmp_path / "run", progress=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["completed"] == 0
    if example == "harbor_local":
        assert summary["requested"] == 18 and summary["status_counts"] == {"cancelled": 18}
    else:
        assert summary["requested"] is None and summary["status_counts"] == {}
