"""`-v` reaches the actors: the learner (and the env pool actors it starts) log their INFO lines (evaluation reward,
warm-up, weight pushes) when the driver was run with `-v`, and stay at WARNING without it."""

from __future__ import annotations

import logging
import os

import pytest
import ray

from raygrpo.core.environ import LOG_LEVEL_ENV, configure_logging

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]


class LevelProbe:
    """A learner whose `train()` says whether a raygrpo logger in its process logs at INFO."""

    def __init__(self) -> None:
        self.progress: dict = {}

    def train(self) -> dict:
        return {"info": logging.getLogger("raygrpo.train.learner").isEnabledFor(logging.INFO)}


@pytest.mark.parametrize("verbose", [True, False])
def test_the_learner_logs_at_info_when_the_driver_has_v(ray_local, monkeypatch, verbose):
    from raygrpo.actors.learner import start_learner

    monkeypatch.setenv(LOG_LEVEL_ENV, "")
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)
    configure_logging(verbose)  # what `raygrpo -v` does in the driver
    assert os.environ[LOG_LEVEL_ENV] == ("INFO" if verbose else "WARNING")
    learner = start_learner(f"{__name__}:LevelProbe", num_cpus=0, num_gpus=0)
    try:
        assert ray.get(learner.train.remote(), timeout=60) == {"info": verbose}
    finally:
        ray.kill(learner, no_restart=True)
