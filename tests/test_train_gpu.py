"""The learner (and the transformers engine) on a GPU. Skipped where there is no CUDA device.

Run on a GPU machine with `pytest -m gpu tests/test_train_gpu.py`.
"""

from __future__ import annotations

import pytest

from tests.test_train_e2e import _config, _train_lines

pytestmark = [pytest.mark.gpu, pytest.mark.ray, pytest.mark.timeout(600)]


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_learner_trains_on_the_gpu(ray_local, tiny_model_dir, tmp_path, mode):
    from raygrpo.train.run import train

    # Ray detects the GPU itself; the learner reserves it, the engine stays on the CPU.
    cfg = _config(tiny_model_dir, train={"mode": mode, "learner": {"num_gpus": 1}}, trainer={"max_steps": 3})
    summary = train(cfg, tmp_path / "run", progress=False)
    lines = _train_lines(tmp_path / "run")
    assert [r["step"] for r in lines] == [1, 2, 3] and summary["leaked_envs"] == 0
    assert all(r["loss"] is not None for r in lines)
