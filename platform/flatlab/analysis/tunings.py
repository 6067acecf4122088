"""The comparison of a study of several independent tunings, with the tuning as the unit of replication.

Each tuning is first compared on its own, exactly as a single-tuning study is
(:func:`~flatlab.analysis.compare.table.compare_table` over its final seeds: means, paired per-seed
tests against the reference arm, Holm within each quantity's family). Across tunings, per arm and
quantity (:mod:`flatlab.analysis.replication`): each tuning's final-seed mean, their median, the
two-level interval of the mean (tunings, then seeds within a tuning) and the share of the variance that
comes from the tuning; against the reference, the same for the per-seed differences, and a verdict
from the S per-tuning Holm-adjusted tests: it **holds in every tuning** (same sign, significant in all),
**depends on the tuning** (k of S agree) or **no difference found** (AlgoPerf's independent studies;
Bouthillier et al., MLSys 2021). The rule is written out in ``docs/comparing.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from flatlab.analysis.compare.statistics import CONFIDENCE, clip
from flatlab.analysis.compare.table import Comparison, RowTable, _by_seed, compare_table
from flatlab.analysis.replication import (
    AcrossTunings,
    PairedAcrossTunings,
    Verdict,
    across_tunings,
    paired_across_tunings,
    verdict,
)
from flatlab.analysis.sample import Sample
from flatlab.errors import ConfigError


@dataclass(frozen=True)
class TuningRow:
    """One arm and quantity over the tunings.

    Attributes:
        quantity, arm: which.
        across: the arm's values over tunings (each tuning's final-seed mean, median, two-level interval
            clipped to the quantity's range as a single table's, variance components).
        paired: against the reference arm (``None`` for the reference itself).
        p_holm: per tuning, the paired test's p-value Holm-adjusted within that tuning's family (NaN
            where there is no test).
        verdict: whether the difference survives re-tuning (``None`` for the reference).
    """

    quantity: str
    arm: str
    across: AcrossTunings
    paired: Optional[PairedAcrossTunings] = None
    p_holm: Tuple[float, ...] = ()
    verdict: Optional[Verdict] = None


@dataclass(frozen=True)
class TuningComparison(RowTable):
    """A multi-tuning study's comparison (:func:`compare_tunings`).

    Attributes:
        metric, reference, confidence, quantities, higher_is_better: as in
            :class:`~flatlab.analysis.compare.table.Comparison`, shared by every tuning.
        tunings: the tunings compared, in order.
        per_tuning: each tuning's own table.
        rows: one :class:`TuningRow` per quantity and arm, quantity-major, reference first.
        study: the study's name, for titles.
        notes: what the table leaves out and why.
    """

    metric: str
    reference: str
    confidence: float
    quantities: Tuple[str, ...]
    higher_is_better: Mapping[str, bool]
    tunings: Tuple[int, ...]
    per_tuning: Tuple[Comparison, ...] = field(repr=False)
    rows: Tuple[TuningRow, ...]
    study: str = ""
    notes: Tuple[str, ...] = ()

    def holding(self) -> List[TuningRow]:
        """The rows whose difference from the reference holds in every tuning."""
        return [r for r in self.rows if r.verdict is not None and r.verdict.kind == "holds"]

    def frame(self) -> Any:
        """The table as numbers, one row per (quantity, arm): tuning means ``t<k>``, ``median``, ``mean``,
        ``low``, ``high`` (two-level), ``tuning_share``, and against the reference ``diff_t<k>`` and
        ``p_holm_t<k>`` per tuning, ``diff``, ``diff_low``, ``diff_high``, ``diff_tuning_share`` and
        ``verdict``."""
        # pandas on first use: importing this module stays light
        import pandas as pd

        out = []
        for r in self.rows:
            row: Dict[str, Any] = {"quantity": r.quantity, "arm": r.arm}
            row.update({f"t{k}": m for k, m in zip(self.tunings, r.across.tuning_means)})
            e = r.across.estimate
            row.update(median=r.across.median, mean=e.mean, low=e.low, high=e.high)
            row["tuning_share"] = r.across.components.share
            if r.paired is not None:
                row.update({f"diff_t{k}": p.estimate.mean for k, p in zip(self.tunings, r.paired.per_tuning)})
                row.update({f"p_holm_t{k}": p for k, p in zip(self.tunings, r.p_holm)})
                d = r.paired.across.estimate
                row.update(diff=d.mean, diff_low=d.low, diff_high=d.high)
                row["diff_tuning_share"] = r.paired.across.components.share
                row["verdict"] = r.verdict.text if r.verdict is not None else ""
            out.append(row)
        return pd.DataFrame(out)


def compare_tunings(
    data: Any,
    *,
    metric: Optional[str] = None,
    reference: Optional[str] = None,
    measures: Optional[Sequence[str]] = None,
    confidence: float = CONFIDENCE,
    study: str = "",
) -> TuningComparison:
    """The comparison of a study's tunings (module docstring).

    Args:
        data: a :class:`~flatlab.analysis.sample.Sample` (or a ``trials_frame`` table) with a ``tuning``
            column; each tuning's final-stage trials are compared (its best configuration's search
            trials where it has no final stage).
        metric, reference, measures, confidence, study: as for
            :func:`~flatlab.analysis.compare.table.compare_table`; the reference and quantities are
            those of the first tuning, and every tuning is compared on them.
    Returns:
        A :class:`TuningComparison`.
    Raises:
        ConfigError: as :func:`~flatlab.analysis.compare.table.compare_table`, for any tuning.
    """
    sample = Sample.of(data)
    tunings = tuple(sample.tunings)
    if not tunings:
        raise ConfigError("no trials recorded for this study: nothing to compare")
    first = compare_table(
        sample.tuning(tunings[0]).trials, metric=metric, reference=reference, measures=measures, confidence=confidence
    )
    flat = [q for q in first.quantities[1:] if q.startswith(("flat/", "flat_at_target/"))]
    tables = [first] + [
        compare_table(
            sample.tuning(k).trials,
            metric=first.metric,
            reference=first.reference,
            measures=measures if measures is not None else flat,
            confidence=confidence,
        )
        for k in tunings[1:]
    ]
    rows: List[TuningRow] = []
    for q in first.quantities:
        better = first.higher_is_better[q]
        for arm in first.arms:
            values = [_by_seed(c.seeds, arm, q) if q in c.quantities else {} for c in tables]
            across = across_tunings([dict(v) for v in values], confidence)
            across = replace(across, estimate=clip(across.estimate, first.support.get(q)))  # as a single table
            if arm == first.reference:
                rows.append(TuningRow(q, arm, across))
                continue
            refs = [_by_seed(c.seeds, first.reference, q) if q in c.quantities else {} for c in tables]
            paired = paired_across_tunings(values, refs, higher_is_better=better, confidence=confidence)
            p_holm = tuple(_p_holm(c, q, arm) for c in tables)
            call = verdict(
                p_holm,
                [p.estimate.mean for p in paired.per_tuning],
                across=paired.across.estimate.mean,
                alpha=round(1.0 - confidence, 12),
            )
            rows.append(TuningRow(q, arm, across, paired, p_holm, call))
    notes = _notes(tunings, tables)
    return TuningComparison(
        first.metric,
        first.reference,
        float(confidence),
        first.quantities,
        dict(first.higher_is_better),
        tunings,
        tuple(tables),
        tuple(rows),
        study or sample.info.name,
        notes,
    )


def _notes(tunings: Sequence[int], tables: Sequence[Comparison]) -> Tuple[str, ...]:
    """Each tuning's notes, once: a note every tuning has as it is, the others prefixed with their tuning."""
    every = set.intersection(*(set(c.notes) for c in tables)) if tables else set()
    shared = [n for n in tables[0].notes if n in every] if tables else []
    own = [f"tuning {k}: {n}" for k, c in zip(tunings, tables) for n in c.notes if n not in every]
    return tuple(shared + own)


def _p_holm(comparison: Comparison, quantity: str, arm: str) -> float:
    """``arm``'s Holm-adjusted p-value for ``quantity`` in one tuning's table (NaN where it has none)."""
    for r in comparison.rows:
        if r.quantity == quantity and r.arm == arm:
            return r.p_holm
    return float("nan")
