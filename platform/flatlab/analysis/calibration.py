"""The error rates of the tuning-level claim (:mod:`flatlab.analysis.claims`), by simulating studies.

A simulated study has a reference and ``arms`` other arms, each tuned ``tunings`` times and re-run on
``seeds`` matched final seeds, in the model y[a,k,s] = mu_a + u[a,k] + v[k,s] + e[a,k,s] with
e ~ N(0, 1) (the seed noise, the unit), u ~ N(0, ratio^2) (the tuning's effect, independent per arm and
tuning) and v ~ N(0, 1) (a seed effect shared by matched seeds, which the differences cancel). An effect is
stated in SDs of d_k, the per-tuning mean difference: sd(d_k) = sqrt(2 ratio^2 + 2 / seeds), so the power of
the test depends on the effect and S alone. Identical arms (effect 0) give the A/A false-claim rates.

The tests (``tests/analysis/test_claims_calibration.py``) and ``bench/claims_power.py`` call these; the
claims are computed by the same functions ``flatlab compare`` uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Sequence

import numpy as np

from flatlab.analysis.claims import ALPHA, EQUIVALENT, SHOWN, label, tost, tuning_t_test
from flatlab.analysis.compare.statistics import holm


def simulate(
    rng: np.random.Generator, *, reps: int, arms: int, tunings: int, seeds: int, ratio: float, effect: float
) -> np.ndarray:
    """Per-seed differences arm − reference of ``reps`` simulated studies.

    Returns:
        Shape ``(reps, arms, tunings, seeds)``; arm a's true difference is ``effect`` SDs of d_k for every arm.
    """
    y = rng.normal(0.0, 1.0, (reps, arms + 1, tunings, seeds))  # e
    y += rng.normal(0.0, ratio, (reps, arms + 1, tunings, 1))  # u: per arm and tuning
    y += rng.normal(0.0, 1.0, (reps, 1, tunings, seeds))  # v: shared by matched seeds
    delta = effect * math.sqrt(2 * ratio**2 + 2 / seeds)
    return y[:, 1:] + delta - y[:, :1]


def directional_rate(
    *, tunings: int, seeds: int, ratio: float, effect: float, reps: int, seed: int, alpha: float = ALPHA
) -> float:
    """The share of simulated one-arm studies whose claim is directional (p < alpha over the S values d_k)."""
    d = simulate(
        np.random.default_rng(seed), reps=reps, arms=1, tunings=tunings, seeds=seeds, ratio=ratio, effect=effect
    )
    p = tuning_t_test(d[:, 0].mean(axis=-1), 1 - alpha)[4]
    return float(np.mean(p < alpha))


@dataclass(frozen=True)
class FamilyRates:
    """What a family of arms against one reference claimed over simulated studies (:func:`family_rate`).

    Attributes:
        any_directional: the share of studies where some arm got a directional claim (family-wise rate).
        any_equivalent_beside_nonzero_interval: the share where an equivalence label stood beside an
            interval that excludes 0 (must be 0).
    """

    any_directional: float
    any_equivalent_beside_nonzero_interval: float


def family_rate(
    *, arms: int, tunings: int, seeds: int, ratio: float, reps: int, seed: int, alpha: float = ALPHA
) -> FamilyRates:
    """Identical arms against one reference, labelled as :func:`~flatlab.analysis.claims.claims` labels them:
    the t over the tunings and the TOST (margin: one SD of d_k) of every arm, Holm across the arms, then
    :func:`~flatlab.analysis.claims.label` (vectorised over the studies; the heterogeneity, which no label
    depends on, is left out)."""
    d = simulate(np.random.default_rng(seed), reps=reps, arms=arms, tunings=tunings, seeds=seeds, ratio=ratio, effect=0)
    d_k = d.mean(axis=-1)  # (reps, arms, S)
    _, _, _, (low, high), p = tuning_t_test(d_k, 1 - alpha)
    p_eq = tost(d_k, math.sqrt(2 * ratio**2 + 2 / seeds))
    directional = wrong = 0
    for r in range(reps):
        labels = [label(ph, eh, lo, hi, alpha) for ph, eh, lo, hi in zip(holm(p[r]), holm(p_eq[r]), low[r], high[r])]
        directional += SHOWN in labels
        wrong += any(lab == EQUIVALENT and (lo > 0 or hi < 0) for lab, lo, hi in zip(labels, low[r], high[r]))
    return FamilyRates(directional / reps, wrong / reps)


def power_curve(
    *,
    tunings: int,
    seeds: int,
    ratio: float,
    effects: Sequence[float],
    reps: int,
    seed: int,
    alpha: float = ALPHA,
) -> Dict[float, float]:
    """effect (SDs of d_k) -> the simulated share of directional claims of one arm (its power)."""
    return {
        e: directional_rate(tunings=tunings, seeds=seeds, ratio=ratio, effect=e, reps=reps, seed=seed + i, alpha=alpha)
        for i, e in enumerate(effects)
    }
