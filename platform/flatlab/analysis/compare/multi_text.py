"""Text outputs of a :class:`~flatlab.analysis.compare.multi.MultiSummary`: markdown, LaTeX, CSV and a
rich table, with one set of headers, cells and caption (as :mod:`~flatlab.analysis.compare.text` for a
single study)."""

from __future__ import annotations

from typing import Any, List

from flatlab.analysis.compare.columns import number
from flatlab.analysis.compare.multi import MultiSummary, wins
from flatlab.analysis.compare.statistics import finite
from flatlab.analysis.compare.text import latex_table, markdown_table, write_format
from flatlab.analysis.console_table import make_table, print_table
from flatlab.lazy import lazy

pd = lazy("pandas")


def title(summary: MultiSummary) -> str:
    """The table's title: the workloads and the reference arm."""
    return (
        f"{len(summary.workloads)} workloads ({', '.join(summary.workloads)}): test metric and flatness "
        f"relative to {summary.reference}"
    )


def headers(summary: MultiSummary) -> List[str]:
    """Column headers of the text tables."""
    ref = summary.reference
    return [
        "arm",
        "workload",
        "test metric",
        "mean",
        "rank",
        f"Δ vs {ref}",
        f"ratio vs {ref}",
        "test error",
        "r (error / best)",
    ] + [f"{m} / {ref}" for m in summary.measures]


def cells(summary: MultiSummary) -> List[List[str]]:
    """The text cells of each (arm, workload) row, in :func:`headers` order; ``-`` where there is no value
    and in the reference arm's own relative columns."""
    out = []
    for row in summary.frame.to_dict("records"):
        rank = "-" if pd.isna(row["rank"]) else f"{int(row['rank'])}/{row['ranked']}"
        if row["arm"] == summary.reference:
            relative = ["-", "-"] + ["-"] * len(summary.measures)
        else:
            relative = [number(row["diff"], signed=True), number(row["ratio"])] + [
                number(row[f"{m} ratio"]) for m in summary.measures
            ]
        out.append(
            [
                row["arm"],
                row["workload"],
                row["metric"],
                number(row["mean"]),
                rank,
                *relative[:2],
                number(row["error"]),
                number(row["r"]) if finite(row["r"]) else "-",
                *relative[2:],
            ]
        )
    return out


def caption(summary: MultiSummary) -> List[str]:
    """The lines under the table: what each column is, what '-' means, and each arm's share of wins."""
    ref = summary.reference
    won = wins(summary)
    lines = [
        "One workload per study. mean: of the test metric over the study's compared seeds (its final-stage trials, "
        "else each arm's best configuration with its seeds, as `flatlab compare STUDY`); rank: among the arms with a "
        "value in that workload (1 = best by the metric's direction; tied arms share the best rank), of how many; Δ "
        f"/ ratio: the arm's mean minus / over {ref}'s.",
        "test error: 1 − metric for an accuracy-like metric, the metric itself for a loss; r: the arm's test error "
        "over the workload's best arm's (1 = best), the performance ratio of the profiles (Dolan & Moré 2002, as "
        "AlgoPerf).",
    ]
    if summary.measures:
        lines.append(
            f"flat/* / {ref}: the arm's mean flatness over {ref}'s, for the measures recorded in every study "
            f"(< 1: flatter than {ref})."
        )
    lines += [
        "A ratio needs both means > 0; '-': no value (the arm is not in that study, or none of its seeds gave one), "
        "counted as not solved (r = inf) in the profiles.",
        "These compare means, without tests: `flatlab compare STUDY` has each workload's paired tests, Holm-adjusted.",
        f"Share of the {len(summary.workloads)} workloads where the arm has the lowest test error (ρ(1)): "
        + ", ".join(f"{a} {won[a]:.2g}" for a in summary.arms)
        + ".",
    ]
    if summary.averages:
        lines.append(
            f"Average of the test metric over the {len(summary.workloads)} workloads (the AVG column of a GLUE "
            "table; '-': an arm without a value in some workload): "
            + ", ".join(f"{a} {number(summary.averages[a])}" for a in summary.arms)
            + "."
        )
    return lines + list(summary.notes)


def to_markdown(summary: MultiSummary) -> str:
    """A GitHub markdown table: title, table, the caption as a list."""
    table = markdown_table(headers(summary), cells(summary), left=3)
    return "\n".join([f"### {title(summary)}", "", table, ""] + [f"- {line}" for line in caption(summary)]) + "\n"


def to_latex(summary: MultiSummary) -> str:
    """A booktabs table, one block per arm, the caption as ``\\caption``."""
    body = cells(summary)
    starts = [i for i, r in enumerate(body) if i == 0 or r[0] != body[i - 1][0]]
    return latex_table(headers(summary), body, " ".join(caption(summary)), starts)


def to_csv(summary: MultiSummary) -> str:
    """:attr:`MultiSummary.frame` as CSV, full precision (``inf``: not solved; empty: no value)."""
    return summary.frame.to_csv(index=False)


def render(summary: MultiSummary, console: Any) -> None:
    """Print the table with rich, one section per arm, the caption under it; no cell is split
    (:mod:`flatlab.analysis.console_table`)."""
    body = cells(summary)
    starts = [i for i, row in enumerate(body) if i == 0 or row[0] != body[i - 1][0]]
    rows = [[row[0] if i in starts else ""] + row[1:] for i, row in enumerate(body)]
    print_table(
        console, make_table(headers(summary), rows, sections=starts, title=title(summary)), "use --format markdown"
    )
    for line in caption(summary):
        console.print(line, soft_wrap=True)


def format_summary(summary: MultiSummary, fmt: str) -> str:
    """``markdown``, ``latex`` or ``csv`` text.

    Raises:
        ConfigError: another format.
    """
    return write_format(summary, fmt, {"markdown": to_markdown, "latex": to_latex, "csv": to_csv})
