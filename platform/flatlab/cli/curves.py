"""``flatlab curves STUDY``: a study's per-epoch curves beside a published reference
(:mod:`flatlab.analysis.published`). Registered on the ``flatlab`` app (:mod:`flatlab.cli.app`) when
:mod:`flatlab.cli.main` imports it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, List, Optional

import typer

from flatlab.analysis import published as pub
from flatlab.cli.app import ROOT_HELP, _fail, _root, app, check_confidence, console
from flatlab.cli.equal import write_cost_curves
from flatlab.errors import ConfigError, FlatlabError
from flatlab.lazy import lazy
from flatlab.reports.published_runs import compare_study
from flatlab.tracking import runs

workload_ranges = lazy("flatlab.workloads.ranges")  # torch: the registries that declare the ranges

FORMATS = ("table", "markdown", "csv")


def parse_map(items: Optional[List[str]]) -> Dict[str, str]:
    """``["sgd=fmnist_2c2d/sgd", ...]`` -> ``{"sgd": "fmnist_2c2d/sgd"}``.

    Raises:
        ConfigError: an item without ``=`` or with an empty side.
    """
    out: Dict[str, str] = {}
    for item in items or []:
        arm, sep, curve = item.partition("=")
        if not sep or not arm.strip() or not curve.strip():
            raise ConfigError(f"--map {item!r}; expected ARM=CURVE, e.g. --map sgd=fmnist_2c2d/sgd")
        out[arm.strip()] = curve.strip()
    return out


def parse_epochs(text: Optional[str]) -> Optional[List[int]]:
    """``"1-3,10"`` -> ``[1, 2, 3, 10]``; ``None`` -> ``None`` (every epoch).

    Raises:
        ConfigError: anything but comma-separated non-negative ints and ``a-b`` ranges with a <= b.
    """
    if text is None:
        return None
    out: List[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            a, b = -1, -1
        if a < 0 or b < a:
            raise ConfigError(f"--epochs {text!r}; expected epochs and ranges such as 1-3,10")
        out.extend(range(a, b + 1))
    return out


@app.command()
def curves(
    study: str = typer.Argument(..., help="study name (the MLflow experiment)"),
    published: Optional[Path] = typer.Option(
        None, help="a curve-set JSON file (default: the one the study declares, Study(published=...))"
    ),
    map_: Optional[List[str]] = typer.Option(
        None,
        "--map",
        help="ARM=CURVE: compare this arm with this curve of the file (repeat; default: the study's mapping)",
    ),
    metric: Optional[List[str]] = typer.Option(
        None, "--metric", help="only this flatlab metric, e.g. test/accuracy (repeat)"
    ),
    epochs: Optional[str] = typer.Option(
        None, help="only these epochs, e.g. 1-3,10,100 (default: every epoch both sides have)"
    ),
    confidence: float = typer.Option(0.95, help="of flatlab's t-interval over seeds"),
    fmt: str = typer.Option("table", "--format", help="table, markdown or csv (text formats go to stdout)"),
    cost: Optional[str] = typer.Option(
        None,
        "--cost",
        help="passes or seconds: instead, each arm's metric against its compute (median and 25-75th percentile band "
        "over final seeds and tunings), a CSV and PNG per metric in --output",
    ),
    output: Optional[Path] = typer.Option(None, help="with --cost: the folder (default <root>/<study>/cost_curves)"),
    points: int = typer.Option(50, min=2, help="with --cost: the grid of costs the curves are read at"),
    tracking_uri: Optional[str] = typer.Option(None, envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI"),
    root: Optional[Path] = typer.Option(None, help=ROOT_HELP),
) -> None:
    """flatlab's per-epoch mean and t-interval over seeds beside published runs (mean, min-max), per
    arm, metric and epoch: whether flatlab's mean falls inside the published range, whether the
    intervals overlap, and where it falls outside. With --cost passes|seconds: each arm's metric against
    its passes or training seconds instead."""
    uri = tracking_uri or runs.default_tracking_uri(_root(root).resolve())
    try:
        if cost is not None:
            folder = output or _root(root) / study / "cost_curves"
            paths = write_cost_curves(uri, study, cost, metric, folder, points)
            console.print(f"wrote {len(paths)} files to {folder}", soft_wrap=True, markup=False)
            return
        check_confidence(confidence)
        if fmt not in FORMATS:
            raise FlatlabError(f"--format {fmt!r} is not supported; expected one of {', '.join(FORMATS)}")
        comparison = compare_study(
            uri,
            study,
            path=str(published) if published else None,
            arms=parse_map(map_) or None,
            metrics=metric or None,
            epochs=parse_epochs(epochs),
            confidence=confidence,
            ranges_of=workload_ranges.ranges_of,
        )
        if fmt == "table":
            pub.render(comparison, console)
        elif fmt == "markdown":
            sys.stdout.write(pub.to_markdown(comparison))
        else:
            sys.stdout.write(comparison.rows.to_csv(index=False))
    except (FlatlabError, ValueError) as exc:
        _fail(exc)
