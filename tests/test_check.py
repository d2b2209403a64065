"""`raygrpo check` and `raygrpo train --skip-broken`, through the command line, on real Harbor task folders written
here and on the example suite, over Ray (the session's local runtime) with the local sandbox backend.

The written suite holds a sound task whose solution copies `/solution/<file>` into place (which pasting the script's
text cannot run), a task whose reference solution fails, a task whose verifier passes the untouched sandbox, and a
task without `solution/solve.sh`. Sandboxes are checked through the OS afterwards.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from raygrpo.driver.check import CHECK_KIND, read_broken_tasks
from raygrpo.cli import main
from raygrpo.config import load_config
from raygrpo.core.errors import ResolveError
from raygrpo.sandbox.os_probe import process_env_marks, sandbox_mounts
from raygrpo.sandbox.owners import live_sandboxes
from raygrpo.train.run import resolve_train
from tests.harbor_utils import EXAMPLE_DIR, make_task
from tests.ors_utils import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

COPIED_TEST = """#!/bin/bash
if [ "$(cat /app/answer.txt 2>/dev/null)" = "42" ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""
ALWAYS_PASSES = """#!/bin/bash
echo 1 > /logs/verifier/reward.txt
"""


def write_suite(root: Path) -> Path:
    suite = root / "suite"
    task = make_task(suite, "copies", test_sh=COPIED_TEST, solve_sh="cp /solution/answer.txt /app/answer.txt")
    (task / "solution" / "answer.txt").write_text("42\n")
    make_task(suite, "broken-oracle", solve_sh="echo 'writing the answer'\necho 'cp: /solution/x: missing' >&2\nexit 1")
    make_task(suite, "noop-passes", test_sh=ALWAYS_PASSES)
    (make_task(suite, "no-solution") / "solution" / "solve.sh").unlink()
    return suite


def no_sandboxes_left(base: Path) -> bool:
    def state():
        procs = [pid for pid, (root, _) in process_env_marks().items() if root and root.startswith(str(base))]
        return procs, sandbox_mounts(base), [s.sandbox_id for s in live_sandboxes(str(base))] if base.exists() else []

    return wait_until(lambda: state() == ([], [], []), 10)


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """`raygrpo check SUITE --json FILE` run once on the written suite: (exit code, stdout, the JSON, the suite)."""
    root = tmp_path_factory.mktemp("check")
    suite = write_suite(root)
    mp = pytest.MonkeyPatch()
    mp.setenv("RAYGRPO_SANDBOX_ROOT", str(root / "sandboxes"))
    try:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["check", str(suite), "--json", str(root / "check.json"), "--no-progress",
                         "--out", str(root / "out")])
    finally:
        mp.undo()
    assert no_sandboxes_left(root / "sandboxes")
    return code, out.getvalue(), json.loads((root / "check.json").read_text()), suite, root


@pytest.mark.timeout(300)
def test_check_judges_each_task_and_exits_1_on_broken_ones(checked):
    code, stdout, data, suite, root = checked
    assert code == 1
    assert data["kind"] == CHECK_KIND and data["tasks"] == 4 and data["broken"] == 3 and data["leaked_envs"] == 0
    verdicts = {Path(v["task_dir"]).name: v for v in data["verdicts"]}
    ok = verdicts["copies"]  # the solution's own file reached /solution
    assert (ok["status"], ok["oracle_reward"], ok["noop_reward"], ok["oracle_exit_code"]) == ("ok", 1.0, 0.0, 0)
    failing = verdicts["broken-oracle"]
    assert failing["status"] == "oracle_below_threshold" and failing["oracle_reward"] == 0.0
    assert failing["cause"] == "solve.sh exited 1: cp: /solution/x: missing"
    passes = verdicts["noop-passes"]
    assert passes["status"] == "noop_passes" and passes["noop_reward"] == 1.0 and "untouched sandbox" in passes["cause"]
    missing = verdicts["no-solution"]
    assert missing["status"] == "oracle_task_error" and missing["oracle_reward"] is None
    assert str(suite / "no-solution" / "solution" / "solve.sh") in missing["cause"]
    # The table: one row per task with its rewards and status, and the cause's first line.
    for name in ("copies", "broken-oracle", "noop-passes", "no-solution", "oracle_below_threshold", "noop_passes",
                 "oracle_task_error", "solve.sh exited 1"):
        assert name in stdout, (name, stdout)
    # Every rollout's trajectory is kept: the oracle's step says what solve.sh did.
    trajs = [json.loads(line) for line in (root / "out" / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 8
    assert any(s["tool"] == "(solution)" and s["metadata"]["exit_code"] == 1 for t in trajs for s in t["steps"])


@pytest.mark.timeout(300)
def test_check_of_the_example_suite_passes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYGRPO_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    code = main(["check", str(EXAMPLE_DIR / "rollout.yaml"), "--json", str(tmp_path / "check.json"), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads((tmp_path / "check.json").read_text())
    assert data["tasks"] == 9 and data["broken"] == 0 and data["leaked_envs"] == 0
    assert all((v["oracle_reward"], v["noop_reward"]) == (1.0, 0.0) for v in data["verdicts"])
    assert "9 of 9 tasks ok" in out and "count-words" in out
    assert no_sandboxes_left(tmp_path / "sandboxes")


@pytest.mark.timeout(300)
def test_check_of_one_task_folder(checked, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RAYGRPO_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    suite = checked[3]
    assert main(["check", str(suite / "copies"), "--no-progress"]) == 0
    assert "1 of 1 tasks ok" in capsys.readouterr().out
    assert main(["check", str(suite / "noop-passes"), "--no-progress"]) == 1
    assert no_sandboxes_left(tmp_path / "sandboxes")


@pytest.mark.timeout(60)
def test_check_refuses_what_it_cannot_check_with_exit_2(tmp_path, capsys):
    assert main(["check", "examples/echo/rollout.yaml"]) == 2
    assert "envs.echo: raygrpo check runs Harbor tasks" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "nowhere.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["check", str(tmp_path / "empty")]) == 2
    assert "envs.tasks.path" in capsys.readouterr().err


# ── raygrpo train --skip-broken ──────────────────────────────────────────────────────────────────────────────────


def train_config(suite: Path):
    return load_config(data={
        "envs": {"suite": {"kind": "harbor", "path": str(suite)}},
        "policy": {"kind": "scripted", "script": f"{EXAMPLE_DIR}/policies.py:wrong"},
    })


@pytest.mark.timeout(300)
def test_skip_broken_leaves_the_broken_tasks_out_of_training_and_says_which(checked, caplog):
    _, _, _, suite, root = checked
    names = {v.task for v in read_broken_tasks(root / "check.json")}
    assert names == {"tests/broken-oracle", "tests/noop-passes", "tests/no-solution"}
    with caplog.at_level(logging.WARNING, logger="raygrpo.driver.resolve"):
        resolved = resolve_train(train_config(suite), root / "check.json")
    assert [Path(t.metadata["task_dir"]).name for t in resolved.tasks_by_env["suite"]] == ["copies"]
    assert sorted(Path(t.metadata["task_dir"]).name for t in resolved.skipped) == ["broken-oracle", "no-solution",
                                                                                   "noop-passes"]
    assert "leaving out 3 broken task(s) of envs.suite" in caplog.text and "tests/noop-passes" in caplog.text
    # Without the file nothing is left out.
    assert len(resolve_train(train_config(suite)).tasks_by_env["suite"]) == 4


@pytest.mark.timeout(60)
def test_skip_broken_refuses_a_file_that_is_not_a_check_result(tmp_path, capsys):
    suite = write_suite(tmp_path)
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"requested": 4, "status_counts": {"ok": 4}}))
    with pytest.raises(ResolveError, match=rf"^--skip-broken: {summary} is not a raygrpo check result"):
        resolve_train(train_config(suite), summary)
    (tmp_path / "notes.txt").write_text("not json")
    with pytest.raises(ResolveError, match="not JSON"):
        resolve_train(train_config(suite), tmp_path / "notes.txt")
    # Through the command line: exit 2 before Ray starts, naming the file.
    config = tmp_path / "train.yaml"
    config.write_text(f"envs: {{suite: {{kind: harbor, path: {suite}}}}}\n"
                      f"policy: {{kind: scripted, script: {EXAMPLE_DIR}/policies.py:wrong}}\n")
    assert main(["train", str(config), "--out", str(tmp_path / "run"), "--skip-broken", str(summary)]) == 2
    assert f"--skip-broken: {summary} is not a raygrpo check result" in capsys.readouterr().err
