"""Text outputs of a :class:`~flatlab.tracking.compare.table.Comparison`: markdown, LaTeX (booktabs),
CSV and a rich table, with one set of headers, cells and caption."""

from __future__ import annotations

import math
from typing import Any, List, Sequence

from flatlab.errors import ConfigError
from flatlab.tracking.compare.statistics import finite
from flatlab.tracking.compare.table import TARGETS, Comparison

FORMATS = ("table", "markdown", "latex", "csv")


def number(v: Any, signed: bool = False) -> str:
    """4 significant digits, the whole integer part always (no exponent for step counts); ``-`` for NaN."""
    if not finite(v):
        return "-"
    v = float(v)
    digits = max(4, int(math.floor(math.log10(abs(v)))) + 1 if v else 1)
    return f"{v:{'+' if signed else ''}.{digits}g}"


def _p(v: float) -> str:
    return f"{v:.3g}" if finite(v) else "-"


def headers(comparison: Comparison) -> List[str]:
    """Column headers of the text tables (the markdown, LaTeX and rich outputs share them)."""
    pct = f"{comparison.confidence * 100:g}%"
    ref = comparison.reference
    return ["quantity", "arm", "seeds", "mean ± std", f"{pct} CI", f"Δ vs {ref}", f"Δ {pct} CI", "p (paired t)",
            f"seeds better arm:{ref}:tie"]


def cells(comparison: Comparison) -> List[List[str]]:
    """The text cells of each row, in :func:`headers` order."""
    out = []
    for r in comparison.rows:
        s, d = r.summary, r.diff
        seeds = f"{s.n}/{r.runs}" + (" reached" if r.quantity in TARGETS else "")
        spread = "-" if s.n == 0 else number(s.mean) + ("" if not finite(s.std) else f" ± {number(s.std)}")
        ci = f"[{number(s.low)}, {number(s.high)}]" if finite(s.low) else "-"
        if d is None:
            delta = dci = p = fav = "-"
        else:
            e = d.estimate
            delta = number(e.mean, signed=True)
            dci = f"[{number(e.low, signed=True)}, {number(e.high, signed=True)}]" if finite(e.low) else "-"
            p = _p(d.p)
            fav = f"{d.arm_better}:{d.ref_better}:{d.ties}" if e.n else "-"
        out.append([r.quantity, r.arm, seeds, spread, ci, delta, dci, p, fav])
    return out


def caption(comparison: Comparison) -> List[str]:
    """The lines under a table: what was compared, how, and what was left out."""
    c = comparison
    pct = f"{c.confidence * 100:g}%"
    value = "final-epoch" if c.rank_by == "final" else "best-epoch"
    over = "final-stage trials (each arm's best configuration over fresh seeds)" if c.source == "final" else (
        f"each arm's best configuration (the best mean over its completed seeds of the {value} validation metric), "
        "all its seeds")
    higher = [q for q in c.quantities if c.higher_is_better[q]]
    lower = [q for q in c.quantities if not c.higher_is_better[q]]
    lines = [
        f"Over {over}. seeds: seeds with a value / seeds run; mean ± sample std (ddof 1); {pct} CI: Student t "
        "interval of the mean over seeds.",
        f"Δ: per-seed difference arm − {c.reference}, seeds matched by seed value, with its {pct} t interval; "
        f"p: two-sided paired t-test; seeds better: seeds where the arm beats {c.reference} : where {c.reference} "
        "beats the arm : ties.",
        "Better is " + "; ".join(x for x in (f"higher {', '.join(higher)}" if higher else "",
                                            f"lower {', '.join(lower)}" if lower else "") if x) + " (flat/*: lower = flatter).",
        "Only completed trials give values; '-': no value, or fewer than 2 seeds (no std, CI or p).",
    ]
    if any(q in TARGETS for q in c.quantities):
        lines.append("To-target rows: k/n reached counts every seed run (failed seeds did not reach it); "
                     "their statistics and differences are over the seeds that reached it.")
    return lines + list(c.notes)


def to_markdown(comparison: Comparison) -> str:
    """A GitHub markdown table (title, table, then the caption as a list); numbers as printed by
    :func:`cells`, so they can be parsed back."""
    title = f"### {comparison.study + ': ' if comparison.study else ''}{comparison.metric} and flatness vs {comparison.reference}"
    table = markdown_table(headers(comparison), cells(comparison), left=2)
    return "\n".join([title, "", table, ""] + [f"- {line}" for line in caption(comparison)]) + "\n"


def markdown_table(head: Sequence[str], body: Sequence[Sequence[str]], left: int = 1) -> str:
    """A pipe table, the first ``left`` columns left-aligned and the rest right; ``|`` in a cell is escaped."""
    def line(cells_: Sequence[str]) -> str:
        return "| " + " | ".join(str(x).replace("|", "\\|") for x in cells_) + " |"

    rule = "|" + "|".join(["---"] * left + ["---:"] * (len(head) - left)) + "|"
    return "\n".join([line(head), rule] + [line(r) for r in body])


_LATEX = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "Δ": r"$\Delta$", "−": "-"}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (``±`` and ``Δ`` as math)."""
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


def latex_table(head: Sequence[str], body: Sequence[Sequence[str]], caption_text: str = "", groups: Sequence[int] = ()) -> str:
    """A booktabs ``table`` environment (``\\usepackage{booktabs}``); ``groups``: row indices
    before which a ``\\midrule`` goes."""
    lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{ll" + "r" * (len(head) - 2) + "}", r"\toprule",
             " & ".join(latex_escape(h) for h in head) + r" \\", r"\midrule"]
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
    """A booktabs table, one block per quantity, the caption as ``\\caption``."""
    body = cells(comparison)
    starts = [i for i, r in enumerate(comparison.rows) if i == 0 or r.quantity != comparison.rows[i - 1].quantity]
    return latex_table(headers(comparison), body, " ".join(caption(comparison)), starts)


def to_csv(comparison: Comparison) -> str:
    """:meth:`Comparison.frame` as CSV, full precision."""
    return comparison.frame().to_csv(index=False)


def render(comparison: Comparison, console: Any) -> None:
    """Print the table with rich: one section per quantity, the caption under it."""
    from rich.table import Table

    title = f"{comparison.study + ': ' if comparison.study else ''}{comparison.metric} and flatness vs {comparison.reference}"
    table = Table(*headers(comparison), title=title)
    for col in table.columns:
        col.overflow = "fold"
    for i, (r, row) in enumerate(zip(comparison.rows, cells(comparison))):
        first = i == 0 or r.quantity != comparison.rows[i - 1].quantity
        if first and i:
            table.add_section()
        table.add_row(*([row[0] if first else ""] + row[1:]))
    console.print(table)
    for line in caption(comparison):
        console.print(line, soft_wrap=True)


def format_comparison(comparison: Comparison, fmt: str) -> str:
    """``markdown``, ``latex`` or ``csv`` text.

    Raises:
        ConfigError: another format.
    """
    writers = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv}
    if fmt not in writers:
        raise ConfigError(f"--format {fmt!r} is not supported; expected one of {', '.join(FORMATS)}")
    return writers[fmt](comparison)
