"""The time-to-target and equal-compute tables as text cells and captions (terminal and markdown).

:func:`time_to_target_cells` renders a :class:`~flatlab.analysis.time_to_target.TimeToTarget` (median
passes and seconds per arm, runs that reached the target, the geometric-mean speed-up over the reference
with its interval and verdict per unit); :func:`at_equal_cells` an
:class:`~flatlab.analysis.equal_compute.AtEqual` (per quantity and arm, the median at the budget and the
tuning-level claim against the reference).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

from flatlab.analysis.compare.columns import number
from flatlab.analysis.compare.statistics import finite


def cell(v: Any) -> str:
    """A number as :func:`~flatlab.analysis.compare.columns.number`, ``∞`` for +inf (a miss)."""
    return "∞" if isinstance(v, float) and v == math.inf else number(v)


def _interval(mean: float, low: float, high: float) -> str:
    return f"{number(mean)} [{number(low)}, {number(high)}]" if finite(mean) else "-"


def _ratio_of_medians(ratio: float) -> str:
    """The reference's median time over the arm's, or which median is ∞ (a ratio of 0 or ∞ says only that)."""
    if ratio == 0:
        return "arm's median ∞"
    if ratio == math.inf:
        return "reference's median ∞"
    return f"{number(ratio)} (medians)" if finite(ratio) else "both medians ∞"


def time_to_target_cells(r: Any) -> Tuple[List[str], List[List[str]], List[str]]:
    """``(head, body, caption)`` of a time-to-target table."""
    head = ["arm", "reached", "median passes", "median seconds"]
    units = ("passes", "seconds")
    head += [h for u in units for h in (f"speed-up ({u})", f"verdict ({u})")]
    body = []
    for arm, m in _reference_first(r.medians, r.reference):
        row = [arm, f"{m['reached']}/{m['runs']}", cell(m["passes"]), cell(m["seconds"])]
        for u in units:
            s = next((s for s in r.speedups if s.arm == arm and s.unit == u), None)
            if s is None:
                row += ["(reference)", ""]
            elif s.claim is None:
                row += [_ratio_of_medians(s.ratio_of_medians), f"not tested: {s.missed} unit(s) missed"]
            else:
                row += [_interval(*s.speedup), s.claim.text]
        body.append(row)
    caption = [
        f"target: {r.metric} {'>=' if r.higher_is_better else '<='} {number(r.target)} ({r.target_source}); "
        "time = cumulative passes (gradient evaluations) or training seconds at the end of the first epoch "
        "at the target; a miss is ∞; medians over final seeds and tunings.",
        f"speed-up over {r.reference}: exp of the mean over tunings (seeds in a study of one tuning) of "
        "ln(median reference time / median arm time), with its t interval; Holm across arms; "
        "'no difference' within ±10 % in time; a detectable effect is in ln units.",
    ]
    return head, body, caption


def at_equal_cells(r: Any) -> Tuple[List[str], List[List[str]], List[str]]:
    """``(head, body, caption)`` of an equal-compute table."""
    head = ["quantity", "arm", "median", f"arm − {r.reference}", "p (Holm)", "verdict"]
    body = []
    for q in r.quantities:
        found = {c.arm: c for c in r.claims.get(q, ())}
        for arm, m in _reference_first(r.medians, r.reference):
            c = found.get(arm)
            if c is None:
                body.append([q, arm, number(m.get(q, math.nan)), "(reference)", "", ""])
                continue
            e = c.estimate
            body.append([q, arm, number(m[q]), _interval(e.mean, e.low, e.high), number(c.p_holm), c.text])
    caption = [
        f"at {number(r.budget)} {r.unit} ({_unit_words(r.unit)}), the largest budget every final run reached: "
        "each run read at its last epoch within it; flat_curve measures at the last measured epoch up to it.",
        "differences: the mean over tunings (seeds in a study of one tuning) of the mean matched-seed "
        "difference, with its t interval; Holm across arms per quantity.",
    ]
    return head, body, caption


def _reference_first(medians: Dict[str, Any], reference: str) -> List[Tuple[str, Any]]:
    return sorted(medians.items(), key=lambda kv: (kv[0] != reference, kv[0]))


def _unit_words(unit: str) -> str:
    return {"passes": "gradient evaluations", "seconds": "training seconds"}.get(unit, unit)
