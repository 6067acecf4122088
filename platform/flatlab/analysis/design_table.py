"""``flatlab compare STUDY --design``: per claim, the variance components and costs a launch measured, the
effect its design detects, and the cheapest (S tunings, m final seeds) with power 0.8 for a stated effect.

The arithmetic is :mod:`flatlab.analysis.design`; here it is fed from a
:class:`~flatlab.analysis.tunings.TuningComparison` (the components of each claim's per-seed differences)
and the sample's run times (c_t: one tuning's search of the arm and of the reference, the median over
tunings of the summed durations of their search trials; c_s: one final seed of both, the median final-trial
duration of each, added). The level is alpha / (arms in the family), Holm's first and strictest step, so
the power is a lower bound for every arm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np

from flatlab.analysis.compare.columns import number
from flatlab.analysis.compare.statistics import finite
from flatlab.analysis.compare.text import markdown_table
from flatlab.analysis.design import POWER, Allocation, allocate, detectable_effect
from flatlab.analysis.sample import STAGE_FINAL, Sample
from flatlab.analysis.tunings import TuningComparison

NAN = float("nan")


@dataclass(frozen=True)
class DesignRow:
    """One claim's design (:func:`study_design`).

    Attributes:
        quantity, arm: the claim (arm against the comparison's reference).
        sigma2_tuning, sigma2_seed: the variance components of its per-seed differences (units squared).
        tunings, seeds: the design judged (S, m): the launch's, or a planned one.
        detectable: the smallest |delta| that design detects with power 0.8 (the quantity's units).
        effect, effect_source: the effect the allocation is for, and where it came from (``--effect``, the
            claim's margin).
        cost_tuning, cost_seed: c_t and c_s in core-seconds (NaN where the runs carry no times).
        allocation: the cheapest design for ``effect`` (``None``: none within the bounds, or no costs).
    """

    quantity: str
    arm: str
    sigma2_tuning: float
    sigma2_seed: float
    tunings: int
    seeds: int
    detectable: float
    effect: float
    effect_source: str
    cost_tuning: float
    cost_seed: float
    allocation: Optional[Allocation]


def run_costs(sample: Sample, arm: str) -> Tuple[float, float]:
    """``(c_t, c_s)`` of one arm in core-seconds: the median over tunings of its search trials' summed
    durations, and the median duration of its final trials (``end_time − start_time``, ms in the store).
    NaN where the sample has no times. Each trial is taken to use one core."""
    df = sample.trials
    if not {"start_time", "end_time"} <= set(df.columns):
        return NAN, NAN
    mine = df[df["arm"] == arm]
    seconds = (mine["end_time"].astype(float) - mine["start_time"].astype(float)) / 1000.0
    final = mine["stage"] == STAGE_FINAL
    per_tuning = seconds[~final].groupby(mine.loc[~final, "tuning"]).sum(min_count=1)
    c_t = float(np.nanmedian(per_tuning)) if per_tuning.notna().any() else NAN
    c_s = float(np.nanmedian(seconds[final])) if seconds[final].notna().any() else NAN
    return c_t, c_s


def study_design(
    c: TuningComparison,
    sample: Sample,
    *,
    effects: Optional[Mapping[str, float]] = None,
    planned: Optional[Tuple[int, int]] = None,
) -> Tuple[DesignRow, ...]:
    """Every claim's design: its components, the design's detectable effect and the cheapest (S, m).

    Args:
        c: the comparison over tunings whose claims are judged.
        sample: the same launch's trials (their run times give the costs).
        effects: quantity -> the effect to detect (the quantity's units); default each claim's margin m.
        planned: the (S, m) to judge instead of the launch's own (the dry run's planned design).
    """
    costs = {a: run_costs(sample, a) for a in c.arms}
    family = {q: sum(1 for r in c.rows if r.quantity == q and r.claim is not None) for q in c.quantities}
    out: List[DesignRow] = []
    for r in c.rows:
        if r.claim is None or r.paired is None:
            continue
        comp = r.paired.across.components
        s_t, s_s = comp.tuning, comp.seed
        alpha = c.alpha / max(family[r.quantity], 1)
        s, m = planned or (len(c.tunings), max(1, int(round(np.mean([n for n in r.paired.across.seeds if n] or [1])))))
        sd = float(np.sqrt(s_t + s_s / m)) if finite(s_t) and finite(s_s) else NAN
        detect = detectable_effect(sd, s, alpha) if finite(sd) else NAN
        effect = (effects or {}).get(r.quantity)
        source = "given" if effect is not None else "the claim's margin m"
        effect = effect if effect is not None else r.claim.margin
        c_t = costs[r.arm][0] + costs[c.reference][0]
        c_s = costs[r.arm][1] + costs[c.reference][1]
        alloc = None
        if all(finite(v) and v > 0 for v in (effect, c_t, c_s)) and finite(s_t) and finite(s_s) and s_t + s_s > 0:
            alloc = allocate(effect, s_t, s_s, c_t, c_s, alpha=alpha)
        out.append(DesignRow(r.quantity, r.arm, s_t, s_s, s, m, detect, effect, source, c_t, c_s, alloc))
    return tuple(out)


HEADERS = (
    "quantity",
    "arm",
    "σ²_tuning, σ²_seed of Δ",
    "design (S × m)",
    "detects ±",
    "effect",
    "c_t, c_s (core-s)",
    "cheapest for the effect: S × m (power; core-s)",
)


def cells(rows: Sequence[DesignRow]) -> List[List[str]]:
    """The text cells of each row, in :data:`HEADERS` order."""
    out = []
    for d in rows:
        a = d.allocation
        best = f"{a.tunings} × {a.seeds} ({a.power:.2f}; {a.cost:,.0f})" if a is not None else "-"
        out.append(
            [
                d.quantity,
                d.arm,
                f"{number(d.sigma2_tuning)}, {number(d.sigma2_seed)}",
                f"{d.tunings} × {d.seeds}",
                number(d.detectable),
                number(d.effect) if finite(d.effect) else "-",
                f"{number(d.cost_tuning)}, {number(d.cost_seed)}" if finite(d.cost_tuning) else "-",
                best,
            ]
        )
    return out


def caption(c: TuningComparison) -> List[str]:
    """What the design table's columns mean."""
    return [
        f"Var(mean Δ) = σ²_tuning / S + σ²_seed / (S m) (one-way random-effects components of the per-seed "
        f"differences against {c.reference}); power {POWER:g} of the t over the S tunings at alpha / arms, "
        "Holm's first step (docs/comparing.md).",
        "c_t: one tuning's search of the arm and the reference; c_s: one final seed of both (median run times, "
        "one core each); cheapest: least S (c_t + m c_s) over m = 1..20, near m* = sqrt(c_t σ²_seed / "
        "(c_s σ²_tuning)).",
    ]


def to_markdown(c: TuningComparison, rows: Sequence[DesignRow]) -> str:
    """The design table in markdown with its title and caption."""
    title = f"### {c.study + ': ' if c.study else ''}design of the comparison against {c.reference}"
    body = markdown_table(list(HEADERS), cells(rows), left=2)
    return "\n".join([title, "", body, ""] + [f"- {line}" for line in caption(c)]) + "\n"


def planned_lines(c: TuningComparison, sample: Sample, planned: Tuple[int, int]) -> List[str]:
    """What a planned design of S tunings x m final seeds detects, from the variance components of an earlier
    launch (``c``, ``sample``): one line per quantity, each arm's smallest effect found with power 0.8."""
    rows = study_design(c, sample, planned=planned)
    s, m = planned
    out = [
        f"with {s} tunings x {m} final seeds, the variance components of the last launch ({len(c.tunings)} tunings) "
        f"say this design detects, with power {POWER:g} (docs/comparing.md):"
    ]
    for q in c.quantities:
        mine = [d for d in rows if d.quantity == q]
        if mine:
            out.append(f"  {q}: " + ", ".join(f"{d.arm} ±{number(d.detectable)}" for d in mine))
    return out
