"""Does a measure predict generalisation? Rank correlation over many trained models, after Jiang et al.
(ICLR 2020, "Fantastic Generalization Measures and Where to Find Them").

* :func:`kendall_tau`: Kendall's τ between a measure (a flatness value) and a target (the test metric,
  the generalisation gap) over models, with a cluster bootstrap interval and p-value: models that share
  a tuning or a configuration are not independent, so the bootstrap resamples tunings, then the
  configurations of each drawn tuning, then the models of each drawn configuration;
* :func:`granulated_tau`: the granulated Kendall coefficient: per hyperparameter axis i, ψ_i is
  the mean τ over the groups of models that share every other axis's value (only axis i varies), and
  Ψ the mean of the ψ_i. Both are defined in Jiang et al.'s §2, where the axes are a full grid of
  hyperparameters (m_i = the number of combinations of the other axes' values).

τ is τ-b (``scipy.stats.kendalltau``, ``variant="b"``): (concordant − discordant pairs) over
√((pairs untied in the measure)·(pairs untied in the target)); without ties it equals Jiang et al.'s τ.
τ measures an association over the models, not a cause. A model missing either value is dropped
(pairwise). Too few models or a constant measure/target give NaN with the reason in words, never an
exception; malformed input raises ``ConfigError``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from flatlab.analysis.compare.statistics import CONFIDENCE
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

stats = lazy("scipy.stats")

NAN = float("nan")


@dataclass(frozen=True)
class Correlation:
    """Kendall's τ-b of a measure and a target over ``n`` models (:func:`kendall_tau`).

    ``p``: the two-sided p-value of τ = 0, the cluster bootstrap's, never below scipy's for independent
    models (:func:`kendall_tau`); ``[low, high]``: its percentile interval
    at ``confidence`` over the ``resamples`` resamples that gave a τ (a resample whose measure or target
    is constant has none and is dropped); ``units``: the number of clusters at each level of the
    resampling, outermost first (e.g. ``(tunings, configurations)``; ``()``: models resampled as
    independent); ``reason``: why ``tau`` is NaN, or ''."""

    n: int
    tau: float
    p: float
    low: float
    high: float
    confidence: float
    resamples: int
    reason: str = ""
    units: Tuple[int, ...] = ()


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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a constant group: NaN, dropped by the caller
        return float(stats.kendalltau(x, y, variant="b").statistic)


def _paths(clusters: Optional[Sequence[Sequence[Hashable]]], size: int) -> List[Tuple[Hashable, ...]]:
    """Each model's cluster path as a tuple (``()`` for every model without ``clusters``); ConfigError for
    a wrong length, a path that is not a sequence of hashable values, or paths of different depths."""
    if clusters is None:
        return [()] * size
    if isinstance(clusters, (str, bytes)) or len(clusters) != size:
        raise ConfigError(f"clusters must have one path per model ({size}); got {clusters!r:.80}")
    paths = []
    for i, path in enumerate(clusters):
        if isinstance(path, (str, bytes)) or not isinstance(path, Sequence):
            raise ConfigError(f"clusters[{i}] must be a sequence such as (tuning, configuration); got {path!r}")
        try:
            hash(tuple(path))
        except TypeError as err:
            raise ConfigError(f"clusters[{i}] must hold hashable values (numbers, text, tuples); got {path!r}") from err
        paths.append(tuple(path))
    if len({len(p) for p in paths}) > 1:
        raise ConfigError(f"every model's cluster path must have the same depth; got {sorted({len(p) for p in paths})}")
    return paths


def resample_counts(clusters: Sequence[Tuple[Hashable, ...]], n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """How often each model appears in each multi-stage bootstrap resample (Davison & Hinkley 1997,
    *Bootstrap Methods and their Application*, §3.8, resampling at every stage; Field & Welsh 2007,
    *JRSS B* 69:369-390, the "cluster bootstrap" of a nested design).

    ``clusters[i]`` is model i's path, outermost level first, e.g. ``(tuning, configuration)``. Stage 1
    draws as many top-level clusters as there are, with replacement; each drawn cluster draws as many of
    its sub-clusters as it has, with replacement; and so on down to the models of each drawn innermost
    cluster. With empty paths it is the ordinary bootstrap of models. A cluster drawn M times contributes
    M independent draws of its k children, i.e. Multinomial(M·k, 1/k) children in total, which is how
    all resamples are drawn at once.

    Returns:
        ``(n_resamples, n)`` integer counts; each row is one resample's multiset of models.
    """
    counts = np.zeros((int(n_resamples), len(clusters)), dtype=np.int64)
    if len(clusters):
        _draw(list(range(len(clusters))), clusters, 0, np.ones(int(n_resamples), dtype=np.int64), rng, counts)
    return counts


def _draw(members: List[int], clusters, level: int, copies: np.ndarray, rng, counts: np.ndarray) -> None:
    """Add to ``counts`` the draws below one cluster (its ``members``) drawn ``copies`` times (per resample)."""
    leaf = level == len(clusters[members[0]])
    if leaf:
        children = [[i] for i in members]
    else:
        grouped: Dict[Hashable, List[int]] = {}
        for i in members:
            grouped.setdefault(clusters[i][level], []).append(i)
        children = list(grouped.values())
    k = len(children)
    drawn = rng.multinomial(copies * k, np.full(k, 1.0 / k))
    for child, c in zip(children, drawn.T):
        if leaf:
            counts[:, child[0]] += c
        else:
            _draw(child, clusters, level + 1, c, rng, counts)


def weighted_tau(x: np.ndarray, y: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """τ-b of each resample given as model counts (``counts``: ``(B, n)``), without building it.

    Over the pairs of a multiset in which model i appears w_i times, the τ-b numerator is
    Σ_{i<j} w_i w_j sign(x_i − x_j) sign(y_i − y_j) = ½ wᵀ S w, and the untied pairs of the measure are
    ½ wᵀ T_x w with T_x[i, j] = [x_i ≠ x_j] (two copies of one model are tied in both), so
    τ-b = wᵀ S w / √(wᵀ T_x w · wᵀ T_y w), exactly ``scipy.stats.kendalltau`` of the expanded resample.

    Returns:
        ``(B,)`` τ values, NaN where the resample's measure or target is constant. Memory: O(n²).
    """
    dx = np.sign(x[:, None] - x[None, :]).astype(np.int64)
    dy = np.sign(y[:, None] - y[None, :]).astype(np.int64)
    w = np.asarray(counts, dtype=np.int64)

    def quadratic(matrix: np.ndarray) -> np.ndarray:  # wᵀ A w per resample, in exact integers
        return np.sum((w @ matrix) * w, axis=1).astype(float)

    num = quadratic(dx * dy)
    den = quadratic(dx != 0) * quadratic(dy != 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.sqrt(den), np.nan)


def bootstrap_p(taus: np.ndarray) -> float:
    """Two-sided p-value of τ = 0 from bootstrap replicates: the smallest α at which the equal-tailed
    percentile interval at 1 − α leaves 0 out (the achieved significance level of the percentile
    interval, Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, §15.4), with the Monte Carlo
    count corrected as (1 + count)/(B + 1) (Davison & Hinkley 1997, §4.2), so that it is never 0:

        p = min(1, 2 (1 + min(#{τ* ≤ 0}, #{τ* ≥ 0})) / (B + 1)).

    p < α exactly when the percentile interval at 1 − α excludes 0, up to the resolution 2/(B + 1).
    NaN for no replicate."""
    taus = np.asarray(taus, dtype=float)
    if not taus.size:
        return NAN
    side = min(int(np.count_nonzero(taus <= 0)), int(np.count_nonzero(taus >= 0)))
    return min(1.0, 2.0 * (1 + side) / (taus.size + 1))


def kendall_tau(
    measure: Sequence[float],
    target: Sequence[float],
    *,
    clusters: Optional[Sequence[Sequence[Hashable]]] = None,
    confidence: float = CONFIDENCE,
    n_resamples: int = 1000,
    seed: int = 0,
) -> Correlation:
    """Kendall's τ-b between ``measure`` and ``target`` over models (one value each, same order), with a
    cluster bootstrap percentile interval and p-value.

    Models that share a tuning or a configuration (the final seeds of one configuration, the trials of
    one search) are not independent: τ over 160 such models carries far less information than over 160
    independent ones, and scipy's p-value, which assumes independence, is far too small. ``clusters``
    gives each model's path, outermost first, e.g. ``(tuning, configuration)``; each resample
    (:func:`resample_counts`) draws tunings, then configurations within each drawn tuning, then the
    models of each drawn configuration, all with replacement; without ``clusters`` models are resampled
    as independent. The interval is the (1 ∓ confidence)/2 quantiles (linear interpolation) of the
    resamples that have a τ (:func:`weighted_tau`), ``resamples`` counts them, and ``p`` is the larger of
    :func:`bootstrap_p` of the same replicates and scipy's p for independent models (Kendall's exact test
    for small n without ties). The bootstrap is a large-sample approximation: over a handful of models
    every resample can give the same τ, and its p alone would fall below what the number of models allows
    (4 perfectly ordered models: exact p = 1/12); clustering only adds uncertainty, so scipy's p is a
    floor. Resampling at every stage tends to widen the interval (Davison & Hinkley 1997, §3.8); with
    few models or top-level clusters the interval can still be narrow (all resamples alike).

    Jiang et al. (ICLR 2020, §2): a measure predicts generalisation over a set of models when its ranking
    agrees with the target's; τ = 1 same order, −1 reversed, 0 no association. The sign is that of the
    pair as given: a sharpness measure (lower = flatter, as flatlab's ``flat/*``) against the
    generalisation gap has τ > 0 when flatter models are associated with a smaller gap.

    Returns:
        :class:`Correlation`; NaN τ, p and interval with ``reason`` for fewer than 2 models with both
        values or a constant measure or target.
    Raises:
        ConfigError: ``measure``/``target`` not numbers of the same length; ``clusters`` not one path per
            model of equal depth and hashable values; ``confidence`` outside (0, 1); ``n_resamples`` not
            a positive integer.
    """
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ConfigError(f"confidence must be a number in (0, 1), e.g. 0.95; got {confidence!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ConfigError(f"n_resamples must be a positive integer, e.g. 1000; got {n_resamples!r}")
    x, y = _values(measure, target)
    paths = _paths(clusters, x.size)
    keep = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    x, y, paths = x[keep], y[keep], [paths[i] for i in keep]
    depth = len(paths[0]) if paths else 0
    units = tuple(len({p[: level + 1] for p in paths}) for level in range(depth))
    reason = _undefined(x, y)
    if reason:
        return Correlation(int(x.size), NAN, NAN, NAN, NAN, float(confidence), 0, reason, units)
    counts = resample_counts(paths, int(n_resamples), np.random.default_rng(seed))
    taus = weighted_tau(x, y, counts)
    taus = taus[np.isfinite(taus)]
    tail = (1 - confidence) / 2
    low, high = (float(v) for v in np.quantile(taus, [tail, 1 - tail])) if taus.size else (NAN, NAN)
    p = max(bootstrap_p(taus), _independent_p(x, y))
    return Correlation(int(x.size), _tau(x, y), p, low, high, float(confidence), int(taus.size), "", units)


def _independent_p(x: np.ndarray, y: np.ndarray) -> float:
    """scipy's two-sided p of τ = 0 for independent models (exact for small n without ties): the
    smallest p the models' number allows, 1/12 for 4 models."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.kendalltau(x, y, variant="b").pvalue)
    return p if np.isfinite(p) else 0.0


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
