"""The GPU check's `--dry-run`: the learner path without Ray (GRPOTrainer + raygrpo's trainer subclass, the in-process
rollout function, the transformers engine) on the CPU at tiny sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_run_prints_its_figures(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=280, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])  # one JSON object, last
    assert result["kind"] == "raygrpo-gpu-check" and result["dry_run"] and result["device"] == "cpu"
    assert result["steps"] == 2 and len(result["train_reward_by_step"]) == 2
    assert result["completion_tokens"] > 0 and result["s_per_step"] > 0 and result["tokens_per_s"] > 0
    for key in ("eval_before", "eval_after"):
        assert result[key]["rollouts"] == 4 and result[key]["scored_fraction"] == 1.0
        assert result[key]["reward_ci95"] is not None
        # The sums reward without --graded is 0 or 1: the fraction given the full reward is the mean.
        assert result[key]["solved_fraction"] == pytest.approx(result[key]["reward_mean"])
    assert result["eval_before"]["policy_version"] == 0 and result["eval_after"]["policy_version"] == 2
    # After the weight sync the engine scores tokens as the learner does.
    assert result["sync_logprob_max_abs_diff"] < 1e-4
    assert result["peak_gpu_memory_bytes"] is None
