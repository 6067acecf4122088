"""Does a measure predict generalisation? Rank correlation over many trained models, after Jiang et al.
(ICLR 2020, "Fantastic Generalization Measures and Where to Find Them").

* :func:`kendall_tau`: Kendall's τ between a measure (a flatness value) and a target (the test metric,
  the generalisation gap) over models, with a percentile bootstrap interval over models;
* :func:`granulated_tau`: the granulated Kendall coefficient: per hyperparameter axis i, ψ_i is
  the mean τ over the groups of models that share every other axis's value (only axis i varies), and
  Ψ the mean of the ψ_i. Both are defined in Jiang et al.'s §2, where the axes are a full grid of
  hyperparameters (m_i = the number of combinations of the other axes' values).

τ is τ-b (``scipy.stats.kendalltau``, ``variant="b"``): (concordant − discordant pairs) over
√((pairs untied in the measure)·(pairs untied in the target)); without ties it equals Jiang et al.'s τ.
A model missing either value is dropped (pairwise). Too few models or a constant measure/target give
NaN with the reason in words, never an exception; malformed input raises ``ConfigError``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Mapping, Sequence, Tuple

import numpy as np

from flatlab.analysis.compare.statistics import CONFIDENCE
from flatlab.errors import ConfigError

NAN = float("nan")


@dataclass(frozen=True)
class Correlation:
    """Kendall's τ-b of a measure and a target over ``n`` models (:func:`kendall_tau`).

    ``p``: scipy's two-sided p-value of τ = 0; ``[low, high]``: the percentile bootstrap interval at
    ``confidence`` over ``resamples`` resamples of models that gave a τ (a resample whose measure or target
    is constant has none and is dropped); ``reason``: why ``tau`` is NaN, or ''."""

    n: int
    tau: float
    p: float
    low: float
    high: float
    confidence: float
    resamples: int
    reason: str = ""


@dataclass(frozen=True)
class SkippedGroup:
    """A group of models left out of axis ``axis``'s ψ: ``fixed`` the other axes' shared values
    (``((name, value), ...)``), ``models`` its size, ``reason`` why."""

    axis: str
    fixed: Tuple[Tuple[str, Any], ...]
    models: int
    reason: str


@dataclass(frozen=True)
class Granulated:
    """The granulated Kendall coefficient (:func:`granulated_tau`).

    ``per_axis[axis]``: ψ_axis, the mean τ over its ``groups[axis]`` usable groups (NaN: none);
    ``psi``: Ψ, the mean of the finite ψ_axis; ``models``: the models with both values;
    ``skipped``: the groups left out and why; ``reason``: why ``psi`` is NaN, or ''."""

    per_axis: Dict[str, float]
    psi: float
    groups: Dict[str, int]
    models: int
    skipped: Tuple[SkippedGroup, ...] = field(default=())
    reason: str = ""


def _values(measure: Sequence[float], target: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """``measure`` and ``target`` as float arrays (``None`` -> NaN); ConfigError for malformed input."""
    try:
        x = np.asarray([np.nan if v is None else v for v in measure], dtype=float)
        y = np.asarray([np.nan if v is None else v for v in target], dtype=float)
    except (TypeError, ValueError) as err:
        raise ConfigError("measure and target must be sequences of numbers, one per model") from err
    if x.ndim != 1 or y.ndim != 1 or x.size != y.size:
        raise ConfigError(f"measure and target must have one value per model; got shapes {x.shape} and {y.shape}")
    return x, y


def _undefined(x: np.ndarray, y: np.ndarray) -> str:
    """Why τ is undefined for these models, or ''."""
    if x.size < 2:
        return f"fewer than 2 models with both values ({x.size})"
    if np.all(x == x[0]):
        return "the measure is constant over the models"
    if np.all(y == y[0]):
        return "the target is constant over the models"
    return ""


def _tau(x: np.ndarray, y: np.ndarray) -> float:
    # SciPy on first use: importing this module stays light
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a constant resample: NaN, dropped by the caller
        return float(stats.kendalltau(x, y, variant="b").statistic)


def kendall_tau(
    measure: Sequence[float],
    target: Sequence[float],
    *,
    confidence: float = CONFIDENCE,
    n_resamples: int = 1000,
    seed: int = 0,
) -> Correlation:
    """Kendall's τ-b between ``measure`` and ``target`` over models (one value each, same order), with a
    percentile bootstrap interval over models (``scipy.stats.bootstrap``, paired resamples of models,
    ``method="percentile"``, generator seeded with ``seed``). A resample in which the measure or the
    target is constant has no τ; the interval is the (1 ∓ confidence)/2 quantiles (linear interpolation,
    as scipy's) of the resamples that have one, and ``resamples`` counts them.

    Jiang et al. (ICLR 2020, §2): a measure predicts generalisation over a set of models when its ranking
    agrees with the target's; τ = 1 same order, −1 reversed, 0 no association. The sign is that of the
    pair as given: a sharpness measure (lower = flatter, as flatlab's ``flat/*``) against the
    generalisation gap has τ > 0 when flatter models generalise better.

    Returns:
        :class:`Correlation`; NaN τ, p and interval with ``reason`` for fewer than 2 models with both
        values or a constant measure or target.
    Raises:
        ConfigError: ``measure``/``target`` not numbers of the same length; ``confidence`` outside
            (0, 1); ``n_resamples`` not a positive integer.
    """
    # SciPy on first use: importing this module stays light
    from scipy import stats

    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ConfigError(f"confidence must be a number in (0, 1), e.g. 0.95; got {confidence!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ConfigError(f"n_resamples must be a positive integer, e.g. 1000; got {n_resamples!r}")
    x, y = _values(measure, target)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    reason = _undefined(x, y)
    if reason:
        return Correlation(int(x.size), NAN, NAN, NAN, NAN, float(confidence), 0, reason)
    result = stats.kendalltau(x, y, variant="b")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples: scipy warns, they are dropped below
        boot = stats.bootstrap(
            (x, y),
            _tau,
            paired=True,
            vectorized=False,
            n_resamples=int(n_resamples),
            method="percentile",
            confidence_level=confidence,
            random_state=np.random.default_rng(seed),
        )
    taus = np.asarray(boot.bootstrap_distribution, dtype=float)
    taus = taus[np.isfinite(taus)]
    tail = (1 - confidence) / 2
    low, high = (float(v) for v in np.quantile(taus, [tail, 1 - tail])) if taus.size else (NAN, NAN)
    return Correlation(
        int(x.size), float(result.statistic), float(result.pvalue), low, high, float(confidence), int(taus.size)
    )


def _axis_records(axes: Sequence[Mapping[str, Hashable]], size: int) -> List[str]:
    """The axis names shared by every record; ConfigError when records differ or are not mappings."""
    if len(axes) != size:
        raise ConfigError(f"axes, measure and target must have one entry per model; got {len(axes)} and {size}")
    if not size:
        return []
    bad = [i for i, a in enumerate(axes) if not isinstance(a, Mapping)]
    if bad:
        raise ConfigError(f"axes[{bad[0]}] must be a mapping {{axis name: value}}; got {axes[bad[0]]!r}")
    names = list(axes[0])
    for i, record in enumerate(axes):
        if set(record) != set(names):
            raise ConfigError(f"every model must have the same axes {sorted(names)}; axes[{i}] has {sorted(record)}")
        for name, value in record.items():
            try:
                hash(value)
            except TypeError as err:
                raise ConfigError(f"axes[{i}][{name!r}] must be hashable (a number or text); got {value!r}") from err
    if not names:
        raise ConfigError("axes must name at least one hyperparameter axis per model")
    return names


def granulated_tau(
    axes: Sequence[Mapping[str, Hashable]], measure: Sequence[float], target: Sequence[float]
) -> Granulated:
    """Jiang et al.'s granulated Kendall coefficient (ICLR 2020, §2) over a grid of models.

    For each axis i, the models (those with both values finite) are grouped by the values of every other
    axis; a group where axis i takes at least two values gives τ_group (:func:`kendall_tau`'s τ-b), and

        ψ_i = mean of τ_group over axis i's usable groups,   Ψ = mean of ψ_i over the axes that have one.

    Jiang et al. average over every axis of a full grid; here an axis without a usable group (and a group
    with one value of axis i, or a constant measure or target) is left out and listed in ``skipped``.

    Args:
        axes: per model, ``{axis name: value}`` (hashable values: a learning rate, a width, an optimizer
            name); every model the same axis names.
        measure, target: per model, e.g. a flatness value and the generalisation gap (NaN/None: missing).
    Returns:
        :class:`Granulated`; ``psi`` NaN with ``reason`` when no axis has a usable group.
    Raises:
        ConfigError: lengths differ, a record is not a mapping, records name different axes or none, or a
            value is not hashable.
    """
    x, y = _values(measure, target)
    names = _axis_records(axes, x.size)
    keep = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    per_axis: Dict[str, float] = {}
    groups: Dict[str, int] = {}
    skipped: List[SkippedGroup] = []
    for axis in names:
        others = [n for n in names if n != axis]
        buckets: Dict[tuple, List[int]] = {}
        for i in keep:
            buckets.setdefault(tuple(axes[i][n] for n in others), []).append(int(i))
        taus = []
        for key, members in buckets.items():
            fixed = tuple(zip(others, key))
            reason = ""
            if len({axes[i][axis] for i in members}) < 2:
                reason = f"only one value of {axis} in the group"
            reason = reason or _undefined(x[members], y[members])
            if reason:
                skipped.append(SkippedGroup(axis, fixed, len(members), reason))
            else:
                taus.append(_tau(x[members], y[members]))
        per_axis[axis] = float(np.mean(taus)) if taus else NAN
        groups[axis] = len(taus)
    psis = [v for v in per_axis.values() if np.isfinite(v)]
    reason = "" if psis else "no axis has a group of models in which only it varies"
    return Granulated(per_axis, float(np.mean(psis)) if psis else NAN, groups, int(keep.size), tuple(skipped), reason)
