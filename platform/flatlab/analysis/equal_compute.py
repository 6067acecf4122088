"""The arms compared at equal compute: every final run read at the largest budget all of them reached.

From the per-epoch histories of a study's final trials (:mod:`flatlab.analysis.histories`), in passes
(``compute/passes``, gradient evaluations) or seconds (``compute/train_s``, training seconds):

* the **budget** B is the smallest total over the final runs of their cost, so every run of every arm
  reached it (an arm's shortest run bounds it);
* each run is read at its **last epoch whose cumulative cost is <= B** (epochs are the resolution, so a
  run's cost there is at most B and within one epoch's cost of it), and each quantity at its last value
  logged up to that epoch: the study's validation metric and the test metric where logged every epoch
  (``test_every_epoch``), and the flatness measures logged every k epochs (``flat_curve/<m>`` with
  ``measure_every``: the measure of the last measured epoch at or before that one, which may lie up to
  k − 1 epochs earlier). ``flat/<m>`` is measured only on the final model and is not used;
* the claims are those of the main table (:func:`flatlab.analysis.claims.claims`): per unit of
  replication (the tuning, or the seed in a study of one tuning) the mean over matched seeds of
  arm − reference, a t over the units, Holm across arms, the equivalence test at the quantity's margin
  (:func:`flatlab.analysis.tunings.default_margin` unless given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from flatlab.analysis.claims import Claim, claims
from flatlab.analysis.compare.statistics import CONFIDENCE, finite
from flatlab.analysis.histories import check, higher_is_better, last_finite, per_seed_differences, runs, unit_column
from flatlab.analysis.tunings import default_margin
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")

CURVE_PREFIX = "flat_curve"
"""The prefix of the flatness measures logged during training (``flat_curve/<m>``, ``flat_curve_<split>/<m>``)."""


@dataclass(frozen=True)
class AtEqual:
    """The arms at an equal budget (:func:`at_equal`).

    Attributes:
        unit: ``passes`` or ``seconds``; budget: B in that unit.
        reference: the reference arm; quantities: what was compared, the study metric first.
        per_run: one row per final run: ``run_id``, ``arm``, ``tuning``, ``seed``, ``epoch`` (read there),
            ``cost`` (its cumulative cost then, <= B) and each quantity's value.
        medians: arm -> quantity -> the median over its runs.
        claims: quantity -> the family of claims of the arms against the reference.
    """

    unit: str
    budget: float
    reference: str
    quantities: Tuple[str, ...]
    per_run: Any
    medians: Dict[str, Dict[str, float]]
    claims: Dict[str, Tuple[Claim, ...]]

    def frame(self) -> Any:
        """One row per (quantity, arm): the median over runs and, against the reference, the estimate,
        its interval, Holm p, label and words."""
        rows = []
        for q in self.quantities:
            found = {c.arm: c for c in self.claims.get(q, ())}
            for arm in self.medians:
                row: Dict[str, Any] = {"quantity": q, "arm": arm, "median": self.medians[arm].get(q, math.nan)}
                c = found.get(arm)
                if c is not None:
                    e = c.estimate
                    row.update(diff=e.mean, diff_low=e.low, diff_high=e.high, p_holm=c.p_holm)
                    row.update(label=c.label, claim=c.text, margin=c.margin, margin_source=c.margin_source)
                rows.append(row)
        return pd.DataFrame(rows)


def quantities_of(histories: Any, metric: str) -> Tuple[str, ...]:
    """The quantities the histories allow at equal cost: ``metric``, the test metrics, ``flat_curve/*``
    columns with a value (in that order)."""
    cols = [c for c in histories.columns if c != metric and histories[c].notna().any()]
    tests = [c for c in cols if c.startswith("test/")]
    flat = sorted(c for c in cols if c.startswith(CURVE_PREFIX))
    return (metric, *tests, *flat)


def at_equal(
    histories: Any,
    *,
    unit: str,
    metric: str,
    reference: str,
    mode: str = "max",
    quantities: Optional[Sequence[str]] = None,
    margins: Optional[Mapping[str, float]] = None,
    confidence: float = CONFIDENCE,
) -> AtEqual:
    """The arms compared at the largest budget every final run reached (module docstring).

    Args:
        histories: the per-epoch histories with the unit's column.
        unit: ``passes`` or ``seconds``.
        metric, mode: the study's validation metric and its direction (``max``/``min``).
        reference: the reference arm.
        quantities: what to compare (default :func:`quantities_of`).
        margins: quantity -> equivalence margin (its units); default :func:`~flatlab.analysis.tunings.default_margin`.
        confidence: of the intervals; the claims' family-wise level is ``1 − confidence``.
    Raises:
        ConfigError: an unknown unit, a missing column, an unknown reference arm, a budget of 0 (a run
            that logged no cost).
    """
    column = unit_column(unit)
    qs = tuple(quantities) if quantities is not None else quantities_of(histories, metric)
    h = check(histories, (column, *qs))
    budget = min(last_finite(rows[column]) for _key, rows in runs(h))
    if not (finite(budget) and budget > 0):
        raise ConfigError(f"a final run logged no {column}: no budget in {unit} every run reached")
    per_run = _read_at(h, column, budget, qs)
    if reference not in set(per_run["arm"]):
        raise ConfigError(
            f"reference arm {reference!r} has no final run; arms: {', '.join(sorted(set(per_run['arm'])))}"
        )
    medians = {a: {q: _median(rows[q]) for q in qs} for a, rows in per_run.groupby("arm", sort=True)}
    given = dict(margins or {})
    family = {}
    for q in qs:
        ref_mean = medians[reference][q]
        m, source = (given[q], "given") if q in given else default_margin(q, ref_mean, reference)
        diffs = per_seed_differences(per_run, q, reference)
        family[q] = claims(
            q, reference, diffs, higher_is_better=higher_is_better(q, metric, mode), margin=m, margin_source=source,
            alpha=round(1.0 - confidence, 12),
        )  # fmt: skip
    return AtEqual(unit, float(budget), reference, qs, per_run, medians, family)


def _read_at(h: Any, column: str, budget: float, qs: Sequence[str]) -> Any:
    """Each run at its last epoch with cost <= ``budget``: the epoch, the cost, and each quantity's last
    value logged up to it."""
    out = []
    for (run_id, arm, tuning, seed), rows in runs(h):
        upto = rows[rows[column].to_numpy(dtype=float) <= budget * (1 + 1e-12)]
        row: Dict[str, Any] = {"run_id": run_id, "arm": arm, "tuning": int(tuning), "seed": seed}
        if upto.empty:  # the first epoch alone costs more than the budget: nothing to read
            row.update(epoch=math.nan, cost=math.nan, **{q: math.nan for q in qs})
        else:
            row.update(epoch=int(upto["epoch"].iloc[-1]), cost=float(upto[column].iloc[-1]))
            row.update({q: last_finite(upto[q]) for q in qs})
        out.append(row)
    return pd.DataFrame(out)


def _median(values: Any) -> float:
    v = np.asarray([x for x in values if finite(x)], dtype=float)
    return float(np.median(v)) if v.size else math.nan
