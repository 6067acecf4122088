"""The columns of ``flatlab compare``'s table: each statistic is one registered :class:`Column`.

A column is a header, the text of its cell in one row and the numbers it adds to the row of the table's
CSV frame. The renderers (markdown, LaTeX, rich: :mod:`flatlab.analysis.compare.text`; CSV:
:meth:`~flatlab.analysis.compare.table.Comparison.frame`) loop over :data:`COLUMNS`, so a new statistic
is one :func:`register_column` call. Its functions get the :class:`~flatlab.analysis.compare.table.Comparison`
and one :class:`~flatlab.analysis.compare.table.Row`: the arm's t-estimate over seeds (``summary``), its
paired difference against the reference (``diff``, ``None`` on the reference's row), and the per-seed
values themselves (``values`` and ``reference_values``, ``{seed: value}``), from which a new statistic
is computed. The table over tunings keeps its own list of the same columns (:mod:`flatlab.analysis.tunings_text`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from flatlab.analysis.compare.statistics import finite
from flatlab.analysis.sample import TARGETS
from flatlab.errors import ConfigError


def _no_fields(table: Any, row: Any) -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True)
class Column:
    """One column of a table: ``name`` its key, ``header(table)`` its title, ``cell(table, row)`` its text
    for one row and ``fields(table, row)`` the numbers it adds to that row of the table's CSV frame
    (``{field: value}``; none by default)."""

    name: str
    header: Callable[[Any], str]
    cell: Callable[[Any, Any], str]
    fields: Callable[[Any, Any], Mapping[str, Any]] = _no_fields


def insert_column(columns: List[Column], column: Column, after: Optional[str] = None) -> Column:
    """Add ``column`` to the list ``columns``, at the end or after the column named ``after``; returns it.

    Raises:
        ConfigError: a column of that name exists, or ``after`` names none (the message lists the columns).
    """
    names = [c.name for c in columns]
    if column.name in names:
        raise ConfigError(f"a column named {column.name!r} is registered already; columns: {', '.join(names)}")
    if after is not None and after not in names:
        raise ConfigError(f"after={after!r} names no column; columns: {', '.join(names)}")
    columns.insert(names.index(after) + 1 if after is not None else len(columns), column)
    return column


def number(v: Any, signed: bool = False) -> str:
    """4 significant digits, the whole integer part always (no exponent for step counts); ``-`` for NaN."""
    if not finite(v):
        return "-"
    v = float(v)
    digits = max(4, int(math.floor(math.log10(abs(v)))) + 1 if v else 1)
    return f"{v:{'+' if signed else ''}.{digits}g}"


def p_text(v: float) -> str:
    """A p-value with 3 significant digits; ``-`` for NaN."""
    return f"{v:.3g}" if finite(v) else "-"


COLUMNS: List[Column] = []
"""``flatlab compare``'s columns in order, after ``quantity`` and ``arm``."""


def register_column(column: Column, *, after: Optional[str] = None) -> Column:
    """Add ``column`` to :data:`COLUMNS` (:func:`insert_column`): every output of ``flatlab compare`` shows it.

    Raises:
        ConfigError: a column of that name exists, or ``after`` names none.
    """
    return insert_column(COLUMNS, column, after)


def frame_fields(table: Any, row: Any) -> Dict[str, Any]:
    """The CSV frame's numbers of ``row``: every registered column's :attr:`Column.fields`, in order."""
    out: Dict[str, Any] = {}
    for column in COLUMNS:
        out.update(column.fields(table, row))
    return out


# ---- the built-in columns --------------------------------------------------------------------------

NAN = float("nan")
SIGNIFICANCE = "sig."
"""The marker column: ``*`` where the Holm-adjusted p is below ``alpha = 1 − confidence``, ``ns`` where
it is not, ``-`` without a test (the caption says so)."""


def _pct(c: Any) -> str:
    return f"{c.confidence * 100:g}%"


def _paired(cell: Callable[[Any, Any], str]) -> Callable[[Any, Any], str]:
    """A cell of the paired difference against the reference; ``-`` on the reference's own row."""
    return lambda c, r: cell(c, r) if r.diff is not None else "-"


def _diff(get: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A number of the paired difference; NaN on the reference's own row."""
    return lambda r: get(r.diff) if r.diff is not None else NAN


def _seeds(c: Any, r: Any) -> str:
    return f"{r.summary.n}/{r.runs}" + (" reached" if r.quantity in TARGETS else "")


def _spread(c: Any, r: Any) -> str:
    s = r.summary
    return "-" if s.n == 0 else number(s.mean) + ("" if not finite(s.std) else f" ± {number(s.std)}")


def _interval(low: float, high: float, signed: bool = False) -> str:
    return f"[{number(low, signed=signed)}, {number(high, signed=signed)}]" if finite(low) else "-"


def _better(c: Any, r: Any) -> str:
    d = r.diff
    return f"{d.arm_better}:{d.ref_better}:{d.ties}" if d.estimate.n else "-"


for _column in (
    Column("seeds", lambda c: "seeds", _seeds, lambda c, r: {"runs": r.runs, "n": r.summary.n}),
    Column("mean", lambda c: "mean ± std", _spread, lambda c, r: {"mean": r.summary.mean, "std": r.summary.std}),
    Column(
        "ci",
        lambda c: f"{_pct(c)} CI",
        lambda c, r: _interval(r.summary.low, r.summary.high),
        lambda c, r: {"ci_low": r.summary.low, "ci_high": r.summary.high},
    ),
    Column(
        "diff",
        lambda c: f"Δ vs {c.reference}",
        _paired(lambda c, r: number(r.diff.estimate.mean, signed=True)),
        lambda c, r: {
            "diff_n": _diff(lambda d: d.estimate.n)(r),
            "diff_mean": _diff(lambda d: d.estimate.mean)(r),
            "diff_std": _diff(lambda d: d.estimate.std)(r),
        },
    ),
    Column(
        "diff_ci",
        lambda c: f"Δ {_pct(c)} CI",
        _paired(lambda c, r: _interval(r.diff.estimate.low, r.diff.estimate.high, signed=True)),
        lambda c, r: {"diff_low": _diff(lambda d: d.estimate.low)(r), "diff_high": _diff(lambda d: d.estimate.high)(r)},
    ),
    Column(
        "d_z",
        lambda c: "d_z",
        _paired(lambda c, r: f"{r.diff.d_z:+.2f}" if finite(r.diff.d_z) else "-"),
        lambda c, r: {"d_z": _diff(lambda d: d.d_z)(r)},
    ),
    Column(
        "p",
        lambda c: "p (paired t)",
        _paired(lambda c, r: p_text(r.diff.p)),
        lambda c, r: {"p": _diff(lambda d: d.p)(r)},
    ),
    Column(
        "p_holm",
        lambda c: "p Holm",
        _paired(lambda c, r: p_text(r.p_holm)),
        lambda c, r: {"p_holm": r.p_holm, "tests": len(c.family(r.quantity)) if r.diff is not None else NAN},
    ),
    Column(
        "significant",
        lambda c: SIGNIFICANCE,
        _paired(lambda c, r: {True: "*", False: "ns", None: "-"}[c.significant(r)]),
        lambda c, r: {"significant": c.significant(r)},
    ),
    Column(
        "seeds_better",
        lambda c: f"seeds better arm:{c.reference}:tie",
        _paired(_better),
        lambda c, r: {
            "arm_better": _diff(lambda d: d.arm_better)(r),
            "ref_better": _diff(lambda d: d.ref_better)(r),
            "ties": _diff(lambda d: d.ties)(r),
        },
    ),
):
    register_column(_column)
