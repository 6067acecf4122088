"""Hutchinson trace, power iteration, Hessian-vector products and Fisher trace against exact values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from flatlab.errors import ConfigError
from flatlab.sharpness import (
    fisher_trace,
    group_parameters,
    hessian_trace,
    hessian_vector_product,
    top_hessian_eigenvalue,
)


def _exact_hessian(model, batches, names=None):
    """Hessian of the mean cross-entropy over all examples w.r.t. the flattened selected parameters."""
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    params = {n: p.detach() for n, p in model.named_parameters() if names is None or n in names}
    shapes = [(n, p.shape, p.numel()) for n, p in params.items()]
    flat = torch.cat([p.reshape(-1) for p in params.values()])

    def loss(v):
        ps, i = {}, 0
        for n, shape, k in shapes:
            ps[n] = v[i : i + k].reshape(shape)
            i += k
        return F.cross_entropy(functional_call(model, ps, (x,)), y)

    return torch.func.hessian(loss)(flat)


def test_hutchinson_matches_the_exact_trace_of_a_small_mlp(kit):
    model = kit.make_mlp()
    data = kit.classification_data(batch=24)
    exact = float(_exact_hessian(model, data).trace())
    est = hessian_trace(model, data, n_probes=300, seed=1)
    assert 0 < est.stderr < 0.2 * abs(exact)
    assert abs(est.value - exact) < 4 * est.stderr
    both = hessian_trace(model, data, n_probes=5, seed=1, method="jvp")
    assert both.values == pytest.approx(est.values[:5], rel=1e-9)


def test_hutchinson_and_power_iteration_on_a_quadratic(quad, kit):
    model, H, _ = quad
    kw = dict(params=["w"], loss_fn=kit.quadratic_loss)
    est = hessian_trace(model, kit.QUAD_DATA, n_probes=400, **kw)
    assert abs(est.value - float(H.trace())) < 4 * est.stderr
    top = top_hessian_eigenvalue(model, kit.QUAD_DATA, tol=1e-9, max_iters=2000, **kw)
    assert top.converged
    assert top.value == pytest.approx(float(torch.linalg.eigvalsh(H)[-1]), rel=1e-3)


def test_power_iteration_matches_the_dominant_eigenvalue_of_a_small_mlp(kit):
    model = kit.make_mlp(seed=3)
    data = kit.classification_data(seed=3)
    eigs = torch.linalg.eigvalsh(_exact_hessian(model, data))
    dominant = float(eigs[eigs.abs().argmax()])
    top = top_hessian_eigenvalue(model, data, tol=1e-10, max_iters=3000)
    assert top.value == pytest.approx(dominant, rel=1e-3)


def test_hessian_vector_product_equals_exact_hessian_times_vector(kit):
    model = kit.make_mlp()
    data = kit.classification_data()
    names = ["2.weight", "2.bias"]
    H = _exact_hessian(model, data, names)
    g = torch.Generator().manual_seed(0)
    v = [torch.randn(3, 6, generator=g, dtype=torch.float64), torch.randn(3, generator=g, dtype=torch.float64)]
    expected = H @ torch.cat([t.reshape(-1) for t in v])
    for method in ("jvp", "double_backward"):
        hv = hessian_vector_product(model, data, v, params=names, method=method)
        assert torch.allclose(torch.cat([t.reshape(-1) for t in hv]), expected, rtol=1e-9, atol=1e-12)
    with pytest.raises(ConfigError, match=r"vector must hold 2 tensors shaped like the selected parameters"):
        hessian_vector_product(model, data, v[:1], params=names)
    with pytest.raises(ConfigError, match=r"method='exact' is not allowed"):
        hessian_trace(model, data, method="exact")


def test_curvature_on_a_clip_like_model_with_attention_both_methods_agree(kit):
    model = kit.TinyCLIPClassifier()
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    block = list(group_parameters(model, "clip")["visual.transformer.resblocks.0"])
    a = hessian_trace(model, [(x, y)], n_probes=2, params=block, method="jvp")
    b = hessian_trace(model, [(x, y)], n_probes=2, params=block, method="double_backward")
    assert a.values == pytest.approx(b.values, rel=1e-3, abs=1e-5)
    text = list(group_parameters(model, "clip")["transformer.resblocks.0"])  # unused by the classifier
    assert hessian_trace(model, [(x, y)], n_probes=2, params=text).value == 0.0
    assert fisher_trace(model, [(x, y)], params=text).value == 0.0


def _exact_fisher_trace(model, batches, names=None):
    """(1/m) sum_i sum_c p_c(x_i) ||grad CE(f(x_i), c)||^2, by enumerating the classes."""
    x = torch.cat([b[0] for b in batches])
    params = [p for n, p in model.named_parameters() if names is None or n in names]
    total = 0.0
    for xi in x:
        logits = model(xi[None])
        probs = torch.softmax(logits, -1)[0].detach()
        for c in range(logits.shape[1]):
            gs = torch.autograd.grad(F.cross_entropy(logits, torch.tensor([c])), params, retain_graph=True)
            total += float(probs[c]) * sum(float((g**2).sum()) for g in gs)
    return total / len(x)


@pytest.mark.parametrize("estimator, n_samples", [("per_example", 200), ("batch", 800)])
def test_fisher_trace_with_sampled_labels_matches_the_exact_fisher(kit, estimator, n_samples):
    model = kit.make_mlp(seed=1)
    data = kit.classification_data(seed=2, batch=24)
    exact = _exact_fisher_trace(model, data)
    est = fisher_trace(model, data, n_samples=n_samples, estimator=estimator, seed=0)
    assert est.n == n_samples
    assert abs(est.value - exact) < 4 * est.stderr
    assert est.stderr < 0.15 * exact


def test_fisher_trace_restricted_to_a_group(kit):
    model = kit.make_mlp(seed=1)
    data = kit.classification_data(seed=2, batch=24)
    names = ["0.weight", "0.bias"]
    exact = _exact_fisher_trace(model, data, names)
    est = fisher_trace(model, data, n_samples=200, params=names)
    assert abs(est.value - exact) < 4 * est.stderr
    with pytest.raises(ConfigError, match=r"estimator='diag' is not allowed"):
        fisher_trace(model, data, estimator="diag")


MEASURES = {
    "average": lambda s, m, d: s.average_sharpness(m, d, n_draws=2),
    "batched": lambda s, m, d: s.average_sharpness_batched(m, d, n_draws=3, draws_per_forward=2),
    "worst_l2": lambda s, m, d: s.worst_case_sharpness(m, d, rho=0.1, steps=2),
    "worst_linf": lambda s, m, d: s.worst_case_sharpness(m, d, rho=0.1, steps=2, norm="linf"),
    "hutchinson": lambda s, m, d: s.hessian_trace(m, d, n_probes=2),
    "hutchinson_jvp": lambda s, m, d: s.hessian_trace(m, d, n_probes=2, method="jvp"),
    "power_jvp": lambda s, m, d: s.top_hessian_eigenvalue(m, d, max_iters=2, method="jvp"),
    "power": lambda s, m, d: s.top_hessian_eigenvalue(m, d, max_iters=3),
    "fisher": lambda s, m, d: s.fisher_trace(m, d),
    "fisher_batch": lambda s, m, d: s.fisher_trace(m, d, estimator="batch"),
    "neighbourhood": lambda s, m, d: s.neighbourhood_loss(m, d, sigma=0.1, n_draws=2),
    "layerwise": lambda s, m, d: s.layerwise_sharpness(m, d, n_draws=2),
}


@pytest.mark.parametrize("name", sorted(MEASURES))
def test_every_measure_leaves_the_model_bitwise_unchanged(kit, unchanged, name):
    import flatlab.sharpness as s

    torch.manual_seed(0)
    model = kit.TinyConvNet().train()  # BatchNorm + Dropout in train mode, grads present
    x, y = torch.randn(6, 3, 6, 6), torch.randint(0, 5, (6,))
    F.cross_entropy(model(x), y).backward()
    with unchanged(model):
        result = MEASURES[name](s, model, [(x[:4], y[:4]), (x[4:], y[4:])])
    assert result is not None
