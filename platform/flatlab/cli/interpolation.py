"""``flatlab interpolation-report``: the WiSE-FT interpolation figures of an alpha study, rebuilt on demand."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flatlab.cli.app import ROOT_HELP, _fail, _root, app, console
from flatlab.errors import FlatlabError
from flatlab.lazy import lazy
from flatlab.tracking import runs

interpolation_report_mod = lazy("flatlab.interpolation.report")  # torch


@app.command("interpolation-report")
def interpolation_report(
    study: str = typer.Argument(..., help="an alpha study (workload clip_interpolate), e.g. rft_clip_alpha"),
    tracking_uri: Optional[str] = typer.Option(None, envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI"),
    root: Optional[Path] = typer.Option(None, help=ROOT_HELP),
    output: Optional[Path] = typer.Option(None, help="folder for the figures (default: <root>/<study>/report)"),
    split: str = typer.Option("ood", help="the OOD split shown in the accuracy/loss figures"),
) -> None:
    """Plot an alpha study's curves (seed paper Figs. 1 to 5), its tau of sharpness against OOD accuracy, and log them
    on its launch run."""
    base = _root(root).resolve()
    uri = tracking_uri or runs.default_tracking_uri(base)
    try:
        rep = interpolation_report_mod.interpolation_report(
            uri, study, out_dir=output or base / study / "report", split=split
        )
    except (FlatlabError, ValueError) as exc:
        _fail(exc)
    for path in (*rep.figures, rep.summary_path):
        console.print(str(path))
    console.print(f"logged under report/ on run {rep.parent_run_id}")
