"""Power and cost of a study of S tunings with m final seeds each: what effect it detects, and which (S, m)
detects a stated effect at the least cost.

A claim is the one-sample t over the S per-tuning differences d_k (:mod:`flatlab.analysis.claims`). With
sigma^2_t the tuning's and sigma^2_s the seed's variance component of the per-seed differences (one-way
random-effects ANOVA, :func:`flatlab.analysis.replication.variance_components`),

    Var(d_k) = sigma^2_t + sigma^2_s / m,    Var(mean of d_k) = sigma^2_t / S + sigma^2_s / (S m),

and the test's power against a true difference delta at level alpha is that of the t-test with S − 1 degrees
of freedom and non-centrality delta / sqrt(Var(d_k) / S) (``scipy.stats.nct``). Spending c_t core-seconds on
a tuning's search and c_s on one final seed, a study costs S (c_t + m c_s); for a fixed variance of the mean
that cost is least at m* = sqrt(c_t sigma^2_s / (c_s sigma^2_t)), the classical allocation of a two-stage
nested design (Cochran, *Sampling Techniques*, 3rd ed., 1977, §10.6). :func:`allocate` searches the integer
(S, m) around it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from flatlab.errors import ConfigError
from flatlab.lazy import lazy

stats = lazy("scipy.stats")
optimize = lazy("scipy.optimize")

POWER = 0.8
NAN = float("nan")


def power(delta: Any, sd: Any, s: Any, alpha: float) -> Any:
    """The power of the two-sided one-sample t-test over ``s`` values of SD ``sd`` against a mean ``delta``.

    ``P(|T| > t_{1−alpha/2, s−1})`` with T non-central t, s − 1 degrees of freedom and non-centrality
    ``delta · sqrt(s) / sd``. Broadcasts over its arguments; ``sd = 0`` gives 1 for ``delta != 0``.

    Raises:
        ConfigError: ``alpha`` outside (0, 1).
    """
    _check_alpha(alpha)
    s = np.asarray(s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        nc = np.abs(np.asarray(delta, dtype=float) * np.sqrt(s) / np.asarray(sd, dtype=float))
        crit = stats.t.ppf(1 - alpha / 2, s - 1)
        # the far tail P(T < -crit) is below alpha / 2 and vanishes as nc grows; scipy's nct gives NaN for it
        # once it underflows, which is 0 to double precision
        far = np.nan_to_num(stats.nct.sf(crit, s - 1, -nc), nan=0.0)
        out = stats.nct.sf(crit, s - 1, nc) + far
    out = np.where(np.isinf(nc), 1.0, out)
    out = np.where(s < 2, NAN, out)
    return out.item() if np.ndim(out) == 0 else out


def detectable_effect(sd: float, s: int, alpha: float, target: float = POWER) -> float:
    """The smallest |delta| that the t-test over ``s`` tunings with SD ``sd`` of d_k detects with power
    ``target`` at level ``alpha`` (the quantity's units). NaN for ``s < 2`` or a non-finite ``sd``; 0 for
    ``sd = 0``.

    Raises:
        ConfigError: ``alpha`` or ``target`` outside (0, 1).
    """
    _check_alpha(alpha)
    if not 0 < target < 1:
        raise ConfigError(f"the target power must lie in (0, 1), e.g. 0.8; got {target!r}")
    if s is None or s < 2 or not math.isfinite(sd):
        return NAN
    if sd == 0:
        return 0.0
    high = sd
    while power(high, sd, s, alpha) < target:
        high *= 2
    return float(optimize.brentq(lambda d: power(d, sd, s, alpha) - target, 0.0, high, xtol=1e-10 * sd))


@dataclass(frozen=True)
class Allocation:
    """The cheapest design for an effect (:func:`allocate`).

    Attributes:
        tunings: S, independent tunings per arm.
        seeds: m, final seeds per tuning.
        power: its power against the effect.
        cost: S (c_t + m c_s), in the units of the costs given (core-seconds per arm).
        m_star: the continuous allocation sqrt(c_t sigma^2_s / (c_s sigma^2_t)) (inf without tuning variance).
        detectable: the effect this design detects with the target power.
    """

    tunings: int
    seeds: int
    power: float
    cost: float
    m_star: float
    detectable: float


def allocate(
    effect: float,
    sigma2_tuning: float,
    sigma2_seed: float,
    cost_tuning: float,
    cost_seed: float,
    *,
    alpha: float,
    target: float = POWER,
    min_seeds: int = 1,
    max_seeds: int = 20,
    max_tunings: int = 500,
) -> Optional[Allocation]:
    """The (S, m) with power ``target`` against ``effect`` at level ``alpha`` and the least cost S (c_t + m c_s).

    Every m in [min_seeds, max_seeds] is tried with its smallest sufficient S in [2, max_tunings]; ties in
    cost go to more tunings. ``None`` when no design within the bounds reaches the target.

    Args:
        effect: the difference to detect, |delta| > 0 (the quantity's units).
        sigma2_tuning, sigma2_seed: the variance components of the per-seed differences (units squared).
        cost_tuning, cost_seed: c_t, one tuning's search of one arm, and c_s, one final seed (core-seconds).
        alpha: the test's level (e.g. alpha / arms for the first step of Holm).
    Raises:
        ConfigError: a non-positive effect or cost, a negative variance, bounds out of order.
    """
    for name, v in (("effect", effect), ("cost_tuning", cost_tuning), ("cost_seed", cost_seed)):
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"{name} must be a positive number; got {v!r}")
    if not (sigma2_tuning >= 0 and sigma2_seed >= 0) or sigma2_tuning + sigma2_seed <= 0:
        raise ConfigError(f"the variances must be >= 0, not both 0; got {sigma2_tuning!r}, {sigma2_seed!r}")
    if not 1 <= min_seeds <= max_seeds or max_tunings < 2:
        raise ConfigError("need 1 <= min_seeds <= max_seeds and max_tunings >= 2")
    s_grid = np.arange(2, max_tunings + 1)
    best = None
    for m in range(min_seeds, max_seeds + 1):
        sd = math.sqrt(sigma2_tuning + sigma2_seed / m)
        ok = np.nonzero(np.asarray(power(effect, sd, s_grid, alpha)) >= target)[0]
        if not ok.size:
            continue
        s = int(s_grid[ok[0]])
        cost = s * (cost_tuning + m * cost_seed)
        if best is None or cost < best[0] - 1e-9:
            best = (cost, s, m, sd)
    if best is None:
        return None
    cost, s, m, sd = best
    m_star = math.sqrt(cost_tuning * sigma2_seed / (cost_seed * sigma2_tuning)) if sigma2_tuning > 0 else math.inf
    return Allocation(s, m, float(power(effect, sd, s, alpha)), cost, m_star, detectable_effect(sd, s, alpha, target))


def _check_alpha(alpha: float) -> None:
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ConfigError(f"alpha must be a number in (0, 1), e.g. 0.05; got {alpha!r}")
