"""The statistics of a paper table: the t-interval of a mean over seeds and the paired per-seed test.

* :func:`t_estimate`: mean, sample standard deviation (ddof = 1) and the Student t-interval of the mean,
  ``mean ± t_{(1+c)/2, n-1} · std / √n`` (e.g. IRE Table 1 and TSAM Table 2 report means over seeds);
* :func:`paired_difference`: the per-seed differences ``d_s = arm_s − reference_s`` (seeds matched by
  seed value), their t-interval, the paired t-test's two-sided p-value (``scipy.stats.ttest_rel``),
  the effect size Cohen's d_z and how many seeds favour each side;
* :func:`holm`: Holm's step-down adjustment of a family of p-values (the arms' paired tests of one
  quantity), so that a table of many arms does not read as many independent discoveries.

* :func:`clip`: a mean's interval intersected with the values the quantity can take.

With fewer than two values the std, interval, p-value and effect size are NaN (never an exception).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from flatlab.lazy import lazy

stats = lazy("scipy.stats")

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """Mean, sample std (ddof = 1) and the t-interval ``[low, high]`` of the mean over ``n`` values.

    ``std``, ``low``, ``high`` are NaN for ``n < 2``; everything is NaN for ``n = 0``."""

    n: int
    mean: float
    std: float
    low: float
    high: float


@dataclass(frozen=True)
class Paired:
    """Paired per-seed differences ``arm − reference`` over ``n`` matched seeds.

    ``estimate`` describes the differences (mean, std, t-interval); ``p`` is the two-sided paired
    t-test's p-value (NaN for ``n < 2`` or when all differences are equal, where t is undefined);
    ``arm_better``/``ref_better``/``ties`` count seeds by the quantity's direction; ``d_z`` is the
    effect size :func:`cohen_dz` of the differences (its sign that of ``arm − reference``)."""

    estimate: Estimate
    p: float
    arm_better: int
    ref_better: int
    ties: int
    d_z: float = float("nan")


def t_estimate(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean, sample std and the two-sided Student-t interval of the mean of the finite ``values``:
    ``mean ± t.ppf((1 + confidence) / 2, n − 1) · std / √n`` (std with ddof = 1).

    Fewer than two values: NaN std and interval (never an exception)."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    nan = float("nan")
    if n == 0:
        return Estimate(0, nan, nan, nan, nan)
    mean = float(x.mean())
    if n < 2:
        return Estimate(1, mean, nan, nan, nan)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
    return Estimate(n, mean, std, mean - half, mean + half)


def clip(estimate: Estimate, support: Optional[Tuple[float, float]]) -> Estimate:
    """``estimate`` with its interval intersected with ``support = (low, high)``, the values the
    quantity can take (``None``: unbounded, unchanged). The true mean of such a quantity lies in its
    support too, so the intersection covers it whenever the t-interval does (same coverage) and only
    drops impossible values, e.g. a Fisher trace's ``[-2.97, 26.5]`` -> ``[0, 26.5]``. The mean and std
    are unchanged; for the mean of an arm, never for paired differences (of either sign). NaN stays NaN;
    an interval already inside ``support`` is returned as the same object."""
    if support is None or not finite(estimate.low):
        return estimate
    low, high = support
    if low <= estimate.low and estimate.high <= high:
        return estimate  # the same object: nothing clipped
    return replace(estimate, low=min(max(estimate.low, low), high), high=max(min(estimate.high, high), low))


def paired_difference(
    arm: Mapping[Any, float], reference: Mapping[Any, float], *, higher_is_better: bool, confidence: float = CONFIDENCE
) -> Paired:
    """The paired comparison of two arms' per-seed values (``{seed: value}``), over the seeds where
    both have a finite value: differences ``arm − reference``, their :func:`t_estimate`, the paired
    t-test's two-sided p-value (``scipy.stats.ttest_rel``), the effect size :func:`cohen_dz` and the
    seeds favouring each side.

    ``p`` and ``d_z`` are NaN for fewer than two matched seeds, and when every difference is equal (zero
    variance: the t statistic is undefined)."""
    seeds = [s for s in arm if s in reference and finite(arm[s]) and finite(reference[s])]
    a = np.asarray([arm[s] for s in seeds], dtype=float)
    b = np.asarray([reference[s] for s in seeds], dtype=float)
    d = a - b
    estimate = t_estimate(d.tolist(), confidence)
    p = float("nan")
    if len(d) >= 2 and float(np.ptp(d)) > 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(stats.ttest_rel(a, b).pvalue)
    better = int((d > 0).sum() if higher_is_better else (d < 0).sum())
    ties = int((d == 0).sum())
    return Paired(estimate, p, better, len(d) - better - ties, ties, cohen_dz(estimate))


def cohen_dz(differences: Estimate) -> float:
    """Cohen's d_z, the standardized effect of a paired design: the mean of the per-seed differences
    over their sample standard deviation,

        d_z = mean(d) / std(d),   d_s = arm_s − reference_s,   std with ddof = 1

    (Cohen, *Statistical Power Analysis for the Behavioral Sciences*, 2nd ed., 1988, ch. 2, the
    paired case; Lakens, "Calculating and reporting effect sizes", *Front. Psychol.* 4:863, 2013). It is the paired
    t statistic divided by √n
    (``t = d_z · √n``), so unlike t or p it does not grow with the number of seeds. Its sign is that of
    ``arm − reference``: for a lower-is-better quantity (a loss, ``flat/*``) a negative d_z favours
    the arm. Unitless.

    Args:
        differences: the :func:`t_estimate` of the paired differences.
    Returns:
        d_z; NaN for fewer than two differences or when they are all equal (zero std: d_z undefined).
    """
    if differences.n < 2 or not finite(differences.std) or differences.std == 0:
        return float("nan")
    return differences.mean / differences.std


def paired_power(n: int, d_z: float, alpha: float = 1 - CONFIDENCE) -> float:
    """The power of the two-sided paired t-test on ``n`` seeds at level ``alpha`` against a true
    effect ``d_z`` (:func:`cohen_dz`): ``P(|T| > t_{1 − alpha/2, n − 1})`` with ``T`` non-central t,
    ``n − 1`` degrees of freedom and non-centrality ``d_z · √n`` (``scipy.stats.nct``). E.g. n = 3,
    d_z = 1, alpha = 0.05: about 0.18; n = 5: 0.40; n = 10: 0.80.

    Raises:
        ValueError: ``n < 2`` or ``alpha`` outside (0, 1).
    """
    if n < 2 or not 0 < alpha < 1:
        raise ValueError(f"paired_power needs n >= 2 and alpha in (0, 1); got n={n!r}, alpha={alpha!r}")
    crit = float(stats.t.ppf(1 - alpha / 2, n - 1))
    nc = d_z * math.sqrt(n)
    return float(stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc))


def holm(p_values: Sequence[float]) -> List[float]:
    """Holm's step-down adjusted p-values of one family of tests (Holm, "A simple sequentially
    rejective multiple test procedure", *Scand. J. Statist.* 6:65-70, 1979).

    With the m finite p-values sorted ``p_(1) <= ... <= p_(m)``, the adjusted value of the i-th
    smallest is

        p~_(i) = max_{j <= i} min(1, (m − j + 1) · p_(j)),

    the running maximum keeping the adjusted values in the order of the raw ones. Rejecting every
    hypothesis with ``p~ < alpha`` is Holm's procedure: it controls the family-wise error rate (the
    chance of any false rejection in the family) at ``alpha`` under any dependence between the tests,
    and rejects at least what Bonferroni (``m · p``) rejects. Example: ``[0.01, 0.04, 0.03, 0.005]``
    gives ``[0.03, 0.06, 0.06, 0.02]``.

    Args:
        p_values: the family's raw p-values, in any order. NaN (or ``None``) marks a test that could
            not be run (too few seeds, zero variance): it stays NaN and is not counted in m.
    Returns:
        The adjusted p-values, in the order of ``p_values``.
    Raises:
        ValueError: a finite p-value outside [0, 1].
    """
    values = [float(p) if finite(p) else float("nan") for p in p_values]
    bad = [p for p in values if finite(p) and not 0.0 <= p <= 1.0]
    if bad:
        raise ValueError(f"p-values must lie in [0, 1]; got {', '.join(map(str, bad))}")
    order = sorted((i for i, p in enumerate(values) if finite(p)), key=lambda i: values[i])
    m = len(order)
    out = [float("nan")] * len(values)
    running = 0.0
    for rank, i in enumerate(order):  # rank j - 1 = 0 .. m - 1: multiplier m - j + 1 = m - rank
        running = max(running, min(1.0, (m - rank) * values[i]))
        out[i] = running
    return out


def finite(v: Any) -> bool:
    """Whether ``v`` is a finite number (``None``, NaN, +-inf and text are not)."""
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
