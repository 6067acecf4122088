"""Average-case adaptive sharpness (loop and vmap), neighbourhood loss, exact restore."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import TensorDataset

from flatlab.errors import ConfigError, UnknownNameError
from flatlab.sharpness import (
    as_subset,
    average_sharpness,
    average_sharpness_batched,
    group_parameters,
    layerwise_sharpness,
    neighbourhood_loss,
)


def test_adaptive_sharpness_of_a_quadratic_matches_the_closed_form(quad, kit):
    model, H, w = quad
    rho = 0.3
    est = average_sharpness(model, kit.QUAD_DATA, rho=rho, n_draws=4000, params=["w"], loss_fn=kit.quadratic_loss)
    exact = rho**2 / 2 * float((H * torch.outer(w.abs(), w.abs())).trace())  # rho^2/2 tr(H . |w||w|^T)
    assert est.n == 4000 and len(est.values) == 4000 and est.adaptive and est.rho == rho
    assert est.clean_loss == pytest.approx(0.5 * float(w @ H @ w), rel=1e-12)
    assert 0 < est.stderr < 0.1 * exact
    assert abs(est.value - exact) < 3 * est.stderr


def test_non_adaptive_sharpness_of_a_quadratic_is_half_rho_squared_trace(quad, kit):
    model, H, _ = quad
    rho = 0.2
    est = average_sharpness(
        model, kit.QUAD_DATA, rho=rho, n_draws=4000, adaptive=False, params=["w"], loss_fn=kit.quadratic_loss
    )
    exact = rho**2 / 2 * float(H.trace())
    assert abs(est.value - exact) < 3 * est.stderr
    assert est.stderr < 0.1 * exact


def test_group_that_does_not_affect_the_loss_has_exactly_zero_sharpness(quad, kit):
    model, _, _ = quad
    groups = group_parameters(model)
    assert groups == {"w": ("w",), "unused": ("unused.weight", "unused.bias")}
    layers = layerwise_sharpness(model, kit.QUAD_DATA, groups, rho=1.0, n_draws=5, loss_fn=kit.quadratic_loss)
    assert layers["unused"].value == 0.0 and layers["unused"].values == (0.0,) * 5
    assert layers["w"].value > 0
    batched = average_sharpness_batched(
        model, kit.QUAD_DATA, n_draws=5, params=list(groups["unused"]), loss_fn=kit.quadratic_loss
    )
    assert batched.value == 0.0


def test_same_seed_same_noise_different_seed_different_noise(quad, kit):
    model, _, _ = quad
    kw = dict(rho=0.5, n_draws=6, loss_fn=kit.quadratic_loss)
    a = average_sharpness(model, kit.QUAD_DATA, seed=3, **kw)
    b = average_sharpness(model, kit.QUAD_DATA, seed=3, **kw)
    c = average_sharpness(model, kit.QUAD_DATA, seed=4, **kw)
    assert a == b
    assert a.values != c.values
    # the noise z is shared across models: for c = 1 and w = 0 the draws reduce to 1/2 delta^T H delta
    zero = kit.Quadratic(model.H, torch.zeros(8, dtype=torch.float64))
    other = kit.Quadratic(2 * model.H, torch.zeros(8, dtype=torch.float64))
    za = average_sharpness(zero, kit.QUAD_DATA, seed=3, adaptive=False, params=["w"], **kw)
    zb = average_sharpness(other, kit.QUAD_DATA, seed=3, adaptive=False, params=["w"], **kw)
    assert zb.values == pytest.approx([2 * v for v in za.values], rel=1e-12)


@pytest.mark.parametrize("adaptive", [True, False])
def test_batched_variant_equals_the_loop_for_the_same_noise(kit, adaptive):
    torch.manual_seed(0)
    model = kit.TinyConvNet()
    x = torch.randn(12, 3, 6, 6)
    y = torch.randint(0, 5, (12,))
    data = [(x[:5], y[:5]), (x[5:], y[5:])]  # unequal batches: example-weighted mean
    kw = dict(rho=0.5, n_draws=7, adaptive=adaptive, seed=11)
    loop = average_sharpness(model, data, **kw)
    vm = average_sharpness_batched(model, data, draws_per_forward=3, **kw)
    assert vm.clean_loss == loop.clean_loss
    assert max(abs(a - b) for a, b in zip(loop.values, vm.values)) < 1e-5
    assert abs(loop.value - vm.value) < 1e-5 and vm.n == 7


def test_batched_variant_on_a_clip_like_model_with_multihead_attention(kit):
    model = kit.TinyCLIPClassifier()
    x = torch.randn(6, 3, 8, 8)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    block = group_parameters(model, "clip")["visual.transformer.resblocks.1"]
    kw = dict(rho=0.5, n_draws=4, params=list(block), seed=2)
    loop = average_sharpness(model, [(x, y)], **kw)
    vm = average_sharpness_batched(model, [(x, y)], draws_per_forward=4, **kw)
    assert max(abs(a - b) for a, b in zip(loop.values, vm.values)) < 1e-5
    assert loop.value != 0.0


def test_neighbourhood_loss_mean_and_variance_of_a_quadratic(quad, kit):
    model, H, w = quad
    sigma = 0.2
    res = neighbourhood_loss(model, kit.QUAD_DATA, sigma=sigma, n_draws=4000, params=["w"], loss_fn=kit.quadratic_loss)
    mean = 0.5 * float(w @ H @ w) + sigma**2 / 2 * float(H.trace())
    var = sigma**2 * float((H @ w).pow(2).sum()) + sigma**4 / 2 * float((H @ H).trace())
    assert abs(res.mean - mean) < 3 * res.stderr
    assert res.variance == pytest.approx(var, rel=0.1)  # sampling error of a variance ~ sqrt(2/n) ~ 2%
    assert res.clean_loss == pytest.approx(0.5 * float(w @ H @ w), rel=1e-12) and res.sigma == sigma


def test_tensor_dataset_and_list_of_batches_give_the_same_value(kit):
    model = kit.make_mlp()
    batches = kit.classification_data(n=24, batch=8)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    a = average_sharpness(model, batches, n_draws=3)
    b = average_sharpness(model, TensorDataset(x, y), n_draws=3, batch_size=8)
    assert a.values == pytest.approx(b.values, rel=1e-12, abs=1e-15)
    assert as_subset(TensorDataset(x, y), batch_size=10).m == 24


def test_model_restored_after_an_exception_mid_measure(kit, unchanged):
    model = kit.TinyConvNet().train()
    x, y = torch.randn(4, 3, 6, 6), torch.randint(0, 5, (4,))
    calls = []

    def flaky(out, targets):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return torch.nn.functional.cross_entropy(out, targets)

    with unchanged(model):
        with pytest.raises(RuntimeError, match="boom"):
            average_sharpness(model, [(x, y)], n_draws=5, loss_fn=flaky)


def test_argument_errors_name_the_rule(kit):
    model = kit.make_mlp()
    data = kit.classification_data()
    with pytest.raises(ConfigError, match=r"rho must be a finite number > 0; got 0"):
        average_sharpness(model, data, rho=0)
    with pytest.raises(ConfigError, match=r"n_draws must be an integer >= 1; got 0"):
        average_sharpness(model, data, n_draws=0)
    with pytest.raises(UnknownNameError, match=r"unknown parameter name 'head.weight'.*valid names: 0.weight, 0.bias"):
        average_sharpness(model, data, params=["head.weight"])
    with pytest.raises(ConfigError, match=r"not the string '0.weight'"):
        average_sharpness(model, data, params="0.weight")
    with pytest.raises(ConfigError, match=r"at least one batch"):
        average_sharpness(model, [])
    with pytest.raises(ConfigError, match=r"draws_per_forward must be an integer >= 1"):
        average_sharpness_batched(model, data, draws_per_forward=0)
    assert math.isnan(average_sharpness(model, data, n_draws=1).stderr)
