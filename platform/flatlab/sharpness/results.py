"""Small result records returned by the sharpness and curvature measures (all values are Python floats)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Tuple


def mean_and_stderr(values: Sequence[float]) -> Tuple[float, float]:
    """Sample mean and its standard error ``std(ddof=1) / sqrt(n)`` (``nan`` when ``n < 2``)."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, float("nan")
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


@dataclass(frozen=True)
class Estimate:
    """A Monte-Carlo estimate: ``value`` = mean of ``values``, ``stderr`` = its standard error.

    Attributes:
        value: the estimate.
        stderr: standard error over the ``n`` independent draws/probes (``nan`` if ``n == 1``).
        n: number of draws/probes.
        values: the per-draw values, in draw order.
    """

    value: float
    stderr: float
    n: int
    values: Tuple[float, ...]

    @classmethod
    def from_values(cls, values: Sequence[float]) -> "Estimate":
        mean, err = mean_and_stderr(values)
        return cls(mean, err, len(values), tuple(float(v) for v in values))


@dataclass(frozen=True)
class SharpnessEstimate:
    """Average-case sharpness ``S = E_delta[L(w + delta)] - L(w)`` (loss units, NOT divided by rho^2).

    Attributes:
        value: mean over draws of ``L(w + delta_k) - L(w)``.
        stderr: standard error of ``value`` over the draws (``nan`` if ``n == 1``).
        n: number of draws.
        values: per-draw ``L(w + delta_k) - L(w)``, in draw order.
        clean_loss: ``L(w)``, mean loss over the evaluation subset.
        rho: noise scale.
        adaptive: ``True`` for ``c = |w|`` (adaptive), ``False`` for ``c = 1``.
    """

    value: float
    stderr: float
    n: int
    values: Tuple[float, ...]
    clean_loss: float
    rho: float
    adaptive: bool


@dataclass(frozen=True)
class WorstCaseSharpness:
    """Worst-case sharpness ``max_{delta in ellipsoid} L(w + delta) - L(w)`` found by projected ascent.

    Attributes:
        value: ``max(clean_loss, *losses) - clean_loss`` >= 0 (``delta = 0`` is in the ellipsoid); a lower
            bound on the true maximum.
        clean_loss: ``L(w)``.
        losses: ``L(w + delta_t)`` at every iterate ``t = 0..steps`` (``steps + 1`` values).
        norm: ``"l2"`` or ``"linf"``.
        rho: radius of the ball in the rescaled coordinates ``u = delta / c``.
        adaptive: ``True`` for ``c = |w|``.
    """

    value: float
    clean_loss: float
    losses: Tuple[float, ...]
    norm: str
    rho: float
    adaptive: bool


@dataclass(frozen=True)
class EigenEstimate:
    """Dominant Hessian eigenvalue from power iteration.

    Attributes:
        value: Rayleigh quotient ``v^T H v`` of the final unit vector (loss units per parameter unit^2).
        iterations: Hessian-vector products used.
        converged: whether the relative change fell below the tolerance before ``max_iters``.
    """

    value: float
    iterations: int
    converged: bool


@dataclass(frozen=True)
class NeighbourhoodLoss:
    """TSAM's flatness measure (Fig. 2): statistics of ``L(w + eps)``, ``eps ~ N(0, sigma^2 I)``.

    Attributes:
        mean: mean over draws of ``L(w + eps_k)`` (not minus ``L(w)``).
        variance: unbiased sample variance of ``L(w + eps_k)`` over draws (``nan`` if ``n == 1``).
        stderr: standard error of ``mean``.
        n: number of draws.
        values: per-draw ``L(w + eps_k)``.
        clean_loss: ``L(w)``.
        sigma: noise standard deviation per coordinate.
    """

    mean: float
    variance: float
    stderr: float
    n: int
    values: Tuple[float, ...]
    clean_loss: float
    sigma: float


@dataclass(frozen=True)
class ObjectiveValue:
    """A training objective evaluated at ``theta`` (TSAM paper, Table 2: ERM, SAM and tilted objectives).

    Attributes:
        value: the objective (loss units).
        clean_loss: ``L(theta)`` on the same subset.
        losses: the perturbed losses it was computed from, in order (``(clean_loss,)`` for ERM).
    """

    value: float
    clean_loss: float
    losses: Tuple[float, ...]
