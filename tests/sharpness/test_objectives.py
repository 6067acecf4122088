"""The TSAM paper's three objectives (Table 2) on quadratics, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.sharpness.measures import compute_measures, measure_subset
from flatlab.sharpness.objectives import erm_objective, log_mean_exp, sam_objective, tilted_objective
from flatlab.workloads.base import Split

DATA = [(torch.zeros(2, 1), torch.zeros(2))]


class Bowl(nn.Module):
    """``L(w) = 1/2 sum_i h_i (w_i - c_i)^2`` whatever the inputs; one parameter ``w``."""

    def __init__(self, h, w, c) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=torch.float64))
        self.register_buffer("h", torch.tensor(h, dtype=torch.float64))
        self.register_buffer("c", torch.tensor(c, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (0.5 * (self.h * (self.w - self.c) ** 2).sum()).expand(x.shape[0])


def mean_out(out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return out.mean()


def bowl_loss(h, w, c, at):
    return 0.5 * sum(hi * (wi + ai - ci) ** 2 for hi, wi, ci, ai in zip(h, w, c, at))


H, W, C = [1.0, 3.0, 0.5], [0.4, -0.2, 1.0], [0.0, 0.1, -0.3]


def test_erm_objective_is_the_loss():
    got = erm_objective(Bowl(H, W, C), DATA, loss_fn=mean_out)
    assert got.value == pytest.approx(bowl_loss(H, W, C, [0, 0, 0]), rel=1e-12)


def test_sam_objective_is_the_exact_maximum_on_an_isotropic_bowl():
    # h = 1: max over ||e|| <= rho of 1/2 ||w - c + e||^2 = 1/2 (||w - c|| + rho)^2, reached by SAM's one step
    rho = 0.3
    got = sam_objective(Bowl([1.0] * 3, W, C), DATA, rho=rho, loss_fn=mean_out)
    r = math.dist(W, C)
    assert got.value == pytest.approx(0.5 * (r + rho) ** 2, rel=1e-12)
    assert got.clean_loss == pytest.approx(0.5 * r**2, rel=1e-12)


def test_sam_objective_takes_sams_ascent_step_on_an_anisotropic_bowl():
    rho = 0.2
    g = [hi * (wi - ci) for hi, wi, ci in zip(H, W, C)]
    norm = math.sqrt(sum(x * x for x in g))
    expected = bowl_loss(H, W, C, [rho * x / norm for x in g])
    got = sam_objective(Bowl(H, W, C), DATA, rho=rho, loss_fn=mean_out)
    assert got.value == pytest.approx(expected, rel=1e-12)
    longer = sam_objective(Bowl(H, W, C), DATA, rho=rho, steps=30, loss_fn=mean_out)
    # the maximum over the ball is at most 1/2 h_max (||w - c|| + rho)^2 (a bound, not reached here)
    assert got.clean_loss < longer.value <= 0.5 * max(H) * (math.dist(W, C) + rho) ** 2
    with pytest.raises(ConfigError, match="steps"):
        sam_objective(Bowl(H, W, C), DATA, rho=rho, steps=0)


def test_log_mean_exp_by_hand():
    assert log_mean_exp([1.0, 2.0, 3.0], 1.0) == pytest.approx(math.log((math.e + math.e**2 + math.e**3) / 3))
    assert log_mean_exp([1.0, 2.0, 3.0], 0.0) == 2.0
    assert log_mean_exp([1.0, 2.0, 3.0], 1e4) == pytest.approx(3.0 - math.log(3) / 1e4)
    assert log_mean_exp([1000.0, 1001.0], 50.0) == pytest.approx(1001.0 + math.log((math.exp(-50) + 1) / 2) / 50)


def test_tilted_objective_without_noise_is_the_sam_ascent_for_every_t():
    rho = 0.2
    sam = sam_objective(Bowl(H, W, C), DATA, rho=rho, loss_fn=mean_out).value
    for t in (0.0, 1.0, 100.0):
        got = tilted_objective(Bowl(H, W, C), DATA, t=t, s=4, rho=rho, noise_radius=0.0, loss_fn=mean_out)
        assert got.losses == pytest.approx([sam] * 4, rel=1e-12) and got.value == pytest.approx(sam, rel=1e-12)


def test_tilted_objective_repeats_the_optimizers_draws_by_hand():
    rho, r, t, s, seed = 0.1, 0.5, 5.0, 3, 7
    torch.manual_seed(123)
    before = torch.get_rng_state()
    got = tilted_objective(Bowl(H, W, C), DATA, t=t, s=s, rho=rho, noise_radius=r, seed=seed, loss_fn=mean_out)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is untouched
    gen = torch.manual_seed(seed)
    losses = []
    for _ in range(s):  # TSAM's sampling: N(0, I) clipped to norm r, then rho g/||g|| at theta + delta
        n = torch.randn(3, dtype=torch.float64, generator=gen).tolist()
        scale = min(1.0, r / (math.sqrt(sum(x * x for x in n)) + 1e-12))
        delta = [x * scale for x in n]
        g = [hi * (wi + di - ci) for hi, wi, di, ci in zip(H, W, delta, C)]
        norm = math.sqrt(sum(x * x for x in g)) + 1e-12
        losses.append(bowl_loss(H, W, C, [d + rho * x / norm for d, x in zip(delta, g)]))
    assert got.losses == pytest.approx(losses, rel=1e-10)
    assert got.value == pytest.approx(math.log(sum(math.exp(t * x) for x in losses) / s) / t, rel=1e-10)
    assert min(losses) < got.value < max(losses)
    with pytest.raises(ConfigError, match="noise="):
        tilted_objective(Bowl(H, W, C), DATA, t=1.0, noise="laplace")
    with pytest.raises(ConfigError, match="t must be"):
        tilted_objective(Bowl(H, W, C), DATA, t=-1.0)


def test_the_registered_measures_log_the_three_objectives():
    split = Split(torch.zeros(4, 1), torch.zeros(4))
    subset = measure_subset(split, 0, 0)
    declared = {
        "erm_objective": {},
        "sam_objective": {"rho": 0.2},
        "tilted_objective": {"t": 0.0, "rho": 0.2, "noise_radius": 0},
    }
    out = compute_measures(Bowl(H, W, C), subset, mean_out, declared)
    assert out["flat/erm_objective"] == pytest.approx(bowl_loss(H, W, C, [0, 0, 0]))
    assert out["flat/sam_objective"] == pytest.approx(out["flat/tilted_objective"], rel=1e-12)
    assert out["flat/erm_objective"] < out["flat/sam_objective"]
    assert out["flat/tilted_objective_clean"] == out["flat/sam_objective_clean"] == out["flat/erm_objective"]
