"""Hessian-vector products, Hutchinson's trace estimator and power iteration.

All quantities are for the Hessian ``H = d^2 L / dw^2`` of the mean loss over the fixed evaluation
subset (:mod:`flatlab.sharpness.data`), restricted to the selected parameters ``params`` (a group, or
all floating-point parameters), in eval mode. The model is never modified.

* Hessian-vector product, per batch, accumulated with weights ``n_b / m``:
  ``method="double_backward"`` (default): ``autograd.grad(g . v)`` with ``g`` built with
  ``create_graph=True``; the gradient graph of a batch is reused for every Hutchinson probe, so extra
  probes cost one double-backward each (much faster than ``jvp`` on small models on the CPU);
  ``method="jvp"``: forward-over-reverse, ``torch.func.jvp(torch.func.grad(f), (w,), (v,))``, one
  full forward+backward per product, no graph kept between products.
  Fused attention kernels have neither forward-mode nor second-order derivatives, so both run under
  ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` (same values, the reference kernel).
* Hutchinson (1989): ``tr(H) = E_v[v^T H v]`` with Rademacher ``v`` (entries +-1); ``n_probes`` probes,
  regenerated from ``seed`` for every batch so that no more than one probe is held at a time.
* Power iteration: ``v <- Hv / ||Hv||``; returns the Rayleigh quotient, i.e. the eigenvalue of largest
  MAGNITUDE (the largest eigenvalue at a minimum, where ``H`` is positive semi-definite).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.ranges import NONNEGATIVE
from flatlab.sharpness import _state
from flatlab.sharpness.data import (
    DEFAULT_BATCH_SIZE,
    EvalData,
    EvalSubset,
    LossFn,
    as_subset,
    functional_forward,
    token_cross_entropy,
    weighted_batches,
)
from flatlab.sharpness.registry import register_measure, with_stderr
from flatlab.sharpness.results import EigenEstimate, Estimate

HVP_METHODS = ("jvp", "double_backward")
Vectors = List[torch.Tensor]


def _dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum((x.double() * y.double()).sum() for x, y in zip(a, b))


class _HVP:
    """Hessian-vector products of one batch's loss with respect to the selected parameters."""

    def __init__(
        self, model: nn.Module, names: Sequence[str], base: Sequence[torch.Tensor], loss_fn: LossFn, method: str
    ) -> None:
        if method not in HVP_METHODS:
            raise ConfigError(f"method={method!r} is not allowed; expected one of {', '.join(map(repr, HVP_METHODS))}")
        self.model, self.names, self.base, self.loss_fn, self.method = model, list(names), list(base), loss_fn, method

    def _loss(self, inputs, targets, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        out = functional_forward(self.model, dict(zip(self.names, tensors)), inputs)
        return self.loss_fn(out, targets)

    def batch(self, inputs, targets) -> Callable[[Vectors], Vectors]:
        """A function ``v -> H_b v`` for this batch (``H_b`` the Hessian of the batch's mean loss)."""
        if self.method == "jvp":

            def grad_fn(*tensors: torch.Tensor):
                return torch.func.grad(lambda ts: self._loss(inputs, targets, ts))(tensors)

            def hvp(v: Vectors) -> Vectors:
                # no_grad: keep autograd from recording through the model's other (trainable) parameters;
                # torch.func.grad and forward-mode AD are unaffected by it.
                with torch.no_grad(), _state.math_attention():
                    _, hv = torch.func.jvp(grad_fn, tuple(self.base), tuple(v))
                return list(hv)

            return hvp

        leaves = [b.detach().requires_grad_(True) for b in self.base]
        with torch.enable_grad(), _state.math_attention():
            loss = self._loss(inputs, targets, leaves)
            grads = torch.autograd.grad(loss, leaves, create_graph=True, allow_unused=True)
        used = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]

        def hvp(v: Vectors) -> Vectors:
            out = [torch.zeros_like(b) for b in self.base]
            if used:
                with torch.enable_grad(), _state.math_attention():
                    hv = torch.autograd.grad(
                        [grads[i] for i in used],
                        leaves,
                        grad_outputs=[v[i] for i in used],
                        retain_graph=True,
                        allow_unused=True,
                    )
                out = [torch.zeros_like(b) if h is None else h.detach() for b, h in zip(self.base, hv)]
            return out

        return hvp


def _setup(model, data, params, loss_fn, batch_size, method):
    subset = as_subset(data, batch_size)
    named = _state.resolve_params(model, params)
    base = [p.detach() for _, p in named]
    hvp = _HVP(model, [n for n, _ in named], base, loss_fn or token_cross_entropy, method)
    return subset, named, base, hvp


def hessian_vector_product(
    model: nn.Module,
    data: EvalData,
    vector: Sequence[torch.Tensor],
    *,
    params: Optional[Sequence[str]] = None,
    method: str = "double_backward",
    loss_fn: Optional[LossFn] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> Vectors:
    """``H v`` over the whole subset; ``vector[i]`` has the shape of the i-th selected parameter
    (``named_parameters()`` order); returns tensors of the same shapes.

    Raises:
        ConfigError: unknown ``method``, or ``vector`` not matching the selected parameters' shapes.
    """
    subset, named, base, hvp = _setup(model, data, params, loss_fn, batch_size, method)
    vector = list(vector)
    if len(vector) != len(base) or any(v.shape != b.shape for v, b in zip(vector, base)):
        raise ConfigError(
            f"vector must hold {len(base)} tensors shaped like the selected parameters "
            f"{[tuple(b.shape) for b in base][:6]}; got {[tuple(v.shape) for v in vector][:6]}"
        )
    device = _state.device_of(named)
    total = [torch.zeros_like(b) for b in base]
    with _state.eval_mode(model):
        for inputs, targets, weight in weighted_batches(subset, device):
            for acc, h in zip(total, hvp.batch(inputs, targets)(vector)):
                acc.add_(h, alpha=weight)
    return total


def hessian_trace(
    model: nn.Module,
    data: EvalData,
    *,
    n_probes: int = 100,
    params: Optional[Sequence[str]] = None,
    seed: int = 0,
    method: str = "double_backward",
    loss_fn: Optional[LossFn] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> Estimate:
    """Hutchinson's estimate of ``tr(H)`` (Hutchinson 1989; the IRE paper's flatness measure,
    "Improving Generalization and Convergence by Enhancing Implicit Regularization": Tr of the Hessian).

    Args:
        n_probes: Rademacher probes ``v`` (entries +-1); ``values[j] = v_j^T H v_j``.
        params: parameter names (one group for a layer-wise trace); ``None`` = all.
        method: ``"double_backward"`` (default) or ``"jvp"`` (forward-over-reverse).
        seed, batch_size: as :func:`~flatlab.sharpness.average_sharpness`.
        loss_fn: the batch-mean loss; default :func:`~flatlab.sharpness.data.token_cross_entropy` (``(B, C)``
            logits, or ``(B, T, V)`` token logits with the loss averaged per token, IRE paper Table 6).

    Returns:
        :class:`Estimate` of the trace (loss units per parameter unit^2) with its standard error.

    Raises:
        ConfigError: ``n_probes < 1`` or unknown ``method``. UnknownNameError: unknown parameter names.
    """
    _state.check_count("n_probes", n_probes)
    subset, named, base, hvp = _setup(model, data, params, loss_fn, batch_size, method)
    device = _state.device_of(named)
    quad = [0.0] * n_probes
    with _state.eval_mode(model):
        for inputs, targets, weight in weighted_batches(subset, device):
            gen = _state.make_generator(device, seed)  # same probes for every batch
            apply = hvp.batch(inputs, targets)
            for j in range(n_probes):
                v = [_state.rademacher(b, gen) for b in base]
                quad[j] += weight * float(_dot(v, apply(v)))
    return Estimate.from_values(quad)


def top_hessian_eigenvalue(
    model: nn.Module,
    data: EvalData,
    *,
    max_iters: int = 100,
    tol: float = 1e-4,
    params: Optional[Sequence[str]] = None,
    seed: int = 0,
    method: str = "double_backward",
    loss_fn: Optional[LossFn] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> EigenEstimate:
    """Dominant Hessian eigenvalue by power iteration (module docstring).

    Stops when ``|lambda_t - lambda_{t-1}| <= tol * |lambda_t|`` or after ``max_iters`` products.

    Returns:
        :class:`EigenEstimate` (loss units per parameter unit^2).

    Raises:
        ConfigError: ``max_iters < 1``, ``tol`` not > 0, unknown ``method``.
    """
    _state.check_count("max_iters", max_iters)
    tol = _state.check_positive("tol", tol)
    subset, named, base, hvp = _setup(model, data, params, loss_fn, batch_size, method)
    device = _state.device_of(named)
    gen = _state.make_generator(device, seed)
    v = [_state.standard_normal(b, gen) for b in base]
    norm = math.sqrt(float(_dot(v, v)))
    v = [x / norm for x in v]
    eig, prev, converged, it = 0.0, None, False, 0
    with _state.eval_mode(model):
        for it in range(1, max_iters + 1):  # noqa: B007 (read after the loop: the iterations used)
            hv = [torch.zeros_like(b) for b in base]
            for inputs, targets, weight in weighted_batches(subset, device):
                for acc, h in zip(hv, hvp.batch(inputs, targets)(v)):
                    acc.add_(h, alpha=weight)
            eig = float(_dot(v, hv))
            size = math.sqrt(float(_dot(hv, hv)))
            if size == 0.0:
                converged = True
                break
            v = [h / size for h in hv]
            if prev is not None and abs(eig - prev) <= tol * abs(eig):
                converged = True
                break
            prev = eig
    return EigenEstimate(eig, it, converged)


@register_measure(
    name="hessian_trace",
    doc="Hutchinson estimate of Tr(H) of the loss, Rademacher probes (loss units per parameter unit^2)",
    source="Hutchinson 1989; IRE paper's Tr(nabla^2 L)",
    hparams=(HParam("probes", 30, int, low=1, doc="Rademacher probes v, each giving v^T H v"),),
    metrics=("flat/hessian_trace", "flat/hessian_trace_stderr"),
    support={"flat/hessian_trace_stderr": NONNEGATIVE},  # the trace itself: unbounded (saddles, single probes)
)
def _hessian_measure(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    est = hessian_trace(model, subset, n_probes=p["probes"], seed=seed, loss_fn=loss_fn)
    return with_stderr("flat/hessian_trace", est.value, est.stderr)
