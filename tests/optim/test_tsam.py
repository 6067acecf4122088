"""TSAM (flatlab.optim.tsam): online tilted aggregation, the step against a stored-copies reference,
pass accounting, memory, and the paper's 1-D toy problem."""

from __future__ import annotations

import math

import pytest
import torch
from _optim_testlib import (
    CountingClosure,
    assert_bitwise,
    closure_for,
    image_batch,
    mlp,
    params_of,
    small_cnn,
    twin,
    vector_batch,
)

from flatlab.errors import ConfigError
from flatlab.optim.protocol import Progress
from flatlab.optim.tsam import TSAM, TiltedAccumulator, sample_noise, tilt_at


def _samples(n=5, seed=0, loss_scale=1.0, loss_offset=0.0):
    g = torch.Generator().manual_seed(seed)
    losses = [torch.tensor(loss_offset + loss_scale * float(torch.randn((), generator=g))) for _ in range(n)]
    grads = [[torch.randn(4, 3, generator=g), torch.randn(3, generator=g)] for _ in range(n)]
    return losses, grads


def _accumulate(t, losses, grads, consume=False):
    acc = TiltedAccumulator(t)
    for loss, g in zip(losses, grads):
        acc.add(loss, [x.clone() for x in g] if consume else g, consume=consume)
    return acc, acc.gradient()


def test_accumulator_consuming_and_cloning_agree_and_cloning_leaves_the_inputs_alone():
    losses, grads = _samples(seed=5)
    kept = [[x.clone() for x in g] for g in grads]
    cloned, taken = _accumulate(5.0, losses, grads)[1], _accumulate(5.0, losses, grads, consume=True)[1]
    assert all(torch.equal(a, b) for a, b in zip(cloned, taken))
    assert all(torch.equal(a, b) for g, k in zip(grads, kept) for a, b in zip(g, k))


def test_adopting_accumulator_starts_a_tensor_at_its_first_gradient():
    # the second tensor has no gradient in the first sample: its aggregate is w_2·G_2 + w_3·G_3 (A was 0)
    losses, grads = _samples(n=3, seed=6)
    t = 2.0
    acc = TiltedAccumulator(t)
    for j, (loss, g) in enumerate(zip(losses, grads)):
        acc.add(loss, [g[0], None if j == 0 else g[1]])
    agg = acc.gradient()
    w = torch.softmax(t * torch.stack(losses).double(), 0)
    torch.testing.assert_close(
        agg[0].double(), sum(w[j] * grads[j][0].double() for j in range(3)), rtol=1e-6, atol=1e-7
    )
    torch.testing.assert_close(agg[1].double(), sum(w[j] * grads[j][1].double() for j in (1, 2)), rtol=1e-6, atol=1e-7)
    never = TiltedAccumulator(t)
    for loss, g in zip(losses, grads):
        never.add(loss, [g[0], None])
    assert never.gradient()[1] is None


def test_accumulator_t0_is_the_plain_mean():
    losses, grads = _samples()
    acc, agg = _accumulate(0.0, losses, grads)
    for i in range(2):
        torch.testing.assert_close(agg[i], torch.stack([g[i] for g in grads]).mean(0), rtol=1e-6, atol=1e-7)
    assert float(acc.tilted_loss()) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-6)


def test_accumulator_large_t_keeps_the_max_loss_gradient():
    losses, grads = _samples(seed=3)
    j = int(torch.stack(losses).argmax())
    acc, agg = _accumulate(1e5, losses, grads)
    for i in range(2):
        torch.testing.assert_close(agg[i], grads[j][i], rtol=1e-6, atol=1e-7)
    assert float(acc.tilted_loss()) == pytest.approx(float(losses[j]), rel=1e-4)


@pytest.mark.parametrize("t", [0.5, 5.0, 20.0])
def test_accumulator_equals_direct_softmax_for_losses_near_1e3(t):
    losses, grads = _samples(n=7, seed=1, loss_scale=0.3, loss_offset=1000.0)
    L = torch.stack(losses).double()
    assert torch.isinf(torch.exp(t * L.float())).all()  # a naive float32 exp(t·L) overflows
    w = torch.softmax(t * L, dim=0)  # stable reference, float64
    acc, agg = _accumulate(t, losses, grads)
    for i in range(2):
        expected = sum(w[j] * grads[j][i].double() for j in range(len(grads)))
        torch.testing.assert_close(agg[i].double(), expected, rtol=0, atol=1e-6)
    lme = (torch.logsumexp(t * L, 0) - math.log(len(losses))) / t  # log-mean-exp objective
    assert float(acc.tilted_loss()) == pytest.approx(float(lme), abs=1e-4)
    assert math.isfinite(float(acc.tilted_loss()))


def test_noise_norms():
    ps = [torch.zeros(50, 20), torch.zeros(30)]
    for _ in range(5):
        d = sample_noise(ps, 0.3, "gaussian")  # ‖n‖ ≈ 32 > r: rescaled onto the sphere
        assert math.sqrt(sum(float(x.double().pow(2).sum()) for x in d)) == pytest.approx(0.3, rel=1e-5)
        d = sample_noise(ps, 1e3, "gaussian")  # r larger than ‖n‖: left as drawn
        assert 25 < math.sqrt(sum(float(x.pow(2).sum()) for x in d)) < 40
    torch.manual_seed(0)
    radii = torch.tensor([float(sample_noise([torch.zeros(1)], 0.2, "uniform")[0].abs()) for _ in range(2000)])
    assert float(radii.max()) <= 0.2 + 1e-7
    assert float(radii.mean()) == pytest.approx(0.1, abs=0.006)  # uniform in [-r, r] for d = 1


def _reference_tsam_grad(model, batch, *, rho, s, t, radius, noise, seed, primary_pass="noisy"):
    """Stored-copies TSAM, one step: the released procedure ('noisy': every ascent gradient at θ+δ_j), or
    with primary_pass='center' sample 1's ascent gradient taken at θ."""
    torch.manual_seed(seed)
    params = list(model.parameters())
    theta = [p.detach().clone() for p in params]
    closure = closure_for(model, batch)
    losses, grads = [], []
    for j in range(s):
        if j == 0 and primary_pass == "center":
            closure()
        with torch.no_grad():
            for p, d in zip(params, sample_noise(params, radius, noise)):
                p.add_(d)
        if j == 0 and primary_pass == "noisy":
            closure()
        elif j > 0:
            closure.extra()
        with torch.no_grad():
            g = [p.grad.clone() for p in params]
            norm = torch.linalg.vector_norm(torch.stack([x.norm() for x in g]))
            for p, x in zip(params, g):
                p.add_(x * (rho / (norm + 1e-12)))
        losses.append(float(closure.extra()))
        grads.append([p.grad.clone() for p in params])
        with torch.no_grad():
            for p, th in zip(params, theta):
                p.copy_(th)
    return losses, grads


@pytest.mark.parametrize(
    "t,noise,primary_pass",
    [
        (0.0, "gaussian", "noisy"),
        (5.0, "gaussian", "noisy"),
        (1e5, "gaussian", "noisy"),
        (5.0, "uniform", "noisy"),
        (0.0, "uniform", "center"),
        (5.0, "gaussian", "center"),
        (1e5, "uniform", "center"),
    ],
)
def test_step_matches_stored_copies_reference(t, noise, primary_pass):
    model, batch = small_cnn(), image_batch()
    kw = dict(rho=0.2, s=3, radius=0.5, noise=noise)
    ref_model = twin(model, torch.optim.SGD(model.parameters(), lr=0.1))[0]
    losses, grads = _reference_tsam_grad(ref_model, batch, t=t, seed=7, primary_pass=primary_pass, **kw)
    before = params_of(model)
    opt = TSAM(
        torch.optim.SGD(model.parameters(), lr=0.1),
        rho=0.2,
        s=3,
        t=t,
        noise_radius=0.5,
        noise=noise,
        primary_pass=primary_pass,
    )
    torch.manual_seed(7)
    opt.step(closure_for(model, batch))
    w = torch.softmax(t * torch.tensor(losses, dtype=torch.float64), 0)
    for i, p in enumerate(model.parameters()):
        expected = sum(w[j] * grads[j][i].double() for j in range(3)).float()
        torch.testing.assert_close(p.grad, expected, rtol=1e-5, atol=1e-6)
        if t == 0.0:  # the plain mean of the s perturbed gradients
            torch.testing.assert_close(p.grad, sum(g[i] for g in grads) / 3, rtol=1e-5, atol=1e-6)
        if t == 1e5:  # the max-loss sample's gradient
            torch.testing.assert_close(p.grad, grads[max(range(3), key=losses.__getitem__)][i], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p.detach(), before[i] - 0.1 * p.grad, rtol=1e-6, atol=1e-7)
    m = opt.pop_metrics()
    assert m["opt/perturbed_loss"] == pytest.approx(sum(losses) / 3, rel=1e-5)
    assert m["opt/perturbed_loss_max"] == pytest.approx(max(losses), rel=1e-6)
    lme = (
        sum(losses) / 3
        if t == 0
        else float(torch.logsumexp(t * torch.tensor(losses, dtype=torch.float64), 0) - math.log(3)) / t
    )
    assert m["opt/tilted_loss"] == pytest.approx(lme, rel=1e-5)


def test_rho_and_noise_zero_is_the_base_step():
    model, batch = mlp(), vector_batch()
    for s, exact in [(1, True), (3, False)]:
        m, o = twin(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        ref_m, ref_o = twin(m, o)
        opt = TSAM(o, rho=0.0, s=s, t=5.0, noise_radius=0.0)
        for _ in range(2):
            opt.step(closure_for(m, batch))
            ref_o.zero_grad()
            closure_for(ref_m, batch)()
            ref_o.step()
        if exact:
            assert_bitwise(params_of(m), params_of(ref_m))
        else:  # Σ_j w_j·g with w_j = 1/3 is g up to rounding
            for a, b in zip(params_of(m), params_of(ref_m)):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("primary_pass", ["center", "noisy"])
@pytest.mark.parametrize("s", [1, 3])
def test_2s_passes_exactly_one_primary(primary_pass, s):
    model, batch = small_cnn(), image_batch()
    opt = TSAM(torch.optim.SGD(model.parameters(), lr=0.1), s=s, primary_pass=primary_pass)
    closure = CountingClosure(closure_for(model, batch))
    opt.step(closure)
    assert (closure.primary, closure.extra_calls, closure.sampled) == (1, 2 * s - 1, 0)


def test_extra_memory_does_not_grow_with_s():
    model, batch = small_cnn(), image_batch()
    n = sum(p.numel() for p in model.parameters())
    copies = {}
    for s in (3, 8):
        m, _ = twin(model, torch.optim.SGD(model.parameters(), lr=0.1))
        opt = TSAM(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), s=s)
        opt.step(closure_for(m, batch))
        copies[s] = sum(v.numel() for st in opt.state.values() for v in st.values() if torch.is_tensor(v)) / n
    # θ only: the accumulator takes over the first perturbed gradient, the noise is drawn into the parameters
    assert copies[3] == copies[8] == 1.0


def test_t_schedule_is_linear_in_progress():
    assert tilt_at(20.0, "constant", 0.25) == 20.0
    assert tilt_at(20.0, "increase", 0.25) == 5.0
    assert tilt_at(20.0, "decrease", 0.25) == 15.0
    opt = TSAM(torch.optim.SGD(mlp().parameters(), lr=0.1), t=8.0, t_schedule="increase")
    assert opt.current_t() == 0.0  # no progress yet: fraction 0
    opt.on_progress(Progress(step=30, epoch=3, total_steps=40, steps_per_epoch=10))
    assert opt.current_t() == 6.0


@pytest.mark.parametrize(
    "kw,pattern",
    [
        (dict(s=0), r"s=0 is not allowed; expected int in \[1, inf\)"),
        (dict(s=2.5), r"s=2.5 is not allowed"),
        (dict(t=-1.0), r"t=-1.0 is not allowed; expected float in \[0, 1e\+06\]"),
        (dict(t=float("inf")), r"t=inf is not allowed"),
        (dict(rho=-0.2), r"rho=-0.2 is not allowed"),
        (dict(noise_radius=-1), r"noise_radius=-1 is not allowed"),
        (dict(noise="laplace"), r"noise='laplace' is not allowed; expected one of 'gaussian', 'uniform'"),
        (dict(t_schedule="cosine"), r"t_schedule='cosine' is not allowed"),
        (dict(primary_pass="theta"), r"primary_pass='theta' is not allowed; expected one of 'noisy', 'center'"),
    ],
)
def test_bad_values_raise_config_error_naming_the_field(kw, pattern):
    with pytest.raises(ConfigError, match=pattern):
        TSAM(torch.optim.SGD(mlp().parameters(), lr=0.1), **kw)


# ---------------------------------------------------------------------------------------------- toy
# TSAM paper, Fig. 1: L(θ) = 2·sin(4πθ)/(2θ) + 0.005(θ−1)², ρ = 0.2, lr 0.005, start θ = 0.5. Its local
# minima sit near 0.358, 0.868, 1.370, 1.872, 2.373 with curvature L'' ≈ 431, 181, 115, 84, 67: the
# further right, the flatter. Noise: Gaussian clipped to r = 0.1 (in 1-D, δ = ±0.1 nearly always).
# The iterate keeps bouncing (ρ = 0.2 is 40% of the distance between minima), so the end point is the
# mean of the last 100 iterates, and flatness is the curvature of the local minimum that plain gradient
# descent reaches from there. The dynamics are chaotic (which basin a seed ends in can change with the
# last bit of rounding), so the assertions are about basins and means over seeds. Measured (400 steps,
# s = 3), with the default primary_pass='noisy' (the released procedure), seeds 0-7:
#   t = 0   : end points 0.617 0.611 0.572 0.593 0.601 0.598 0.601 0.595 (mean 0.600) -> minimum 0.358
#             (L'' 431) for 7 of 8 seeds, 0.868 (L'' 181) for seed 0
#   t = 1   : 0.658 0.636 0.617 0.625 0.658 0.650 0.664 0.666 (mean 0.647) -> 0.868 (L'' 181), every seed
#   t = 100 : 0.684 0.654 0.620 0.683 0.641 0.655 0.649 0.712 (mean 0.662) -> 0.868 (L'' 181), every seed
#             (with 1000 steps, 2 of 8 seeds reach 1.370 / L'' 115 or its edge)
# With primary_pass='center' (sample 1 ascends from θ), seeds 0-2:
#   t = 0   : end points 0.569, 0.570, 0.536 (mean 0.558) -> minimum 0.358 (L'' 431) for every seed
#   t = 1   : end points 0.661, 0.639, 0.655 (mean 0.652) -> minimum 0.868 (L'' 181) for every seed
#   t = 100 : end points 1.098, 1.088, 0.923 (mean 1.036) -> minimum 0.868 (L'' 181) for every
#             seed, the tail sitting on the far side of that basin (over seeds 0-7: 1.370, L'' 115, in 2 of 8)
_PI4 = 4 * math.pi


def _toy_loss(th):
    return torch.sin(_PI4 * th) / th + 0.005 * (th - 1) ** 2


def _toy_grad(th):
    return (_PI4 * torch.cos(_PI4 * th) * th - torch.sin(_PI4 * th)) / th**2 + 0.01 * (th - 1)


class _ToyClosure:
    """Analytic loss and gradient of the 1-D toy (no BatchNorm: extra == primary)."""

    def __init__(self, p):
        self.p = p

    @torch.no_grad()
    def __call__(self):
        self.p.grad = _toy_grad(self.p.detach())
        return _toy_loss(self.p.detach()).sum()

    extra = __call__

    def with_sampled_grads(self, params):
        return self(), [self.p.grad.clone()]


def _local_minimum(x: float):
    th = torch.tensor([x], dtype=torch.float64)
    for _ in range(4000):
        th -= 2e-4 * _toy_grad(th)
    h = 1e-4
    curvature = (_toy_loss(th + h) - 2 * _toy_loss(th) + _toy_loss(th - h)) / h**2
    return float(th), float(curvature)


def _toy_end_point(t: float, seed: int, steps: int = 400, tail: int = 100, primary_pass: str = "noisy") -> float:
    torch.manual_seed(seed)
    th = torch.nn.Parameter(torch.tensor([0.5]))
    opt = TSAM(
        torch.optim.SGD([th], lr=0.005),
        rho=0.2,
        s=3,
        t=t,
        noise_radius=0.1,
        noise="gaussian",
        primary_pass=primary_pass,
    )
    closure, total = _ToyClosure(th), 0.0
    for k in range(steps):
        opt.step(closure)
        if k >= steps - tail:
            total += float(th.detach())
    return total / tail


def test_toy_larger_tilt_ends_in_flatter_minima():
    ends = {t: [_toy_end_point(t, seed) for seed in range(8)] for t in (0.0, 1.0, 100.0)}
    curv = {t: [_local_minimum(e)[1] for e in es] for t, es in ends.items()}
    mean_end = {t: sum(es) / len(es) for t, es in ends.items()}
    mean_curv = {t: sum(c) / len(c) for t, c in curv.items()}
    assert sum(c == pytest.approx(431, rel=0.01) for c in curv[0.0]) >= 6  # t = 0: mostly the sharpest minimum
    assert max(curv[1.0] + curv[100.0]) < 190  # tilted: flatter minima only
    assert mean_curv[0.0] > mean_curv[1.0] >= mean_curv[100.0]
    assert mean_end[0.0] + 0.03 < mean_end[1.0] < mean_end[100.0]  # further right


def test_toy_center_primary_pass_larger_tilt_ends_in_flatter_minima():
    ends = {t: [_toy_end_point(t, seed, primary_pass="center") for seed in range(3)] for t in (0.0, 1.0, 100.0)}
    curv = {t: [_local_minimum(e)[1] for e in es] for t, es in ends.items()}
    mean_end = {t: sum(es) / len(es) for t, es in ends.items()}
    mean_curv = {t: sum(c) / len(c) for t, c in curv.items()}
    assert all(c == pytest.approx(431, rel=0.01) for c in curv[0.0])  # t = 0: the sharpest minimum
    assert max(curv[1.0] + curv[100.0]) < 190  # tilted: flatter minima only
    assert mean_curv[0.0] > mean_curv[1.0] >= mean_curv[100.0]
    assert mean_end[0.0] + 0.05 < mean_end[1.0] and mean_end[1.0] + 0.2 < mean_end[100.0]  # further right


def test_unreached_tensor_keeps_grad_none_and_others_get_the_tilted_gradient():
    model, batch = mlp(), vector_batch()
    spare = torch.nn.Parameter(torch.ones(3))  # in the optimizer, never in the loss
    opt = TSAM(torch.optim.SGD([*model.parameters(), spare], lr=0.1), rho=0.1, s=3, t=2.0, noise_radius=0.1)
    opt.step(closure_for(model, batch))
    assert spare.grad is None
    assert torch.equal(spare.detach(), torch.ones(3))  # θ restored exactly, not stepped
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_plain_closure_that_zeroes_grads_in_place_gives_the_same_step():
    # A plain callable closure may zero p.grad in place (zero_grad(set_to_none=False)); the accumulator
    # keeps earlier samples' gradient tensors, which must not be zeroed under it.
    model, batch = mlp(), vector_batch()
    m2, _ = twin(model, torch.optim.SGD(model.parameters(), lr=0.1))
    ref = closure_for(model, batch)
    x, y = batch

    def zeroing():
        for p in m2.parameters():
            if p.grad is not None:
                p.grad.zero_()
        loss = torch.nn.functional.cross_entropy(m2(x), y)
        loss.backward()
        return loss.detach()

    kw = dict(rho=0.1, s=3, t=2.0, noise_radius=0.1)
    o1 = TSAM(torch.optim.SGD(model.parameters(), lr=0.1), **kw)
    o2 = TSAM(torch.optim.SGD(m2.parameters(), lr=0.1), **kw)
    torch.manual_seed(0)
    o1.step(ref)
    torch.manual_seed(0)
    o2.step(zeroing)
    for a, b in zip(model.parameters(), m2.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
