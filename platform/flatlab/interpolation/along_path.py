"""Sharpness along the interpolation path: general and layer-wise sharpness of every theta_alpha.

Seed paper "In Search of the Successful Interpolation" (App. A and its sharpness-along-alpha
analysis): the adaptive average sharpness of ``theta_alpha = (1 - alpha) * theta_zs + alpha * theta_ft``
(alpha = weight on the fine-tuned model) on the same fixed OOD subset with the same noise seed for
every alpha, for the whole model and for each layer (group): the heat map of layer-wise sharpness per
layer along alpha (Fig. 4). Two definitions of the layer-wise value (:data:`LAYER_SHARPNESS`):

* ``finetuned`` (§3.1, the paper's, the default): perturb layer i of the FINE-TUNED model, then
  interpolate, and measure against the unperturbed interpolation,

      S_i(alpha) = E_delta[L((1 - alpha) theta_zs + alpha (theta_ft + delta_i))] - L(theta_alpha),
      delta_i ~ N(0, rho^2 diag(c^2)) on layer i only, c = |theta_ft| (adaptive) or 1.

  Since ``(1 - alpha) theta_zs + alpha (theta_ft + delta_i) = theta_alpha + alpha delta_i``, it is
  measured as theta_alpha perturbed with ``c = alpha |theta_ft|`` (or ``alpha``) on layer i
  (:func:`finetuned_layer_sharpness`); S_i(0) = 0 exactly (the zero-shot end carries no fine-tuned weight).
* ``interpolated``: perturb layer i of theta_alpha itself, ``c = |theta_alpha|`` (or 1): the plain
  layer-wise sharpness of the interpolated model (:func:`flatlab.sharpness.layerwise_sharpness`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.interpolation.state import interpolate
from flatlab.interpolation.sweep import DEFAULT_ALPHAS
from flatlab.sharpness.average import (
    DEFAULT_DRAWS,
    DEFAULT_RHO,
    average_sharpness,
    perturbed_losses,
    sharpness_estimate,
)
from flatlab.sharpness.data import DEFAULT_BATCH_SIZE, EvalData, LossFn, as_subset
from flatlab.sharpness.grouping import select_group
from flatlab.sharpness.results import SharpnessEstimate

LAYER_SHARPNESS = ("finetuned", "interpolated")
"""The definitions of layer-wise sharpness along the path (module docstring); the first is the paper's."""


@dataclass(frozen=True)
class SharpnessPath:
    """Sharpness of every ``theta_alpha``.

    Attributes:
        alphas: weights on the fine-tuned model.
        general: whole-model estimate per alpha.
        layerwise: ``{group: (estimate per alpha)}`` (empty when no groups were requested).
    """

    alphas: Tuple[float, ...]
    general: Tuple[SharpnessEstimate, ...]
    layerwise: Mapping[str, Tuple[SharpnessEstimate, ...]]

    def general_values(self) -> Tuple[float, ...]:
        """Whole-model sharpness per alpha (loss units)."""
        return tuple(e.value for e in self.general)

    def matrix(self) -> torch.Tensor:
        """Layer-wise values, shape ``(n_groups, n_alphas)`` float64, rows in ``layerwise`` order."""
        return torch.tensor([[e.value for e in row] for row in self.layerwise.values()], dtype=torch.float64).reshape(
            len(self.layerwise), len(self.alphas)
        )


def finetuned_layer_sharpness(
    model: nn.Module,
    zs: Mapping[str, Any],
    ft: Mapping[str, Any],
    alpha: float,
    data: EvalData,
    groups: Mapping[str, Sequence[str]],
    *,
    rho: float = DEFAULT_RHO,
    n_draws: int = DEFAULT_DRAWS,
    adaptive: bool = True,
    seed: int = 0,
    loss_fn: Optional[LossFn] = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> Dict[str, SharpnessEstimate]:
    """Layer-wise sharpness as the seed paper's §3.1 defines it: perturb layer i of the FINE-TUNED model,
    then interpolate with the zero-shot model at ``alpha`` (module docstring, ``finetuned``).

    Each group is measured with the same seed (the same ``z`` for every group and every alpha), as
    ``theta_alpha + alpha * rho * c * z`` on the group's parameters with ``c = |theta_ft|`` (adaptive) or 1
    (:func:`flatlab.sharpness.perturbed_losses` with ``c`` given). ``model``'s state dict is loaded back
    afterwards (also on exception).

    Args:
        model: module whose parameter names are the keys of ``zs``/``ft`` (weights are loaded into it).
        zs, ft: zero-shot and fine-tuned state dicts.
        alpha: weight on the fine-tuned model (WiSE-FT).
        data: the fixed evaluation subset.
        groups: ``{group: parameter names}`` (e.g. ``group_parameters(model, "clip")``).
        rho, n_draws, adaptive, seed, loss_fn, batch_size: as :func:`flatlab.sharpness.average_sharpness`.

    Returns:
        ``{group: SharpnessEstimate}`` in group order (loss units; ``clean_loss`` = L(theta_alpha); value
        0 exactly at alpha = 0).

    Raises:
        ConfigError: incompatible state dicts, non-finite ``alpha``, bad ``rho``/``n_draws``, empty data.
        UnknownNameError: a group name that is not a parameter of ``model``.
    """
    subset = as_subset(data, batch_size)
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out: Dict[str, SharpnessEstimate] = {}
    try:
        model.load_state_dict(interpolate(zs, ft, alpha))
        for g, names in groups.items():
            c = {n: alpha * (ft[n].abs() if adaptive else torch.ones_like(ft[n])) for n in names if n in ft}
            clean, losses = perturbed_losses(
                model,
                subset,
                scale=rho,
                scale_name="rho",
                adaptive=adaptive,
                n_draws=n_draws,
                params=list(names),
                seed=seed,
                loss_fn=loss_fn,
                batch_size=batch_size,
                c=c,
            )
            out[g] = sharpness_estimate(clean, losses, rho, adaptive)
    finally:
        model.load_state_dict(original)
    return out


def sharpness_along_path(
    model: nn.Module,
    zs: Mapping[str, Any],
    ft: Mapping[str, Any],
    data: EvalData,
    *,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    groups: Optional[Mapping[str, Sequence[str]]] = None,
    layer_sharpness: str = "finetuned",
    measure: Callable[..., SharpnessEstimate] = average_sharpness,
    **measure_kwargs: Any,
) -> SharpnessPath:
    """Load each ``theta_alpha`` into ``model`` and measure general (and, with ``groups``, layer-wise)
    sharpness; ``model``'s original state dict is loaded back afterwards (also on exception).

    Args:
        model: module whose ``state_dict()`` keys match ``zs``/``ft``.
        zs, ft: zero-shot and fine-tuned state dicts.
        data: the fixed evaluation subset (e.g. OOD examples).
        alphas: weights on the fine-tuned model; default 0, 0.05, ..., 1.
        groups: ``{group: parameter names}`` for layer-wise sharpness (e.g. ``group_parameters(model,
            "clip")``); ``None`` = general sharpness only.
        layer_sharpness: ``finetuned`` (§3.1: perturb the fine-tuned model's layer, then interpolate;
            :func:`finetuned_layer_sharpness`) or ``interpolated`` (perturb theta_alpha's layer).
        measure: :func:`~flatlab.sharpness.average_sharpness` (default) or
            :func:`~flatlab.sharpness.average_sharpness_batched`; with ``finetuned`` layers, the average
            estimator itself measures the layers.
        **measure_kwargs: ``rho``, ``n_draws``, ``seed``, ``loss_fn`` ... (same seed for every alpha).

    Cost: ``len(alphas) * (1 + len(groups))`` measures.

    Raises:
        ConfigError: incompatible state dicts, empty ``alphas``, an unknown ``layer_sharpness``;
            UnknownNameError from the measure.
    """
    alphas = tuple(float(a) for a in alphas)
    if not alphas:
        raise ConfigError("sharpness_along_path needs at least one alpha")
    if layer_sharpness not in LAYER_SHARPNESS:
        raise ConfigError(f"layer_sharpness must be one of {', '.join(LAYER_SHARPNESS)}; got {layer_sharpness!r}")
    subset = as_subset(data, measure_kwargs.pop("batch_size", DEFAULT_BATCH_SIZE))
    groups = dict(groups or {})
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    general = []
    layerwise: Dict[str, list] = {g: [] for g in groups}
    try:
        for alpha in alphas:
            model.load_state_dict(interpolate(zs, ft, alpha))
            general.append(measure(model, subset, **measure_kwargs))
            if layer_sharpness == "finetuned" and groups:
                kw = {k: v for k, v in measure_kwargs.items() if k != "draws_per_forward"}
                for g, est in finetuned_layer_sharpness(model, zs, ft, alpha, subset, groups, **kw).items():
                    layerwise[g].append(est)
                continue
            for g in groups:
                layerwise[g].append(measure(model, subset, params=select_group(groups, g), **measure_kwargs))
    finally:
        model.load_state_dict(original)
    return SharpnessPath(alphas, tuple(general), {g: tuple(v) for g, v in layerwise.items()})
