"""The registered defaults of ``tsam``, ``asam``, ``sam_adamw`` against hand-written references of the authors'
procedures (../shared/ALGORITHMS.md, sections 1 and 2), several steps on a tiny BatchNorm CNN in float64
with the same random draws.

The references below are written from the algorithm descriptions with plain tensor code (SGD with momentum
and AdamW written out too); they do not call flatlab's optimizers. Agreement is measured as the relative
L2 distance over all parameters, ‖θ_ours − θ_ref‖ / ‖θ_ref‖ ≤ 1e-6; each test also shows that the
alternative option (TSAM ``primary_pass='center'``, ASAM ``asam_scope='weights'``) is measurably further
away, so the comparison can fail.
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import pytest
import torch
import torch.nn.functional as F
from _optim_testlib import closure_for
from torch import nn

from flatlab.optim import get_optimizer

STEPS = 5
LR, MOMENTUM, WD = 0.05, 0.9, 5e-4


def tiny_bn_cnn(seed: int = 0) -> nn.Module:
    """Conv(2→3, 3×3)-BN-ReLU-Linear on 2×5×5 inputs, float64 (conv, BN gain/shift, linear: 6 tensors)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 3 * 3, 4)
    ).double()


def batches(n: int = STEPS) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [
        (torch.randn(8, 2, 5, 5, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g))
        for _ in range(n)
    ]


# ------------------------------------------------------------------------------------ reference parts
def loss_and_grads(model: nn.Module, batch, *, update_bn: bool) -> Tuple[float, List[torch.Tensor]]:
    """Mean cross-entropy and its gradient at the model's current parameters (train-mode BatchNorm).

    ``update_bn=False``: the running statistics are put back afterwards (the extra passes of
    ALGORITHMS.md section 1, "must not update BatchNorm running statistics").
    """
    saved = {k: v.clone() for k, v in model.state_dict().items() if not k.endswith(("weight", "bias"))}
    x, y = batch
    params = list(model.parameters())
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params)
    if not update_bn:
        with torch.no_grad():
            for k, v in model.state_dict().items():
                if k in saved:
                    v.copy_(saved[k])
    return float(loss.detach()), [g.detach().clone() for g in grads]


def set_params(model: nn.Module, values: List[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, v in zip(model.parameters(), values):
            p.copy_(v)


def norm(ts: List[torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum((t * t).sum() for t in ts))


class SGDByHand:
    """torch.optim.SGD's rule written out: d = g + wd·θ; b = d (first step) else μ·b + d; θ ← θ − lr·b."""

    def __init__(self) -> None:
        self.buf: List[torch.Tensor] = []

    def step(self, theta: List[torch.Tensor], grads: List[torch.Tensor]) -> List[torch.Tensor]:
        d = [g + WD * t for g, t in zip(grads, theta)]
        self.buf = d if not self.buf else [MOMENTUM * b + x for b, x in zip(self.buf, d)]
        return [t - LR * b for t, b in zip(theta, self.buf)]


class AdamWByHand:
    """AdamW (Loshchilov & Hutter 2019): θ ← θ(1 − lr·wd), then the bias-corrected Adam step."""

    def __init__(self, lr: float, wd: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        self.lr, self.wd, (self.b1, self.b2), self.eps = lr, wd, betas, eps
        self.m: List[torch.Tensor] = []
        self.v: List[torch.Tensor] = []
        self.k = 0

    def step(self, theta: List[torch.Tensor], grads: List[torch.Tensor]) -> List[torch.Tensor]:
        self.k += 1
        if not self.m:
            self.m = [torch.zeros_like(g) for g in grads]
            self.v = [torch.zeros_like(g) for g in grads]
        self.m = [self.b1 * m + (1 - self.b1) * g for m, g in zip(self.m, grads)]
        self.v = [self.b2 * v + (1 - self.b2) * g * g for v, g in zip(self.v, grads)]
        c1, c2 = 1 - self.b1**self.k, 1 - self.b2**self.k
        return [
            t * (1 - self.lr * self.wd) - self.lr * (m / c1) / ((v / c2).sqrt() + self.eps)
            for t, m, v in zip(theta, self.m, self.v)
        ]


def tsam_reference(model: nn.Module, *, rho: float, s: int, t: float, r: float, seed: int) -> List[torch.Tensor]:
    """TSAM as ALGORITHMS.md section 2 describes the released procedure, ``STEPS`` steps over SGD.

    Per sample j: δ_j = n·min(1, r/‖n‖), n ~ N(0, I) drawn tensor by tensor in parameter order from the
    global RNG; g at θ+δ_j (for j = 1 too); ε_j = δ_j + ρ·g/‖g‖; L_j, G_j at θ+ε_j. Then w = softmax(t·L),
    the base steps with Σ_j w_j G_j. BatchNorm statistics: updated by the first pass (at θ+δ_1) only.
    """
    torch.manual_seed(seed)
    base = SGDByHand()
    for batch in batches():
        theta = [p.detach().clone() for p in model.parameters()]
        losses, grads = [], []
        for j in range(s):
            n = [torch.randn_like(th) for th in theta]
            delta = [x * min(1.0, r / float(norm(n))) for x in n]
            set_params(model, [th + d for th, d in zip(theta, delta)])
            _, g = loss_and_grads(model, batch, update_bn=(j == 0))
            gn = float(norm(g))
            set_params(model, [th + d + rho * x / gn for th, d, x in zip(theta, delta, g)])
            loss_j, grads_j = loss_and_grads(model, batch, update_bn=False)
            losses.append(loss_j)
            grads.append(grads_j)
        w = torch.softmax(t * torch.tensor(losses, dtype=torch.float64), 0)
        tilted = [sum(w[j] * grads[j][i] for j in range(s)) for i in range(len(theta))]
        set_params(model, base.step(theta, tilted))
    return [p.detach().clone() for p in model.parameters()]


def asam_reference(model: nn.Module, *, rho: float, eta: float) -> List[torch.Tensor]:
    """ASAM (Kwon et al. 2021) as ALGORITHMS.md section 1 describes the official code, over SGD.

    T_w = |w| + η for every parameter whose NAME contains 'weight' (BatchNorm's gain included), 1 for the
    others; ε = ρ·T²⊙g/‖T⊙g‖ with g the gradient at θ; the base steps with the gradient at θ+ε
    (BatchNorm statistics updated at θ only).
    """
    base = SGDByHand()
    names = [n for n, _ in model.named_parameters()]
    for batch in batches():
        theta = [p.detach().clone() for p in model.parameters()]
        _, g = loss_and_grads(model, batch, update_bn=True)
        T = [th.abs() + eta if "weight" in n else torch.ones_like(th) for n, th in zip(names, theta)]
        scale = rho / float(norm([a * b for a, b in zip(T, g)]))
        set_params(model, [th + scale * a * a * b for th, a, b in zip(theta, T, g)])
        _, g_adv = loss_and_grads(model, batch, update_bn=False)
        set_params(model, base.step(theta, g_adv))
    return [p.detach().clone() for p in model.parameters()]


def sam_adamw_reference(model: nn.Module, *, rho: float, lr: float, wd: float) -> List[torch.Tensor]:
    """SAM (Foret et al. 2021, ε = ρ·g/‖g‖, one global norm) then an AdamW step with ∇L(θ+ε)."""
    base = AdamWByHand(lr, wd)
    for batch in batches():
        theta = [p.detach().clone() for p in model.parameters()]
        _, g = loss_and_grads(model, batch, update_bn=True)
        gn = float(norm(g))
        set_params(model, [th + rho * x / gn for th, x in zip(theta, g)])
        _, g_adv = loss_and_grads(model, batch, update_bn=False)
        set_params(model, base.step(theta, g_adv))
    return [p.detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------------------------ ours
def run_ours(name: str, *, seed: int = 0, **hp) -> Tuple[List[torch.Tensor], Dict[str, torch.Tensor]]:
    model = tiny_bn_cnn()
    opt = get_optimizer(name).create(model.named_parameters(), **hp)  # as the trainer builds it
    torch.manual_seed(seed)
    for batch in batches():
        opt.step(closure_for(model, batch))
    buffers = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    return [p.detach().clone() for p in model.parameters()], buffers


def rel_distance(a: List[torch.Tensor], b: List[torch.Tensor]) -> float:
    return float(norm([x - y for x, y in zip(a, b)]) / norm(b))


# ------------------------------------------------------------------------------------ tests
TSAM_HP = dict(rho=0.2, s=3, t=5.0, noise_radius=0.3)


def test_tsam_default_is_the_released_procedure():
    ref_model = tiny_bn_cnn()
    ref = tsam_reference(ref_model, rho=0.2, s=3, t=5.0, r=0.3, seed=3)
    sgd = dict(lr=LR, momentum=MOMENTUM, weight_decay=WD)
    ours, buffers = run_ours("tsam", seed=3, **sgd, **TSAM_HP)
    assert get_optimizer("tsam").resolve({})["primary_pass"] == "noisy"
    moved = rel_distance([p.detach() for p in tiny_bn_cnn().parameters()], ref)
    assert moved > 1e-2  # the reference did move
    assert rel_distance(ours, ref) <= 1e-6
    for k, v in buffers.items():  # statistics from the primary pass at θ+δ_1 only
        torch.testing.assert_close(v, ref_model.state_dict()[k], rtol=1e-9, atol=1e-12, msg=k)
    center, _ = run_ours("tsam", seed=3, primary_pass="center", **sgd, **TSAM_HP)
    assert rel_distance(center, ref) > 1e-4  # the option changes sample 1's ascent direction


def test_asam_default_is_the_official_weight_name_rule():
    ref = asam_reference(tiny_bn_cnn(), rho=0.5, eta=0.01)
    sgd = dict(lr=LR, momentum=MOMENTUM, weight_decay=WD)
    ours, _ = run_ours("asam", **sgd, rho=0.5, eta=0.01)
    assert get_optimizer("asam").resolve({})["asam_scope"] == "weight_names"
    assert rel_distance(ours, ref) <= 1e-6
    dims, _ = run_ours("asam", **sgd, rho=0.5, eta=0.01, asam_scope="weights")  # BN gain not scaled
    assert rel_distance(dims, ref) > 1e-4


def test_sam_adamw_step_is_sam_then_adamw():
    ref = sam_adamw_reference(tiny_bn_cnn(), rho=0.1, lr=1e-3, wd=5e-4)
    ours, _ = run_ours("sam_adamw", lr=1e-3, weight_decay=5e-4, rho=0.1)
    assert rel_distance(ours, ref) <= 1e-6
    spec = get_optimizer("sam_adamw")
    assert spec.base == "adamw" and [h.name for h in spec.hparams] == [
        "lr",
        "weight_decay",
        "beta1",
        "beta2",
        "eps",
        "rho",
        "ascent",
    ]
    sgd_base, _ = run_ours("sam", lr=1e-3, weight_decay=5e-4, rho=0.1, momentum=0.9)
    assert rel_distance(sgd_base, ref) > 1e-2  # a different base is a different step


def test_tsam_adamw_with_one_sample_and_no_noise_is_sam_adamw():
    # s = 1, r = 0: δ = 0, ε = ρ·g/‖g‖, weight 1 -- exactly SAM's step, here over AdamW
    ref = sam_adamw_reference(tiny_bn_cnn(), rho=0.1, lr=1e-3, wd=5e-4)
    ours, _ = run_ours("tsam_adamw", lr=1e-3, weight_decay=5e-4, rho=0.1, s=1, noise_radius=0.0)
    assert rel_distance(ours, ref) <= 1e-6
    assert math.isfinite(rel_distance(ours, ref))


@pytest.mark.parametrize("name", ["sam_adamw_ire"])
def test_sam_adamw_ire_is_exactly_sam_adamw_before_switch_on(name):
    ours, _ = run_ours(name, lr=1e-3, weight_decay=5e-4, rho=0.1, switch_step=100)
    ref, _ = run_ours("sam_adamw", lr=1e-3, weight_decay=5e-4, rho=0.1)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref))
    on, _ = run_ours(name, lr=1e-3, weight_decay=5e-4, rho=0.1, kappa=2.0, gamma=0.5)
    assert rel_distance(on, ref) > 1e-3  # switched on, it amplifies the flat half
