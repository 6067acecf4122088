"""Weight interpolation between zero-shot and fine-tuned models (WiSE-FT / robust fine-tuning) and the
seed paper's analyses ("In Search of the Successful Interpolation").

``alpha`` is ALWAYS the weight on the fine-tuned model: ``theta_alpha = (1 - alpha) theta_zs + alpha
theta_ft`` (WiSE-FT). The seed paper's alpha is the weight on the zero-shot model (= our ``1 - alpha``).

Public surface: :func:`interpolate`, :func:`interpolate_keys` (layer-wise, Def. 1.1),
:func:`check_compatible`; :func:`alpha_grid`, :data:`DEFAULT_ALPHAS`, :func:`alpha_sweep`,
:func:`layerwise_alpha_sweep`, :class:`SweepResult`, :func:`instability` (Def. 1), :func:`barrier`,
:func:`gain` (Eq. 2), :func:`is_failure_mode`; :func:`find_stragglers`, :func:`prune_stragglers`,
:func:`pruned_interpolation` (Algorithm 1); :func:`sharpness_along_path`, :class:`SharpnessPath`,
:func:`finetuned_layer_sharpness` (§3.1's layer-wise sharpness), :data:`LAYER_SHARPNESS`. The alpha study's
trial, the workload ``clip_interpolate``, is :mod:`flatlab.interpolation.workload` (loaded by the workload
registry, not here).
Plots live in :mod:`flatlab.interpolation.plots` (imported on demand: it loads matplotlib). The
procedures and conventions: ``docs/algorithms/rft.md``.
"""

from flatlab.interpolation.along_path import (
    LAYER_SHARPNESS,
    SharpnessPath,
    finetuned_layer_sharpness,
    sharpness_along_path,
)
from flatlab.interpolation.state import check_compatible, interpolate, interpolate_keys
from flatlab.interpolation.stragglers import find_stragglers, prune_stragglers, pruned_interpolation
from flatlab.interpolation.sweep import (
    DEFAULT_ALPHAS,
    SweepResult,
    alpha_grid,
    alpha_sweep,
    barrier,
    gain,
    instability,
    is_failure_mode,
    layerwise_alpha_sweep,
)

__all__ = [
    "DEFAULT_ALPHAS",
    "LAYER_SHARPNESS",
    "SharpnessPath",
    "SweepResult",
    "alpha_grid",
    "alpha_sweep",
    "barrier",
    "check_compatible",
    "find_stragglers",
    "finetuned_layer_sharpness",
    "gain",
    "instability",
    "interpolate",
    "interpolate_keys",
    "is_failure_mode",
    "layerwise_alpha_sweep",
    "prune_stragglers",
    "pruned_interpolation",
    "sharpness_along_path",
]
