"""Straggler detection, seeded Bernoulli(0.5) pruning (seed Algorithm 1), sharpness along the path."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.interpolation import (
    find_stragglers,
    interpolate,
    prune_stragglers,
    pruned_interpolation,
    sharpness_along_path,
)
from flatlab.sharpness import SharpnessEstimate, average_sharpness, group_parameters


def _estimate(value: float) -> SharpnessEstimate:
    return SharpnessEstimate(value, 0.0, 1, (value,), 1.0, 1.0, True)


def test_find_stragglers_uses_the_threshold():
    layers = {"a": 0.5, "b": 1e-5, "c": _estimate(-2e-4), "d": _estimate(0.02)}
    assert find_stragglers(layers) == ["b", "c"]  # default 1e-3
    assert find_stragglers(layers, threshold=0.1) == ["b", "c", "d"]
    assert find_stragglers(layers, threshold=-1.0) == []
    with pytest.raises(ConfigError, match=r"threshold must be a finite number"):
        find_stragglers(layers, threshold=float("inf"))


def _wide_pair():
    torch.manual_seed(0)
    zs = nn.Sequential(nn.Linear(40, 50), nn.Linear(50, 3)).state_dict()
    torch.manual_seed(1)
    ft = nn.Sequential(nn.Linear(40, 50), nn.Linear(50, 3)).state_dict()
    return zs, ft


def test_pruning_zeroes_about_half_of_the_straggler_entries_and_nothing_else():
    zs, ft = _wide_pair()
    keys = ["0.weight", "0.bias"]  # 2000 + 50 entries
    pruned = prune_stragglers(ft, keys, seed=7)
    n = ft["0.weight"].numel() + ft["0.bias"].numel()
    zeroed = sum(int((pruned[k] == 0).sum()) for k in keys)
    assert all(int((ft[k] == 0).sum()) == 0 for k in keys)  # every zero comes from the mask
    assert abs(zeroed - n / 2) <= 4 * math.sqrt(n / 4)  # Binomial(n, 1/2): 4 standard deviations
    for k in keys:  # kept entries unchanged
        kept = pruned[k] != 0
        assert torch.equal(pruned[k][kept], ft[k][kept])
    for k in ("1.weight", "1.bias"):  # non-straggler layers bitwise unchanged
        assert torch.equal(pruned[k], ft[k])
    again = prune_stragglers(ft, keys, seed=7)
    other = prune_stragglers(ft, keys, seed=8)
    assert all(torch.equal(again[k], pruned[k]) for k in ft)  # reproducible by seed
    assert not torch.equal(other["0.weight"], pruned["0.weight"])
    assert float(ft["0.weight"].abs().min()) > 0  # the input was not modified


def test_pruned_interpolation_is_interpolation_with_the_pruned_fine_tuned_model():
    zs, ft = _wide_pair()
    keys = ["1.weight"]
    pruned = prune_stragglers(ft, keys, seed=3)
    at1 = pruned_interpolation(zs, ft, 1.0, keys, seed=3)
    at0 = pruned_interpolation(zs, ft, 0.0, keys, seed=3)
    mid = pruned_interpolation(zs, ft, 0.4, keys, seed=3)
    assert all(torch.equal(at1[k], pruned[k]) for k in ft)
    assert all(torch.equal(at0[k], zs[k]) for k in zs)
    assert torch.allclose(mid["1.weight"], 0.6 * zs["1.weight"] + 0.4 * pruned["1.weight"], atol=1e-7)
    with pytest.raises(ConfigError, match=r"straggler key 'head.weight' is not in the fine-tuned state dict"):
        prune_stragglers(ft, ["head.weight"])
    with pytest.raises(ConfigError, match=r"drop_prob must be in \[0, 1\]"):
        prune_stragglers(ft, keys, drop_prob=1.5)


def test_sharpness_along_the_path_general_and_layerwise():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3), nn.Linear(3, 3))
    zs = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    ft = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3), nn.Linear(3, 3)).state_dict()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(16, 4, generator=g), torch.randint(0, 3, (16,), generator=g))]
    groups = group_parameters(model)
    path = sharpness_along_path(
        model,
        zs,
        ft,
        data,
        alphas=(0.0, 0.5, 1.0),
        groups=groups,
        layer_sharpness="interpolated",
        rho=0.5,
        n_draws=4,
        seed=5,
    )
    assert all(torch.equal(model.state_dict()[k], original[k]) for k in original)  # model restored
    assert path.matrix().shape == (3, 3) and list(path.layerwise) == ["0", "2", "3"]
    # the alpha = 0.5 entry is exactly average_sharpness of the interpolated model with the same seed
    probe = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3), nn.Linear(3, 3))
    probe.load_state_dict(interpolate(zs, ft, 0.5))
    assert path.general[1] == average_sharpness(probe, data, rho=0.5, n_draws=4, seed=5)
    assert path.layerwise["2"][1] == average_sharpness(probe, data, rho=0.5, n_draws=4, seed=5, params=groups["2"])
    assert path.general_values()[0] > 0
