"""Rich tables whose numbers are never split or cut, at any terminal width (``flatlab results``, the
best-trial table of ``flatlab run``, ``flatlab compare``).

A *whole* column (numbers, intervals, arm names, one ``name=value`` param per line) never wraps: it is
as wide as its longest cell line and its header. When the table is too wide for the console, those
headers go on several lines, broken at spaces and after ``/`` and ``:`` (``best/val/accuracy`` over ``0.9123``
reads ``best/`` ``val/`` ``accuracy``), never inside a word. The other columns (ids, statuses, times,
messages) fold. A table that cannot fit even so is printed at the width it needs (nothing cut; the
terminal wraps its lines) with one line under it saying so (:func:`print_table`).
"""

from __future__ import annotations

import re
from typing import Any, Collection, List, Sequence

TEXT_MIN = 4  # characters a folding column keeps when rich shrinks it (fewer: unreadable)


def make_table(head: Sequence[str], rows: Sequence[Sequence[str]], whole: Collection[int], **table_args: Any) -> Any:
    """A ``rich.table.Table`` of ``rows`` (strings; ``\\n`` separates lines of a cell) under ``head``.

    Args:
        head: the column headers.
        rows: the cells, one sequence per row, as long as ``head``.
        whole: indices of the columns kept whole (``no_wrap``; see the module docstring).
        table_args: passed to ``Table`` (``title``, ``caption``, ...).
    """
    from rich.table import Table

    table = Table(**table_args)
    for i, header in enumerate(head):
        table.add_column(header, no_wrap=True) if i in whole else table.add_column(header, overflow="fold")
    for r in rows:
        table.add_row(*r)
    return table


def needed_width(table: Any) -> int:
    """Columns ``table`` (from :func:`make_table`) needs so that no whole column is cut: whole columns at
    their width, folding columns at :data:`TEXT_MIN` characters (or their longest line, if shorter),
    plus cell padding and borders."""
    content = 0
    for column in table.columns:
        lines = [line for cell in [column.header, *column.cells] for line in str(cell).splitlines()]
        longest = max((_cells(line) for line in lines), default=0)
        content += longest if column.no_wrap else min(longest, TEXT_MIN)
    _, right, _, left = table.padding
    padding = (left + right) * len(table.columns)
    borders = (2 if table.box and table.show_edge else 0) + (len(table.columns) - 1 if table.box else 0)
    return content + padding + borders


def print_table(console: Any, table: Any, hint: str) -> None:
    """Print ``table`` (from :func:`make_table`) on ``console``. When it needs more columns than the
    console has (:func:`needed_width`), the headers of its whole columns go on several lines; if it
    still does not fit, it is printed at the width it needs (nothing cut; the terminal wraps its lines)
    with, under it, ``the table is wider than this terminal (N columns): widen it, or <hint>``."""
    if needed_width(table) > console.width:
        for column in table.columns:
            if column.no_wrap:
                header = str(column.header)
                width = max([_longest_line(c) for c in column.cells] + [_cells(p) for p in _header_parts(header)])
                column.header = _wrap_header(header, width)
    need = needed_width(table)
    if need <= console.width:
        console.print(table)
        return
    table.width = need
    console.print(table, crop=False)
    console.print(f"the table is wider than this terminal ({need} columns): widen it, or {hint}", soft_wrap=True)


def _cells(text: str) -> int:
    """Terminal cells ``text`` takes (rich's measure: wide characters count 2)."""
    from rich.cells import cell_len

    return cell_len(text)


def _longest_line(cell: str) -> int:
    return max((_cells(line) for line in str(cell).splitlines()), default=0)


def _header_parts(header: str) -> List[str]:
    """``best/val/accuracy`` -> ``best/``, ``val/``, ``accuracy``; ``p (paired t)`` -> ``p``, ``(paired``,
    ``t)``; ``arm:sgd:tie`` -> ``arm:``, ``sgd:``, ``tie``."""
    return re.findall(r"[^\s/:]*[/:]|[^\s/:]+", header)


def _wrap_header(header: str, width: int) -> str:
    """``header`` on lines of at most ``width`` characters, broken at spaces and after ``/`` and ``:``."""
    lines: List[str] = []
    for part in _header_parts(header):
        joint = "" if not lines or lines[-1].endswith(("/", ":")) else " "
        if lines and _cells(lines[-1] + joint + part) <= width:
            lines[-1] += joint + part
        else:
            lines.append(part)
    return "\n".join(lines)
