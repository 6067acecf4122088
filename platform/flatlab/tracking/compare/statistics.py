"""The statistics of a paper table: the t-interval of a mean over seeds and the paired per-seed test.

* :func:`t_estimate`: mean, sample standard deviation (ddof = 1) and the Student t-interval of the mean,
  ``mean ± t_{(1+c)/2, n-1} · std / √n`` (e.g. IRE Table 1 and TSAM Table 2 report means over seeds);
* :func:`paired_difference`: the per-seed differences ``d_s = arm_s − reference_s`` (seeds matched by
  seed value), their t-interval, the paired t-test's two-sided p-value (``scipy.stats.ttest_rel``) and
  how many seeds favour each side.

With fewer than two values the std, interval and p-value are NaN (never an exception).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

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
    ``arm_better``/``ref_better``/``ties`` count seeds by the quantity's direction."""

    estimate: Estimate
    p: float
    arm_better: int
    ref_better: int
    ties: int



def t_estimate(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean, sample std and the two-sided Student-t interval of the mean of the finite ``values``:
    ``mean ± t.ppf((1 + confidence) / 2, n − 1) · std / √n`` (std with ddof = 1).

    Fewer than two values: NaN std and interval (never an exception)."""
    import numpy as np
    from scipy import stats

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


def paired_difference(arm: Mapping[Any, float], reference: Mapping[Any, float], *, higher_is_better: bool,
                      confidence: float = CONFIDENCE) -> Paired:
    """The paired comparison of two arms' per-seed values (``{seed: value}``), over the seeds where
    both have a finite value: differences ``arm − reference``, their :func:`t_estimate`, the paired
    t-test's two-sided p-value (``scipy.stats.ttest_rel``) and the seeds favouring each side.

    ``p`` is NaN for fewer than two matched seeds, and when every difference is equal (zero
    variance: the t statistic is undefined)."""
    import numpy as np
    from scipy import stats

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
    return Paired(estimate, p, better, len(d) - better - ties, ties)


def finite(v: Any) -> bool:
    """Whether ``v`` is a finite number (``None``, NaN, +-inf and text are not)."""
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
