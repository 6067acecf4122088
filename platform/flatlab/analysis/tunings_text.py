"""Text outputs of a :class:`~flatlab.analysis.tunings.TuningComparison`: markdown, CSV and a rich table per
quantity, from one list of registered columns (:data:`COLUMNS`), a caption and a summary of the claims.

A column is a header and a cell function; :func:`register_column` adds one, and every renderer loops over
:data:`COLUMNS`, so a new statistic of the table is one registration (its number goes in
:meth:`~flatlab.analysis.tunings.TuningComparison.frame` for CSV).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from flatlab.analysis.claims import EQUIVALENT, INCONCLUSIVE, SHOWN, Claim, margin_text
from flatlab.analysis.compare.columns import Column, insert_column, number
from flatlab.analysis.compare.statistics import finite
from flatlab.analysis.compare.text import markdown_table, write_format
from flatlab.analysis.console_table import make_table, print_table
from flatlab.analysis.sample import AT_TARGET_PREFIX, FLAT_PREFIX
from flatlab.analysis.tunings import TuningComparison, TuningRow

COLUMNS: List[Column] = []
"""The table's columns in order (after ``quantity`` and ``arm``)."""


def register_column(column: Column, *, after: Optional[str] = None) -> Column:
    """Add ``column`` (:class:`~flatlab.analysis.compare.columns.Column`: its ``header(c)`` and
    ``cell(c, row)`` get the :class:`TuningComparison` and a :class:`TuningRow`) to :data:`COLUMNS`, at
    the end or after the column named ``after``.

    Raises:
        ConfigError: a column of that name exists, or ``after`` names none.
    """
    return insert_column(COLUMNS, column, after)


def _pct(c: TuningComparison) -> str:
    return f"{c.confidence * 100:g}%"


def _interval(mean: float, low: float, high: float, signed: bool = False) -> str:
    if not finite(mean):
        return "-"
    head = number(mean, signed=signed)
    return head + (f" [{number(low, signed=signed)}, {number(high, signed=signed)}]" if finite(low) else "")


def _p(v: float) -> str:
    return f"{v:.2g}" if finite(v) else "-"


def _claimed(cell: Callable[[TuningComparison, Claim], str]) -> Callable[[TuningComparison, TuningRow], str]:
    """A cell of the claim against the reference; ``-`` on the reference's own row."""
    return lambda c, r: cell(c, r.claim) if r.claim is not None else "-"


def _heterogeneity(c: TuningComparison, k: Claim) -> str:
    h = k.heterogeneity
    if not finite(h.p_holm) and not finite(h.sd):
        return "-"
    head = "depends on the tuning: " if h.depends(c.alpha) else ""
    against = f"; {h.disagree} of {k.estimate.n} against" if h.disagree else ""
    return f"{head}SD {number(h.sd)} (p Holm {_p(h.p_holm)}{against})"


for _column in (
    Column("mean", lambda c: f"mean [{_pct(c)} CI]", lambda c, r: _interval(*_mean(r))),
    Column("per_tuning", lambda c: f"Δ vs {c.reference} per tuning", _claimed(lambda c, k: _per_tuning(k))),
    Column(
        "difference",
        lambda c: f"Δ [{_pct(c)} CI, tunings]",
        _claimed(lambda c, k: _interval(k.estimate.mean, k.estimate.low, k.estimate.high, signed=True)),
    ),
    Column("p_holm", lambda c: "p Holm", _claimed(lambda c, k: _p(k.p_holm))),
    Column("claim", lambda c: "claim", lambda c, r: r.claim.text if r.claim is not None else "(reference)"),
    Column("margin", lambda c: "m", _claimed(lambda c, k: number(k.margin) if finite(k.margin) else "-")),
    Column("heterogeneity", lambda c: "heterogeneity: SD of Δ across tunings", _claimed(_heterogeneity)),
):
    register_column(_column)


def _mean(r: TuningRow):
    e = r.across.estimate
    return e.mean, e.low, e.high


def _per_tuning(k: Claim) -> str:
    return ", ".join(number(d, signed=True) if finite(d) else "-" for d in k.per_tuning)


def headers(c: TuningComparison) -> List[str]:
    """Column headers: quantity, arm, then each registered column's."""
    return ["quantity", "arm"] + [col.header(c) for col in COLUMNS]


def cells(c: TuningComparison) -> List[List[str]]:
    """The text cells of each row, in :func:`headers` order."""
    return [[r.quantity, r.arm] + [col.cell(c, r) for col in COLUMNS] for r in c.rows]


def summary(c: TuningComparison) -> List[str]:
    """The claims in four groups: shown, shown not to differ by more than m, depending on the tuning, and
    not shown (inconclusive); a group with no claim says ``none``."""
    s = len(c.tunings)

    def named(rows: List[TuningRow]) -> str:
        return "; ".join(f"{r.arm} {_words(c, r)} ({r.quantity})" for r in rows) or "none"

    depend = "; ".join(f"{r.arm} vs {c.reference} ({r.quantity})" for r in c.depending()) or "none"
    return [
        f"Shown over {s} tunings (p Holm < {c.alpha:g}): {named(c.with_label(SHOWN))}.",
        f"Shown not to differ by more than m: {named(c.with_label(EQUIVALENT))}.",
        f"Depends on the tuning: {depend}.",
        f"Not shown either way (inconclusive): {len(c.with_label(INCONCLUSIVE))} of "
        f"{sum(1 for r in c.rows if r.claim is not None)} claims.",
    ]


def _words(c: TuningComparison, r: TuningRow) -> str:
    """A shown claim's words; an equivalence as "within ±m of <reference>"."""
    k = r.claim
    return f"within {margin_text(k.margin)} of {c.reference}" if k.label == EQUIVALENT else k.text


def caption(c: TuningComparison) -> List[str]:
    """The lines under the table: what each column is, and the notes."""
    pct = f"{c.confidence * 100:g}%"
    return [
        f"{len(c.tunings)} independent tunings per arm (each its own search, seeds, best configuration and final "
        "seeds); mean [CI]: Student t interval over the tuning means, which includes the variance of the tuning "
        "and of the seeds within it.",
        f"Δ per tuning: d_k, the mean over tuning k's matched seeds of arm − {c.reference}. Δ [{pct} CI]: Student t "
        f"over the S values d_k (S − 1 degrees of freedom); p Holm: that t-test, Holm-adjusted across the arms of "
        f"the quantity (the claim is tested at the level of the tuning, docs/comparing.md).",
        f"claim: shown (p Holm < {c.alpha:g}) in the quantity's words; 'no difference larger than ±m' when the "
        f"two one-sided tests at the margin m pass after Holm; otherwise inconclusive, with the smallest effect "
        f"this design detects at power 0.8. m: the study's margin, else 1 point of an accuracy or 10 % of "
        f"{c.reference}'s mean.",
        "heterogeneity: the between-tuning SD of the per-seed differences (random-effects ANOVA), the F-test's "
        "p across tunings (Holm across arms) and the tunings whose sign is against the estimate; 'depends on the "
        "tuning' when that test is significant. It is reported beside the claim, never instead of it.",
        *c.notes,
    ]


def to_markdown(c: TuningComparison) -> str:
    """A markdown table with its title, summary lines and caption."""
    title = f"### {c.study + ': ' if c.study else ''}{c.metric} and flatness vs {c.reference}, over tunings"
    table = markdown_table(headers(c), cells(c), left=2)
    lines = [title, ""] + [f"**{line}**" if i == 0 else line for i, line in enumerate(summary(c))]
    return "\n".join(lines + ["", table, ""] + [f"- {line}" for line in caption(c)]) + "\n"


def to_csv(c: TuningComparison) -> str:
    """:meth:`TuningComparison.frame` as CSV, full precision."""
    return c.frame().to_csv(index=False)


def render(c: TuningComparison, console: Any) -> None:
    """Print one rich table per quantity (numbers never split), the summary lines and the caption."""
    console.print(f"[bold]{c.study + ': ' if c.study else ''}{c.metric} and flatness vs {c.reference}[/bold]")
    head = headers(c)[1:]
    body = cells(c)
    for q in c.quantities:
        better = "higher is better" if c.higher_is_better[q] else "lower is better"
        if q.startswith((FLAT_PREFIX, AT_TARGET_PREFIX)):
            better = "lower = flatter"
        rows = [row[1:] for r, row in zip(c.rows, body) if r.quantity == q]
        print_table(
            console, make_table(head, rows, title_justify="left", title=f"{q} ({better})"), "use --format markdown"
        )
    for i, line in enumerate(summary(c)):
        console.print(line, style="bold" if i == 0 else None, markup=False, soft_wrap=True)
    for line in caption(c):
        console.print(line, soft_wrap=True, markup=False)


def format_tunings(c: TuningComparison, fmt: str) -> str:
    """``markdown`` or ``csv`` text.

    Raises:
        ConfigError: another format.
    """
    return write_format(c, fmt, {"markdown": to_markdown, "csv": to_csv}, " with tunings")
