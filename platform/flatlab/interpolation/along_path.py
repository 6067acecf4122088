"""Sharpness along the interpolation path: general and layer-wise sharpness of every theta_alpha.

Seed paper "In Search of the Successful Interpolation" (App. A and its sharpness-along-alpha
analysis): the adaptive average sharpness of ``theta_alpha = (1 - alpha) * theta_zs + alpha * theta_ft``
(alpha = weight on the fine-tuned model) on the same fixed OOD subset with the same noise seed for
every alpha, for the whole model and for each layer (group): the heat map of layer-wise sharpness per
layer along alpha.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.interpolation.state import interpolate
from flatlab.interpolation.sweep import DEFAULT_ALPHAS
from flatlab.sharpness.average import average_sharpness
from flatlab.sharpness.data import DEFAULT_BATCH_SIZE, EvalData, as_subset
from flatlab.sharpness.grouping import select_group
from flatlab.sharpness.results import SharpnessEstimate


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


def sharpness_along_path(
    model: nn.Module,
    zs: Mapping[str, Any],
    ft: Mapping[str, Any],
    data: EvalData,
    *,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    groups: Optional[Mapping[str, Sequence[str]]] = None,
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
        measure: :func:`~flatlab.sharpness.average_sharpness` (default) or
            :func:`~flatlab.sharpness.average_sharpness_batched`.
        **measure_kwargs: ``rho``, ``n_draws``, ``seed``, ``loss_fn`` ... (same seed for every alpha).

    Cost: ``len(alphas) * (1 + len(groups))`` measures.

    Raises:
        ConfigError: incompatible state dicts, empty ``alphas``; UnknownNameError from the measure.
    """
    alphas = tuple(float(a) for a in alphas)
    if not alphas:
        raise ConfigError("sharpness_along_path needs at least one alpha")
    subset = as_subset(data, measure_kwargs.pop("batch_size", DEFAULT_BATCH_SIZE))
    groups = dict(groups or {})
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    general = []
    layerwise: Dict[str, list] = {g: [] for g in groups}
    try:
        for alpha in alphas:
            model.load_state_dict(interpolate(zs, ft, alpha))
            general.append(measure(model, subset, **measure_kwargs))
            for g in groups:
                layerwise[g].append(measure(model, subset, params=select_group(groups, g), **measure_kwargs))
    finally:
        model.load_state_dict(original)
    return SharpnessPath(alphas, tuple(general), {g: tuple(v) for g, v in layerwise.items()})
