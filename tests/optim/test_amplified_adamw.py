"""AdmIRE's amplified step inside AdamW's update (flatlab.optim._amplified_adamw) against IRE's copy and
blend over torch's AdamW: same masks, parameters equal to rounding, coordinates that are not flat within
rounding of torch's AdamW (the same decay c, applied as θ − c·θ; the step in Adam's efficient order), the
moments bit for bit torch's, as many passes over a parameter as torch's AdamW makes; and the cases where
IRE must fall back to the copy and blend."""

from __future__ import annotations

import collections
from typing import Dict

import pytest
import torch
from _optim_testlib import (
    assert_bitwise,
    assert_within_rounding_of_step,
    closure_for,
    image_batch,
    mlp,
    params_of,
    small_cnn,
    ulps_apart,
    vector_batch,
)
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from flatlab.optim import _amplified_adamw
from flatlab.optim.ire import IRE


def _admire(model, hook: bool = False, **adamw):
    kw = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    kw.update(adamw)
    base = torch.optim.AdamW(model.parameters(), **kw)
    handle = base.register_step_pre_hook(lambda *a: None) if hook else None  # a hook forces the copy and blend
    opt = IRE(base, kappa=3.0, gamma=0.7, mask_interval=3, kappa_decay=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + 0.2 * step))
    return opt, sched, handle


def _rel(a, b):
    num = sum(float((x - y).pow(2).sum()) for x, y in zip(a, b)) ** 0.5
    return num / sum(float(y.pow(2).sum()) for y in b) ** 0.5


# Runs compared over many steps use an MLP: a convolution's bias before BatchNorm has a gradient of pure
# rounding noise, which Adam scales to a full step, so two runs that differ by rounding part there.


@pytest.mark.parametrize("weight_decay", [0.1, 0.0, 100.0], ids=["wd", "no-wd", "lr-wd-one"])
def test_amplified_step_equals_the_copy_and_blend_over_torch_adamw(weight_decay):
    # lr·wd = 1 on the first step (lr 1e-2, wd 100): AdamW's decay zeroes θ, and flat coordinates get
    # θ_old + (1+κ)·Δ = −κ·θ_old − ..., which the decay θ − c·s⊙θ with c = 1 also gives
    batch = vector_batch()
    direct_model, blend_model = mlp(hidden=16), mlp(hidden=16)
    direct, direct_sched, _ = _admire(direct_model, weight_decay=weight_decay)
    blend, blend_sched, _ = _admire(blend_model, hook=True, weight_decay=weight_decay)
    for step in range(12):
        torch.manual_seed(100 + step)  # the same sampled labels on refresh steps
        direct.step(closure_for(direct_model, batch))
        torch.manual_seed(100 + step)
        blend.step(closure_for(blend_model, batch))
        direct_sched.step()
        blend_sched.step()
        for p, q in zip(direct_model.parameters(), blend_model.parameters()):
            assert torch.equal(direct.state[p]["mask"], blend.state[q]["mask"])
            # which way each took: the amplified step keeps no θ_old; the blend keeps θ_old and its weights
            assert "theta" not in direct.state[p] and "scale" in direct.state[p]
            assert "theta" in blend.state[q] and "scale" not in blend.state[q]
        assert _rel(params_of(direct_model), params_of(blend_model)) < 1e-6
    flat_fraction = sum(int(direct.state[p]["mask"].sum()) for p in direct_model.parameters())
    assert 0.6 < flat_fraction / sum(p.numel() for p in direct_model.parameters()) <= 0.75


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_amplified_step_off_the_mask_is_adamw_to_rounding_and_the_moments_bitwise(dtype):
    # float64: the hand formula θ_old + (1+κ)·Δ is exact enough to check the amplification tightly
    model = mlp(hidden=16).to(dtype)
    x, y = vector_batch()
    opt, sched, _ = _admire(model)
    closure = closure_for(model, (x.to(dtype), y))
    for _ in range(2):  # AdamW's state exists, a mask is in force (refreshed on the first of 3 steps)
        opt.step(closure)
        sched.step()
    ref = torch.optim.AdamW(
        [p.detach().clone().requires_grad_() for p in model.parameters()],
        lr=opt.param_groups[0]["lr"],
        betas=(0.9, 0.95),
        weight_decay=0.1,
    )
    for p, r in zip(model.parameters(), ref.param_groups[0]["params"]):
        ref.state[r] = {k: v.clone() for k, v in opt.base.state[p].items()}
    masks = [opt.state[p]["mask"].clone() for p in model.parameters()]
    old = params_of(model)
    opt.step(closure)  # not a refresh step (mask_interval 3): the masks above are the ones applied
    for p, r in zip(model.parameters(), ref.param_groups[0]["params"]):
        r.grad = p.grad.clone()
    ref.step()
    kappa = opt.kappa_at(0)
    assert 0 < kappa < 3.0  # κ decays with the schedule
    for p, r, o, mask in zip(model.parameters(), ref.param_groups[0]["params"], old, masks):
        assert torch.equal(opt.state[p]["mask"], mask)
        new = r.detach()
        assert_within_rounding_of_step(p.detach()[~mask], new[~mask], (new - o)[~mask], ulps=2, steps=4)
        if dtype == torch.float64:
            torch.testing.assert_close(p.detach()[mask], (o + (1 + kappa) * (new - o))[mask], rtol=1e-12, atol=1e-15)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.base.state[p][key], ref.state[r][key]), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lr, weight_decay", [(1e-3, 0.1), (1e-4, 0.01), (3e-4, 5e-4), (1e-2, 100.0)])
def test_the_decay_is_the_one_torch_s_adamw_applies(dtype, lr, weight_decay):
    # torch multiplies θ by 1 − lr·wd rounded to float32 (float64 for float64 tensors): for lr·wd = 1e-6
    # that factor is off by up to 3 % of lr·wd. applied_decay returns that c exactly, so θ − c·θ decays a
    # coordinate by what torch's AdamW does (to an ulp), not by the exact lr·wd
    c = _amplified_adamw.applied_decay(lr, weight_decay, dtype)
    assert float(torch.ones((), dtype=dtype).mul_(1 - lr * weight_decay)) == 1 - c  # torch's own factor
    theta = torch.randn(10_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
    torch_decay = theta.clone().mul_(1 - lr * weight_decay)
    ours = theta.clone().addcmul_(theta, torch.ones_like(theta), value=-c)
    assert int(ulps_apart(ours, torch_decay).max()) <= 1
    # the decrement summed over the coordinates: torch's, not a systematically different one
    decrement = float((theta - torch_decay).double().sum())
    assert float((theta - ours).double().sum()) / decrement == pytest.approx(1, abs=2e-3)
    off = abs(lr * weight_decay - c) / c  # the rounding of torch's factor, relative to its decay
    if off > 0.01:  # float32, lr·wd of 1e-6 (1.3 %) and 1.5e-7 (16 %): the exact lr·wd would decay less or more
        exact = theta.clone().addcmul_(theta, torch.ones_like(theta), value=-lr * weight_decay)
        assert abs(float((theta - exact).double().sum()) / decrement - 1) > 0.5 * off
    assert (off > 0.01) == (dtype == torch.float32 and lr * weight_decay < 1e-5)


class FullSizeOps(TorchDispatchMode):
    """Counts, by name, the operations that read or write a tensor of ``numel`` entries: passes over a
    parameter of that size (its AdamW state and temporaries have the same size)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel = numel
        self.seen: Dict[str, int] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = tree_flatten((args, kwargs, out))[0]
        if any(isinstance(t, torch.Tensor) and t.numel() == self.numel for t in tensors):
            self.seen[func.overloadpacket.__name__] += 1
        return out


def test_amplified_step_makes_as_many_passes_over_a_parameter_as_torch_s_adamw():
    # issue 26: IRE's cost on a step that holds the mask is that of AdamW's own passes. torch's eight
    # (decay, lerp, two for v, √v, ÷√bc2, +ε, update) against decay by s, lerp, two for v, √v, +ε̂, ÷s,
    # update: the division by s takes the place of the division by √bc2
    weight = torch.randn(300, 7, generator=torch.Generator().manual_seed(0))
    grad = torch.randn(300, 7, generator=torch.Generator().manual_seed(1))
    counts = []
    for scales in (None, torch.where(torch.rand(300, 7) < 0.5, 4.0, 1.0)):
        p = weight.clone().requires_grad_()
        base = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.1)
        for _ in range(2):  # the second step: the state exists
            p.grad = grad.clone()
            watch = FullSizeOps(p.numel())
            with watch:
                if scales is None:
                    base.step()
                else:
                    _amplified_adamw.amplified_adamw_step(base, {p: scales})
        counts.append(sum(n for name, n in watch.seen.items() if name not in ("clone", "detach", "alias")))
    assert counts == [8, 8]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_first_step_initialises_adamw_state_as_torch_does(dtype):
    # κ = 0 in the only group: the step is AdamW's alone, from empty state, bit for bit
    model, batch = small_cnn().to(dtype), image_batch()
    ref_model = small_cnn().to(dtype)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # torch keeps AdamW's step count in float64 under a float64 default
    try:
        base = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        ref = torch.optim.AdamW(ref_model.parameters(), lr=1e-2, weight_decay=0.1)
        closure_for(model, (batch[0].to(dtype), batch[1]))()
        closure_for(ref_model, (batch[0].to(dtype), batch[1]))()
        assert _amplified_adamw.applies(base)
        _amplified_adamw.amplified_adamw_step(base, {})
        ref.step()
    finally:
        torch.set_default_dtype(default)
    assert_bitwise(params_of(model), params_of(ref_model))
    for p, r in zip(model.parameters(), ref_model.parameters()):
        assert set(base.state[p]) == set(ref.state[r]) == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in ref.state[r].items():
            mine = base.state[p][key]
            assert (mine.dtype, mine.device, mine.shape) == (value.dtype, value.device, value.shape), key
            assert torch.equal(mine, value), key


def test_switching_ways_mid_run_rebuilds_what_each_needs():
    # a hook added and removed between steps: each step takes the other way, and still agrees
    batch = vector_batch()
    model, always_blend_model = mlp(hidden=16), mlp(hidden=16)
    opt, sched, _ = _admire(model)
    ref, ref_sched, _ = _admire(always_blend_model, hook=True)
    handle = None
    for step in range(9):
        if step % 2 == 1:
            handle = opt.base.register_step_pre_hook(lambda *a: None)
        elif handle is not None:
            handle.remove()
        for o, m in ((opt, model), (ref, always_blend_model)):
            torch.manual_seed(7 + step)
            o.step(closure_for(m, batch))
        sched.step()
        ref_sched.step()
        assert _rel(params_of(model), params_of(always_blend_model)) < 1e-6
        kept = set(opt.state[next(model.parameters())])
        assert ("scale" in kept) == (step % 2 == 0) and ("theta" in kept) == (step % 2 == 1)


@pytest.mark.parametrize(
    "options, applies",
    [
        ({}, True),
        ({"amsgrad": True}, False),
        ({"maximize": True}, False),
        ({"foreach": True}, False),
        ({"foreach": False}, True),
        ({"lr": torch.tensor(1e-2)}, False),
        ({"weight_decay": 100.0}, True),  # lr·wd = 1: θ's decay is 0; θ − c·s⊙θ with c = 1 still gives −κ·θ_old
    ],
    ids=["default", "amsgrad", "maximize", "foreach", "no-foreach", "tensor-lr", "lr-wd-one"],
)
def test_amplified_step_applies_only_to_torch_s_plain_single_tensor_adamw(options, applies):
    model, batch = small_cnn(), image_batch()
    opt, _, _ = _admire(model, **options)
    closure_for(model, batch)()
    assert _amplified_adamw.applies(opt.base) == applies  # before AdamW's first step (no state yet)
    opt.step(closure_for(model, batch))
    assert _amplified_adamw.applies(opt.base) == applies
    opt.step(closure_for(model, batch))
    p = next(model.parameters())
    assert ("scale" in opt.state[p]) == applies and ("theta" in opt.state[p]) != applies
    assert all(torch.isfinite(q).all() for q in model.parameters())


def test_not_for_subclasses_or_hooked_optimizers():
    model, batch = small_cnn(), image_batch()

    class MyAdamW(torch.optim.AdamW):
        pass

    sub = MyAdamW(model.parameters(), lr=1e-3)
    sub.step(closure_for(model, batch))
    assert not _amplified_adamw.applies(sub)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-3)
    plain.step(closure_for(model, batch))
    assert _amplified_adamw.applies(plain)
    handle = register_optimizer_step_post_hook(lambda *a: None)
    try:
        assert not _amplified_adamw.applies(plain)
    finally:
        handle.remove()
    assert _amplified_adamw.applies(plain)
    p = next(model.parameters())
    with pytest.raises(ValueError, match=r"scale .* torch.float64 for a parameter .* torch.float32; expected"):
        _amplified_adamw.amplified_adamw_step(plain, {p: torch.ones_like(p, dtype=torch.float64)})
