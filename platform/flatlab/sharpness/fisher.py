"""Trace of the Fisher information with labels sampled from the model's own softmax.

The IRE paper ("Improving Generalization and Convergence by Enhancing Implicit Regularization",
flatness measure) uses ``tr(F)``, which approximates ``tr(Hessian)`` near a minimum:

    tr(F) = (1/m) sum_i E_{y ~ softmax(f(x_i))} || grad_w CE(f(x_i), y) ||^2

over the fixed evaluation subset, in eval mode, restricted to the selected parameters. The model
returns logits ``(B, C)``, or token logits ``(B, T, V)`` (a language model, IRE paper Table 6): then a
label is sampled per token and the trace is averaged per token,

    tr(F) = (1/(m T)) sum_{i, t} E_{y_t ~ softmax(f(x_i)_t)} || grad_w log p(y_t | x_i) ||^2,

the Fisher (Gauss-Newton) of the per-token mean loss. Given the inputs, the sampled labels of different
tokens are independent and each score has zero mean, so the squared norm of a sum of token scores is,
in expectation, the sum of their squared norms: both estimators below multiply the squared gradient of
a mean over ``n`` predictions by ``n``. Two unbiased estimators, each repeated for ``n_samples`` label
draws:

* ``"per_example"``: per-example (per-sequence) gradients (``torch.func.vmap`` over ``torch.func.grad``),
  ``T * ||grad of the sequence's mean loss||^2`` (``T = 1`` for ``(B, C)``), exact up to the label
  sampling for ``(B, C)``; memory ``chunk_size x #params``.
* ``"batch"`` (Sophia's estimator, as IRE's code): ``n_b * ||grad of the batch-mean loss||^2`` per
  batch (``n_b`` its predictions: ``B``, or ``B * T`` tokens); unbiased because the score has zero
  mean under sampled labels; one backward per batch, higher variance.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn
from torch.func import grad, vmap

from flatlab.batch import sample_labels
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
    call_model,
    functional_forward,
    token_cross_entropy,
    weighted_batches,
)
from flatlab.sharpness.registry import register_measure, with_stderr
from flatlab.sharpness.results import Estimate

FISHER_ESTIMATORS = ("per_example", "batch")


def _sample_labels(logits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Labels ``(B,)`` or ``(B, T)`` drawn from the model's softmax, one per prediction (the trainer's
    sampler on this estimate's own RNG)."""
    if logits.ndim not in (2, 3):
        raise ConfigError(
            "fisher_trace needs (B, C) logits or (B, T, V) token logits from the model; "
            f"got shape {tuple(logits.shape)}"
        )
    return sample_labels(logits.reshape(-1, logits.shape[-1]), generator=gen).reshape(logits.shape[:-1])


def fisher_trace(
    model: nn.Module,
    data: EvalData,
    *,
    n_samples: int = 1,
    estimator: str = "per_example",
    params: Optional[Sequence[str]] = None,
    seed: int = 0,
    chunk_size: Optional[int] = 32,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> Estimate:
    """``tr(F)`` with sampled labels (module docstring; IRE paper's flatness measure).

    Args:
        n_samples: independent label draws (``values`` has one estimate per draw).
        estimator: ``"per_example"`` or ``"batch"``.
        params: parameter names (a group); ``None`` = all floating-point parameters.
        seed: seed of the label sampler.
        chunk_size: examples per vmapped chunk in ``"per_example"`` (``None`` = the whole batch).
        batch_size: batch size when ``data`` is a ``TensorDataset``.

    Returns:
        :class:`Estimate` of the trace (nats per parameter unit^2).

    Raises:
        ConfigError: unknown ``estimator``, ``n_samples < 1``, outputs neither (B, C) nor (B, T, V), or non-tensor
            inputs with ``"per_example"``.
    """
    if estimator not in FISHER_ESTIMATORS:
        raise ConfigError(
            f"estimator={estimator!r} is not allowed; expected one of {', '.join(map(repr, FISHER_ESTIMATORS))}"
        )
    _state.check_count("n_samples", n_samples)
    subset = as_subset(data, batch_size)
    named = _state.resolve_params(model, params)
    names = [n for n, _ in named]
    device = _state.device_of(named)
    gen = _state.make_generator(device, seed)
    values: List[float] = [0.0] * n_samples
    with _state.eval_mode(model):
        base = {n: p.detach() for n, p in named}
        for inputs, _targets, weight in weighted_batches(subset, device):
            with torch.no_grad():
                logits = call_model(model, inputs)
            for s in range(n_samples):
                labels = _sample_labels(logits, gen)
                if estimator == "batch":
                    leaves = {n: t.detach().requires_grad_(True) for n, t in base.items()}
                    with torch.enable_grad():
                        loss = token_cross_entropy(functional_forward(model, leaves, inputs), labels)
                        gs = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
                    sq = sum(float((g.double() ** 2).sum()) for g in gs if g is not None)
                    values[s] += weight * labels.numel() * sq  # B * T: the predictions the mean is over
                else:
                    if not isinstance(inputs, torch.Tensor):
                        raise ConfigError("estimator='per_example' needs tensor inputs; use estimator='batch'")

                    def one(ps, x, y):
                        out = functional_forward(model, ps, x.unsqueeze(0))
                        return token_cross_entropy(out, y.unsqueeze(0))

                    # math kernel: fused attention has no vmap rule; no_grad: do not record through the
                    # model's other parameters (torch.func.grad ignores it).
                    with torch.no_grad(), _state.math_attention():
                        per = vmap(grad(one), in_dims=(None, 0, 0), chunk_size=chunk_size)(base, inputs, labels)
                    sq = sum((per[n].double() ** 2).flatten(1).sum(1) for n in names)  # (B,)
                    values[s] += weight * float(sq.mean()) * labels[0].numel()  # x T: a sequence's tokens
    return Estimate.from_values(values)


@register_measure(
    name="fisher_trace",
    doc="Tr(F), Fisher with labels sampled from the model's softmax; (B, C) logits, or (B, T, V) token "
    "logits averaged per token (nats per parameter unit^2)",
    source="IRE paper (Improving Generalization and Convergence by Enhancing Implicit Regularization), "
    "flatness measure Tr(F) ~ Tr(H)",
    hparams=(
        HParam("samples", 1, int, low=1, doc="independent label draws per example (the estimate averages them)"),
        HParam(
            "estimator",
            "per_example",
            str,
            choices=FISHER_ESTIMATORS,
            doc="per_example: per-example gradients (tensor inputs); batch: Sophia/IRE's batch-gradient estimator",
        ),
    ),
    metrics=("flat/fisher_trace", "flat/fisher_trace_stderr"),
    support={"flat/fisher_trace": NONNEGATIVE, "flat/fisher_trace_stderr": NONNEGATIVE},
)
def _fisher_measure(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    # The Fisher of the model's own predictive distribution: cross-entropy on sampled labels whatever
    # the training loss (label smoothing, a subset of logits ...), so loss_fn is not used.
    est = fisher_trace(model, subset, n_samples=p["samples"], estimator=p["estimator"], seed=seed)
    return with_stderr("flat/fisher_trace", est.value, est.stderr)
