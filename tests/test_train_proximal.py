"""The moving average of the learner's weights that is PPO-EWMA's proximal policy (`raygrpo.train.proximal`)."""

from __future__ import annotations

import logging

import pytest
import torch

from raygrpo.train.proximal import PROXIMAL_FILE, ProximalWeights

pytestmark = pytest.mark.timeout(60)


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[1].weight.requires_grad_(False)  # a frozen weight (a LoRA run's base model) is not averaged
    return model


def test_the_average_starts_at_the_weights_and_moves_towards_them_by_one_minus_decay():
    model = _model()
    proximal = ProximalWeights(0.75)
    proximal.advance(model)
    start = model[0].weight.detach().clone()
    assert set(proximal.average) == {"0.weight", "0.bias", "1.bias"}
    with torch.no_grad():
        model[0].weight.add_(4.0)
    proximal.advance(model)
    assert torch.allclose(proximal.average["0.weight"], start + 1.0)
    proximal.advance(model)
    assert torch.allclose(proximal.average["0.weight"], start + 1.75)


def test_the_average_is_swapped_in_for_the_proximal_pass_and_out_again_even_on_an_error():
    model = _model()
    proximal = ProximalWeights(0.5)
    with pytest.raises(RuntimeError, match="advance"):
        with proximal.swapped_in(model):
            pass
    proximal.advance(model)
    with torch.no_grad():
        model[0].weight.add_(2.0)
    learner = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x = torch.ones(1, 3)
    with proximal.swapped_in(model):
        assert torch.allclose(model[0].weight, learner["0.weight"] - 2.0)
        assert torch.equal(model[1].weight, learner["1.weight"])  # frozen: the learner's
        proximal_out = model(x)
    assert torch.equal(model[0].weight, learner["0.weight"])
    assert not torch.allclose(proximal_out, model(x))
    with pytest.raises(ValueError):
        with proximal.swapped_in(model):
            raise ValueError("a failed forward pass")
    assert all(torch.equal(v, learner[k]) for k, v in model.state_dict().items())
    # The optimizer keeps training the learner's parameters, not the average.
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model(x).sum().backward()
    optimizer.step()
    assert not torch.equal(model[0].weight, learner["0.weight"])
    assert torch.allclose(proximal.average["0.weight"], learner["0.weight"] - 2.0)


def test_the_average_survives_a_checkpoint_and_a_checkpoint_without_one_restarts_it(tmp_path, caplog):
    model = _model()
    proximal = ProximalWeights(0.5)
    proximal.advance(model)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    proximal.advance(model)
    proximal.save(tmp_path)
    assert (tmp_path / PROXIMAL_FILE).is_file()
    resumed = ProximalWeights(0.5)
    resumed.load(tmp_path)
    assert all(torch.equal(resumed.average[k], proximal.average[k]) for k in proximal.average)

    empty = tmp_path / "older"
    empty.mkdir()
    with caplog.at_level(logging.WARNING, logger="raygrpo.train.proximal"):
        resumed.load(empty)
    assert resumed.average is None and "keeps no proximal average" in caplog.text
    resumed.advance(model)
    assert torch.equal(resumed.average["0.weight"], model[0].weight)


def test_a_decay_outside_zero_to_one_is_refused():
    for decay in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="decay must be in"):
            ProximalWeights(decay)
