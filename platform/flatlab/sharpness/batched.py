"""Average-case adaptive sharpness with several noise draws per forward pass (``torch.func.vmap``).

The estimator, its noise and its result are :func:`flatlab.sharpness.average.average_sharpness`'s for
the same ``seed`` (to float rounding): both are :func:`flatlab.sharpness.average.perturbed_losses`,
here with ``draws_per_forward`` draws stacked along a new leading dimension and passed to
``torch.func.functional_call`` under ``torch.func.vmap``. The model itself is never modified.

Worth it when one batch under-uses the device (small models, small batches); memory grows with
``draws_per_forward`` (activations and perturbed parameters of ``k`` models at once).
"""

from __future__ import annotations

from typing import Optional, Sequence

from torch import nn

from flatlab.sharpness.average import DEFAULT_DRAWS, DEFAULT_RHO, perturbed_losses, sharpness_estimate
from flatlab.sharpness.data import DEFAULT_BATCH_SIZE, EvalData, LossFn
from flatlab.sharpness.results import SharpnessEstimate

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
    clean, losses = perturbed_losses(
        model,
        data,
        scale=rho,
        scale_name="rho",
        adaptive=adaptive,
        n_draws=n_draws,
        params=params,
        seed=seed,
        loss_fn=loss_fn,
        batch_size=batch_size,
        draws_per_forward=draws_per_forward,
        math_attention=math_attention,
    )
    return sharpness_estimate(clean, losses, rho, adaptive)
