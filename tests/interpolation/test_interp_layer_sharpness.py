"""Layer-wise sharpness along the path as the seed paper's §3.1 defines it (perturb the fine-tuned model's
layer, then interpolate), against a hand computation on a two-layer linear model, and beside the other
definition (perturb the interpolated model's layer)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flatlab.errors import ConfigError
from flatlab.interpolation import finetuned_layer_sharpness, interpolate, sharpness_along_path
from flatlab.sharpness import average_sharpness

GROUPS = {"first": ["0.weight"], "second": ["1.weight"]}


def _linear(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4, bias=False), nn.Linear(4, 2, bias=False)).double()


@pytest.fixture
def setting():
    model = _linear(0)
    zs = {k: v.clone() for k, v in model.state_dict().items()}
    ft = {k: v.clone() for k, v in _linear(1).state_dict().items()}
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    y = torch.randn(5, 2, generator=g, dtype=torch.float64)
    return model, zs, ft, [(x, y)]


def _loss(w1, w2, x, y) -> float:
    return float(((x @ w1.T @ w2.T - y) ** 2).mean())  # F.mse_loss, mean over examples and outputs


def test_each_draw_perturbs_the_fine_tuned_layer_then_interpolates(setting):
    model, zs, ft, data = setting
    (x, y), alpha, rho, draws, seed = data[0], 0.3, 0.7, 4, 11
    got = finetuned_layer_sharpness(
        model, zs, ft, alpha, data, GROUPS, rho=rho, n_draws=draws, seed=seed, loss_fn=F.mse_loss
    )
    # by hand: the draws z_k of the documented stream (one generator, draw by draw, tensor by tensor), the
    # fine-tuned first layer perturbed by rho |W1_ft| z_k, then the interpolation, then the loss
    gen = torch.Generator().manual_seed(seed)
    z = [torch.randn(ft["0.weight"].shape, generator=gen, dtype=torch.float64) for _ in range(draws)]
    mix = lambda a, b: (1 - alpha) * a + alpha * b  # noqa: E731
    w2 = mix(zs["1.weight"], ft["1.weight"])
    clean = _loss(mix(zs["0.weight"], ft["0.weight"]), w2, x, y)
    perturbed = [_loss(mix(zs["0.weight"], ft["0.weight"] + rho * ft["0.weight"].abs() * zk), w2, x, y) for zk in z]
    assert got["first"].clean_loss == pytest.approx(clean, rel=1e-12)
    assert got["first"].value == pytest.approx(sum(perturbed) / draws - clean, rel=1e-10)
    assert list(got) == ["first", "second"] and got["first"].rho == rho and got["first"].adaptive
    assert torch.equal(model.state_dict()["0.weight"], zs["0.weight"])  # the model is given back


def test_the_expectation_is_alpha_squared_times_the_fine_tuned_layers_noise(setting):
    # E ||W2 (W1 + alpha delta) x - y||^2 - ||W2 W1 x - y||^2 = alpha^2 sum_i sum_jk W2_ij^2 rho^2 c_jk^2 x_k^2
    model, zs, ft, data = setting
    x, alpha, rho = data[0][0], 0.6, 0.5
    w2 = (1 - alpha) * zs["1.weight"] + alpha * ft["1.weight"]
    y = x @ ((1 - alpha) * zs["0.weight"] + alpha * ft["0.weight"]).T @ w2.T  # theta_alpha fits: no linear term
    data = [(x, y)]
    got = finetuned_layer_sharpness(
        model, zs, ft, alpha, data, GROUPS, rho=rho, n_draws=4000, seed=0, loss_fn=F.mse_loss
    )
    c2 = (rho * ft["0.weight"].abs()) ** 2  # (4, 3)
    exact = alpha**2 * float(((w2**2) @ c2 @ (x**2).T).sum()) / y.numel()
    assert abs(got["first"].value - exact) < 4 * got["first"].stderr and got["first"].stderr < 0.05 * exact


def test_the_zero_shot_end_has_no_layer_sharpness_and_the_fine_tuned_end_is_plain_layer_sharpness(setting):
    model, zs, ft, data = setting
    kw = dict(rho=0.5, n_draws=3, seed=2, loss_fn=F.mse_loss)
    at0 = finetuned_layer_sharpness(model, zs, ft, 0.0, data, GROUPS, **kw)
    assert at0["first"].value == 0.0 and at0["second"].value == 0.0  # exactly: alpha * delta = 0
    at1 = finetuned_layer_sharpness(model, zs, ft, 1.0, data, GROUPS, **kw)
    model.load_state_dict(ft)
    plain = average_sharpness(model, data, params=GROUPS["second"], **kw)
    assert at1["second"].value == pytest.approx(plain.value, rel=1e-12)  # alpha = 1: theta_alpha = theta_ft
    model.load_state_dict(zs)
    interpolated = average_sharpness(model, data, params=GROUPS["second"], **kw)  # the other definition at 0
    assert interpolated.value != 0.0


def test_the_path_uses_the_papers_definition_unless_told_otherwise(setting):
    model, zs, ft, data = setting
    kw = dict(alphas=(0.0, 0.5), groups=GROUPS, rho=0.5, n_draws=3, seed=4, loss_fn=F.mse_loss)
    paper = sharpness_along_path(model, zs, ft, data, **kw)
    other = sharpness_along_path(model, zs, ft, data, layer_sharpness="interpolated", **kw)
    direct = finetuned_layer_sharpness(model, zs, ft, 0.5, data, GROUPS, rho=0.5, n_draws=3, seed=4, loss_fn=F.mse_loss)
    assert paper.layerwise["first"][1].value == direct["first"].value and paper.layerwise["first"][0].value == 0.0
    model.load_state_dict(interpolate(zs, ft, 0.5))
    at_half = average_sharpness(model, data, params=GROUPS["first"], rho=0.5, n_draws=3, seed=4, loss_fn=F.mse_loss)
    assert other.layerwise["first"][1].value == at_half.value != paper.layerwise["first"][1].value
    assert paper.general == other.general  # the whole-model value does not depend on the layer definition
    with pytest.raises(ConfigError, match=r"layer_sharpness must be one of finetuned, interpolated; got 'ft'"):
        sharpness_along_path(model, zs, ft, data, layer_sharpness="ft", **kw)


def test_an_explicit_c_must_cover_every_perturbed_parameter_with_its_shape(setting):
    from flatlab.sharpness.average import perturbed_losses

    model, _, _, data = setting
    kw = dict(scale=1.0, scale_name="rho", adaptive=True, n_draws=1, seed=0, loss_fn=F.mse_loss, batch_size=8)
    with pytest.raises(ConfigError, match=r"c has no entry for the perturbed parameter '1.weight'"):
        perturbed_losses(model, data, params=["0.weight", "1.weight"], c={"0.weight": torch.ones(4, 3)}, **kw)
    with pytest.raises(ConfigError, match=r"c\['0.weight'\] has shape \(3, 4\); the parameter has \(4, 3\)"):
        perturbed_losses(model, data, params=["0.weight"], c={"0.weight": torch.ones(3, 4)}, **kw)
    clean, losses = perturbed_losses(model, data, params=["0.weight"], c={"0.weight": torch.zeros(4, 3)}, **kw)
    assert losses == [clean]  # c = 0: no perturbation
