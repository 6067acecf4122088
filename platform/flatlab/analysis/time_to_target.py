"""Time to a validation target in compute units, and the speed-up over a reference arm (AlgoPerf-style).

AlgoPerf (Dahl et al., 2023, "Benchmarking Neural Network Training Algorithms", §4) scores a training
algorithm by the time it takes to reach a validation target; a run that misses it scores ∞, and the
score is the median over independent studies. Here, from the per-epoch histories of a study's final
trials (:mod:`flatlab.analysis.histories`):

* the **target** is a validation value: given (``target``), or the median over the reference arm's final
  runs of their final value of the metric;
* a run's **time to target** is its cumulative cost at the end of the first epoch whose metric reaches the
  target (>= for a metric to maximise, <= for one to minimise), in passes (``compute/passes``, gradient
  evaluations) and in seconds (``compute/train_s``, training seconds); a miss is ∞. Epochs are the
  resolution: the time is an upper bound within one epoch's cost;
* each arm's **median time** is the median over its final runs (seeds and tunings together, misses as ∞);
* the **speed-up** is estimated at the level of the unit of replication (the tuning, or the seed in a
  study of one tuning): per unit k, T_a,k is the median over its seeds of arm a's time and
  d_k = ln(T_ref,k / T_a,k) (> 0: the arm is faster). The estimand is E[d_k], the mean log speed-up of
  the arm as tuned by the study's protocol; exp of the estimate and of its interval is the geometric-mean
  speed-up and its interval. The test, interval, Holm across arms and equivalence margin (±ln 1.1: within
  10 % in time) are :func:`flatlab.analysis.claims.claims`'. An arm with a unit where either median is ∞
  (half or more of an even number of seeds missed, so one of two; more than half of an odd number) has no
  finite d_k there, and gets no interval: it is reported with the count of such units instead of being
  tested on the rest.

Across studies (one workload each), :func:`cost_matrix` gives each arm's median time per study for the
performance profiles of :mod:`flatlab.analysis.compare.profiles`, in the same unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from flatlab.analysis.claims import Claim, claims
from flatlab.analysis.compare.statistics import CONFIDENCE, finite
from flatlab.analysis.histories import UNITS, check, groups, last_finite, runs
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")

MARGIN = math.log(1.1)
"""The equivalence margin of the log speed-up: within 10 % in time."""
INF = math.inf


@dataclass(frozen=True)
class Speedup:
    """One arm's speed-up over the reference in one cost unit.

    Attributes:
        unit: ``passes`` or ``seconds``.
        arm: which arm.
        ratio_of_medians: the reference's median time / the arm's (AlgoPerf's medians; > 1: faster).
        per_unit: d_k = ln(T_ref,k / T_a,k) per unit of replication (±inf or NaN where a median is ∞).
        missed: units whose d_k is not finite.
        claim: the test of E[d_k] = 0 (log scale; ``None`` where ``missed`` > 0 or no reference).
    """

    unit: str
    arm: str
    ratio_of_medians: float
    per_unit: Tuple[float, ...]
    missed: int
    claim: Optional[Claim]

    @property
    def speedup(self) -> Tuple[float, float, float]:
        """The geometric-mean speed-up and its interval, exp of the claim's estimate (NaN without one)."""
        if self.claim is None:
            return (math.nan, math.nan, math.nan)
        e = self.claim.estimate
        return (math.exp(e.mean), math.exp(e.low), math.exp(e.high)) if finite(e.mean) else (math.nan,) * 3


@dataclass(frozen=True)
class TimeToTarget:
    """The time-to-target table of a study (:func:`time_to_target`).

    Attributes:
        metric, target, target_source: the validation metric, its target and where it came from.
        higher_is_better: the metric's direction.
        reference: the reference arm.
        per_run: one row per final run: ``run_id``, ``arm``, ``tuning``, ``seed``, ``final`` (its last value),
            ``epoch`` (first epoch at the target; NaN: missed), ``passes``, ``seconds`` (∞: missed).
        medians: arm -> {``passes``, ``seconds``: the median over its runs; ``reached``, ``runs``: counts}.
        speedups: one :class:`Speedup` per arm other than the reference and unit, unit-major.
    """

    metric: str
    target: float
    target_source: str
    higher_is_better: bool
    reference: str
    per_run: Any
    medians: Dict[str, Dict[str, float]]
    speedups: Tuple[Speedup, ...]

    def frame(self) -> Any:
        """One row per arm: median passes and seconds, runs that reached, and per unit the ratio of medians,
        the geometric-mean speed-up with its interval, Holm p, label and words."""
        rows = []
        for arm, m in self.medians.items():
            row: Dict[str, Any] = {"arm": arm, **m}
            for s in (s for s in self.speedups if s.arm == arm):
                g = s.speedup
                row.update({f"{s.unit}_ratio_of_medians": s.ratio_of_medians, f"{s.unit}_speedup": g[0]})
                row.update({f"{s.unit}_low": g[1], f"{s.unit}_high": g[2], f"{s.unit}_missed": s.missed})
                c = s.claim
                row.update({f"{s.unit}_p_holm": c.p_holm if c else math.nan, f"{s.unit}_label": c.label if c else ""})
                row[f"{s.unit}_claim"] = c.text if c else f"not tested: {s.missed} unit(s) missed the target"
            rows.append(row)
        return pd.DataFrame(rows)


def reference_target(histories: Any, metric: str, reference: str) -> float:
    """The median over the reference arm's runs of their final (last finite) value of ``metric``.

    Raises:
        ConfigError: the reference arm has no run with a value.
    """
    h = check(histories, (metric,))
    finals = [last_finite(rows[metric]) for (_r, arm, _t, _s), rows in runs(h) if arm == reference]
    finals = [v for v in finals if finite(v)]
    if not finals:
        arms = ", ".join(sorted(set(h["arm"])))
        raise ConfigError(f"reference arm {reference!r} has no final run with {metric!r}; arms: {arms}")
    return float(np.median(finals))


def runs_to_target(histories: Any, metric: str, target: float, higher_is_better: bool) -> Any:
    """One row per run: its final value, the first epoch at the target, and the passes and seconds then
    (cumulative at the end of that epoch; ∞ and NaN epoch where it never reaches it)."""
    h = check(histories, (metric, *UNITS.values()))
    out = []
    for (run_id, arm, tuning, seed), rows in runs(h):
        values = rows[metric].to_numpy(dtype=float)
        hit = values >= target if higher_is_better else values <= target
        hit &= np.isfinite(values)
        row = {"run_id": run_id, "arm": arm, "tuning": int(tuning), "seed": seed, "final": last_finite(values)}
        if hit.any():
            i = int(np.argmax(hit))
            row.update(epoch=int(rows["epoch"].iloc[i]))
            row.update({u: float(rows[c].iloc[i]) for u, c in UNITS.items()})
        else:
            row.update(epoch=math.nan, **{u: INF for u in UNITS})
        out.append(row)
    return pd.DataFrame(out)


def time_to_target(
    histories: Any,
    *,
    metric: str,
    reference: str,
    target: Optional[float] = None,
    higher_is_better: bool = True,
    confidence: float = CONFIDENCE,
    target_source: str = "given",
) -> TimeToTarget:
    """The time to target of every final run, each arm's medians and its speed-up (module docstring).

    Args:
        histories: the per-epoch histories (:mod:`flatlab.analysis.histories`) with ``metric``,
            ``compute/passes`` and ``compute/train_s``.
        metric: the validation metric (e.g. ``val/accuracy``).
        reference: the reference arm.
        target: the target value in the metric's units (``None``: :func:`reference_target`).
        higher_is_better: the metric's direction (``False`` for a loss).
        confidence: of the intervals; the claims' family-wise level is ``1 − confidence``.
        target_source: where a given ``target`` came from, in words (``given``, ``study``).
    Raises:
        ConfigError: a missing column, an unknown reference arm, a non-finite target.
    """
    if target is None:
        target, source = reference_target(histories, metric, reference), f"median final {metric} of {reference}"
    elif not finite(target):
        raise ConfigError(f"the target of {metric} must be a finite number; got {target!r}")
    else:
        source = target_source
    per_run = runs_to_target(histories, metric, float(target), higher_is_better)
    if reference not in set(per_run["arm"]):
        raise ConfigError(
            f"reference arm {reference!r} has no final run; arms: {', '.join(sorted(set(per_run['arm'])))}"
        )
    medians = {
        a: {
            **{u: float(np.median(rows[u].to_numpy(dtype=float))) for u in UNITS},
            "reached": int(np.isfinite(rows["passes"]).sum()),
            "runs": len(rows),
        }
        for a, rows in per_run.groupby("arm", sort=True)
    }
    speedups = tuple(s for u in UNITS for s in _speedups(per_run, medians, u, reference, confidence))
    return TimeToTarget(metric, float(target), source, higher_is_better, reference, per_run, medians, speedups)


def cost_matrix(results: Mapping[str, TimeToTarget], unit: str) -> Any:
    """The median time to target of every arm on every study, arms × studies, for performance profiles
    in a compute unit (:func:`flatlab.analysis.compare.profiles.performance_ratios`: a miss, ∞, and an arm
    absent from a study, NaN, are both "not solved").

    Args:
        results: study name -> its :class:`TimeToTarget` (each against its own target).
        unit: ``passes`` or ``seconds``.
    Raises:
        ConfigError: another unit.
    """
    if unit not in UNITS:
        raise ConfigError(f"cost unit {unit!r} is not supported; expected one of {', '.join(UNITS)}")
    arms = sorted({a for r in results.values() for a in r.medians})
    return pd.DataFrame(
        {w: [r.medians[a][unit] if a in r.medians else math.nan for a in arms] for w, r in results.items()},
        index=pd.Index(arms, name="arm"),
    )


def _speedups(per_run: Any, medians: Dict, unit: str, reference: str, confidence: float) -> Tuple[Speedup, ...]:
    """The speed-ups of every arm over ``reference`` in ``unit``; one claims family over the arms whose
    every d_k is finite."""
    arms = [a for a in medians if a != reference]
    d: Dict[str, list] = {a: [] for a in arms}
    for _label, rows in groups(per_run):
        ref = _median(rows, reference, unit)
        for a in arms:
            d[a].append(_log_ratio(ref, _median(rows, a, unit)))
    tested = [a for a in arms if d[a] and all(finite(v) for v in d[a])]
    family = claims(
        f"speedup/{unit}_to_target", reference, {a: [[v] for v in d[a]] for a in tested},
        higher_is_better=True, margin=MARGIN, margin_source="default (±10 % in time)",
        alpha=round(1.0 - confidence, 12),
    ) if tested else ()  # fmt: skip
    found = dict(zip(tested, family))
    out = []
    for a in arms:
        ratio = _ratio(medians[reference][unit], medians[a][unit])
        missed = sum(1 for v in d[a] if not finite(v))
        out.append(Speedup(unit, a, ratio, tuple(d[a]), missed, found.get(a)))
    return tuple(out)


def _median(rows: Any, arm: str, unit: str) -> float:
    values = rows.loc[rows["arm"] == arm, unit].to_numpy(dtype=float)
    return float(np.median(values)) if values.size else math.nan


def _log_ratio(ref: float, arm: float) -> float:
    """ln(ref / arm): +inf where only the reference misses, −inf where only the arm does, NaN where both
    miss or a side has no run."""
    if math.isnan(ref) or math.isnan(arm) or (math.isinf(ref) and math.isinf(arm)):
        return math.nan
    if math.isinf(ref) or math.isinf(arm):
        return INF if math.isinf(ref) else -INF
    return math.log(ref / arm) if ref > 0 and arm > 0 else math.nan


def _ratio(ref: float, arm: float) -> float:
    """ref / arm with ∞/∞ NaN, finite/∞ 0, ∞/finite ∞."""
    if math.isinf(ref) and math.isinf(arm):
        return math.nan
    if math.isinf(arm):
        return 0.0
    return ref / arm if arm > 0 else math.nan
