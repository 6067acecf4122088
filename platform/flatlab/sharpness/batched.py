"""Average-case adaptive sharpness with several noise draws per forward pass (``torch.func.vmap``).

Same estimator, same noise and same result as :func:`flatlab.sharpness.average.average_sharpness`
(to float rounding) for the same ``seed``: the ``z_k`` are pre-drawn in the same order (draw by draw,
tensor by tensor), ``draws_per_forward`` at a time, stacked along a new leading dimension, and the
perturbed parameters ``w + rho * c * z_k`` of shape ``(k, *w.shape)`` are passed to
``torch.func.functional_call`` under ``torch.func.vmap``. The model itself is never modified.

Worth it when one batch under-uses the device (small models, small batches); memory grows with
``draws_per_forward`` (activations and perturbed parameters of ``k`` models at once).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from flatlab.sharpness import _state
from flatlab.sharpness.average import DEFAULT_DRAWS, DEFAULT_RHO
from flatlab.sharpness.data import (
    DEFAULT_BATCH_SIZE,
    EvalData,
    LossFn,
    as_subset,
    functional_forward,
    subset_loss,
    weighted_batches,
)
from flatlab.sharpness.results import SharpnessEstimate, mean_and_stderr

DEFAULT_DRAWS_PER_FORWARD = 4


def average_sharpness_batched(
    model: nn.Module,
    data: EvalData,
    *,
    rho: float = DEFAULT_RHO,
    n_draws: int = DEFAULT_DRAWS,
    adaptive: bool = True,
    params: Optional[Sequence[str]] = None,
    seed: int = 0,
    loss_fn: Optional[LossFn] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    draws_per_forward: int = DEFAULT_DRAWS_PER_FORWARD,
    math_attention: bool = True,
) -> SharpnessEstimate:
    """:func:`~flatlab.sharpness.average.average_sharpness` evaluating ``draws_per_forward`` draws per
    (vmapped) forward pass (Andriushchenko et al. 2023; seed paper App. A).

    Args: as ``average_sharpness``, plus
        draws_per_forward: ``k`` >= 1 draws evaluated together; perturbed parameters of shape
            ``(k, *w.shape)`` are materialised for the selected parameters.
        math_attention: run ``scaled_dot_product_attention`` with the math kernel inside ``vmap``
            (fused kernels have no batching rule and fall back to a slow per-draw loop).

    Returns:
        :class:`SharpnessEstimate`, equal to the loop's for the same seed up to float rounding.

    Raises:
        ConfigError / UnknownNameError: as ``average_sharpness``; ``draws_per_forward < 1``.
    """
    rho = _state.check_positive("rho", rho)
    _state.check_count("n_draws", n_draws)
    _state.check_count("draws_per_forward", draws_per_forward)
    subset = as_subset(data, batch_size)
    loss_fn = loss_fn or F.cross_entropy
    named = _state.resolve_params(model, params)
    device = _state.device_of(named)
    gen = _state.make_generator(device, seed)
    names = [n for n, _ in named]
    losses: List[float] = []
    with _state.eval_mode(model), torch.no_grad():
        base = [p.detach() for _, p in named]
        clean = subset_loss(model, subset, loss_fn, device)
        scales = _state.noise_scales(base, rho, adaptive)
        done = 0
        while done < n_draws:
            k = min(draws_per_forward, n_draws - done)
            z = [_state.noise_buffer(w, (k,)) for w in base]  # z[i]: (k, *w.shape)
            for j in range(k):  # the loop's order: draw by draw, tensor by tensor
                for zi in z:
                    _state.fill_standard_normal(zi[j], gen)
            perturbed: Dict[str, torch.Tensor] = {}
            for name, w, s, zi in zip(names, base, scales, z):
                zi = zi.to(w.dtype)
                perturbed[name] = torch.add(w, zi, alpha=rho) if s is None else torch.addcmul(w, s, zi)
            del z
            total = torch.zeros(k, dtype=torch.float64, device=device)
            for inputs, targets, weight in weighted_batches(subset, device):

                def loss_of(ps: Dict[str, torch.Tensor], inputs=inputs, targets=targets) -> torch.Tensor:
                    return loss_fn(functional_forward(model, ps, inputs), targets)

                with _state.math_attention(math_attention):
                    total += weight * vmap(loss_of, randomness="different")(perturbed).double()
            losses.extend(total.tolist())
            done += k
    diffs = [v - clean for v in losses]
    value, err = mean_and_stderr(diffs)
    return SharpnessEstimate(value, err, n_draws, tuple(diffs), clean, rho, bool(adaptive))
