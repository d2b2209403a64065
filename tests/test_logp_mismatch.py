"""The sampling/learner log-prob mismatch on hand-made tensors: which tokens count, and the two figures."""

from __future__ import annotations

import math

import pytest
import torch

from raygrpo.train.logp_mismatch import FIELDS, fresh_rows, logp_mismatch

pytestmark = pytest.mark.timeout(60)

NAN = float("nan")


def test_only_model_tokens_of_fresh_rows_count():
    learner = torch.tensor([
        [-1.0, -2.0, -3.0, -4.0],  # fresh: tokens 0 and 3 count (1 and 2 are tool results)
        [-1.0, -1.0, -1.0, -1.0],  # stale: left out whatever its gap
        [-0.5, -0.5, -0.5, -0.5],  # fresh, one padded position and one the engine could not score
    ])
    sampling = torch.tensor([
        [-1.5, -9.0, -9.0, -3.0],
        [-9.0, -9.0, -9.0, -9.0],
        [-0.5, NAN, -9.0, 0.0],
    ])
    completion_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]])
    tool_mask = torch.tensor([[1, 0, 0, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    fresh = torch.tensor([True, False, True])
    figures = logp_mismatch(learner, sampling, completion_mask, tool_mask, fresh)
    d = torch.tensor([0.5, -1.0, 0.0, 8.5])  # rows 0 (tokens 0, 3) and 2 (tokens 0, 2)
    assert figures["logp_mismatch_mean"] == pytest.approx(d.abs().mean().item())
    assert figures["logp_mismatch_k3"] == pytest.approx((d.exp() - 1 - d).mean().item(), rel=1e-5)


def test_k3_is_the_kl_estimator_and_zero_without_a_gap():
    ones = torch.ones(1, 3)
    same = logp_mismatch(-ones, -ones, ones, None, torch.tensor([True]))
    assert same == {"logp_mismatch_mean": 0.0, "logp_mismatch_k3": 0.0}
    # Learner one nat above the sampler on every token: |d| = 1, k3 = e - 2.
    shifted = logp_mismatch(-ones, -2 * ones, ones, None, torch.tensor([True]))
    assert shifted["logp_mismatch_mean"] == pytest.approx(1.0)
    assert shifted["logp_mismatch_k3"] == pytest.approx(math.e - 2, rel=1e-6)
    below = logp_mismatch(-2 * ones, -ones, ones, None, torch.tensor([True]))
    assert below["logp_mismatch_k3"] == pytest.approx(math.exp(-1), rel=1e-6)  # e^-1 - 1 + 1: positive either way


def test_no_fresh_model_token_gives_no_figure():
    ones = torch.ones(2, 3)
    none = dict.fromkeys(FIELDS)
    assert logp_mismatch(-ones, 0 * ones, ones, None, torch.tensor([False, False])) == none  # all stale
    assert logp_mismatch(-ones, 0 * ones, ones, torch.zeros(2, 3), torch.tensor([True, True])) == none  # all tools
    assert logp_mismatch(-ones, 0 * ones, torch.zeros(2, 3), None, torch.tensor([True, True])) == none  # padding


def test_fresh_rows_are_those_of_the_version_being_trained():
    assert fresh_rows([3, 2, None, 3], 3).tolist() == [True, False, False, True]
    assert fresh_rows([0, 0], None).tolist() == [False, False]
