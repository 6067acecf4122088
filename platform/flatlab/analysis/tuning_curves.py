"""Tuning curves of one pool of N independent random-search trials: what a search of n ≤ N trials finds.

* :func:`expected_best`: the unbiased expected best of n trials drawn without replacement (Tang et al.
  2020, "Showing Your Work Doesn't Always Work"), n = 1..N;
* :func:`median_tuning_curve`: the median tuning curve with simultaneous confidence bands (Lourie, Cho &
  He 2024, "Show Your Work with Confidence"), computed by ``opda``;
* :func:`selection_probabilities` and :func:`chosen_trial`: the exact distribution of the trial a search
  of n trials picks by its validation value, and of any other quantity of that trial (its test metric,
  a flatness measure): Sivaprasad et al. (ICML 2020) draw the subsets at random, here every subset counts;
* :func:`win_probability`: the probability that one arm's chosen trial beats another's at budget n.

Every estimator assumes i.i.d. trials: random search run to the end (no TPE, no early stopping).
A subset of n trials is drawn uniformly without replacement. Ties in validation: among the tied best
trials of a subset one is picked uniformly at random (so a tied block shares its selection probability
equally, whatever the pool's order); the expected best does not depend on the tie rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from flatlab.analysis.compare.statistics import CONFIDENCE
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

nonparametric = lazy("opda.nonparametric")

BAND_METHODS = ("ld_highest_density", "ld_equal_tailed", "ks", "dkw")


@dataclass(frozen=True)
class TuningCurve:
    """A median tuning curve and its simultaneous confidence band at ``ns`` trials (:func:`median_tuning_curve`).

    ``median[i]``, ``lower[i]``, ``upper[i]``: the curve and the band's bounds at ``ns[i]`` in the
    metric's units, ``lower <= median <= upper`` (a bound may be ±inf where the support is unbounded);
    ``confidence``: the band's simultaneous coverage; ``method``: opda's band construction."""

    ns: Tuple[int, ...]
    median: Tuple[float, ...]
    lower: Tuple[float, ...]
    upper: Tuple[float, ...]
    confidence: float
    method: str


@dataclass(frozen=True)
class ChosenTrial:
    """The distribution of a quantity of the trial chosen by validation among n (:func:`chosen_trial`).

    ``values[t]``: trial t's quantity (pool order); ``probabilities[t]``: the chance that trial t is chosen
    (they sum to 1). ``mean`` and ``std`` of that discrete distribution; ``median``, ``low``, ``high`` its
    quantiles at 0.5, (1 − confidence)/2 and (1 + confidence)/2, each the smallest value whose cumulative
    probability reaches the level (Q(p) = min{y : P(Y ≤ y) ≥ p}, opda's ``ppf`` convention)."""

    n: int
    values: Tuple[float, ...]
    probabilities: Tuple[float, ...]
    mean: float
    std: float
    median: float
    low: float
    high: float
    confidence: float


def _pool(values: Sequence[float], name: str) -> np.ndarray:
    """``values`` as a 1-D float array of finite values, else ConfigError naming ``name``."""
    try:
        x = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{name} must be a sequence of numbers (one per trial); got {values!r}") from err
    if x.ndim != 1 or x.size == 0:
        raise ConfigError(f"{name} must be a non-empty 1-D sequence of numbers (one per trial); got shape {x.shape}")
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        raise ConfigError(f"{name} must be finite; trial(s) {', '.join(map(str, bad[:5]))} are not")
    return x


def _budget(n: int, size: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= size:
        raise ConfigError(f"n must be an integer in 1..{size} (the pool's trials); got {n!r}")
    return int(n)


def _confidence(confidence: float) -> float:
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ConfigError(f"confidence must be a number in (0, 1), e.g. 0.95; got {confidence!r}")
    return float(confidence)


def rank_weights(size: int, ns: Sequence[int]) -> np.ndarray:
    """``w[j, r − 1] = C(N − r, n_j − 1) / C(N, n_j)``: the probability that the trial ranked r-th best of
    N = ``size`` is the best of n_j trials drawn without replacement (the other n_j − 1 come from the
    N − r worse ones). Shape ``(len(ns), N)``; each row sums to 1.

    Computed by the ratio recurrence w_1 = n/N, w_{r+1} = w_r · (N − r − n + 1)/(N − r): no binomial is
    formed, so it neither overflows nor cancels for N in the thousands.

    Raises:
        ConfigError: an ``n`` outside 1..N.
    """
    ns = np.asarray([_budget(n, size) for n in ns], dtype=float)
    r = np.arange(1, size, dtype=float)
    ratio = np.clip(size - r[None, :] - ns[:, None] + 1, 0, None) / (size - r[None, :])
    return np.concatenate([ns[:, None] / size, ratio], axis=1).cumprod(axis=1)


def expected_best(values: Sequence[float], *, higher_is_better: bool = True) -> np.ndarray:
    """The unbiased expected best of n trials drawn without replacement from the pool, for n = 1..N:

        E[best of n] = Σ_i v_(i) · C(i − 1, n − 1) / C(N, n),   v_(1) ≤ … ≤ v_(N)

    for a metric to maximise (Tang et al. 2020, the without-replacement correction of Dodge et al. 2019's
    expected validation performance); to minimise, the same with the values sorted from the highest down.
    ``result[n − 1]``: at n = 1 the pool's mean, at n = N its best. opda's ``u_tuning_curve`` is the same
    estimator with float binomials; here the weights are :func:`rank_weights`. Units: those of ``values``.

    Raises:
        ConfigError: ``values`` empty or not finite.
    """
    x = _pool(values, "values")
    best_first = np.sort(x)[::-1] if higher_is_better else np.sort(x)
    return rank_weights(x.size, range(1, x.size + 1)) @ best_first


def median_tuning_curve(
    values: Sequence[float],
    *,
    higher_is_better: bool = True,
    support: Tuple[float, float] = (-np.inf, np.inf),
    confidence: float = CONFIDENCE,
    ns: Optional[Sequence[int]] = None,
    method: str = "ld_highest_density",
    seed: int = 0,
) -> TuningCurve:
    """The median tuning curve F̂⁻¹(0.5^{1/n}) (to minimise: F̂⁻¹(1 − 0.5^{1/n})), the median of the best
    of n trials under the pool's empirical distribution F̂, with a simultaneous confidence band from a band
    on the CDF (Lourie, Cho & He 2024, §3; ``opda.nonparametric.EmpiricalDistribution.confidence_bands``
    and ``quantile_tuning_curve``, quantile Q(p) = inf{y ∈ [a, b] : p ≤ F̂(y)}).

    Args:
        values: the pool's metric, one per trial.
        higher_is_better: maximise (True) or minimise the metric.
        support: ``(a, b)``, the values the metric can take (accuracy: ``(0, 1)``); the band's outer bound
            is a or b where the data say nothing more, so with an unbounded side (±inf, the default) that
            bound is ±inf from some n on.
        confidence: the band's simultaneous coverage, in (0, 1).
        ns: the numbers of trials (positive integers; above N allowed); default 1..N.
        method: opda's band, one of ``BAND_METHODS`` (default the paper's highest-density
            Learned-Miller–DeStefano band, calibrated by simulation: ``seed`` fixes it; run in-process).
            Its coverage is exact for a continuous metric; opda warns when ``values`` has ties.
    Raises:
        ConfigError: empty or non-finite ``values``; ``support`` not a pair a < b around every value;
            ``confidence``, ``ns`` or ``method`` not allowed.
    """
    x = _pool(values, "values")
    confidence = _confidence(confidence)
    try:
        a, b = (float(s) for s in support)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"support must be a pair (low, high) of numbers, e.g. (0, 1); got {support!r}") from err
    if not (a < b and a <= x.min() and x.max() <= b):
        raise ConfigError(
            f"support must satisfy low < high and hold every value; got {support!r} for values in "
            f"[{x.min()}, {x.max()}]"
        )
    if method not in BAND_METHODS:
        raise ConfigError(f"method must be one of {', '.join(BAND_METHODS)}; got {method!r}")
    ns = list(range(1, x.size + 1)) if ns is None else list(ns)
    if not ns or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 for n in ns):
        raise ConfigError(f"ns must be positive integers (numbers of trials); got {ns!r}")
    low_cdf, point, high_cdf = nonparametric.EmpiricalDistribution.confidence_bands(
        x, confidence, a, b, generator=np.random.default_rng(seed), method=method, n_jobs=1
    )
    minimize = not higher_is_better
    grid = np.asarray(ns, dtype=float)
    # a higher CDF puts the quantiles lower: the upper CDF band bounds the curve from below
    curves = [c.quantile_tuning_curve(grid, q=0.5, minimize=minimize) for c in (point, high_cdf, low_cdf)]
    median, lower, upper = (tuple(float(v) for v in np.atleast_1d(c)) for c in curves)
    return TuningCurve(tuple(int(n) for n in ns), median, lower, upper, confidence, method)


def selection_probabilities(validation: Sequence[float], n: int, *, higher_is_better: bool = True) -> np.ndarray:
    """``p[t]``: the probability that trial t is the one a search of ``n`` trials, drawn uniformly without
    replacement from the pool, picks by its best ``validation`` value (Sivaprasad et al., ICML 2020, §3,
    computed exactly instead of from sampled subsets). The trial ranked i-th best is picked with
    probability C(N − i, n − 1) / C(N, n) (:func:`rank_weights`); trials tied in validation share their
    ranks' total equally (a tie within a subset is broken uniformly at random). Shape ``(N,)``, pool order.

    Raises:
        ConfigError: empty or non-finite ``validation``, or ``n`` outside 1..N.
    """
    v = _pool(validation, "validation")
    key = -v if higher_is_better else v
    order = np.argsort(key, kind="stable")  # best first
    weights = rank_weights(v.size, [n])[0]
    _, block = np.unique(key[order], return_inverse=True)  # tied trials share a block
    shares = np.bincount(block, weights=weights) / np.bincount(block)
    p = np.empty(v.size)
    p[order] = shares[block]
    return p


def _quantile(values: np.ndarray, probabilities: np.ndarray, level: float) -> float:
    """Q(level) = min{y : P(Y ≤ y) ≥ level} of a discrete distribution (1e-12 absorbs float sums)."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(probabilities[order])
    index = int(np.searchsorted(cumulative, level - 1e-12, side="left"))
    return float(values[order][min(index, values.size - 1)])


def chosen_trial(
    validation: Sequence[float],
    quantity: Sequence[float],
    n: int,
    *,
    validation_higher_is_better: bool = True,
    confidence: float = CONFIDENCE,
) -> ChosenTrial:
    """The distribution of ``quantity`` (test metric, flatness, …) of the trial that a search of ``n``
    trials from the pool picks by ``validation``: value ``quantity[t]`` with probability
    :func:`selection_probabilities` ``[t]``, with its mean, std, median and central interval (the
    quantiles at (1 ∓ confidence)/2 of that discrete distribution, a range of outcomes, not an interval
    of its mean). Sivaprasad et al. (ICML 2020) report the same distribution's mean ± std from sampled
    subsets. ``quantity = validation`` gives the best validation value of n trials.

    Raises:
        ConfigError: ``validation``/``quantity`` empty, non-finite or of different lengths; ``n`` outside
            1..N; ``confidence`` outside (0, 1).
    """
    p = selection_probabilities(validation, n, higher_is_better=validation_higher_is_better)
    q = _pool(quantity, "quantity")
    confidence = _confidence(confidence)
    if p.size != q.size:
        raise ConfigError(f"validation and quantity must have one value per trial; got {p.size} and {q.size}")
    mean = float(p @ q)
    tail = (1 - confidence) / 2
    return ChosenTrial(
        n=int(n),
        values=tuple(q.tolist()),
        probabilities=tuple(p.tolist()),
        mean=mean,
        std=float(np.sqrt(max(0.0, p @ (q - mean) ** 2))),
        median=_quantile(q, p, 0.5),
        low=_quantile(q, p, tail),
        high=_quantile(q, p, 1 - tail),
        confidence=confidence,
    )


def win_probability(arm: ChosenTrial, reference: ChosenTrial, *, higher_is_better: bool) -> float:
    """The probability that ``arm``'s chosen trial beats ``reference``'s on their quantity, the two
    searches independent (each its own subset of its own pool, budgets ``arm.n`` and ``reference.n``), a
    tie counted half: Σ_s Σ_t p_s q_t [1(x_s better than y_t) + ½·1(x_s = y_t)], exactly, from the two
    :func:`chosen_trial` distributions of the same quantity (Sivaprasad et al.'s probability that an
    optimizer wins at budget n, for two arms). ``higher_is_better``: the quantity's direction.
    In [0, 1]; ``win(a, b) + win(b, a) = 1``."""
    x, p = np.asarray(arm.values), np.asarray(arm.probabilities)
    y, q = np.asarray(reference.values), np.asarray(reference.probabilities)
    diff = x[:, None] - y[None, :]
    score = np.where(diff > 0, 1.0, 0.0) if higher_is_better else np.where(diff < 0, 1.0, 0.0)
    score = score + np.where(diff == 0, 0.5, 0.0)
    return float(p @ score @ q)
