"""IRE (flatlab.optim.ire): the mask, the update rule over SGD / AdamW / SAM, switch-on, κ decay,
the curvature EMA, and the paper's 2-D toy problem."""

from __future__ import annotations

import math

import pytest
import torch
from _optim_testlib import (
    CountingClosure,
    FunctionClosure,
    assert_bitwise,
    assert_within_rounding_of_step,
    closure_for,
    image_batch,
    mlp,
    params_of,
    small_cnn,
    twin,
    vector_batch,
)

from flatlab.errors import ConfigError
from flatlab.optim.ire import IRE, flat_count
from flatlab.optim.protocol import Progress
from flatlab.optim.sam import SAM


class DesignedCurvature:
    """Delegates to a BatchClosure but returns chosen "sampled gradients" (so h is known exactly)."""

    def __init__(self, inner, make_sampled):
        self.inner, self.make_sampled, self.calls = inner, make_sampled, 0

    def __call__(self):
        return self.inner()

    def extra(self):
        return self.inner.extra()

    def with_sampled_grads(self, params):
        self.calls += 1
        loss = self.inner()
        return loss, self.make_sampled(params)


def two_groups(model, lr=0.1, **kw):
    weights = [p for p in model.parameters() if p.ndim >= 2]
    others = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": weights}, {"params": others, "lr": lr / 2}], dict(lr=lr, **kw)


def _mask(opt, model):
    return [opt.state[p]["mask"] for p in model.parameters()]


def test_flat_count_reads_gamma_as_written():
    assert flat_count(0.29, 100) == 29  # float 0.29·100 = 28.999999999999996
    assert flat_count(0.8, 10) == 8 and flat_count(0.5, 3) == 1 and flat_count(0.99, 50) == 49


def test_mask_marks_exactly_floor_gamma_p_smallest_across_groups():
    model, batch = mlp(), vector_batch()
    p_total = sum(p.numel() for p in model.parameters())  # 6·8+8+8·4+4 = 92
    groups, kw = two_groups(model)
    g = torch.Generator().manual_seed(0)
    values = torch.randperm(p_total, generator=g).float() + 1.0  # distinct |h|, spread over both groups

    def sampled(params):
        out, i = [], 0
        for p in params:
            out.append(values[i : i + p.numel()].reshape(p.shape).sqrt())  # h = g² = values
            i += p.numel()
        return out

    opt = IRE(torch.optim.SGD(groups, **kw), kappa=1.0, gamma=0.3)
    opt.step(DesignedCurvature(closure_for(model, batch), sampled))
    mask = torch.cat([m.reshape(-1) for m in _mask(opt, model)])
    k = flat_count(0.3, p_total)
    assert k == 27 and int(mask.sum()) == k
    # `values` follows group order (weights first, then biases); the flat ones are the k smallest
    order = [p for grp in opt.param_groups for p in grp["params"]]
    by_group = torch.cat([opt.state[p]["mask"].reshape(-1) for p in order])
    assert torch.equal(by_group, values <= k)
    n_bias = sum(int(opt.state[p]["mask"].sum()) for p in opt.param_groups[1]["params"])
    assert 0 < n_bias < k  # the threshold is shared by the two groups
    assert opt.pop_metrics()["opt/flat_fraction"] == pytest.approx(k / p_total)


def test_gamma_doc_states_the_authors_earlier_top_k_count():
    from flatlab.optim import get_optimizer

    doc = {h.name: h.doc for h in get_optimizer("sgd_ire").hparams}["gamma"]
    assert "⌊γ·p⌋" in doc and "p − ⌊(1−γ)·p⌋ + 1" in doc
    assert "n − ⌊(1−γ)·n⌋ + 1" in flat_count.__doc__
    assert flat_count(0.75, 8) == 6 and 8 - math.floor((1 - 0.75) * 8) + 1 == 7  # the doc's example: 6 here, 7 there


def _layered_curvature(params):
    # mlp(): 0.weight (8×6) h = 1, 0.bias (8) h = 10, 2.weight (4×8) h = 2 + 0.01·i (distinct), 2.bias (4) h = 0.5
    values = [
        torch.ones(8, 6),
        torch.full((8,), 10.0),
        2.0 + 0.01 * torch.arange(32.0).reshape(4, 8),
        torch.full((4,), 0.5),
    ]
    return [v.sqrt() for v in values]


# γ = 0.6 of 92 coordinates: k = 55 = the 4 of 2.bias + the 48 of 0.weight + the 3 smallest of 2.weight
LAYER_FRACTIONS = {"0.weight": 1.0, "0.bias": 0.0, "2.weight": 3 / 32, "2.bias": 1.0}


def test_per_tensor_flat_fractions_by_parameter_name():
    model, batch = mlp(), vector_batch()
    opt = IRE(torch.optim.SGD(model.named_parameters(), lr=0.1), gamma=0.6, mask_interval=10, log_flat_fraction=True)
    closure = DesignedCurvature(closure_for(model, batch), _layered_curvature)
    opt.step(closure)
    opt.step(closure)  # the held mask: the same fractions
    metrics = opt.pop_metrics()
    per_tensor = {k[len("opt/flat_fraction/") :]: v for k, v in metrics.items() if k.startswith("opt/flat_fraction/")}
    assert per_tensor == pytest.approx(LAYER_FRACTIONS, abs=1e-12)
    assert metrics["opt/flat_fraction"] == pytest.approx(55 / 92)
    assert closure.calls == 1


def test_per_tensor_flat_fractions_without_names_and_only_on_active_steps():
    model, batch = mlp(), vector_batch()
    opt = IRE(torch.optim.SGD(model.parameters(), lr=0.1), gamma=0.6, switch_step=1, log_flat_fraction=True)
    closure = DesignedCurvature(closure_for(model, batch), _layered_curvature)
    opt.step(closure)  # not yet on: no per-tensor metric
    assert not any(k.startswith("opt/flat_fraction/") for k in opt.pop_metrics())
    opt.step(closure)
    metrics = opt.pop_metrics()
    expected = {f"opt/flat_fraction/param{i}": v for i, v in enumerate(LAYER_FRACTIONS.values())}
    assert {k: v for k, v in metrics.items() if k.startswith("opt/flat_fraction/")} == pytest.approx(
        expected, abs=1e-12
    )
    other = mlp()
    off = IRE(torch.optim.SGD(other.parameters(), lr=0.1), gamma=0.6)  # the default: not reported
    off.step(DesignedCurvature(closure_for(other, batch), _layered_curvature))
    assert set(off.pop_metrics()) == {"opt/ire_active", "opt/flat_fraction", "opt/kappa"}


def test_ties_at_the_threshold_count_as_flat():
    model, batch = mlp(), vector_batch()
    p_total = sum(p.numel() for p in model.parameters())

    def sampled(params):  # every weight of layer 0 ties at h = 1; everything else larger
        return [torch.ones_like(p) if i == 0 else torch.full_like(p, 2.0) for i, p in enumerate(params)]

    opt = IRE(torch.optim.SGD(model.parameters(), lr=0.1), gamma=0.1)
    opt.step(DesignedCurvature(closure_for(model, batch), sampled))
    k = flat_count(0.1, p_total)
    masks = _mask(opt, model)
    assert k == 9 and int(masks[0].sum()) == 48 > k  # all 48 tied coordinates, documented
    assert sum(int(m.sum()) for m in masks[1:]) == 0


@pytest.mark.parametrize(
    "make_base",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1),  # decoupled wd
    ],
    ids=["sgd", "adamw"],
)
def test_update_is_theta_old_plus_amplified_base_step(make_base):
    model, batch = small_cnn(), image_batch()
    kappa = 3.0
    opt = IRE(make_base(model.parameters()), kappa=kappa, gamma=0.7, mask_interval=2, switch_step=2)
    for step in range(5):
        ref_model, ref_base = twin(model, opt.base)  # the base alone, from the same θ and state
        old = params_of(model)
        ref_base.zero_grad()
        closure_for(ref_model, batch)()
        ref_base.step()
        opt.step(closure_for(model, batch))
        if step < 2:  # not yet switched on: exactly the base
            assert_bitwise(params_of(model), params_of(ref_model))
            continue
        for p, o, new in zip(model.parameters(), old, params_of(ref_model)):
            mask = opt.state[p]["mask"]
            n = mask.to(o.dtype)
            # float32 to rounding: a flat coordinate moves 4·Δ with |Δ| up to lr = 1e-2, so a few ulps of
            # that step (≈ 4e-9 each) where θ lands near 0
            torch.testing.assert_close(p.detach(), o + (1 + kappa * n) * (new - o), rtol=1e-6, atol=3e-8)
            if isinstance(opt.base, torch.optim.SGD):  # coordinates not flat: the base's step, bit for bit
                assert torch.equal(p.detach()[~mask], new[~mask])
            else:  # CPU AdamW, computed inside its update: its decay as θ − c·θ and its step in Adam's
                # efficient order (Kingma & Ba 2015, §2), so to an ulp or two of θ and a few roundings of Δ
                assert_within_rounding_of_step(p.detach()[~mask], new[~mask], (new - o)[~mask], ulps=2, steps=4)
        # the base's state (momentum / Adam moments) is the base's own, never amplified
        for p, rp in zip(model.parameters(), ref_model.parameters()):
            for key, v in opt.base.state[p].items():
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(ref_base.state[rp][key])), key
    assert 0.6 < sum(int(m.sum()) for m in _mask(opt, model)) / sum(p.numel() for p in model.parameters()) <= 0.75


def test_kappa_zero_and_before_switch_on_are_the_base_bitwise_without_curvature_pass():
    model, batch = small_cnn(), image_batch()
    base = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)  # noqa: E731
    for kw in (dict(kappa=0.0), dict(kappa=2.0, switch_step=100)):
        m = twin(model, base(model))[0]
        ref_m = twin(model, base(model))[0]
        opt, ref = IRE(base(m), **kw), base(ref_m)
        closure = CountingClosure(closure_for(m, batch))
        rng = torch.get_rng_state()
        for _ in range(4):
            opt.step(closure)
            ref.zero_grad()
            closure_for(ref_m, batch)()
            ref.step()
        assert_bitwise(params_of(m), params_of(ref_m))
        assert closure.sampled == 0 and torch.equal(torch.get_rng_state(), rng)  # no label sampling
        assert "theta" not in opt.state[next(m.parameters())]  # no copy either
        metrics = opt.pop_metrics()
        assert metrics["opt/flat_fraction"] == 0.0
        assert metrics["opt/ire_active"] == (1.0 if kw["kappa"] == 0 else 0.0)


def _progress(step, epoch=0, loss=None, warmup=0):
    return Progress(
        step=step, epoch=epoch, total_steps=100, steps_per_epoch=2, warmup_steps=warmup, last_epoch_train_loss=loss
    )


@pytest.mark.parametrize(
    "kw,progress,expected",
    [
        (dict(switch_epoch=2), [_progress(i, epoch=i // 2) for i in range(6)], [0, 0, 0, 0, 1, 1]),
        (dict(switch_step=3), [_progress(i) for i in range(5)], [0, 0, 0, 1, 1]),
        (dict(switch_at_warmup_end=True), [_progress(i, warmup=2) for i in range(4)], [0, 0, 1, 1]),
        # latches: the loss rising again above the threshold does not switch IRE off
        (
            dict(switch_loss=0.5),
            [_progress(i, loss=loss) for i, loss in enumerate([None, 0.8, 0.4, 0.9, 2.0])],
            [0, 0, 1, 1, 1],
        ),
    ],
    ids=["epoch", "step", "warmup", "loss"],
)
def test_switch_on_criteria_latch(kw, progress, expected):
    model, batch = mlp(), vector_batch()
    opt = IRE(torch.optim.SGD(model.parameters(), lr=0.1), **kw)
    closure = CountingClosure(closure_for(model, batch))
    seen = []
    for p in progress:
        opt.on_progress(p)
        opt.step(closure)
        seen.append(int(opt.active))
    assert seen == expected
    assert closure.sampled == 1  # one refresh at the first active step (K = 10)
    assert opt.pop_metrics()["opt/ire_active"] == pytest.approx(sum(expected) / len(expected))


def test_switch_criteria_without_progress_warn():
    model, batch = mlp(), vector_batch()
    opt = IRE(torch.optim.SGD(model.parameters(), lr=0.1), switch_epoch=0)
    with pytest.warns(UserWarning, match=r"switch criteria need on_progress\(Progress\)"):
        opt.step(closure_for(model, batch))
    assert not opt.active
    opt.switch_on()
    opt.step(closure_for(model, batch))
    assert opt.active and opt.pop_metrics()["opt/ire_active"] == 0.5


def test_mask_refreshed_every_k_active_steps():
    model, batch = mlp(), vector_batch()
    opt = IRE(torch.optim.SGD(model.parameters(), lr=0.1), mask_interval=3)
    closure = CountingClosure(closure_for(model, batch))
    for _ in range(7):
        opt.step(closure)
    assert closure.sampled == 3  # steps 0, 3, 6
    assert closure.primary == 4  # the other steps' primary passes


def test_kappa_decays_with_the_scheduler_lr():
    model, batch = mlp(), vector_batch()
    opt = IRE(torch.optim.SGD(model.parameters(), lr=0.2), kappa=2.0, kappa_decay=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5**e)
    kappas = []
    for _ in range(3):
        opt.step(closure_for(model, batch))
        kappas.append(opt.pop_metrics()["opt/kappa"])
        sched.step()
    assert kappas == pytest.approx([2.0, 1.0, 0.5])
    assert opt.base.param_groups[0]["lr"] == pytest.approx(0.025)  # the scheduler moved the base's lr


def test_curvature_ema():
    model, batch = mlp(), vector_batch()
    values = iter([2.0, 4.0])

    def sampled(params):
        v = next(values)
        return [torch.full_like(p, v) for p in params]

    opt = IRE(torch.optim.SGD(model.parameters(), lr=0.1), curvature_beta=0.5, mask_interval=1)
    closure = DesignedCurvature(closure_for(model, batch), sampled)
    opt.step(closure)
    opt.step(closure)
    h = opt.state[next(model.parameters())]["curvature"]
    assert torch.allclose(h, torch.full_like(h, 0.5 * 0.5 * 4.0 + 0.5 * 16.0))  # β(βh₀+(1−β)g₁²)+(1−β)g₂²


def test_sam_ire_mask_comes_from_theta_not_theta_plus_eps():
    model, batch = small_cnn(), image_batch()
    seen = {}

    def sampled(params):  # "curvature" = θ² at the moment of the curvature pass
        seen["params"] = [p.detach().clone() for p in params]
        return [p.detach().clone() for p in params]

    sam = SAM(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.5)
    opt = IRE(sam, kappa=1.0, gamma=0.5)
    theta = params_of(model)
    inner = CountingClosure(closure_for(model, batch))
    opt.step(DesignedCurvature(inner, sampled))
    assert_bitwise(seen["params"], theta)  # taken at θ, before SAM's ascent
    assert (inner.primary, inner.extra_calls) == (1, 1)  # the curvature pass WAS the primary one
    flat = torch.cat([t.pow(2).reshape(-1) for t in theta])
    threshold = torch.kthvalue(flat, flat_count(0.5, flat.numel())).values
    for p, t in zip(model.parameters(), theta):
        assert torch.equal(opt.state[p]["mask"], t.pow(2) <= threshold)
    assert set(opt.pop_metrics()) == {"opt/perturbed_loss", "opt/ire_active", "opt/flat_fraction", "opt/kappa"}


def test_usage_errors():
    model, batch = mlp(), vector_batch()
    opt = IRE(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match=r"IRE \(curvature refresh\).step\(\) needs a closure"):
        opt.step()

    class IgnoresClosure(torch.optim.SGD):
        def step(self, closure=None):
            return super().step()

    closure_for(model, batch)()
    opt = IRE(IgnoresClosure(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="did not call the closure"):
        opt.step(closure_for(model, batch))


@pytest.mark.parametrize(
    "kw,pattern",
    [
        (dict(kappa=-1.0), r"kappa=-1.0 is not allowed; expected float in \[0, inf\)"),
        (dict(gamma=0.0), r"gamma=0.0 is not allowed; expected float in \(0, 1\)"),
        (dict(gamma=1.0), r"gamma=1.0 is not allowed"),
        (dict(mask_interval=0), r"mask_interval=0 is not allowed; expected int in \[1, inf\)"),
        (dict(curvature_beta=1.0), r"curvature_beta=1.0 is not allowed"),
        (dict(switch_epoch=-1), r"switch_epoch=-1 is not allowed; expected int in \[0, inf\) or None"),
        (dict(switch_loss=0.0), r"switch_loss=0.0 is not allowed"),
        (dict(kappa_decay=1), r"kappa_decay=1 is not allowed; expected True or False"),
    ],
)
def test_bad_values_raise_config_error_naming_the_field(kw, pattern):
    with pytest.raises(ConfigError, match=pattern):
        IRE(torch.optim.SGD(mlp().parameters(), lr=0.1), **kw)


# ---------------------------------------------------------------------------------------------- toy
# IRE paper, Fig. 1: L(u, v) = (1+u²)·v²/2, GD with η = 1. The minima are the line v = 0;
# the curvature there is 1+u², so smaller |u| is flatter, and u is the flat direction. The 2-parameter
# toy has no softmax to sample labels from, so the curvature proxy is the TRUE gradient squared
# (FunctionClosure.with_sampled_grads returns ∇L): h = (u·v², (1+u²)·v)². γ = 0.5 marks the one
# coordinate with the smaller h, refreshed every step (K = 1). Start (u, v) = (0.95, 0.3), 200 steps.
# Measured end points: κ = 0 (plain GD): u = 0.749; κ = 1: u = 0.621; κ = 2: u = 0.511; κ = 5: u = 0.241
# (|v| < 1e-22 in all four).
def _toy_end(kappa: float, steps: int = 200):
    uv = torch.nn.Parameter(torch.tensor([0.95, 0.3], dtype=torch.float64))
    closure = FunctionClosure(lambda ps: 0.5 * (1 + ps[0][0] ** 2) * ps[0][1] ** 2, [uv])
    opt = IRE(torch.optim.SGD([uv], lr=1.0), kappa=kappa, gamma=0.5, mask_interval=1)
    for _ in range(steps):
        opt.step(closure)
    return [float(x) for x in uv.detach()]


def test_toy_larger_kappa_reaches_flatter_minima():
    ends = {k: _toy_end(k) for k in (0.0, 1.0, 2.0, 5.0)}
    us = [abs(ends[k][0]) for k in (0.0, 1.0, 2.0, 5.0)]
    assert us == sorted(us, reverse=True) and us[0] - us[-1] > 0.4
    assert us == pytest.approx([0.749, 0.621, 0.511, 0.241], abs=2e-3)
    assert all(abs(v) < 1e-6 for _, v in ends.values())


# ---------------------------------------------------------------------------------------------------
# The exact radix select IRE uses for its threshold (must equal torch.kthvalue, ties and zeros included).
@pytest.mark.parametrize("select", ["kth_smallest_with_count", "radix_kth_smallest_with_count"])
@pytest.mark.parametrize("n", [1, 7, 1000, 65_537, 300_001])
def test_radix_select_equals_kthvalue(n, select):
    # on the CPU the first selects through a sampled bracket (from a copy up to 2^17 entries), the second
    # by the radix passes alone; 300,001 entries take the bracket
    import flatlab.optim._select as flat_mod
    from flatlab.optim._select import kth_smallest_nonnegative

    kth_smallest_with_count = getattr(flat_mod, select)
    g = torch.Generator().manual_seed(n)
    h = torch.randn(n, generator=g).square()
    if n > 10:
        h[: n // 10] = 0.0  # many exact zeros
        h[n // 10 : n // 5] = h[n // 2]  # a block of ties
        h[-1] = float("inf")
        h[-2] = 1e-42  # subnormal
    for k in sorted({1, max(1, n // 10), max(1, n // 5), n // 2 or 1, max(1, int(0.8 * n)), n}):
        if select == "kth_smallest_with_count":
            assert kth_smallest_nonnegative(h, k).item() == torch.kthvalue(h, k).values.item()
        value, count = kth_smallest_with_count(h, k)
        assert value.item() == torch.kthvalue(h, k).values.item()
        assert count == int((h <= value).sum()) and count >= k  # ties with the k-th value all counted


@pytest.mark.parametrize("select", ["kth_smallest_with_count", "radix_kth_smallest_with_count"])
def test_radix_select_ignores_signs_and_rejects_bad_input(select):
    import flatlab.optim._select as flat_mod

    kth_smallest_with_count = getattr(flat_mod, select)
    kth_smallest_nonnegative = lambda h, k: kth_smallest_with_count(h, k)[0]  # noqa: E731

    h = torch.tensor([-0.0, 3.0, 1.0, 2.0])
    assert kth_smallest_nonnegative(h, 1).item() == 0.0 and kth_smallest_nonnegative(h, 3).item() == 2.0
    assert kth_smallest_with_count(h, 1)[1] == 1 and kth_smallest_with_count(h, 4)[1] == 4
    assert kth_smallest_with_count(torch.tensor([2.0, 0.0, 2.0, -0.0, 1.0]), 2)[1] == 2  # -0.0 and 0.0 tie
    nan_last = torch.tensor([float("nan"), 1.0, 0.5]).neg().abs()  # NaN with either sign ranks above +inf
    assert kth_smallest_nonnegative(nan_last, 2).item() == 1.0
    with pytest.raises(ValueError, match=r"k must be in \[1, 4\]"):
        kth_smallest_nonnegative(h, 0)
    with pytest.raises(ValueError, match="must be float32 tensors"):
        kth_smallest_nonnegative(h.double(), 1)
    with pytest.raises(ValueError, match="must be float32 tensors"):
        kth_smallest_nonnegative([], 1)


@pytest.mark.parametrize("select", ["kth_smallest_with_count", "radix_kth_smallest_with_count"])
def test_radix_select_at_both_ends_of_the_bit_range(select):
    # bucket 0 (below 2^-126·2^-7: subnormal bit patterns under 0x10000) with the largest NaN pattern
    # present, and the largest NaN pattern itself selected (bucket 0x7FFF: nothing above it)
    import flatlab.optim._select as flat_mod

    kth_smallest_with_count = getattr(flat_mod, select)

    bits = torch.tensor([0x7FFFFFFF, 0x0000FFFF, 3, 0, 0x00010000, 0x7F800000, 0x7FFFFFFF, 5], dtype=torch.int32)
    h = bits.view(torch.float32)
    for k in range(1, 9):
        value, count = kth_smallest_with_count(h, k)
        expected = torch.kthvalue(h, k).values
        assert int(value.view(torch.int32)) == int(expected.view(torch.int32)) or (value.isnan() and expected.isnan())
        if not value.isnan():
            assert count == int((h <= value).sum())
    assert int(kth_smallest_with_count(h, 3)[0].view(torch.int32)) == 5 and kth_smallest_with_count(h, 3)[1] == 3
    assert int(kth_smallest_with_count(h, 8)[0].view(torch.int32)) == 0x7FFFFFFF
    # int32 keys are taken as the bit patterns themselves (signs already clear): the same answers, as float32
    for k in range(1, 9):
        by_bits, by_value = kth_smallest_with_count(bits, k), kth_smallest_with_count(h, k)
        assert by_bits[0].dtype == torch.float32 and by_bits[1] == by_value[1]
        assert int(by_bits[0].view(torch.int32)) == int(by_value[0].view(torch.int32))
    with pytest.raises(RuntimeError, match="non-negative"):
        kth_smallest_with_count(torch.tensor([1, -2], dtype=torch.int32), 1)


def test_radix_select_keeps_the_bucket_apart_from_entries_with_the_same_lower_bits():
    # the second pass bins entries inside the k-th value's bucket by their lower 16 bits and every other
    # entry by the same bits in a separate range: entries of the neighbouring buckets (and of far ones)
    # share their lower bits with the bucket's entries here, so any mixing would move the answer
    from flatlab.optim._select import radix_kth_smallest_with_count as kth_smallest_with_count

    gen = torch.Generator().manual_seed(3)
    lows = torch.randint(0, 1 << 16, (40,), generator=gen, dtype=torch.int32)
    buckets = torch.tensor([0, 0x3F7F, 0x3F80, 0x3F81, 0x7F80], dtype=torch.int32)
    bits = ((buckets.view(-1, 1) << 16) | lows.view(1, -1)).view(-1)
    bits = bits[torch.randperm(bits.numel(), generator=gen)]
    h = bits.view(torch.float32)
    for k in range(1, bits.numel() + 1):
        value, count = kth_smallest_with_count(h, k)
        assert int(value.view(torch.int32)) == int(torch.kthvalue(bits, k).values)
        assert count == int((bits <= int(value.view(torch.int32))).sum())


@pytest.mark.parametrize("chunk", [None, 3, 1 << 20], ids=["numpy", "torch-in-pieces", "torch-whole"])
def test_at_most_writes_the_mask_and_counts_it(monkeypatch, chunk):
    # on the CPU numpy compares straight into the mask; on other devices torch compares in pieces of
    # SELECT_CHUNK (that path run here on the CPU)
    import flatlab.optim._select as flat_mod

    if chunk is None:
        compare = flat_mod.at_most
    else:
        monkeypatch.setattr(flat_mod, "SELECT_CHUNK", chunk)
        compare = lambda values, bound, out: flat_mod._at_most_in_pieces(values.reshape(-1), bound, out.view(-1))  # noqa: E731
    h = torch.tensor([[0.5, float("nan"), 2.0, 0.25], [1.0, -0.0, float("inf"), 1.0]])
    out = torch.ones(2, 4, dtype=torch.bool)
    assert compare(h, 1.0, out) == 5
    assert out.tolist() == [[True, False, False, True], [True, True, False, True]]
    bits = h.abs().view(torch.int32)  # bit patterns compare as integers; -1 marks nothing
    assert compare(bits, int(torch.tensor(0.5).view(torch.int32)), out) == 3
    assert out.tolist() == [[True, False, False, True], [False, True, False, False]]
    assert compare(bits, -1, out) == 0 and not out.any()
    assert flat_mod.at_most(torch.empty(0), 1.0, torch.empty(0, dtype=torch.bool)) == 0
    with pytest.raises(ValueError, match="out must be a bool tensor of 8 entries, got 8 torch.float32"):
        flat_mod.at_most(h, 1.0, torch.empty(2, 4))


@pytest.mark.parametrize("select", ["kth_smallest_with_count", "radix_kth_smallest_with_count"])
@pytest.mark.parametrize("chunk", [5, 64, 1 << 22])  # pieces smaller than the k-th bucket, and not
def test_radix_select_over_several_tensors_equals_kthvalue_of_their_concatenation(monkeypatch, chunk, select):
    import flatlab.optim._select as flat_mod

    monkeypatch.setattr(flat_mod, "SELECT_CHUNK", chunk)
    g = torch.Generator().manual_seed(3)
    parts = [
        torch.randn(7, 5, generator=g).square(),
        torch.zeros(40),
        torch.randn(300, generator=g).square(),
        torch.full((3, 4), 0.25),
    ]
    parts[2][::7] = 0.25  # ties across tensors
    every = torch.cat([p.flatten() for p in parts])
    for k in (1, 40, 41, 60, 100, 200, every.numel()):
        value, count = getattr(flat_mod, select)(parts, k)
        assert value.item() == torch.kthvalue(every, k).values.item()
        assert count == int((every <= value).sum())


def _equal_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return int(a.view(torch.int32)) == int(b.view(torch.int32))


@pytest.mark.parametrize("chunk", [8, 13, 1 << 20])
@pytest.mark.parametrize("case", ["ties", "subnormals", "all-equal", "zeros"])
def test_radix_select_packs_small_tensors_and_stays_exact(monkeypatch, chunk, case):
    # Consecutive small pieces are binned into one scratch run and counted by one bincount per pass: the
    # value and count still equal torch.kthvalue of the concatenation, for every k (1 and n included),
    # with float32 and int32 (bit pattern) tensors mixed
    import flatlab.optim._select as flat_mod

    monkeypatch.setattr(flat_mod, "SELECT_CHUNK", chunk)
    g = torch.Generator().manual_seed(7)
    sizes = [1, 3, 2, 2, 5, 7, 17, 4]
    parts = [torch.randn(s, generator=g).square() for s in sizes]
    if case == "ties":
        for p in parts:
            p[::2] = 0.5  # ties across tensors and across runs
    elif case == "subnormals":
        for i, p in enumerate(parts):
            p[0] = 1e-45 * (i % 3)  # 0, the smallest subnormal, twice it
            if p.numel() > 1:
                p[1] = 3e-39  # subnormal ties
    elif case == "all-equal":
        parts = [torch.full((s,), 2.0**-130) for s in sizes]  # one subnormal value everywhere
    else:
        parts = [torch.zeros(s) for s in sizes]
    parts[3] = parts[3].view(torch.int32)  # a bit-pattern tensor among the float32 ones
    every = torch.cat([p.view(torch.float32) if p.dtype == torch.int32 else p for p in parts])
    n = every.numel()
    calls = []
    counts = flat_mod._add_counts
    monkeypatch.setattr(
        flat_mod, "_add_counts", lambda hist, bins, size: calls.append(bins.numel()) or counts(hist, bins, size)
    )
    for k in range(1, n + 1):
        calls.clear()
        value, count = flat_mod.radix_kth_smallest_with_count(parts, k)
        expected = torch.kthvalue(every, k).values
        assert _equal_bits(value, expected), (case, k)
        assert count == int((every <= expected).sum()) >= k
        # the runs cover every entry in each pass, each run within the chunk; small pieces share runs
        assert sum(calls) == 2 * n and max(calls) <= chunk
        assert len(calls) == 2 * (1 if chunk >= n else {8: 6, 13: 4}[chunk])  # 10 and 9 pieces
