"""``flatlab objectives``: TSAM Table 2's tables (every trained model on every objective) of a study, on demand."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flatlab.cli.app import ROOT_HELP, _fail, _root, app, console
from flatlab.errors import FlatlabError
from flatlab.reports.declared import objectives_report
from flatlab.tracking import runs


@app.command("objectives")
def objectives(
    study: str = typer.Argument(..., help="a study measuring erm_objective, sam_objective, tilted_objective"),
    tracking_uri: Optional[str] = typer.Option(None, envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI"),
    root: Optional[Path] = typer.Option(None, help=ROOT_HELP),
    output: Optional[Path] = typer.Option(None, help="folder for objectives.md (default: <root>/<study>/report)"),
    split: str = typer.Option("train", help="the study's measure_split (its flat/* metrics)"),
    extra: str = typer.Option("test", help="comma-separated extra splits (flat_<split>/* metrics)"),
) -> None:
    """Print each trained model (row) on the ERM, SAM and tilted objectives (columns), one table per split
    (TSAM paper, Table 2), and log them on the study's launch run."""
    base = _root(root).resolve()
    uri = tracking_uri or runs.default_tracking_uri(base)
    try:
        lines = objectives_report(uri, study, output or base / study / "report", split, extra)
    except (FlatlabError, ValueError) as exc:
        _fail(exc)
    for line in lines:
        console.print(line, markup=False)
