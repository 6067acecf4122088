"""The tuning as the unit of replication: S independent tunings of one arm, each re-run on its final seeds.

``values[k]`` holds tuning k's per-seed values of one quantity, either a sequence (``None``/NaN marks a
missing seed) or a mapping ``{seed: value}``; tunings may have different numbers of seeds.

* :func:`variance_components`: the one-way random-effects ANOVA of the table, σ²_seed, σ²_tuning and
  the share of the variance that comes from the tuning;
* :func:`across_tunings`: each tuning's mean, their median, and the interval of the across-tuning mean
  that includes both levels of variance (tunings, then seeds within a tuning);
* :func:`paired_across_tunings`: the same for the per-seed differences arm − reference (seeds matched
  within each tuning), with each tuning's paired t-test.

The claim against the reference is tested over the tunings in :mod:`flatlab.analysis.claims`.

The model is y_kj = μ + t_k + e_kj with t_k ~ N(0, σ²_tuning) (which configuration tuning k chose) and
e_kj ~ N(0, σ²_seed) (Searle, Casella & McCulloch, *Variance Components*, Wiley 1992, the one-way random
model: ch. 3 balanced, ch. 4 the ANOVA estimators of unbalanced data). Repeating the whole tuning is
the estimator Bouthillier et al. (MLSys 2021, "Accounting for Variance in Machine Learning Benchmarks")
call ideal; an interval over one tuning's seeds leaves σ²_tuning out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Sequence, Tuple, Union

import numpy as np

from flatlab.analysis.compare.statistics import CONFIDENCE, Estimate, Paired, finite, paired_difference, t_estimate
from flatlab.errors import ConfigError

Tuning = Union[Sequence[Any], Mapping[Any, Any]]
NAN = float("nan")


@dataclass(frozen=True)
class Components:
    """The one-way random-effects ANOVA of S tunings × seeds (:func:`variance_components`).

    ``seed`` = σ²_seed = MS_within; ``tuning`` = σ²_tuning = max(0, (MS_between − MS_within) / m0);
    ``share`` = σ²_tuning / (σ²_tuning + σ²_seed), in [0, 1]; ``m0`` the effective seeds per tuning
    (m for balanced tunings). Variances in the quantity's units squared; NaN where undefined."""

    seed: float
    tuning: float
    share: float
    ms_between: float
    ms_within: float
    m0: float


@dataclass(frozen=True)
class AcrossTunings:
    """One quantity of one arm over S tunings (:func:`across_tunings`).

    ``tuning_means[k]`` and ``seeds[k]``: tuning k's mean over its finite seeds and their count (NaN and
    0 for a tuning without any); ``median``: the median of the tuning means; ``estimate``: the t-estimate
    over the S' tunings that have values (``n`` = S', ``mean`` the across-tuning mean, ``std`` that of
    the tuning means, ``[low, high]`` the two-level interval); ``note``: why something is NaN, or ''."""

    tuning_means: Tuple[float, ...]
    seeds: Tuple[int, ...]
    median: float
    estimate: Estimate
    components: Components
    note: str = ""


@dataclass(frozen=True)
class PairedAcrossTunings:
    """Arm against reference over S tunings (:func:`paired_across_tunings`): ``per_tuning[k]`` is tuning k's
    paired per-seed comparison (its ``p`` unadjusted), ``across`` the two-level analysis of the per-seed
    differences arm − reference (its ``components.share``: the tuning's share of their variance)."""

    per_tuning: Tuple[Paired, ...]
    across: AcrossTunings


def _rows(values: Sequence[Tuning], name: str) -> List[np.ndarray]:
    """Each tuning's finite values as a float array (missing and non-finite seeds dropped)."""
    if isinstance(values, np.ndarray):  # a (S, m) table
        values = list(values)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ConfigError(f"{name} must be a non-empty sequence of tunings (each a sequence or a {{seed: value}})")
    rows = []
    for k, tuning in enumerate(values):
        if isinstance(tuning, Mapping):
            tuning = list(tuning.values())
        elif isinstance(tuning, np.ndarray) and tuning.ndim == 1:
            tuning = tuning.tolist()
        if isinstance(tuning, (str, bytes)) or not isinstance(tuning, Sequence):
            raise ConfigError(f"{name}[{k}] must be a sequence of values or a {{seed: value}}; got {tuning!r}")
        rows.append(np.asarray([float(v) for v in tuning if finite(v)], dtype=float))
    return rows


def _check_confidence(confidence: float) -> None:
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ConfigError(f"confidence must be a number in (0, 1), e.g. 0.95; got {confidence!r}")


def variance_components(values: Sequence[Tuning]) -> Components:
    """The one-way random-effects ANOVA estimates of the two variance components of ``values``
    (``values[k]``: tuning k's per-seed values; tunings without a finite value are left out).

    With S tunings of n_k seeds, N = Σ n_k, tuning means ȳ_k and grand mean ȳ (over all N values):
    MS_between = Σ n_k (ȳ_k − ȳ)² / (S − 1), MS_within = Σ_k Σ_j (y_kj − ȳ_k)² / (N − S),
    m0 = (N − Σ n_k² / N) / (S − 1) (= m when every tuning has m seeds), and

        σ²_seed = MS_within,   σ²_tuning = max(0, (MS_between − MS_within) / m0),
        share = σ²_tuning / (σ²_tuning + σ²_seed)

    (the ANOVA estimators of the one-way random model, Searle, Casella & McCulloch 1992, ch. 3 and 4;
    E[MS_between] = σ²_seed + m0 σ²_tuning). A negative estimate of σ²_tuning is truncated at 0.

    Returns NaN components where undefined: MS_between and σ²_tuning for S < 2; MS_within and
    σ²_tuning for N = S (no tuning with two seeds); ``share`` also when both components are 0.

    Raises:
        ConfigError: ``values`` is not a non-empty sequence of tunings.
    """
    rows = [r for r in _rows(values, "values") if r.size]
    sizes = np.asarray([r.size for r in rows], dtype=float)
    s, n = len(rows), float(sizes.sum())
    ms_between = ms_within = m0 = NAN
    if s >= 2:
        means = np.asarray([r.mean() for r in rows])
        grand = float(np.concatenate(rows).mean())
        ms_between = float((sizes * (means - grand) ** 2).sum()) / (s - 1)
        m0 = (n - float((sizes**2).sum()) / n) / (s - 1)
    if n > s:
        ms_within = float(sum(((r - r.mean()) ** 2).sum() for r in rows)) / (n - s)
    tuning = max(0.0, (ms_between - ms_within) / m0) if finite(ms_between) and finite(ms_within) else NAN
    total = tuning + ms_within
    share = tuning / total if finite(total) and total > 0 else NAN
    return Components(ms_within, tuning, share, ms_between, ms_within, m0)


def across_tunings(values: Sequence[Tuning], confidence: float = CONFIDENCE) -> AcrossTunings:
    """Each tuning's mean, their median, and the two-level interval of the across-tuning mean.

    The interval is the Student t-interval over the S tuning means ȳ_k with S − 1 degrees of freedom,

        ȳ ± t_{(1+c)/2, S−1} · s / √S,   ȳ = (1/S) Σ ȳ_k,   s² = Σ (ȳ_k − ȳ)² / (S − 1).

    In the one-way random model a tuning mean over m seeds varies by σ²_tuning + σ²_seed / m, both levels,
    and s² is unbiased for it. With every tuning on m seeds s² = MS_between / m, so the interval is
    the model's interval for μ, ȳ ± t_{S−1} · √(MS_between / (S m)), exact under normality: the same
    answer as the two-level analysis of all S × m values (Searle, Casella & McCulloch 1992, ch. 3).
    With unequal seeds each tuning still counts once; s² / S stays unbiased for the variance of ȳ and the
    t quantile is an approximation.

    Args:
        values: ``values[k]``, tuning k's per-seed values (sequence with ``None``/NaN for a missing seed,
            or ``{seed: value}``).
        confidence: the interval's level, in (0, 1).
    Returns:
        :class:`AcrossTunings`. With one tuning (or one with values) the interval is NaN and ``note``
        says so; a tuning without a finite value is left out of every statistic and named in ``note``.
    Raises:
        ConfigError: ``values`` not a non-empty sequence of tunings, or ``confidence`` outside (0, 1).
    """
    _check_confidence(confidence)
    rows = _rows(values, "values")
    means = tuple(float(r.mean()) if r.size else NAN for r in rows)
    present = [m for m in means if finite(m)]
    notes = []
    empty = [k for k, r in enumerate(rows, start=1) if not r.size]  # tunings are numbered 1..S
    if empty:
        notes.append(f"tuning(s) {', '.join(map(str, empty))} without a finite value left out")
    if len(present) == 1:
        notes.append("one tuning: no interval across tunings (the tuning variance is not measured)")
    elif not present:
        notes.append("no finite value in any tuning")
    median = float(np.median(present)) if present else NAN
    return AcrossTunings(
        tuning_means=means,
        seeds=tuple(int(r.size) for r in rows),
        median=median,
        estimate=t_estimate(present, confidence),
        components=variance_components(values),
        note="; ".join(notes),
    )


def paired_across_tunings(
    arm: Sequence[Mapping[Any, float]],
    reference: Sequence[Mapping[Any, float]],
    *,
    higher_is_better: bool,
    confidence: float = CONFIDENCE,
) -> PairedAcrossTunings:
    """Arm against reference over S tunings, seeds matched within each tuning.

    Per tuning k: :func:`~flatlab.analysis.compare.statistics.paired_difference` of ``arm[k]`` and
    ``reference[k]`` (``{seed: value}``; the seeds both have a finite value for) with its paired t-test.
    Across tunings: :func:`across_tunings` of the per-seed differences d_kj = arm_kj − reference_kj, so
    the interval of the mean difference includes the tuning's variance and ``across.components.share``
    is the tuning's share of the differences' variance. Units: the quantity's; the sign that of
    arm − reference (``higher_is_better`` only orders the per-seed counts).

    Raises:
        ConfigError: ``arm``/``reference`` not sequences of ``{seed: value}`` of the same length, or
            ``confidence`` outside (0, 1).
    """
    _check_confidence(confidence)
    for name, side in (("arm", arm), ("reference", reference)):
        if isinstance(side, (str, bytes)) or not isinstance(side, Sequence) or not side:
            raise ConfigError(f"{name} must be a non-empty sequence of tunings, each a {{seed: value}}")
        bad = [k for k, t in enumerate(side) if not isinstance(t, Mapping)]
        if bad:
            raise ConfigError(f"{name}[{bad[0]}] must be a {{seed: value}} (seeds are matched within a tuning)")
    if len(arm) != len(reference):
        raise ConfigError(f"arm and reference must have the same tunings; got {len(arm)} and {len(reference)}")
    per_tuning, differences = [], []
    for a, r in zip(arm, reference):
        per_tuning.append(paired_difference(a, r, higher_is_better=higher_is_better, confidence=confidence))
        differences.append(seed_differences(a, r))
    return PairedAcrossTunings(tuple(per_tuning), across_tunings(differences, confidence))


def seed_differences(arm: Mapping[Any, float], reference: Mapping[Any, float]) -> List[float]:
    """One tuning's per-seed differences arm − reference (``{seed: value}`` each) over the seeds both have a
    finite value for, in ``arm``'s seed order."""
    return [
        float(arm[s]) - float(reference[s]) for s in arm if s in reference and finite(arm[s]) and finite(reference[s])
    ]
