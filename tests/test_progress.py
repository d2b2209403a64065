"""Progress in log mode (stderr not a terminal, as under `ray job submit`): a burst of updates sooner than
`log_every_s` after the last line is held, not dropped; the latest count appears within `log_every_s`, and the
final one always appears when the run ends."""

from __future__ import annotations

import time

import pytest

from raygrpo.driver.progress import Progress

pytestmark = pytest.mark.timeout(30)


def _lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line]


def test_the_final_count_is_printed_when_the_run_ends(capsys):
    now = [0.0]
    with Progress("steps", None, "log", log_every_s=60.0, clock=lambda: now[0]) as bar:
        bar.update(1)
        now[0] = 10.0
        bar.update(2)
        now[0] = 20.0
        bar.update(3, "reward 0.5")
    lines = _lines(capsys)
    assert [line.split("  ")[0] for line in lines] == ["steps 1", "steps 3"]
    assert "reward 0.5" in lines[-1]


def test_a_held_count_appears_within_log_every_s_without_another_update(capsys):
    with Progress("rollouts", 10, "log", log_every_s=0.3) as bar:
        bar.update(1)
        bar.update(4)  # within log_every_s of the first line: held
        seen, deadline = [], time.monotonic() + 5
        while not any(line.startswith("rollouts 4/10") for line in seen) and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += _lines(capsys)
        assert [line.split("  ")[0] for line in seen] == ["rollouts 1/10", "rollouts 4/10"]
    assert _lines(capsys) == []  # nothing held any more: the end adds no line
