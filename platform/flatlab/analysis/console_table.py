"""Rich tables that never split a word, at any terminal width: every table the CLI prints
(``flatlab results``, the best-trial table of ``flatlab run``, ``flatlab compare``, ``flatlab curves``,
``flatlab run --dry-run``'s plan, ``flatlab optimizers``/``workloads``/``measures``).

Every column keeps each line of its cells on one line (numbers, ids, statuses, times, arm names, one
``name=value`` param per line): it is as wide as its longest cell line. Only *prose* columns (error
messages, descriptions) wrap, at spaces, never inside a word. When the table is too wide for the console,
the headers go on several lines, broken at spaces and after ``/`` and ``:`` (``best/val/accuracy`` over
``0.9123`` reads ``best/`` ``val/`` ``accuracy``), and the prose columns narrow down to their longest
word. A table that cannot fit even so is printed at the width it needs (nothing cut; the terminal wraps
its lines) with one line under it saying so (:func:`print_table`).
"""

from __future__ import annotations

import re
from typing import Any, Collection, List, Optional, Sequence

from rich.cells import cell_len
from rich.table import Table


def make_table(
    head: Sequence[str],
    rows: Sequence[Sequence[str]],
    prose: Collection[int] = (),
    sections: Collection[int] = (),
    **table_args: Any,
) -> Any:
    """A ``rich.table.Table`` of ``rows`` (strings; ``\\n`` separates lines of a cell) under ``head``.

    Args:
        head: the column headers.
        rows: the cells, one sequence per row, as long as ``head``.
        prose: indices of the columns that may wrap at spaces (free text); the others never wrap.
        sections: indices of the rows that start a new section (a rule above them).
        table_args: passed to ``Table`` (``title``, ``caption``, ``box``, ...).
    """
    table = Table(**table_args)
    for i, header in enumerate(head):
        table.add_column(header, no_wrap=i not in prose, overflow="fold")
    for i, r in enumerate(rows):
        if i and i in sections:
            table.add_section()
        table.add_row(*r)
    return table


def needed_width(table: Any) -> int:
    """Terminal columns ``table`` (from :func:`make_table`) needs so that no word is split: its columns at
    their longest line, prose columns at their longest word (header parts included), plus cell padding and
    borders."""
    return sum(_least(column) for column in table.columns) + _frame(table)


def print_table(console: Any, table: Any, hint: Optional[str] = None) -> None:
    """Print ``table`` (from :func:`make_table`) on ``console``. When it is wider than the console, the
    headers go on several lines and the prose columns narrow (:func:`needed_width`); if it still does not
    fit, it is printed at the width it needs (nothing cut; the terminal wraps its lines) with, under it,
    ``the table is N columns wide; this terminal has M: widen it, or <hint>``."""
    natural = sum(
        max([_longest_line(column.header)] + [_longest_line(c) for c in column.cells]) for column in table.columns
    ) + _frame(table)
    if natural <= console.width:
        console.print(table)
        return
    for column in table.columns:
        column.header = _wrap_header(str(column.header), _least(column))
    need = needed_width(table)
    _narrow_prose(table, max(need, console.width) - _frame(table))
    if need <= console.width:
        console.print(table)
        return
    table.width = need
    console.print(table, crop=False)
    more = f", or {hint}" if hint else ""
    console.print(
        f"the table is {need} columns wide; this terminal has {console.width}: widen it{more}", soft_wrap=True
    )


def _least(column: Any) -> int:
    """Content cells ``column`` needs: its longest cell line (a prose column: its longest word), and at
    least its header's longest part (:func:`_header_parts`)."""
    header = max((_cells(p) for p in _header_parts(str(column.header))), default=0)
    if column.no_wrap:
        return max([header] + [_longest_line(c) for c in column.cells])
    return max([header] + [_cells(w) for c in column.cells for w in str(c).split()])


def _frame(table: Any) -> int:
    """Cells of ``table``'s padding and borders."""
    n = len(table.columns)
    _, right, _, left = table.padding
    padding = (left + right) * n - (0 if table.pad_edge or not n else left + right)
    borders = (2 if table.box and table.show_edge else 0) + (n - 1 if table.box and n else 0)
    return padding + borders


def _narrow_prose(table: Any, content: int) -> None:
    """Fix the widths of ``table``'s prose columns so that all its columns' content takes at most
    ``content`` cells: each prose column at least its longest word, the room left shared out evenly up to
    each one's longest line."""
    prose = [c for c in table.columns if not c.no_wrap]
    if not prose:
        return
    widths = {id(c): _least(c) for c in prose}
    full = {id(c): max([_longest_line(c.header)] + [_longest_line(x) for x in c.cells]) for c in prose}
    room = content - sum(_least(c) for c in table.columns)
    while room > 0:
        short = [c for c in prose if widths[id(c)] < full[id(c)]]
        if not short:
            break
        for c in short[:room]:
            widths[id(c)] += 1
        room -= min(room, len(short))
    for c in prose:
        c.width = widths[id(c)]


def _cells(text: str) -> int:
    """Terminal cells ``text`` takes (rich's measure: wide characters count 2)."""
    return cell_len(text)


def _longest_line(cell: Any) -> int:
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
