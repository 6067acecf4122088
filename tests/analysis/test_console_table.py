"""The one table helper of the CLI: no cell line split at any width, and a table wider than the terminal
printed whole with a note naming both widths."""

import re
from pathlib import Path

import pytest
from rich.console import Console

from flatlab.analysis.console_table import make_table, needed_width, print_table

NOTE = r"the table is (\d+) columns wide; this terminal has (\d+): widen it(, or use --format csv)?"


def _print(table, width, hint=None):
    console = Console(record=True, width=width, highlight=False)
    print_table(console, table, hint)
    return console.export_text().splitlines()


def test_a_table_wider_than_the_console_keeps_every_cell_whole_and_names_both_widths():
    rows = [
        ["82dc6947", "FINISHED", "completed", "2024-05-01 12:34:56", "0.9123"],
        ["6947aa01", "TERMINATED", "pruned", "2024-05-01 12:35:07", "0.8912"],
    ]
    table = make_table(["trial_id", "status", "outcome", "start_time", "val/accuracy"], rows)
    lines = _print(table, 40, "use --format csv")
    cells = [c.strip() for line in lines if line.startswith("│") for c in line.strip("│").split("│")]
    assert [c for c in cells if c] == [cell for row in rows for cell in row]  # one line each, nothing split
    width = 2 + 4 + sum(2 + w for w in (8, 10, 9, 19, 8))  # edges, separators, padding, longest lines
    assert needed_width(table) == width == 70
    assert re.fullmatch(NOTE, lines[-1]).groups() == ("70", "40", ", or use --format csv")
    assert {len(line) for line in lines[:-1]} == {70}


def test_prose_wraps_at_spaces_and_a_borderless_table_measures_right():
    rows = [
        ["rho", "0.05", "SAM neighbourhood radius (L2, global); 0.05 CIFAR-10"],
        ["ascent", "'global'", "data parallel: rank-averaged gradient"],
    ]
    table = make_table(["name", "default", "meaning"], rows, prose=(2,), box=None, pad_edge=False)
    assert needed_width(table) == 6 + 8 + len("rank-averaged") + 2 * 2  # inner padding only, no edges
    lines = _print(table, 30)
    assert lines[-1] == "the table is 31 columns wide; this terminal has 30: widen it"
    meaning = [line[18:].strip() for line in lines[1:-1]]
    assert " ".join(m for m in meaning if m).split() == " ".join(r[2] for r in rows).split()
    assert "rank-averaged" in meaning and {len(line) for line in lines[:-1]} == {31}
    fits = _print(make_table(["name", "default", "meaning"], rows, prose=(2,), box=None, pad_edge=False), 50)
    assert all(len(line) <= 50 for line in fits) and len(fits) > 3  # wrapped to the console, no note
    assert not any(line.startswith("the table is") for line in fits)


def test_sections_and_a_table_that_fits_print_unchanged():
    table = make_table(["arm", "epoch"], [["sgd", "1"], ["sgd", "2"], ["sam", "1"]], sections=[2])
    lines = _print(table, 80)
    assert lines[1] == "┃ arm ┃ epoch ┃" and lines[5].startswith("├") and len(lines) == 8


@pytest.mark.parametrize("command", ["optimizers", "measures"])
def test_cli_listings_keep_names_and_ranges_whole_on_a_narrow_terminal(command, monkeypatch):
    """``flatlab optimizers`` / ``measures`` on a 60-column terminal: each hparam name and range on one line."""
    from typer.testing import CliRunner

    import flatlab.cli.listings as cli

    console = Console(record=True, width=60, highlight=False)
    monkeypatch.setattr(cli, "console", console)
    assert CliRunner().invoke(cli.app, [command]).exit_code == 0
    text = console.export_text()
    for phrase in (
        ("weight_decay", "float in [0, inf)") if command == "optimizers" else ("one of 'per_example', 'batch'",)
    ):
        assert phrase in text
    assert re.search(r"the table is \d+ columns wide; this terminal has 60: widen it", text)


def test_every_cli_table_goes_through_the_helper():
    root = Path(__import__("flatlab").__file__).parent
    direct = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "console_table.py" and re.search(r"rich\.table|(?<![\w])Table\(", p.read_text())
    ]
    assert direct == []
