"""IRE under subnormal floats (issue 26): the mask is ranked without squaring the sampled-label gradient.

Once the loss saturates, many sampled-label gradient entries fall below 2^-63 ≈ 1.1e-19, so h = g² is
subnormal or 0 in float32 and every operation on it takes the CPU's slow path. IRE never forms h: the
mask ``fl(g_i²) ≤ kthvalue(fl(g²), k)`` equals ``|g_i| ≤ G``, G the largest float32 whose square rounds to
at most the k-th smallest one (``flatlab.optim._select.square_tie_ceiling``). These tests check that the
mask is still bit for bit the squared one, ties through underflow included, and that 100 AdmIRE steps on
a saturating MLP do no floating-point work on subnormals in IRE's own code.
"""

from __future__ import annotations

import collections
import math
from typing import Dict, List, Optional, Sequence, Set

import pytest
import torch
import torch.nn.functional as F
from _optim_testlib import closure_for, mlp, vector_batch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import flatlab.optim._select as flat_mod
import flatlab.optim.ire as ire_mod
from flatlab.optim import get_optimizer
from flatlab.optim._select import F32_INF_BITS, square_tie_ceiling
from flatlab.optim.ire import IRE, flat_count
from flatlab.train.closure import BatchClosure

OPS_SEEN = 500  # IRE's arithmetic operations in 100 steps, at least (1080 counted: copy, lerp, mask, select)


def subnormal_count(t: torch.Tensor) -> int:
    """Entries of a floating tensor that are finite, non-zero and below the smallest normal number."""
    if not t.is_floating_point() or t.numel() == 0:
        return 0
    return int((torch.isfinite(t) & (t.abs() < torch.finfo(t.dtype).tiny) & (t != 0)).sum())


def f32(bits: int) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).view(torch.float32)


def square_bits(bits: int) -> int:
    x = f32(bits)
    return int((x * x).view(torch.int32))


# ------------------------------------------------------------------------------- the tie ceiling
@pytest.mark.parametrize(
    "bits,expected",
    [
        (0, 0x1A000000),  # every x ≤ 2^-75 squares to 0 (2^-150 rounds to even, 0)
        (1, 0x1A000000),  # the smallest subnormal: its square is 0 too
        (0x1A000000, 0x1A000000),
        (0x3F800000, 0x3F800000),  # 1.0: the next float squares to 1 + 2^-22
        (F32_INF_BITS, F32_INF_BITS),
    ],
)
def test_square_tie_ceiling_at_hand_computed_points(bits, expected):
    assert square_tie_ceiling(f32(bits)) == expected


def test_square_tie_ceiling_is_the_last_float_whose_square_rounds_to_at_most_the_given_one():
    g = torch.Generator().manual_seed(0)
    edges = [0x1A000001, 0x1F7FFFFF, 0x20000000, 0x20000001, 0x3A83126F, 0x5F7FFFFF, 0x5F800000, 0x7F7FFFFF]
    spread = torch.randint(0, F32_INF_BITS + 1, (300,), generator=g).tolist()
    tiny = torch.randint(0, 0x20000000, (100,), generator=g).tolist()  # squares subnormal or 0
    for bits in edges + spread + tiny:
        ceiling = square_tie_ceiling(f32(bits))
        assert bits <= ceiling <= F32_INF_BITS
        assert square_bits(ceiling) <= square_bits(bits)
        if ceiling < F32_INF_BITS:
            assert square_bits(ceiling + 1) > square_bits(bits)
    # the overflow: squares of x ≥ about 1.8e19 round to +inf, as does +inf's
    assert square_tie_ceiling(torch.tensor(2e19)) == F32_INF_BITS


def test_square_tie_ceiling_rejects_bad_input():
    with pytest.raises(ValueError, match="must be >= 0 and not NaN"):
        square_tie_ceiling(torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="must be >= 0 and not NaN"):
        square_tie_ceiling(torch.tensor(-1.0))
    with pytest.raises(ValueError, match="must be one float32 number"):
        square_tie_ceiling(torch.tensor(1.0, dtype=torch.float64))


# ---------------------------------------------------------------- the mask on designed subnormals
def designed_gradient(numel: int) -> torch.Tensor:
    """``numel`` sampled-gradient entries (float32, random signs, shuffled) in three bands of g²:
    exactly 0 after underflow (g = 0, −0, a subnormal g, up to 2^-75), subnormal with ties through
    rounding (|g| in (2^-75, 2^-63), some pairs squaring to the same number), and normal."""
    g = torch.Generator().manual_seed(7)
    zero_band = torch.tensor([0.0, -0.0, 1e-45, 3e-39, 1e-30, 2.0**-75, 1e-23, 2e-23, 2.5e-23, 1e-25])
    n_sub = 30
    sub_band = torch.exp(torch.empty(n_sub).uniform_(math.log(3e-23), math.log(1e-19), generator=g))
    sub_band[1::3] = torch.nextafter(
        sub_band[0::3][: len(sub_band[1::3])], torch.tensor(1.0)
    )  # a neighbour: same square
    normal = torch.exp(torch.empty(numel - len(zero_band) - n_sub).uniform_(math.log(1e-6), 0.0, generator=g))
    values = torch.cat([zero_band, sub_band, normal])
    signs = torch.where(torch.rand(numel, generator=g) < 0.5, -1.0, 1.0)
    return (values * signs)[torch.randperm(numel, generator=g)]


def _mask_of(model, gamma: float, values: torch.Tensor) -> torch.Tensor:
    def sampled(params: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        out, i = [], 0
        for p in params:
            out.append(values[i : i + p.numel()].reshape(p.shape).clone())
            i += p.numel()
        return out

    class Designed:  # delegates to the batch closure but hands over the designed sampled gradients
        def __init__(self, inner):
            self.inner = inner

        def __call__(self):
            return self.inner()

        def extra(self):
            return self.inner.extra()

        def with_sampled_grads(self, params):
            return self.inner(), sampled(params)

    opt = IRE(torch.optim.SGD(model.parameters(), lr=0.1), kappa=1.0, gamma=gamma)
    opt.step(Designed(closure_for(model, vector_batch())))
    mask = torch.cat([opt.state[p]["mask"].reshape(-1) for p in model.parameters()])
    assert opt.pop_metrics()["opt/flat_fraction"] == pytest.approx(int(mask.sum()) / mask.numel())
    return mask


@pytest.mark.parametrize("chunk", [1 << 20, 16], ids=["one-vector", "in-pieces"])
@pytest.mark.parametrize("gamma", [0.05, 0.15, 0.3, 0.45, 0.8])
def test_mask_equals_the_squared_curvature_mask_when_squares_underflow(monkeypatch, gamma, chunk):
    monkeypatch.setattr(ire_mod, "SELECT_CHUNK", chunk)  # 92 coordinates: concatenated, or ranked tensor by tensor
    monkeypatch.setattr(flat_mod, "SELECT_CHUNK", chunk)
    model = mlp()
    numel = sum(p.numel() for p in model.parameters())  # 92
    g = designed_gradient(numel)
    h = g * g  # the authors' curvature in float32: subnormal squares, and zeros where they underflow
    k = flat_count(gamma, numel)
    expected = h <= torch.kthvalue(h, k).values
    assert torch.equal(_mask_of(model, gamma, g), expected)


def test_the_designed_case_has_subnormal_squares_and_ties_through_underflow():
    # The case above can fail: its h holds subnormals, and its thresholds fall where squaring ties
    # magnitudes, so ranking |g| with the k-th |g| as threshold (no tie ceiling) marks fewer.
    g = designed_gradient(92)
    h = g * g
    assert subnormal_count(h) >= 15 and int((h == 0).sum()) == 10 and subnormal_count(g) == 2
    for gamma in (0.05, 0.15):  # thresholds 0 (10 tie) and a subnormal square two magnitudes share
        k = flat_count(gamma, 92)
        by_square = int((h <= torch.kthvalue(h, k).values).sum())
        by_magnitude = int((g.abs() <= torch.kthvalue(g.abs(), k).values).sum())
        assert by_square > by_magnitude == k


def flushed(g: torch.Tensor) -> torch.Tensor:
    """``g`` as a CPU in flush-to-zero mode writes it (Resources(flush_denormal=True)): every subnormal
    entry becomes a zero of its sign, the rest is unchanged (built on the bits, not by float arithmetic)."""
    bits = g.view(torch.int32)
    subnormal = ((bits & 0x7F800000) == 0) & ((bits & 0x7FFFFF) != 0)
    return torch.where(subnormal, bits & torch.tensor(-(2**31), dtype=torch.int32), bits).view(torch.float32)


def mostly_subnormal_gradient(numel: int) -> torch.Tensor:
    """A sampled gradient whose smallest 40 % are subnormal and next 10 % square to a subnormal or to 0."""
    g = torch.Generator().manual_seed(11)
    n_sub, n_tiny = int(0.4 * numel), int(0.1 * numel)
    sub = torch.exp(torch.empty(n_sub).uniform_(math.log(1.5e-45), math.log(1e-38), generator=g))
    tiny = torch.exp(torch.empty(n_tiny).uniform_(math.log(2e-38), math.log(1e-19), generator=g))
    normal = torch.exp(torch.empty(numel - n_sub - n_tiny).uniform_(math.log(1e-6), 0.0, generator=g))
    signs = torch.where(torch.rand(numel, generator=g) < 0.5, -1.0, 1.0)
    return (torch.cat([sub, tiny, normal]) * signs)[torch.randperm(numel, generator=g)]


@pytest.mark.parametrize("gamma", [0.05, 0.15, 0.3, 0.45, 0.6, 0.8])
@pytest.mark.parametrize("make", [designed_gradient, mostly_subnormal_gradient], ids=["designed", "mostly-subnormal"])
def test_flushing_the_sampled_gradients_subnormals_leaves_the_mask_unchanged(gamma, make):
    # a trial's CPU threads flush subnormals by default (flatlab.train.cpu_threads): the sampled gradient
    # then holds 0 where it held a subnormal. Every |g| <= 2^-75 squares to 0 in float32, so h and the
    # mask are the same, also where the threshold is 0 (small γ) and where it is normal.
    model = mlp()
    g = make(sum(p.numel() for p in model.parameters()))
    assert subnormal_count(g) >= 2 and subnormal_count(flushed(g)) == 0
    assert torch.equal(flushed(g).abs() == 0, (g.abs() == 0) | (g.abs() < torch.finfo(torch.float32).tiny))
    h = g * g  # the authors' curvature (unflushed)
    expected = h <= torch.kthvalue(h, flat_count(gamma, g.numel())).values
    assert torch.equal(_mask_of(model, gamma, flushed(g)), expected)
    assert torch.equal(_mask_of(model, gamma, g), expected)


def test_nan_and_inf_rank_as_their_squares():
    model = mlp()
    g = designed_gradient(92)
    g[3], g[50], g[60] = float("nan"), float("-inf"), -3e19  # 3e19² overflows to inf, like −inf's
    h = g * g
    for gamma in (0.5, 0.98):  # k = 46: a finite threshold; k = 90: +inf, and NaN is still not flat
        expected = h <= torch.kthvalue(h, flat_count(gamma, 92)).values
        assert torch.equal(_mask_of(model, gamma, g), expected)
    all_nan = torch.full((92,), float("nan"))
    assert int(_mask_of(model, 0.5, all_nan).sum()) == 0  # h ≤ NaN marks nothing


# ------------------------------------------------------------------------ 100 steps of AdmIRE
# IRE's own work on a step: everything outside the base's step, plus the mask refresh (called from
# inside it, through the curvature closure). Operations that only move data are not arithmetic.
_DATA_MOVES = {
    "view",
    "_unsafe_view",
    "reshape",
    "cat",
    "split",
    "split_with_sizes",
    "copy_",
    "clone",
    "detach",
    "alias",
    "_to_copy",
    "select",
    "slice",
    "as_strided",
    "t",
    "expand",
    "unsqueeze",
    "squeeze",
    "transpose",
    "permute",
    "_foreach_copy_",
    "lift_fresh",
    "empty_like",
    "zeros_like",
}


class SubnormalArithmetic(TorchDispatchMode):
    """Counts floating-point operations that read or write subnormals while ``active`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.found: Dict[str, int] = collections.Counter()
        self.ops = 0
        self.seen: Dict[str, int] = collections.Counter()  # operations counted, by name
        # when set: count only operations with one of these tensors (by storage) among their arguments
        self.only_with: Optional[Set[int]] = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if self.active and name not in _DATA_MOVES:
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            if self.only_with is not None and not any(t.data_ptr() in self.only_with for t in tensors):
                return out
            self.ops += 1
            self.seen[name] += 1
            n = sum(subnormal_count(t) for t in tensors)
            if n:
                self.found[name] += n
        return out


def issue_mlp_run(steps: int):
    """The issue's MLP (3072 → 512 → 512 → 10, ReLU), random inputs, batch 64, AdmIRE's defaults, with
    IRE's own operations watched; returns (optimizer, model, watcher, sampled-gradient magnitudes)."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3072, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x, y = torch.randn(64, 3072, generator=g), torch.randint(0, 10, (64,), generator=g)
    opt = get_optimizer("adamw_ire").create(model.named_parameters())
    closure = BatchClosure(model, F.cross_entropy, x, y)
    watch = SubnormalArithmetic()
    below: List[float] = []  # per refresh: fraction of sampled-gradient entries whose square underflows

    def watched(fn, active: bool):
        def call(*a, **kw):
            before, watch.active = watch.active, active
            try:
                return fn(*a, **kw)
            finally:
                watch.active = before

        return call

    refresh, base_step = opt._refresh_mask, opt.base.step

    def record(sampled):
        every = torch.cat([s.reshape(-1) for s in sampled if s is not None])
        below.append(float(((every != 0) & (every.abs() < 2.0**-63)).float().mean()))

    def refresh_and_record(params, sampled):
        watched(record, False)(sampled)  # the test's own look at the sampled gradients is not IRE's work
        watched(refresh, True)(params, sampled)

    class ModelPasses:  # the closure's passes (forward, backward, label sampling) are the model's work
        def __call__(self):
            return watched(closure, False)()

        def extra(self):
            return watched(closure.extra, False)()

        def with_sampled_grads(self, params):
            return watched(closure.with_sampled_grads, False)(params)

    amplified = ire_mod._amplified_adamw.amplified_adamw_step

    def amplified_watched(base, scales):
        # AdamW's update with IRE's two passes in it: AdamW's own arithmetic (on the gradient and its
        # moments) is the base's work, as inside base.step(); IRE's passes are those that read s = 1 + κ·n
        watch.only_with = {s.data_ptr() for s in scales.values()}
        try:
            return watched(amplified, True)(base, scales)
        finally:
            watch.only_with = None

    opt.base.step = watched(base_step, False)
    opt._refresh_mask = refresh_and_record
    ire_mod._amplified_adamw.amplified_adamw_step = amplified_watched
    try:
        with watch:
            for _ in range(steps):
                watch.active = True
                opt.step(ModelPasses())
                watch.active = False
    finally:
        ire_mod._amplified_adamw.amplified_adamw_step = amplified
    return opt, model, watch, below


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the issue; also spares a shared machine
    yield
    torch.set_num_threads(threads)


def test_admire_does_no_arithmetic_on_subnormals_in_100_steps_on_a_saturating_mlp(one_thread):
    opt, model, watch, below = issue_mlp_run(100)
    # the regime of issue 26: once the loss saturates, a fifth of the sampled gradient squares to a
    # subnormal or 0 (IRE's earlier code squared it: ~3·10^5 subnormal products per refresh here)
    assert len(below) == 10 and max(below[2:]) > 0.05
    assert watch.ops > OPS_SEEN and dict(watch.found) == {}
    # IRE's passes inside AdamW's update were watched: two per tensor and step, the decay θ − c·s⊙θ (in
    # place of AdamW's θ·(1 − c)) and the denominator d / s; 6 tensors, 100 steps
    assert watch.seen["addcmul_"] == 6 * 100 and watch.seen["div_"] == 6 * 100
    kept: Dict[str, int] = collections.Counter()
    for p in model.parameters():
        for key, value in opt.state[p].items():
            kept[key] += subnormal_count(value)
    assert dict(kept) == {"mask": 0, "scale": 0}  # AdamW on the CPU: the amplified step keeps no θ_old
    assert sum(subnormal_count(p.detach()) for p in model.parameters()) == 0
