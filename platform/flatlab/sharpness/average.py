"""Average-case (adaptive) sharpness and TSAM's neighbourhood-loss statistics: one estimator.

Adaptive average sharpness (Andriushchenko et al. 2023, "A Modern Look at the Relationship between
Sharpness and Generalization", average-case adaptive sharpness; used by the seed paper "In Search of
the Successful Interpolation", App. A):

    S = E_delta[L(w + delta)] - L(w),   delta ~ N(0, rho^2 * diag(c^2)),   c = |w| (adaptive) or 1,

estimated with ``n`` draws ``delta_k = rho * c * z_k``, ``z_k ~ N(0, I)``; each draw is evaluated on the
whole fixed subset (:mod:`flatlab.sharpness.data`), in eval mode. Not divided by ``rho^2``. For a
quadratic ``L(w) = 1/2 w^T H w`` the exact value is ``rho^2 / 2 * tr(H * |w||w|^T)``. TSAM's
:func:`neighbourhood_loss` is the same estimator with ``c = 1``, reporting the statistics of the
perturbed losses themselves.

The ``z_k`` come from a ``torch.Generator`` seeded with ``seed`` and are drawn draw by draw, tensor by
tensor in ``named_parameters()`` order, so the same seed gives the same ``z`` for every model of the
same architecture (e.g. every interpolation coefficient alpha). :func:`perturbed_losses` evaluates the
draws one at a time with ``w + delta_k`` written into the parameters (copied back bitwise exactly
afterwards, also on exception), or ``draws_per_forward`` at a time through ``torch.func.vmap``
(:mod:`flatlab.sharpness.batched`; the model is not modified); both read the same ``z_k``. Cost:
``n + 1`` forward passes over the subset plus ``n`` noise draws.

Layer-wise sharpness: ``params`` restricts ``delta`` to one group of parameters (see
:mod:`flatlab.sharpness.grouping`); the others are untouched. Training flags are restored and ``.grad``
is never touched.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.ranges import LOSS, NONNEGATIVE
from flatlab.sharpness import _state
from flatlab.sharpness.data import (
    DEFAULT_BATCH_SIZE,
    EvalData,
    EvalSubset,
    LossFn,
    as_subset,
    functional_forward,
    subset_loss,
    weighted_batches,
)
from flatlab.sharpness.grouping import GroupingLike, Groups, group_parameters, select_group
from flatlab.sharpness.registry import FloatList, register_measure, sweep_key, with_stderr
from flatlab.sharpness.results import NeighbourhoodLoss, SharpnessEstimate, mean_and_stderr

__all__ = [
    "DEFAULT_RHO",
    "DEFAULT_DRAWS",
    "perturbed_losses",
    "sharpness_estimate",
    "average_sharpness",
    "neighbourhood_loss",
    "layerwise_sharpness",
    "sigma_key",
]

DEFAULT_RHO = 1.0  # seed paper, App. A
DEFAULT_DRAWS = 20  # seed paper, App. A


def perturbed_losses(
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
    draws_per_forward: Optional[int] = None,
    math_attention: bool = True,
    c: Optional[Mapping[str, torch.Tensor]] = None,
) -> Tuple[float, List[float]]:
    """``(L(w), [L(w + delta_k) for k < n_draws])`` with ``delta_k = scale * c * z_k`` (module docstring).

    Args:
        scale: ``rho`` or ``sigma``; ``scale_name`` names it in the error message.
        draws_per_forward: ``None``: one draw per forward pass, written into the parameters in place.
            ``k >= 1``: ``k`` draws per forward under ``torch.func.vmap``, with perturbed copies of shape
            ``(k, *w.shape)`` of the selected parameters.
        math_attention: with ``draws_per_forward``, run attention with the math kernel inside ``vmap``.
        c: ``{parameter name: tensor of its shape}``, the per-entry ``c`` given explicitly for every
            perturbed parameter (``adaptive`` is then ignored); e.g. ``alpha * |theta_ft|`` when the
            interpolated model is perturbed as its fine-tuned end is (seed paper §3.1,
            :func:`flatlab.interpolation.finetuned_layer_sharpness`). A zero ``c`` leaves an entry unperturbed.
        model, data, adaptive, n_draws, params, seed, loss_fn, batch_size: as :func:`average_sharpness`.

    Raises:
        ConfigError: ``scale`` not finite and > 0, ``n_draws`` or ``draws_per_forward`` < 1, empty data
            or parameter selection; ``c`` missing a perturbed parameter or of another shape.
        UnknownNameError: a name in ``params`` that is not a parameter of ``model``.
    """
    scale = _state.check_positive(scale_name, scale)
    _state.check_count("n_draws", n_draws)
    in_place = draws_per_forward is None
    per_forward = 1 if draws_per_forward is None else _state.check_count("draws_per_forward", draws_per_forward)
    subset = as_subset(data, batch_size)
    loss_fn = loss_fn or F.cross_entropy
    named = _state.resolve_params(model, params)
    device = _state.device_of(named)
    gen = _state.make_generator(device, seed)
    losses: List[float] = []
    unperturbed = _state.preserved(named) if in_place else contextlib.nullcontext([p.detach() for _, p in named])
    with _state.eval_mode(model), torch.no_grad(), unperturbed as base:
        clean = subset_loss(model, subset, loss_fn, device)
        scales = _state.noise_scales(base, scale, adaptive) if c is None else _given_scales(named, c, scale)
        reused = [_state.noise_buffer(w, (1,)) for w in base] if in_place else None  # one draw at a time
        done = 0
        while done < n_draws:
            k = min(per_forward, n_draws - done)
            z = reused or [_state.noise_buffer(w, (k,)) for w in base]  # z[i]: (k, *w.shape)
            for j in range(k):  # draw by draw, tensor by tensor: the same z_k however many per forward
                for zi in z:
                    _state.fill_standard_normal(zi[j], gen)
            if in_place:
                for (_, p), w, s, zi in zip(named, base, scales, z):
                    _perturb(w, s, zi[0].to(p.dtype), scale, out=p)
                losses.append(subset_loss(model, subset, loss_fn, device))
            else:
                perturbed = {
                    n: _perturb(w, s, zi.to(w.dtype), scale) for (n, _), w, s, zi in zip(named, base, scales, z)
                }
                del z
                losses.extend(_vmapped_losses(model, perturbed, subset, loss_fn, device, k, math_attention))
            done += k
    return clean, losses


def _given_scales(named: _state.NamedParams, c: Mapping[str, torch.Tensor], scale: float) -> List[torch.Tensor]:
    # scale * c per perturbed parameter, on its device and in its dtype
    out = []
    for name, p in named:
        if name not in c:
            raise ConfigError(f"c has no entry for the perturbed parameter {name!r}; it has {len(c)} entries")
        if tuple(c[name].shape) != tuple(p.shape):
            raise ConfigError(f"c[{name!r}] has shape {tuple(c[name].shape)}; the parameter has {tuple(p.shape)}")
        out.append(c[name].detach().to(device=p.device, dtype=p.dtype).abs().mul(scale))
    return out


def _perturb(
    w: torch.Tensor, s: Optional[torch.Tensor], z: torch.Tensor, scale: float, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    # w + scale * z (c = 1), or w + (scale * |w|) * z with s = scale * |w| (adaptive)
    return torch.add(w, z, alpha=scale, out=out) if s is None else torch.addcmul(w, s, z, out=out)


def _vmapped_losses(
    model: nn.Module,
    perturbed: Dict[str, torch.Tensor],
    subset: EvalSubset,
    loss_fn: LossFn,
    device: torch.device,
    k: int,
    math_attention: bool,
) -> List[float]:
    # the subset loss (example-weighted mean, float64) of the k parameter sets stacked in ``perturbed``
    total = torch.zeros(k, dtype=torch.float64, device=device)
    for inputs, targets, weight in weighted_batches(subset, device):

        def loss_of(ps: Dict[str, torch.Tensor], inputs=inputs, targets=targets) -> torch.Tensor:
            return loss_fn(functional_forward(model, ps, inputs), targets)

        with _state.math_attention(math_attention):
            total += weight * vmap(loss_of, randomness="different")(perturbed).double()
    return total.tolist()


def sharpness_estimate(clean: float, losses: Sequence[float], rho: float, adaptive: bool) -> SharpnessEstimate:
    """The :class:`SharpnessEstimate` of :func:`perturbed_losses`' output: the mean of ``L(w + delta_k) - L(w)``."""
    diffs = [v - clean for v in losses]
    value, err = mean_and_stderr(diffs)
    return SharpnessEstimate(value, err, len(diffs), tuple(diffs), clean, float(rho), bool(adaptive))


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
    )
    return sharpness_estimate(clean, losses, rho, adaptive)


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
    clean, losses = perturbed_losses(
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


# ---- the registered measures (flatlab.sharpness.measures runs them) ----------------------------------


def sigma_key(sigma: Union[float, str], stat: str = "") -> str:
    """``neighbourhood_loss``'s sweep at noise scale ``sigma`` (:func:`~flatlab.sharpness.registry.sweep_key`):
    ``flat/neighbourhood_loss/sigma_0.01`` (the mean), then ``stat`` = ``_var`` or ``_stderr`` appended."""
    return sweep_key("neighbourhood_loss", "sigma", sigma, stat)


@register_measure(
    name="neighbourhood_loss",
    doc="mean and variance of L(theta + eps), eps ~ N(0, sigma^2 I) (loss units; _var in loss units^2)",
    source="TSAM paper (Reweighting Local Minima with Tilted SAM), Fig. 2",
    hparams=(
        HParam(
            "sigma",
            0.03,
            float,
            low=0.0,
            low_open=True,
            doc="noise standard deviation per coordinate, parameter units "
            "(default 0.03: ours; the TSAM paper plots a range of scales)",
        ),
        HParam("draws", 40, int, low=2, doc="noise draws (>= 2 for the variance)"),
        FloatList(
            "sigmas",
            None,
            float,
            low=0.0,
            low_open=True,
            doc="optional further noise scales (a sweep, TSAM Fig. 2): per sigma s, the keys "
            "flat/neighbourhood_loss/sigma_<s>, .../sigma_<s>_var, .../sigma_<s>_stderr",
        ),
    ),
    metrics=(
        "flat/neighbourhood_loss",
        "flat/neighbourhood_loss_var",
        "flat/neighbourhood_loss_stderr",
        "flat/neighbourhood_loss_clean",
        sigma_key("<s>"),
        sigma_key("<s>", "_var"),
        sigma_key("<s>", "_stderr"),
    ),
    support={
        "flat/neighbourhood_loss": LOSS,
        "flat/neighbourhood_loss_var": NONNEGATIVE,
        "flat/neighbourhood_loss_stderr": NONNEGATIVE,
        "flat/neighbourhood_loss_clean": LOSS,
        sigma_key("<s>"): LOSS,
        sigma_key("<s>", "_var"): NONNEGATIVE,
        sigma_key("<s>", "_stderr"): NONNEGATIVE,
    },
)
def _neighbourhood_measure(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    est = neighbourhood_loss(model, subset, sigma=p["sigma"], n_draws=p["draws"], seed=seed, loss_fn=loss_fn)
    out = with_stderr("flat/neighbourhood_loss", est.mean, est.stderr)
    out["flat/neighbourhood_loss_var"] = float(est.variance)
    out["flat/neighbourhood_loss_clean"] = float(est.clean_loss)
    for sigma in p["sigmas"] or ():  # the same seed: the same standard-normal draws z at every sigma (eps = sigma z)
        at = neighbourhood_loss(model, subset, sigma=sigma, n_draws=p["draws"], seed=seed, loss_fn=loss_fn)
        out[sigma_key(sigma)] = float(at.mean)
        out[sigma_key(sigma, "_var")] = float(at.variance)
        if math.isfinite(at.stderr):
            out[sigma_key(sigma, "_stderr")] = float(at.stderr)
    return out


@register_measure(
    name="avg_sharpness",
    doc="adaptive average sharpness E[L(theta + delta)] - L(theta), delta ~ N(0, rho^2 diag(|theta|^2)) (loss units)",
    source="'In Search of the Successful Interpolation' (robust fine-tuning of CLIP), App. A; "
    "Andriushchenko et al. 2023",
    hparams=(
        HParam(
            "rho",
            1.0,
            float,
            low=0.0,
            low_open=True,
            doc="noise scale, relative to |theta| when adaptive (seed paper App. A: 1.0)",
        ),
        HParam("draws", 20, int, low=1, doc="noise draws (seed paper: 20)"),
        HParam("adaptive", True, bool, doc="c = |theta| elementwise (True) or c = 1 (False)"),
    ),
    metrics=("flat/avg_sharpness", "flat/avg_sharpness_stderr", "flat/avg_sharpness_clean"),
    support={"flat/avg_sharpness_stderr": NONNEGATIVE, "flat/avg_sharpness_clean": LOSS},  # the value: unbounded
)
def _avg_sharpness_measure(
    model: nn.Module, subset: EvalSubset, loss_fn: LossFn, p: Mapping[str, Any], seed: int
) -> Dict[str, float]:
    est = average_sharpness(
        model, subset, rho=p["rho"], n_draws=p["draws"], adaptive=p["adaptive"], seed=seed, loss_fn=loss_fn
    )
    out = with_stderr("flat/avg_sharpness", est.value, est.stderr)
    out["flat/avg_sharpness_clean"] = float(est.clean_loss)
    return out
