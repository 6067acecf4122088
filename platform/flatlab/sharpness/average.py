"""Average-case (adaptive) sharpness and TSAM's neighbourhood-loss statistics, loop implementation.

Adaptive average sharpness (Andriushchenko et al. 2023, "A Modern Look at the Relationship between
Sharpness and Generalization", average-case adaptive sharpness; used by the seed paper "In Search of
the Successful Interpolation", App. A):

    S = E_delta[L(w + delta)] - L(w),   delta ~ N(0, rho^2 * diag(c^2)),   c = |w| (adaptive) or 1,

estimated with ``n`` draws ``delta_k = rho * c * z_k``, ``z_k ~ N(0, I)``; each draw is evaluated on the
whole fixed subset (:mod:`flatlab.sharpness.data`), in eval mode. Not divided by ``rho^2``. For a
quadratic ``L(w) = 1/2 w^T H w`` the exact value is ``rho^2 / 2 * tr(H * |w||w|^T)``.

The ``z_k`` come from a ``torch.Generator`` seeded with ``seed`` and are drawn draw by draw, tensor by
tensor in ``named_parameters()`` order, so the same seed gives the same ``z`` for every model of the
same architecture (e.g. every interpolation coefficient alpha) and :mod:`flatlab.sharpness.batched`
reproduces them. Cost: ``n + 1`` forward passes over the subset plus ``n`` noise draws.

Layer-wise sharpness: ``params`` restricts ``delta`` to one group of parameters (see
:mod:`flatlab.sharpness.grouping`); the others are untouched. The parameters are perturbed in place
and copied back from a saved copy afterwards (bitwise exact, also on exception); training flags are
restored and ``.grad`` is never touched.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from flatlab.sharpness import _state
from flatlab.sharpness.data import DEFAULT_BATCH_SIZE, EvalData, LossFn, as_subset, subset_loss
from flatlab.sharpness.grouping import GroupingLike, Groups, group_parameters, select_group
from flatlab.sharpness.results import NeighbourhoodLoss, SharpnessEstimate, mean_and_stderr

DEFAULT_RHO = 1.0  # seed paper, App. A
DEFAULT_DRAWS = 20  # seed paper, App. A


def _perturbed_losses(
    model: nn.Module,
    data: EvalData,
    *,
    scale: float,
    scale_name: str,
    adaptive: bool,
    n_draws: int,
    params: Optional[Sequence[str]],
    seed: int,
    loss_fn: Optional[LossFn],
    batch_size: int,
) -> Tuple[float, List[float]]:
    """``(L(w), [L(w + delta_k) for k < n_draws])`` with ``delta_k = scale * c * z_k``."""
    scale = _state.check_positive(scale_name, scale)
    _state.check_count("n_draws", n_draws)
    subset = as_subset(data, batch_size)
    loss_fn = loss_fn or F.cross_entropy
    named = _state.resolve_params(model, params)
    device = _state.device_of(named)
    gen = _state.make_generator(device, seed)
    losses: List[float] = []
    with _state.eval_mode(model), torch.no_grad(), _state.preserved(named) as saved:
        clean = subset_loss(model, subset, loss_fn, device)
        scales = _state.noise_scales(saved, scale, adaptive)
        bufs = [_state.noise_buffer(w) for w in saved]  # reused for every draw
        for _ in range(n_draws):
            for (_, p), w, s, buf in zip(named, saved, scales, bufs):
                z = _state.fill_standard_normal(buf, gen).to(p.dtype)
                if s is None:
                    torch.add(w, z, alpha=scale, out=p)  # w + rho * z
                else:
                    torch.addcmul(w, s, z, out=p)  # w + (rho * |w|) * z
            losses.append(subset_loss(model, subset, loss_fn, device))
    return clean, losses


def average_sharpness(
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
) -> SharpnessEstimate:
    """Average-case adaptive sharpness ``E_delta[L(w + delta)] - L(w)`` (Andriushchenko et al. 2023;
    seed paper App. A). See the module docstring for the estimator.

    Args:
        model: any ``nn.Module``; evaluated in eval mode, restored exactly afterwards.
        data: the fixed evaluation subset (:func:`flatlab.sharpness.data.as_subset`).
        rho: noise scale (dimensionless when adaptive; parameter units when ``adaptive=False``).
        n_draws: number of noise draws ``n`` (seed paper: 20).
        adaptive: ``c = |w|`` elementwise (default) or ``c = 1``.
        params: parameter names to perturb (one layer for layer-wise sharpness); ``None`` = all
            floating-point parameters.
        seed: seed of the noise generator; reuse it across models/alphas for paired comparisons.
        loss_fn: ``loss_fn(outputs, targets) -> scalar batch mean``; default ``F.cross_entropy``.
        batch_size: batch size when ``data`` is a ``TensorDataset``.

    Returns:
        :class:`SharpnessEstimate` (loss units, nats for cross-entropy).

    Raises:
        ConfigError: ``rho`` not finite and > 0, ``n_draws < 1``, empty data or parameter selection.
        UnknownNameError: a name in ``params`` that is not a parameter of ``model``.
    """
    clean, losses = _perturbed_losses(
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
    )
    diffs = [v - clean for v in losses]
    value, err = mean_and_stderr(diffs)
    return SharpnessEstimate(value, err, n_draws, tuple(diffs), clean, float(rho), bool(adaptive))


def neighbourhood_loss(
    model: nn.Module,
    data: EvalData,
    *,
    sigma: float,
    n_draws: int = DEFAULT_DRAWS,
    params: Optional[Sequence[str]] = None,
    seed: int = 0,
    loss_fn: Optional[LossFn] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> NeighbourhoodLoss:
    """TSAM's flatness measure (seed "Reweighting Local Minima with Tilted SAM", Fig. 2): mean and
    variance of ``L(w + eps)``, ``eps ~ N(0, sigma^2 I)`` (isotropic, not adaptive).

    For ``L(w) = 1/2 w^T H w``: mean ``= L(w) + sigma^2/2 tr(H)``, variance
    ``= sigma^2 |Hw|^2 + sigma^4/2 tr(H^2)``.

    Args: as :func:`average_sharpness`, with ``sigma`` the per-coordinate standard deviation
    (parameter units).

    Raises:
        ConfigError / UnknownNameError: as :func:`average_sharpness`.
    """
    clean, losses = _perturbed_losses(
        model,
        data,
        scale=sigma,
        scale_name="sigma",
        adaptive=False,
        n_draws=n_draws,
        params=params,
        seed=seed,
        loss_fn=loss_fn,
        batch_size=batch_size,
    )
    mean, err = mean_and_stderr(losses)
    var = math.fsum((v - mean) ** 2 for v in losses) / (n_draws - 1) if n_draws > 1 else float("nan")
    return NeighbourhoodLoss(mean, var, err, n_draws, tuple(losses), clean, float(sigma))


def layerwise_sharpness(
    model: nn.Module,
    data: EvalData,
    groups: Union[GroupingLike, Mapping[str, Sequence[str]]] = "modules",
    *,
    only: Optional[Sequence[str]] = None,
    measure: Optional[Callable[..., Any]] = None,
    **measure_kwargs: Any,
) -> Dict[str, Any]:
    """Layer-wise sharpness (seed paper, App. A): the measure with ``delta`` on one group at a time.

    Args:
        groups: a grouping name (``clip``, ``vit``, ``modules``), a :class:`Grouping`, or an explicit
            ``{group: parameter names}`` mapping.
        only: restrict to these group names (checked; unknown names raise listing the valid ones).
        measure: ``average_sharpness`` (default), ``average_sharpness_batched``,
            ``worst_case_sharpness``, ``hessian_trace`` ... any ``measure(model, data, *, params=...,
            **kwargs)``.
        **measure_kwargs: passed to ``measure`` (``rho``, ``n_draws``, ``seed`` ...); the same seed is
            used for every group.

    Returns:
        ``{group name: estimate}`` in group order.
    """
    resolved: Groups = (
        {k: tuple(v) for k, v in groups.items()} if isinstance(groups, Mapping) else group_parameters(model, groups)
    )
    names = list(resolved) if only is None else list(only)
    measure = measure or average_sharpness
    subset = as_subset(data, measure_kwargs.pop("batch_size", DEFAULT_BATCH_SIZE))
    return {g: measure(model, subset, params=select_group(resolved, g), **measure_kwargs) for g in names}
