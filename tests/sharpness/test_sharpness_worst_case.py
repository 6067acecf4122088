"""Worst-case adaptive sharpness (projected ascent, l2 and linf) on quadratics with known maxima."""

from __future__ import annotations

import itertools

import pytest
import torch

from flatlab.errors import ConfigError
from flatlab.sharpness import average_sharpness, worst_case_sharpness


def test_l2_at_the_minimum_finds_half_rho_squared_top_eigenvalue(kit):
    H = kit.spd(8, 0)
    model = kit.Quadratic(H, torch.zeros(8, dtype=torch.float64))
    rho = 0.5
    exact = rho**2 / 2 * float(torch.linalg.eigvalsh(H)[-1])
    kw = dict(rho=rho, adaptive=False, params=["w"], loss_fn=kit.quadratic_loss)
    long = worst_case_sharpness(model, kit.QUAD_DATA, steps=200, **kw)
    assert long.value == pytest.approx(exact, rel=1e-5)
    assert long.value <= exact * (1 + 1e-9)
    short = worst_case_sharpness(model, kit.QUAD_DATA, **kw)  # default 20 steps
    assert len(short.losses) == 21 and short.norm == "l2"
    assert exact * 0.99 <= short.value <= exact * (1 + 1e-9)


def test_linf_adaptive_on_a_separable_quadratic_reaches_the_corner(kit):
    h = torch.tensor([0.5, 1.0, 2.0, 3.0, 0.7, 1.5], dtype=torch.float64)
    w = torch.tensor([0.3, -1.2, 0.8, -0.1, 2.0, -0.6], dtype=torch.float64)
    model = kit.Quadratic(torch.diag(h), w)
    rho = 0.4
    # max over |delta_i| <= rho |w_i| of sum h_i (w_i delta_i + delta_i^2 / 2): delta_i = rho |w_i| sign(w_i)
    exact = float((h * (rho * w**2 + rho**2 / 2 * w**2)).sum())
    res = worst_case_sharpness(model, kit.QUAD_DATA, rho=rho, norm="linf", params=["w"], loss_fn=kit.quadratic_loss)
    assert res.value == pytest.approx(exact, rel=1e-10)


def test_linf_is_bounded_by_the_vertex_maximum_and_beats_the_average(kit):
    H = kit.spd(6, 3)
    model = kit.Quadratic(H, torch.zeros(6, dtype=torch.float64))
    rho = 0.5
    vertices = torch.tensor(list(itertools.product([-1.0, 1.0], repeat=6)), dtype=torch.float64)  # (64, 6)
    best = float((0.5 * rho**2 * torch.einsum("vi,ij,vj->v", vertices, H, vertices)).max())
    kw = dict(rho=rho, adaptive=False, params=["w"], loss_fn=kit.quadratic_loss)
    res = worst_case_sharpness(model, kit.QUAD_DATA, norm="linf", **kw)
    avg = average_sharpness(model, kit.QUAD_DATA, n_draws=200, **kw)
    assert avg.value < res.value <= best * (1 + 1e-12)
    assert res.value >= 0.6 * best  # sign ascent ends at a local (vertex) maximum


def test_worst_case_errors(kit):
    model = kit.make_mlp()
    data = kit.classification_data()
    with pytest.raises(ConfigError, match=r"norm='l1' is not allowed; expected one of 'l2', 'linf'"):
        worst_case_sharpness(model, data, rho=0.1, norm="l1")
    with pytest.raises(ConfigError, match=r"init_radius must be in \[0, 1\]; got 2"):
        worst_case_sharpness(model, data, rho=0.1, init_radius=2)
    with pytest.raises(ConfigError, match=r"steps must be an integer >= 1; got 0"):
        worst_case_sharpness(model, data, rho=0.1, steps=0)
