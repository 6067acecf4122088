"""PGN, RSAM and ESAM2 (flatlab.optim.sam_variants) against hand-written steps of their procedures, their
end points (SAM, the base step), their declared passes and their errors."""

from __future__ import annotations

import math

import pytest
import torch
from _optim_testlib import (
    CountingClosure,
    FunctionClosure,
    assert_bitwise,
    closure_for,
    image_batch,
    params_of,
    small_cnn,
    twin,
)

from flatlab.errors import ConfigError
from flatlab.optim import get_optimizer
from flatlab.optim.sam import SAM
from flatlab.optim.sam_variants import ESAM2, PGN, RSAM, rsam_noise_std

LR, MOMENTUM = 0.1, 0.9


def sgd(model, lr=LR):
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)


def unit(grads):
    """g/(‖g‖₂ + 1e-12) with one norm over every tensor, in float64 for the reference."""
    norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    return [g / (norm + 1e-12) for g in grads]


def move_to(model, values):
    with torch.no_grad():
        for p, v in zip(model.parameters(), values):
            p.copy_(v)


def reference_steps(model, batch, steps, gradient_of):
    """``steps`` SGD(momentum) steps of a twin of ``model``, each with the gradient ``gradient_of(model,
    closure)`` computes (a hand-written procedure that leaves θ as it found it)."""
    ref, opt = twin(model, sgd(model))
    for _ in range(steps):
        c = closure_for(ref, batch)
        grads = gradient_of(ref, c)
        for p, g in zip(ref.parameters(), grads):
            p.grad = g
        opt.step()
    return ref


def assert_close_params(model, ref):
    for a, b in zip(params_of(model), params_of(ref)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------- PGN
def pgn_gradient(rho, alpha):
    def gradient_of(model, c):
        theta = params_of(model)
        c()
        g = [p.grad.clone() for p in model.parameters()]
        move_to(model, [t + rho * u for t, u in zip(theta, unit(g))])
        c.extra()
        g_perturbed = [p.grad.clone() for p in model.parameters()]
        move_to(model, theta)
        return [(1 - alpha) * a + alpha * b for a, b in zip(g, g_perturbed)]

    return gradient_of


@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_pgn_matches_the_hand_written_mix_over_two_steps(alpha):
    model, batch = small_cnn(), image_batch()
    ref = reference_steps(model, batch, 2, pgn_gradient(0.2, alpha))
    opt = PGN(sgd(model), rho=0.2, alpha=alpha)
    losses = [float(opt.step(closure_for(model, batch))) for _ in range(2)]
    assert_close_params(model, ref)
    assert losses[1] < losses[0]
    assert set(opt.pop_metrics()) == {"opt/perturbed_loss"}


def test_pgn_end_points_are_sam_and_the_base_step_bitwise():
    model, batch = small_cnn(), image_batch()
    pgn_model, sam_model, sgd_model = twin(model, sgd(model))[0], twin(model, sgd(model))[0], twin(model, sgd(model))[0]
    pgn, sam = PGN(sgd(pgn_model), rho=0.3, alpha=1.0), SAM(sgd(sam_model), rho=0.3)
    zero, base = PGN(sgd(model), rho=0.3, alpha=0.0), sgd(sgd_model)
    for _ in range(2):
        pgn.step(closure_for(pgn_model, batch))
        sam.step(closure_for(sam_model, batch))
        zero.step(closure_for(model, batch))
        base.zero_grad()
        closure_for(sgd_model, batch)()
        base.step()
    assert_bitwise(params_of(pgn_model), params_of(sam_model))
    assert_bitwise(params_of(model), params_of(sgd_model))  # BatchNorm statistics too: the extra pass keeps them
    assert_bitwise(list(model.buffers()), list(sgd_model.buffers()))


# ------------------------------------------------------------------------------------------------ RSAM
def rsam_gradient(rho, noise_std, gamma):
    def gradient_of(model, c):
        theta = params_of(model)
        noise = []
        for t in theta:  # the released code's filter-wise noise, one randn_like per tensor in order
            n = torch.randn_like(t)
            if t.ndim >= 2:
                scale = torch.stack([t[i].norm() for i in range(t.shape[0])]).reshape((-1,) + (1,) * (t.ndim - 1))
            else:
                scale = t.norm() + 1e-16
            noise.append(noise_std * n * scale)
        move_to(model, [t + d for t, d in zip(theta, noise)])
        c()
        v = [d + gamma * p.grad for d, p in zip(noise, model.parameters())]
        move_to(model, [t + rho * u for t, u in zip(theta, unit(v))])
        c.extra()
        g = [p.grad.clone() for p in model.parameters()]
        move_to(model, theta)
        return g

    return gradient_of


@pytest.mark.parametrize("noise_std,gamma", [(5e-4, 2.0), (0.05, 0.5)])
def test_rsam_matches_the_hand_written_procedure_over_two_steps(noise_std, gamma):
    model, batch = small_cnn(), image_batch()
    torch.manual_seed(5)
    ref = reference_steps(model, batch, 2, rsam_gradient(0.2, noise_std, gamma))
    opt = RSAM(sgd(model), rho=0.2, noise_std=noise_std, gamma=gamma)
    torch.manual_seed(5)
    for _ in range(2):
        opt.step(closure_for(model, batch))
    assert_close_params(model, ref)


def test_rsam_noise_moves_the_ascent_and_zero_noise_is_sam_along_gamma_g():
    model, batch = small_cnn(), image_batch()
    sam_model, noisy_model = twin(model, sgd(model))[0], twin(model, sgd(model))[0]
    RSAM(sgd(model), rho=0.2, noise_std=0.0, gamma=2.0).step(closure_for(model, batch))
    SAM(sgd(sam_model), rho=0.2).step(closure_for(sam_model, batch))
    for a, b in zip(params_of(model), params_of(sam_model)):  # v = 2g: the same direction as SAM's
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    RSAM(sgd(noisy_model), rho=0.2, noise_std=0.5, gamma=2.0).step(closure_for(noisy_model, batch))
    assert max(float((a - b).abs().max()) for a, b in zip(params_of(noisy_model), params_of(sam_model))) > 1e-4


def test_rsam_noise_schedule():
    assert rsam_noise_std(0.01, "constant", 0.7) == 0.01
    assert rsam_noise_std(0.01, "cosine_increase", 0.0) == 0.01
    assert rsam_noise_std(0.01, "cosine_increase", 0.5) == pytest.approx(0.03)
    assert rsam_noise_std(0.01, "cosine_increase", 1.0) == pytest.approx(0.05)


# ----------------------------------------------------------------------------------------------- ESAM2
def esam2_gradient(rho, k, record):
    def gradient_of(model, c):
        theta = params_of(model)
        c()
        u = unit([p.grad.clone() for p in model.parameters()])
        losses, grads = [], []
        for j in range(1, k + 1):
            move_to(model, [t + (rho * j / k) * x for t, x in zip(theta, u)])
            losses.append(float(c.extra()))
            grads.append([p.grad.clone() for p in model.parameters()])
        move_to(model, theta)
        best = max(range(k), key=lambda i: (losses[i], -i))  # the largest loss, the first on ties
        record.append((losses, best))
        return grads[best]

    return gradient_of


@pytest.mark.parametrize("rho", [0.2, 1.0])
def test_esam2_matches_the_hand_written_search_over_two_steps(rho):
    model, batch = small_cnn(), image_batch()
    record = []
    ref = reference_steps(model, batch, 2, esam2_gradient(rho, 4, record))
    opt = ESAM2(sgd(model), rho=rho, k=4)
    for _ in range(2):
        opt.step(closure_for(model, batch))
    assert_close_params(model, ref)
    m = opt.pop_metrics()
    assert m["opt/perturbed_loss"] == pytest.approx(sum(max(losses) for losses, _ in record) / 2, rel=1e-5)
    assert m["opt/ascent_fraction"] == pytest.approx(sum((best + 1) / 4 for _, best in record) / 2)


def test_esam2_keeps_the_largest_loss_not_the_longest_step():
    # L(x) = -cos(x) from x = 0.5: along the ascent (+x) the steps 1, 2, 3, 4 give -cos(1.5), -cos(2.5),
    # -cos(3.5), -cos(4.5) = -0.07, 0.80, 0.94, -0.21: the third is kept and SGD steps with L'(3.5) = sin(3.5)
    x = torch.tensor([0.5], requires_grad=True)
    opt = ESAM2(torch.optim.SGD([x], lr=0.1), rho=4.0, k=4)
    opt.step(FunctionClosure(lambda ps: -torch.cos(ps[0]).sum(), [x]))
    assert float(x.detach()) == pytest.approx(0.5 - 0.1 * math.sin(3.5), rel=1e-6)
    m = opt.pop_metrics()
    assert m["opt/ascent_fraction"] == 0.75 and m["opt/perturbed_loss"] == pytest.approx(-math.cos(3.5), rel=1e-6)


def test_esam2_with_one_step_size_is_sam_bitwise():
    model, batch = small_cnn(), image_batch()
    sam_model = twin(model, sgd(model))[0]
    esam2, sam = ESAM2(sgd(model), rho=0.3, k=1), SAM(sgd(sam_model), rho=0.3)
    for _ in range(2):
        esam2.step(closure_for(model, batch))
        sam.step(closure_for(sam_model, batch))
    assert_bitwise(params_of(model), params_of(sam_model))


# ------------------------------------------------------------------------------------------------ shared
@pytest.mark.parametrize("name,kw", [("pgn", {}), ("rsam", {}), ("esam2", {}), ("esam2", {"k": 2})])
def test_declared_passes_equal_the_passes_run_and_theta_is_restored(name, kw):
    model, batch = small_cnn(), image_batch()
    opt = get_optimizer(name).create(model.named_parameters(), **kw)
    opt.param_groups[0]["lr"] = 0.0  # the base step is the identity: θ must come back as it was
    before = params_of(model)
    closure = CountingClosure(closure_for(model, batch))
    opt.step(closure)
    forward, backward = opt.step_passes(0)
    assert forward == backward == closure.primary + closure.extra_calls and closure.primary == 1
    assert closure.sampled == 0
    assert_bitwise(params_of(model), before)


@pytest.mark.parametrize(
    "cls,kw,pattern",
    [
        (PGN, dict(alpha=1.5), r"alpha=1.5 is not allowed; expected float in \[0, 1\]"),
        (PGN, dict(rho=-1.0), r"rho=-1.0 is not allowed"),
        (RSAM, dict(noise_std=-0.1), r"noise_std=-0.1 is not allowed"),
        (RSAM, dict(noise_schedule="step"), r"noise_schedule='step' is not allowed; expected one of 'constant'"),
        (ESAM2, dict(k=0), r"k=0 is not allowed"),
    ],
)
def test_bad_values_raise_config_error_naming_the_field(cls, kw, pattern):
    with pytest.raises(ConfigError, match=pattern):
        cls(sgd(small_cnn()), **kw)
