"""Text outputs of a :class:`~flatlab.analysis.compare.table.Comparison`: markdown, LaTeX (booktabs),
CSV and a rich table, with one set of headers and cells (the registered columns,
:mod:`flatlab.analysis.compare.columns`) and one caption."""

from __future__ import annotations

import math
from typing import Any, Callable, List, Mapping, Optional, Sequence

from flatlab.analysis.compare.columns import COLUMNS, SIGNIFICANCE
from flatlab.analysis.compare.statistics import paired_power
from flatlab.analysis.compare.table import FEW_SEEDS, TARGETS, Comparison
from flatlab.analysis.console_table import make_table, print_table
from flatlab.analysis.sample import AT_TARGET_PREFIX, FLAT_PREFIX
from flatlab.errors import ConfigError

FORMATS = ("table", "markdown", "latex", "csv")


def single_tuning_note(study_file: Optional[str] = None) -> str:
    """The last caption line of a one-tuning table: what its intervals leave out, and the ``flatlab run``
    line that tunes independently, naming ``study_file`` (the launch's, where it recorded one)."""
    return (
        "These intervals cover the seed-to-seed variance of the one configuration each arm's search chose, not "
        "the variance of the search that chose it; a verdict that survives re-tuning needs independent tunings "
        f"(`flatlab run {study_file or '<study file>'} --tunings 3`)."
    )


def headers(comparison: Comparison) -> List[str]:
    """Column headers of the text tables (the markdown, LaTeX and rich outputs share them): ``quantity``,
    ``arm``, then each registered column's (:data:`~flatlab.analysis.compare.columns.COLUMNS`)."""
    return ["quantity", "arm"] + [column.header(comparison) for column in COLUMNS]


def cells(comparison: Comparison) -> List[List[str]]:
    """The text cells of each row, in :func:`headers` order."""
    return [[r.quantity, r.arm] + [column.cell(comparison, r) for column in COLUMNS] for r in comparison.rows]


def caption(comparison: Comparison) -> List[str]:
    """The lines under a table: what was compared, how, and what was left out."""
    c = comparison
    pct = f"{c.confidence * 100:g}%"
    value = "final-epoch" if c.rank_by == "final" else "best-epoch"
    over = (
        "final-stage trials (each arm's best configuration over fresh seeds)"
        if c.source == "final"
        else (
            f"each arm's best configuration (the best mean over its completed seeds of the {value} validation metric), "
            "all its seeds"
        )
    )
    higher = [q for q in c.quantities if c.higher_is_better[q]]
    lower = [q for q in c.quantities if not c.higher_is_better[q]]
    lines = [
        f"Over {over}. seeds: seeds with a value / seeds run; mean ± sample std (ddof 1); {pct} CI: Student t "
        "interval of the mean over seeds.",
        f"Δ: per-seed difference arm − {c.reference}, seeds matched by seed value, with its {pct} t interval; "
        f"d_z: Cohen's d_z effect size, mean(Δ) / std(Δ) over the matched seeds (sign of arm − {c.reference}); "
        f"p: two-sided paired t-test; seeds better: seeds where the arm beats {c.reference} : where {c.reference} "
        "beats the arm : ties.",
        "Better is "
        + "; ".join(
            x
            for x in (f"higher {', '.join(higher)}" if higher else "", f"lower {', '.join(lower)}" if lower else "")
            if x
        )
        + " (flat/*, flat_at_target/*: lower = flatter).",
        "Only completed trials give values; '-': no value, or fewer than 2 seeds (no std, CI or p).",
    ]
    clipped = list(dict.fromkeys(r.quantity for r in c.rows if r.clipped))
    if clipped:
        ranges = "; ".join(f"{q} {_range(c.support[q])}" for q in clipped)
        lines.append(
            f"CI of a mean clipped to the quantity's range where the t interval reaches outside it ({ranges}): "
            "the true mean lies in it too, so the coverage is unchanged; Δ intervals are not clipped."
        )
    if any(q in TARGETS for q in c.quantities):
        lines.append(
            "To-target rows: k/n reached counts every seed run (failed seeds did not reach it); "
            "their statistics and differences are over the seeds that reached it."
        )
    return lines + [single_tuning_note(c.study_file)] + multiplicity(c) + list(c.notes)


def _range(support: Any) -> str:
    """``in [0, 1]`` or ``≥ 0`` (no upper bound)."""
    low, high = support
    return f"≥ {low:g}" if math.isinf(high) else f"in [{low:g}, {high:g}]"


def multiplicity(comparison: Comparison) -> List[str]:
    """The caption lines on multiple testing and on few seeds: how many tests each quantity's family
    holds and that p is Holm-adjusted within it; which arms differ from the reference after the
    adjustment (or that none does); and, where the paired tests are over fewer than
    :data:`~flatlab.analysis.compare.table.FEW_SEEDS` seeds, their degrees of freedom and power."""
    c = comparison
    alpha = f"{c.alpha:g}"
    families = {q: c.family(q) for q in c.quantities}
    tested = {q: rows for q, rows in families.items() if rows}
    if not tested:
        return [
            "No paired test: every arm has fewer than 2 seeds matched with "
            + c.reference
            + " (or all its differences are equal)."
        ]
    sizes = sorted({len(rows) for rows in tested.values()})
    per_family = (
        f"{sizes[0]} test{'s' if sizes[0] > 1 else ''}, the arms' paired tests against {c.reference}"
        if len(sizes) == 1
        else f"tests, the arms' paired tests against {c.reference} ("
        + ", ".join(f"{q}: {len(rows)}" for q, rows in tested.items())
        + ")"
    )
    total = sum(len(rows) for rows in tested.values())
    lines = [
        f"Multiple comparisons: each quantity is one family of {per_family}; p Holm is p adjusted by Holm's (1979) "
        "step-down method within its quantity, which keeps the chance of any false 'significant' in that family at "
        f"{alpha}; {SIGNIFICANCE} '*': adjusted p < {alpha}, 'ns': not. {len(tested)} "
        f"quantit{'ies' if len(tested) > 1 else 'y'}, {total} test{'s' if total != 1 else ''} in all, each quantity "
        "adjusted on its own: read the adjusted p, not the raw p one by one.",
    ]
    hits = {q: [r.arm for r in rows if c.significant(r)] for q, rows in tested.items()}
    if not any(hits.values()):
        lines.append(
            f"No difference from {c.reference} is significant after Holm's adjustment: every adjusted p >= "
            f"{alpha} ({total} test{'s' if total != 1 else ''})."
        )
    else:
        lines.append(
            f"Significant after Holm's adjustment (adjusted p < {alpha}), against {c.reference}: "
            + "; ".join(f"{q}: {', '.join(arms) or 'none'}" for q, arms in hits.items())
            + "."
        )
    ns = sorted({r.diff.estimate.n for rows in tested.values() for r in rows})
    if ns[0] < FEW_SEEDS:
        n = ns[0]
        span = f"{n}" if len(ns) == 1 else f"{n} to {ns[-1]}"
        lines.append(
            f"Few seeds: the paired tests are over n = {span} seeds. A paired t-test on n seeds has n − 1 degrees of "
            f"freedom and low power: with n = {n} it detects a true effect of d_z = 1 with probability "
            f"{paired_power(n, 1.0, c.alpha):.2f} at {alpha} before any adjustment, so 'ns' is not evidence of no "
            "difference, and d_z itself is imprecise; more final seeds (e.g. 10) are needed to tell."
        )
    return lines


def heading(comparison: Comparison) -> str:
    """``"<study>: <metric> and flatness vs <reference>"``; without ``and flatness`` when the table has no
    flatness quantity (a study that measures none)."""
    c = comparison
    flat = any(q.startswith(("flat/", "flat_at_target/")) for q in c.quantities)
    return f"{c.study + ': ' if c.study else ''}{c.metric}{' and flatness' if flat else ''} vs {c.reference}"


def to_markdown(comparison: Comparison) -> str:
    """A GitHub markdown table (title, the :attr:`~Comparison.warnings` as quoted bold lines, table, then
    the caption as a list); numbers as printed by :func:`cells`, so they can be parsed back."""
    title = f"### {heading(comparison)}"
    table = markdown_table(headers(comparison), cells(comparison), left=2)
    warned = [f"> **{line}**\n" for line in comparison.warnings]
    return "\n".join([title, ""] + warned + [table, ""] + [f"- {line}" for line in caption(comparison)]) + "\n"


def markdown_table(head: Sequence[str], body: Sequence[Sequence[str]], left: int = 1) -> str:
    """A pipe table, the first ``left`` columns left-aligned and the rest right; ``|`` in a cell is escaped."""

    def line(cells_: Sequence[str]) -> str:
        return "| " + " | ".join(str(x).replace("|", "\\|") for x in cells_) + " |"

    rule = "|" + "|".join(["---"] * left + ["---:"] * (len(head) - left)) + "|"
    return "\n".join([line(head), rule] + [line(r) for r in body])


_LATEX = {
    "\\": r"\textbackslash{}",
    "_": r"\_",
    "%": r"\%",
    "&": r"\&",
    "#": r"\#",
    "$": r"\$",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "≥": r"$\geq$",
    "Δ": r"$\Delta$",
    "−": "-",
}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (``±`` and ``Δ`` as math)."""
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


def latex_table(
    head: Sequence[str], body: Sequence[Sequence[str]], caption_text: str = "", groups: Sequence[int] = ()
) -> str:
    """A booktabs ``table`` environment (``\\usepackage{booktabs}``); ``groups``: row indices
    before which a ``\\midrule`` goes."""
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\begin{tabular}{ll" + "r" * (len(head) - 2) + "}",
        r"\toprule",
        " & ".join(latex_escape(h) for h in head) + r" \\",
        r"\midrule",
    ]
    for i, r in enumerate(body):
        if i in groups and i:
            lines.append(r"\midrule")
        lines.append(" & ".join(latex_escape(c) for c in r) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption_text:
        lines.append(r"\caption{" + latex_escape(caption_text) + "}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def to_latex(comparison: Comparison) -> str:
    """A booktabs table, one block per quantity, the caption as ``\\caption`` (the
    :attr:`~Comparison.warnings` first)."""
    body = cells(comparison)
    starts = [i for i, r in enumerate(comparison.rows) if i == 0 or r.quantity != comparison.rows[i - 1].quantity]
    return latex_table(headers(comparison), body, " ".join([*comparison.warnings, *caption(comparison)]), starts)


def to_csv(comparison: Comparison) -> str:
    """:meth:`Comparison.frame` as CSV, full precision."""
    return comparison.frame().to_csv(index=False)


def render(comparison: Comparison, console: Any) -> None:
    """Print the table with rich: a title, the :attr:`~Comparison.warnings` (bold), one table per
    quantity (one family of tests; the quantity's name as its title), the caption under them. Numbers,
    intervals and arm names are never split (:mod:`flatlab.analysis.console_table`); a table wider than
    the console says so and points to ``--format markdown``."""
    c = comparison
    console.print(f"[bold]{heading(c)}[/bold]")
    for line in c.warnings:
        console.print(line, style="bold yellow", markup=False, soft_wrap=True)
    head = headers(c)[1:]
    body = cells(c)
    for q in c.quantities:
        better = (
            "higher is better"
            if c.higher_is_better[q]
            else ("lower = flatter" if q.startswith((FLAT_PREFIX, AT_TARGET_PREFIX)) else "lower is better")
        )
        tests = len(c.family(q))
        rows = [row[1:] for r, row in zip(c.rows, body) if r.quantity == q]
        tested = f"{tests} test{'s' if tests != 1 else ''}, Holm-adjusted" if tests else "no paired test"
        table = make_table(head, rows, title_justify="left", title=f"{q} ({better}; {tested})")
        print_table(console, table, "use --format markdown")
    for line in caption(comparison):
        console.print(line, soft_wrap=True)


def write_format(table: Any, fmt: str, writers: Mapping[str, Callable[[Any], str]], context: str = "") -> str:
    """``writers[fmt](table)``: the one dispatch of ``--format`` for every table kind.

    Raises:
        ConfigError: ``fmt`` not a key of ``writers``; the message names the allowed formats, ``table`` (the
            console's) included, and ``context`` (e.g. ``" with tunings"``).
    """
    if fmt not in writers:
        allowed = [f for f in FORMATS if f in writers or f == "table"]
        raise ConfigError(f"--format {fmt!r} is not supported{context}; expected one of {', '.join(allowed)}")
    return writers[fmt](table)


def format_comparison(comparison: Comparison, fmt: str) -> str:
    """``markdown``, ``latex`` or ``csv`` text.

    Raises:
        ConfigError: another format.
    """
    return write_format(comparison, fmt, {"markdown": to_markdown, "latex": to_latex, "csv": to_csv})
