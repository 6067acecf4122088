"""Text outputs of a :class:`~flatlab.analysis.tunings.TuningComparison`: markdown, CSV and a rich table
per quantity, with one set of headers, cells, caption and summary line."""

from __future__ import annotations

from typing import Any, List

from flatlab.analysis.compare.statistics import finite
from flatlab.analysis.compare.text import markdown_table, number, write_format
from flatlab.analysis.console_table import make_table, print_table
from flatlab.analysis.sample import AT_TARGET_PREFIX, FLAT_PREFIX
from flatlab.analysis.tunings import TuningComparison, TuningRow


def headers(c: TuningComparison) -> List[str]:
    """Column headers: quantity, arm, the tuning means, their median, the two-level interval, the tuning's
    share of the variance, and against the reference each tuning's Δ (Holm p), the across-tuning Δ with
    its two-level interval, the tuning's share of Δ's variance and the verdict."""
    pct = f"{c.confidence * 100:g}%"
    ref = c.reference
    return [
        "quantity",
        "arm",
        "mean per tuning",
        "median",
        f"mean [{pct} CI, tunings+seeds]",
        "tuning share",
        f"Δ vs {ref} per tuning (p Holm)",
        f"Δ [{pct} CI]",
        "Δ tuning share",
        "verdict",
    ]


def _interval(mean: float, low: float, high: float, signed: bool = False) -> str:
    if not finite(mean):
        return "-"
    head = number(mean, signed=signed)
    return head + (f" [{number(low, signed=signed)}, {number(high, signed=signed)}]" if finite(low) else "")


def _share(v: float) -> str:
    return f"{100 * v:.0f}%" if finite(v) else "-"


def _cells(c: TuningComparison, r: TuningRow) -> List[str]:
    a = r.across
    means = ", ".join(number(m) for m in a.tuning_means)
    row = [r.quantity, r.arm, means, number(a.median)]
    row += [_interval(a.estimate.mean, a.estimate.low, a.estimate.high), _share(a.components.share)]
    if r.paired is None:
        return row + ["-", "-", "-", "(reference)"]
    per = ", ".join(
        f"{number(p.estimate.mean, signed=True)} ({f'{ph:.2g}' if finite(ph) else '-'})"
        for p, ph in zip(r.paired.per_tuning, r.p_holm)
    )
    d = r.paired.across.estimate
    verdict = r.verdict.text if r.verdict is not None else "-"
    return row + [per, _interval(d.mean, d.low, d.high, signed=True), _share(r.paired.across.components.share), verdict]


def cells(c: TuningComparison) -> List[List[str]]:
    """The text cells of each row, in :func:`headers` order."""
    return [_cells(c, r) for r in c.rows]


def summary(c: TuningComparison) -> str:
    """One line naming the claims that hold in every tuning (``"none"`` where no claim does)."""
    claims = []
    for r in c.holding():
        better = c.higher_is_better[r.quantity] == (r.verdict.direction > 0)
        flat = r.quantity.startswith((FLAT_PREFIX, AT_TARGET_PREFIX))
        word = ("flatter" if better else "sharper") if flat else ("better" if better else "worse")
        claims.append(f"{r.arm} {word} than {c.reference} ({r.quantity})")
    s = len(c.tunings)
    return f"Holds in every one of {s} tunings: " + ("; ".join(claims) if claims else "no claim") + "."


def caption(c: TuningComparison) -> List[str]:
    """The lines under the table: what each column is, and the notes."""
    pct = f"{c.confidence * 100:g}%"
    return [
        f"{len(c.tunings)} independent tunings per arm (each its own search, seeds, best configuration and final "
        "seeds); mean per tuning: over that tuning's final seeds.",
        f"{pct} CI (tunings+seeds): Student t interval over the tuning means (S − 1 degrees of freedom), which "
        "includes the variance of the tuning and of the seeds within it; tuning share: the one-way random-effects "
        "estimate of the tuning's share of the variance (docs/comparing.md).",
        f"Δ: per-seed difference arm − {c.reference}, seeds matched within a tuning; p Holm: each tuning's paired "
        f"t-test, Holm-adjusted within that tuning and quantity; verdict: holds in every tuning (same sign, "
        f"p Holm < {c.alpha:g} in all), depends on the tuning (k of S agree), or no difference found.",
        *c.notes,
    ]


def to_markdown(c: TuningComparison) -> str:
    """A markdown table with its title, summary line and caption."""
    title = f"### {c.study + ': ' if c.study else ''}{c.metric} and flatness vs {c.reference}, over tunings"
    table = markdown_table(headers(c), cells(c), left=2)
    return "\n".join([title, "", f"**{summary(c)}**", "", table, ""] + [f"- {line}" for line in caption(c)]) + "\n"


def to_csv(c: TuningComparison) -> str:
    """:meth:`TuningComparison.frame` as CSV, full precision."""
    return c.frame().to_csv(index=False)


def render(c: TuningComparison, console: Any) -> None:
    """Print one rich table per quantity (numbers never split), the summary line and the caption."""
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
    console.print(summary(c), style="bold", markup=False, soft_wrap=True)
    for line in caption(c):
        console.print(line, soft_wrap=True, markup=False)


def format_tunings(c: TuningComparison, fmt: str) -> str:
    """``markdown`` or ``csv`` text.

    Raises:
        ConfigError: another format.
    """
    return write_format(c, fmt, {"markdown": to_markdown, "csv": to_csv}, " with tunings")
