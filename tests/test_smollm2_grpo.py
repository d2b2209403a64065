"""Two GRPO steps on SmolLM2-135M-Instruct on the CPU, through the learner path of the GPU check (no Ray): the
weights change, and after the weight sync the engine's log-probs match the learner's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parent.parent


def test_two_grpo_steps_on_smollm2(tmp_path):
    pytest.importorskip("gguf")
    from raygrpo.policy.tiny import resolve_model_path

    resolve_model_path("smollm2-135m")  # fetched and converted once per machine (see test_gguf_model.py)
    # The base model answers in prose, not through the tool: its plain answers are scored, with the dense reward
    # (right = 1.0, less the further off), so a group's rewards differ and GRPO has advantages to learn from.
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--model", "smollm2-135m",
           "--steps", "2", "--groups", "2", "--group-size", "4", "--eval-tasks", "2", "--max-tokens", "48",
           "--warmup-steps", "0", "--lr", "1e-5", "--plain-answers", "--graded", "--out", str(tmp_path / "out")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=880, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == 2 and result["parameters"] > 134_000_000
    # A group whose rewards differ has non-zero advantages, hence a gradient.
    assert any(std and std > 0 for std in result["train_reward_std_by_step"]), result
    assert result["weights_changed"]
    assert result["eval_after"]["policy_version"] == 2
    assert result["sync_logprob_max_abs_diff"] < 1e-3
