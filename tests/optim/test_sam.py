"""SAM / ASAM (flatlab.optim.sam): the step, the perturbation formulas, ASAM's scale invariance."""

from __future__ import annotations

import copy
import math
import warnings

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
from flatlab.optim.sam import SAM, asam_scaled


def sgd(model, **kw):
    kw.setdefault("lr", 0.1)
    return torch.optim.SGD(model.parameters(), **kw)


def test_rho_zero_is_the_base_step_bitwise():
    model, batch = mlp(), vector_batch()
    opt = SAM(sgd(model, momentum=0.9, weight_decay=5e-4), rho=0.0)
    ref_model, ref_opt = twin(model, opt.base)
    for _ in range(3):
        opt.step(closure_for(model, batch))
        ref_opt.zero_grad()
        closure_for(ref_model, batch)()
        ref_opt.step()
    assert_bitwise(params_of(model), params_of(ref_model))
    assert not torch.equal(params_of(model)[0], params_of(mlp())[0])  # it did move


def test_perturbation_has_global_norm_rho_over_all_groups():
    model, batch = mlp(), vector_batch()
    weights = [p for p in model.parameters() if p.ndim == 2]
    biases = [p for p in model.parameters() if p.ndim == 1]
    base = torch.optim.SGD([{"params": weights}, {"params": biases, "lr": 0.01}], lr=0.1)
    opt = SAM(base, rho=0.3)
    closure_for(model, batch)()
    grads = [p.grad.clone() for p in model.parameters()]
    before = params_of(model)
    opt.first_step()
    eps = [a - b for a, b in zip(params_of(model), before)]
    norm = math.sqrt(sum(float(e.double().pow(2).sum()) for e in eps))
    assert norm == pytest.approx(0.3, rel=1e-5)
    gnorm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    for e, g in zip(eps, grads):  # ε = ρ·g/‖g‖ elementwise, with ONE norm over both groups
        torch.testing.assert_close(e, 0.3 * g / gnorm, rtol=1e-4, atol=1e-7)
    opt.second_step()


def test_theta_is_restored_exactly():
    # With lr = 0 the base step is the identity, so θ after the step must be θ before, bit for bit
    # (restoring by subtracting ε would leave rounding errors).
    model, batch = small_cnn(), image_batch()
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.0), rho=0.7)
    before = params_of(model)
    opt.step(closure_for(model, batch))
    assert_bitwise(params_of(model), before)


def test_manual_first_second_step_equals_step():
    model, batch = mlp(), vector_batch()
    opt = SAM(sgd(model, momentum=0.9), rho=0.1)
    m2, o2 = twin(model, opt)
    opt.step(closure_for(model, batch))
    c = closure_for(m2, batch)
    c()
    o2.first_step(zero_grad=True)
    c.extra()
    o2.second_step(zero_grad=True)
    assert_bitwise(params_of(model), params_of(m2))
    assert all(p.grad is None for p in m2.parameters())


def _named_groups(model):
    return [{"params": list(model.named_parameters())}]


def test_asam_without_names_uses_the_dimension_rule_and_warns_once(monkeypatch):
    import flatlab.optim.sam as sam_module

    monkeypatch.setattr(sam_module, "_warned_unnamed", False)
    model, batch = small_cnn(), image_batch()
    plain_model = copy.deepcopy(model)
    dims = SAM(torch.optim.SGD(_named_groups(model), lr=0.1), rho=0.5, adaptive=True, asam_scope="weights")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # building it (e.g. to validate hyperparameters) is quiet
        plain = SAM(sgd(plain_model), rho=0.5, adaptive=True)  # default scope, no names
    assert plain.asam_scope == "weight_names"
    with pytest.warns(UserWarning, match=r"built from model.parameters\(\); tensors with ndim >= 2 are scaled instead"):
        plain.step(closure_for(plain_model, batch))
    dims.step(closure_for(model, batch))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: neither the next step nor another optimizer warns again
        plain.step(closure_for(plain_model, batch))
        dims.step(closure_for(model, batch))
        other = copy.deepcopy(small_cnn())
        SAM(sgd(other), rho=0.5, adaptive=True).step(closure_for(other, batch))
    assert_bitwise(params_of(plain_model), params_of(model))  # exactly the 'weights' rule


def test_asam_scope_rule_is_documented_one():
    model = small_cnn()
    names = dict(model.named_parameters())
    # small_cnn: 0.weight conv (4-d), 0.bias, 1.weight / 1.bias BatchNorm (1-d), 7.weight linear (2-d)
    assert asam_scaled(names["0.weight"], "0.weight", "weights")
    assert not asam_scaled(names["0.bias"], "0.bias", "weights")
    assert not asam_scaled(names["1.weight"], "1.weight", "weights")  # BN gain: not scaled ...
    assert asam_scaled(names["1.weight"], "1.weight", "weight_names")  # ... but the official rule does
    assert not asam_scaled(names["1.bias"], "1.bias", "weight_names")
    assert asam_scaled(names["1.bias"], "1.bias", "all")
    assert not asam_scaled(names["1.weight"], None, "weight_names")  # unnamed: the ndim >= 2 rule
    assert asam_scaled(names["0.weight"], None, "weight_names")


@pytest.mark.parametrize("scope", ["weights", "all", "weight_names"])
def test_asam_perturbation_matches_formula_elementwise(scope):
    model, batch = small_cnn(), image_batch()
    eta, rho = 0.01, 0.5
    opt = SAM(torch.optim.SGD(_named_groups(model), lr=0.1), rho=rho, adaptive=True, eta=eta, asam_scope=scope)
    closure_for(model, batch)()
    named = list(model.named_parameters())
    grads = [p.grad.clone() for _, p in named]
    before = params_of(model)
    T = [(w.abs() + eta) if asam_scaled(w, n, scope) else torch.ones_like(w) for (n, _), w in zip(named, before)]
    norm = math.sqrt(sum(float((t * g).double().pow(2).sum()) for t, g in zip(T, grads)))
    opt.first_step()
    for (n, p), w, t, g in zip(named, before, T, grads):
        expected = rho * t * t * g / norm  # ε = ρ·T²⊙g/‖T⊙g‖ (Kwon et al. 2021, Eq. 9)
        torch.testing.assert_close(p.detach() - w, expected, rtol=1e-4, atol=1e-7, msg=n)
    opt.second_step()
    assert_bitwise(params_of(model), [w.add(p.grad, alpha=-0.1) for w, p in zip(before, model.parameters())])


def _rescaled(model, c):
    """Layer 1 (weight and bias) × c, layer 2's weight × 1/c: the same function for a ReLU net, c > 0."""
    m2 = copy.deepcopy(model)
    with torch.no_grad():
        m2[0].weight.mul_(c)
        if m2[0].bias is not None:
            m2[0].bias.mul_(c)
        m2[2].weight.div_(c)
    return m2


def _perturbed_loss(model, batch, **sam_kw):
    opt = SAM(torch.optim.SGD(model.parameters(), lr=0.0), **sam_kw)
    closure = CountingClosure(closure_for(model, batch))
    loss = opt.step(closure)
    return float(loss), float(closure.extra_losses[0]), opt.pop_metrics()["opt/perturbed_loss"]


@pytest.mark.parametrize("bias,scope", [(False, "weights"), (True, "all")])
def test_asam_is_invariant_to_layer_rescaling_and_sam_is_not(bias, scope):
    model, batch = mlp(bias=bias, hidden=16), vector_batch()
    c = 4.0
    asam = dict(rho=0.5, adaptive=True, eta=0.0, asam_scope=scope)
    l0, p0, metric = _perturbed_loss(model, batch, **asam)
    l1, p1, _ = _perturbed_loss(_rescaled(model, c), batch, **asam)
    assert l1 == pytest.approx(l0, rel=1e-6)  # same function
    assert p1 == pytest.approx(p0, rel=1e-6)  # ASAM: same perturbed loss
    assert metric == pytest.approx(p0, rel=1e-6) and p0 > l0
    _, s0, _ = _perturbed_loss(model, batch, rho=0.5)
    _, s1, _ = _perturbed_loss(_rescaled(model, c), batch, rho=0.5)
    assert abs(s1 - s0) > 1e-3 * abs(s0)  # plain SAM sees a different neighbourhood


def test_one_primary_one_extra_pass_and_metrics():
    model, batch = small_cnn(), image_batch()
    opt = SAM(sgd(model), rho=0.05)
    closure = CountingClosure(closure_for(model, batch))
    opt.step(closure)
    opt.step(closure)
    assert (closure.primary, closure.extra_calls, closure.sampled) == (2, 2, 0)
    metrics = opt.pop_metrics()
    assert metrics["opt/perturbed_loss"] == pytest.approx(sum(map(float, closure.extra_losses)) / 2, rel=1e-6)
    assert opt.pop_metrics() == {}


def test_usage_errors():
    model = mlp()
    opt = SAM(sgd(model), rho=0.05)
    with pytest.raises(ValueError, match=r"SAM.step\(\) needs a closure"):
        opt.step()
    with pytest.raises(RuntimeError, match=r"second_step\(\) called without first_step\(\)"):
        opt.second_step()
    with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
        SAM(model, rho=0.05)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw,pattern",
    [
        (dict(rho=-0.1), r"rho=-0.1 is not allowed; expected float in \[0, inf\)"),
        (dict(eta=-1.0), r"eta=-1.0 is not allowed"),
        (dict(adaptive="yes"), r"adaptive='yes' is not allowed; expected True or False"),
        (
            dict(adaptive=True, asam_scope="bias"),
            r"asam_scope='bias' is not allowed; expected one of 'weight_names', 'weights', 'all'",
        ),
    ],
)
def test_bad_values_raise_config_error_naming_the_field(kw, pattern):
    with pytest.raises(ConfigError, match=pattern):
        SAM(sgd(mlp()), **kw)
