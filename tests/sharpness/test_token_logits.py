"""``fisher_trace`` and ``hessian_trace`` on token logits ``(B, T, V)`` (a language model; IRE paper, Table 6):
averaged per token, against the exact per-token Fisher enumerated by hand and the Hessian of the same
predictions laid out as ``(B*T, V)``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flatlab.errors import ConfigError
from flatlab.sharpness import fisher_trace, hessian_trace
from flatlab.sharpness.measures import compute_measures, measure_subset
from flatlab.workloads.base import Split

B, T, D, V = 3, 4, 4, 3


class Mixer(nn.Module):
    """Token logits ``(B, T, V)`` from inputs ``(B, T, D)``; every position sees the sequence's mean."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.net = nn.Sequential(nn.Linear(D, 6), nn.Tanh(), nn.Linear(6, V)).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x + x.mean(1, keepdim=True))


def tokens(seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, D, generator=g, dtype=torch.float64), torch.randint(0, V, (B, T), generator=g)


def exact_per_token_fisher(model, x):
    """(1/(B T)) sum_{i,t} sum_c p_c ||grad log p(c | x_i)_t||^2, enumerating every token and class."""
    params = list(model.parameters())
    logits = model(x)
    total = 0.0
    for i in range(B):
        for t in range(T):
            probs = torch.softmax(logits[i, t], -1).detach()
            for c in range(V):
                gs = torch.autograd.grad(
                    F.cross_entropy(logits[i, t][None], torch.tensor([c])), params, retain_graph=True
                )
                total += float(probs[c]) * sum(float((g**2).sum()) for g in gs)
    return total / (B * T)


@pytest.mark.parametrize("estimator, n_samples", [("per_example", 300), ("batch", 1500)])
def test_fisher_trace_on_token_logits_is_the_per_token_fisher(estimator, n_samples):
    model = Mixer()
    x, y = tokens()
    exact = exact_per_token_fisher(model, x)
    est = fisher_trace(model, [(x, y)], n_samples=n_samples, estimator=estimator, seed=0)
    assert abs(est.value - exact) < 4 * est.stderr and est.stderr < 0.1 * exact


def test_hessian_trace_on_token_logits_is_the_mean_per_token_loss_hessian():
    model = Mixer()
    x, y = tokens()
    got = hessian_trace(model, [(x, y)], n_probes=5, seed=4)  # the default loss: cross-entropy per token

    def per_token_mean(out, targets):  # the same loss written out by hand
        return F.cross_entropy(out.reshape(B * T, V), targets.reshape(B * T))

    by_hand = hessian_trace(model, [(x, y)], n_probes=5, seed=4, loss_fn=per_token_mean)
    assert got.values == pytest.approx(by_hand.values, rel=1e-12)
    # exactly: the trace of the Hessian of the per-token mean loss, with all its parameters flattened
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    shapes = [p.shape for p in model.parameters()]

    def loss_of(w):
        ps, at = {}, 0
        for (name, p), shape in zip(model.named_parameters(), shapes):
            ps[name] = w[at : at + p.numel()].reshape(shape)
            at += p.numel()
        return per_token_mean(torch.func.functional_call(model, ps, (x,)), y)

    exact = float(torch.autograd.functional.hessian(loss_of, flat).diagonal().sum())
    many = hessian_trace(model, [(x, y)], n_probes=400, seed=0)
    assert abs(many.value - exact) < 4 * many.stderr


def test_the_measures_accept_token_logits_and_refuse_other_shapes():
    x, y = tokens()
    subset = measure_subset(Split(x, y), 0, 0)
    out = compute_measures(Mixer(), subset, None, {"fisher_trace": {"samples": 2}, "hessian_trace": {"probes": 2}})
    assert out["flat/fisher_trace"] > 0 and "flat/hessian_trace" in out

    class Flat(Mixer):
        def forward(self, x):
            return super().forward(x).reshape(-1)

    with pytest.raises(
        ConfigError, match=r"needs \(B, C\) logits or \(B, T, V\) token logits from the model; got shape \(36,\)"
    ):
        fisher_trace(Flat(), [(x, y)])
