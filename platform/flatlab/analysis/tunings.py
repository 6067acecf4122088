"""The comparison of a study of several independent tunings, with the tuning as the unit of replication.

Each tuning is first summarised on its own, as a single-tuning study is
(:func:`~flatlab.analysis.compare.table.compare_table` over its final seeds). Across tunings, per arm and
quantity (:mod:`flatlab.analysis.replication`): each tuning's final-seed mean, their median, the
two-level interval of the mean (tunings, then seeds within a tuning) and the share of the variance that
comes from the tuning. Against the reference, the claim is tested at the level of the tuning
(:mod:`flatlab.analysis.claims`): d_k, the mean over tuning k's matched seeds of arm − reference, a t over
the S values d_k, Holm across the arms of the quantity, an equivalence test at the quantity's margin, and
the heterogeneity across tunings beside it (AlgoPerf's independent studies; Bouthillier et al., MLSys
2021). The rule is written out in ``docs/comparing.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from flatlab.analysis.claims import Claim, claims
from flatlab.analysis.compare.statistics import CONFIDENCE, clip, finite
from flatlab.analysis.compare.table import Comparison, RowTable, _by_seed, compare_table
from flatlab.analysis.replication import (
    AcrossTunings,
    PairedAcrossTunings,
    across_tunings,
    paired_across_tunings,
    seed_differences,
)
from flatlab.analysis.sample import Sample
from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.ranges import NO_RANGES, Ranges

pd = lazy("pandas")


@dataclass(frozen=True)
class TuningRow:
    """One arm and quantity over the tunings.

    Attributes:
        quantity, arm: which.
        across: the arm's values over tunings (each tuning's final-seed mean, median, two-level interval
            clipped to the quantity's range as a single table's, variance components).
        paired: against the reference arm, the per-seed differences over tunings (their two-level
            interval and variance components; ``None`` for the reference itself).
        claim: the tuning-level test against the reference, its label and heterogeneity
            (:class:`~flatlab.analysis.claims.Claim`; ``None`` for the reference).
    """

    quantity: str
    arm: str
    across: AcrossTunings
    paired: Optional[PairedAcrossTunings] = None
    claim: Optional[Claim] = None


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

    def with_label(self, label: str) -> List[TuningRow]:
        """The rows whose claim has ``label`` (``shown``, ``equivalent`` or ``inconclusive``)."""
        return [r for r in self.rows if r.claim is not None and r.claim.label == label]

    def depending(self) -> List[TuningRow]:
        """The rows whose difference depends on the tuning (significant heterogeneity after Holm)."""
        return [r for r in self.rows if r.claim is not None and r.claim.heterogeneity.depends(self.alpha)]

    def frame(self) -> Any:
        """The table as numbers, one row per (quantity, arm): tuning means ``t<k>``, ``median``, ``mean``,
        ``low``, ``high`` (two-level), ``tuning_share``, and against the reference the tuning-level claim:
        ``diff_t<k>`` (d_k), ``diff``, ``diff_low``, ``diff_high``, ``p``, ``p_holm``, ``label``, ``claim``
        (its words), ``margin``, ``margin_source``, ``p_equivalence_holm``, ``detectable``, and the
        heterogeneity ``het_sd``, ``het_f``, ``het_p_holm``, ``het_disagree``, ``depends``."""
        out = []
        for r in self.rows:
            row: Dict[str, Any] = {"quantity": r.quantity, "arm": r.arm}
            row.update({f"t{k}": m for k, m in zip(self.tunings, r.across.tuning_means)})
            e = r.across.estimate
            row.update(median=r.across.median, mean=e.mean, low=e.low, high=e.high)
            row["tuning_share"] = r.across.components.share
            if r.claim is not None:
                row.update(_claim_numbers(r.claim, self.tunings, self.alpha))
            out.append(row)
        return pd.DataFrame(out)


def _claim_numbers(c: Claim, tunings: Sequence[int], alpha: float) -> Dict[str, Any]:
    h = c.heterogeneity
    return {
        **{f"diff_t{k}": d for k, d in zip(tunings, c.per_tuning)},
        "diff": c.estimate.mean,
        "diff_low": c.estimate.low,
        "diff_high": c.estimate.high,
        "p": c.p,
        "p_holm": c.p_holm,
        "label": c.label,
        "claim": c.text,
        "margin": c.margin,
        "margin_source": c.margin_source,
        "p_equivalence_holm": c.p_equivalence_holm,
        "detectable": c.detectable,
        "het_sd": h.sd,
        "het_f": h.f,
        "het_p_holm": h.p_holm,
        "het_disagree": h.disagree,
        "depends": h.depends(alpha),
    }


def compare_tunings(
    data: Any,
    *,
    metric: Optional[str] = None,
    reference: Optional[str] = None,
    measures: Optional[Sequence[str]] = None,
    confidence: float = CONFIDENCE,
    margins: Optional[Mapping[str, float]] = None,
    study: str = "",
    ranges: Ranges = NO_RANGES,
) -> TuningComparison:
    """The comparison of a study's tunings (module docstring).

    Args:
        data: a :class:`~flatlab.analysis.sample.Sample` (or a ``trials_frame`` table) with a ``tuning``
            column; each tuning's final-stage trials are compared (its best configuration's search
            trials where it has no final stage).
        metric, reference, measures, confidence, study, ranges: as for
            :func:`~flatlab.analysis.compare.table.compare_table`; the reference and quantities are
            those of the first tuning, and every tuning is compared on them. The family-wise level of the
            claims is ``1 − confidence``.
        margins: quantity -> equivalence margin m (the quantity's units; source ``given``), over the
            study's own (:attr:`~flatlab.analysis.sample.StudyInfo.margins`; source ``study``); a quantity
            without one gets :func:`default_margin`.
    Returns:
        A :class:`TuningComparison`.
    Raises:
        ConfigError: as :func:`~flatlab.analysis.compare.table.compare_table`, for any tuning; a margin
            that is not a positive number.
    """
    sample = Sample.of(data)
    tunings = tuple(sample.tunings)
    if not tunings:
        raise ConfigError("no trials recorded for this study: nothing to compare")
    first = compare_table(
        sample.tuning(tunings[0]).trials,
        metric=metric,
        reference=reference,
        measures=measures,
        confidence=confidence,
        ranges=ranges,
    )
    flat = [q for q in first.quantities[1:] if q.startswith(("flat/", "flat_at_target/"))]
    tables = [first] + [
        compare_table(
            sample.tuning(k).trials,
            metric=first.metric,
            reference=first.reference,
            measures=measures if measures is not None else flat,
            confidence=confidence,
            ranges=ranges,
        )
        for k in tunings[1:]
    ]
    given = {q: (m, "study") for q, m in dict(sample.info.margins or {}).items()}
    given.update({q: (m, "given") for q, m in dict(margins or {}).items()})
    rows: List[TuningRow] = []
    for q in first.quantities:
        rows += _quantity_rows(q, first, tables, given, confidence)
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
        _notes(tunings, tables),
    )


def _quantity_rows(
    q: str,
    first: Comparison,
    tables: Sequence[Comparison],
    margins: Mapping[str, Tuple[float, str]],
    confidence: float,
) -> List[TuningRow]:
    """One quantity's rows: every arm over the tunings, and the family of claims against the reference
    (``margins``: quantity -> (m, its source))."""
    ref = first.reference
    by_arm = {a: [_by_seed(c.seeds, a, q) if q in c.quantities else {} for c in tables] for a in first.arms}
    across = {}
    for arm, values in by_arm.items():
        a = across_tunings([dict(v) for v in values], confidence)
        across[arm] = replace(a, estimate=clip(a.estimate, first.support.get(q)))  # as a single table
    others = [a for a in first.arms if a != ref]
    paired = {
        a: paired_across_tunings(
            by_arm[a], by_arm[ref], higher_is_better=first.higher_is_better[q], confidence=confidence
        )
        for a in others
    }
    per_seed = {a: [seed_differences(x, r) for x, r in zip(by_arm[a], by_arm[ref])] for a in others}
    margin, source = margins.get(q) or default_margin(q, across[ref].estimate.mean, ref)
    family = claims(
        q, ref, per_seed, higher_is_better=first.higher_is_better[q], margin=margin, margin_source=source,
        alpha=round(1.0 - confidence, 12),
    )  # fmt: skip
    found = dict(zip(others, family))
    return [TuningRow(q, a, across[a], paired.get(a), found.get(a)) for a in first.arms]


DEFAULT_ACCURACY_MARGIN = 0.01
"""The default equivalence margin of an accuracy (a fraction): one point."""
DEFAULT_RELATIVE_MARGIN = 0.1
"""The default equivalence margin of any other quantity: this fraction of the reference arm's mean."""


def default_margin(quantity: str, reference_mean: float, reference: str) -> Tuple[Optional[float], str]:
    """The equivalence margin of a quantity the study gives none for, and its source in words.

    An accuracy (a fraction in [0, 1]): ``DEFAULT_ACCURACY_MARGIN``, one point. Any other quantity (flatness,
    losses, epochs to a target): ``DEFAULT_RELATIVE_MARGIN`` of |the reference arm's across-tuning mean|, so
    the margin is in the quantity's units whatever its scale. ``(None, "none")`` when that mean is 0 or
    missing (no equivalence test).
    """
    if "accuracy" in quantity:
        return DEFAULT_ACCURACY_MARGIN, "default (1 point)"
    if finite(reference_mean) and reference_mean != 0:
        pct = f"{100 * DEFAULT_RELATIVE_MARGIN:g} %"
        return DEFAULT_RELATIVE_MARGIN * abs(float(reference_mean)), f"default ({pct} of {reference})"
    return None, "none"


def _notes(tunings: Sequence[int], tables: Sequence[Comparison]) -> Tuple[str, ...]:
    """Each tuning's notes, once: a note every tuning has as it is, the others prefixed with their tuning."""
    every = set.intersection(*(set(c.notes) for c in tables)) if tables else set()
    shared = [n for n in tables[0].notes if n in every] if tables else []
    own = [f"tuning {k}: {n}" for k, c in zip(tunings, tables) for n in c.notes if n not in every]
    return tuple(shared + own)
