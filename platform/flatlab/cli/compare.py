"""``flatlab compare``: the paper table of one study (over its tunings where it has several, with tuning
curves and flatness-generalisation correlations on request), or the summary of several studies."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from flatlab.cli.app import ROOT_HELP, _fail, _root, app, check_confidence, check_rank_by, console, err
from flatlab.errors import FlatlabError


@app.command()
def compare(
    studies: List[str] = typer.Argument(
        ..., metavar="STUDY", help="study name (the MLflow experiment); several: one summary over them, each a workload"
    ),
    reference: Optional[str] = typer.Option(
        None,
        help="arm every other arm is paired against (default: the study's reference_arm, else sgd, else the first arm "
        "alphabetically); with several studies, an arm in all of them",
    ),
    rank_by: str = typer.Option(
        "final",
        "--rank-by",
        help="without a final stage, how each arm's best configuration is chosen: final (mean over seeds "
        "of the final-epoch validation metric, the rule) or best-epoch (of the best epoch's)",
    ),
    metric: Optional[str] = typer.Option(
        None, help="test metric (default: test/perplexity, test/accuracy or test/loss, the first recorded)"
    ),
    fmt: str = typer.Option("table", "--format", help="table, markdown, latex or csv (text formats go to stdout)"),
    against: Optional[str] = typer.Option(
        None,
        help="a search study (Optuna + ASHA) of the same arms: the share of this grid study's trial-epochs it needed to reach the grid's best validation metric",
    ),
    tolerance: float = typer.Option(
        0.0, help="with --against: reaching within this of the grid's best counts (absolute, the metric's units)"
    ),
    confidence: float = typer.Option(0.95, help="of the t intervals"),
    measure: Optional[List[str]] = typer.Option(
        None,
        "--measure",
        help="only this flatness quantity (repeatable): flat/<m>, flat_at_target/<m> or a bare measure "
        "<m> (its flat/ and flat_at_target/ rows); default every measure recorded",
    ),
    plot: Optional[Path] = typer.Option(
        None,
        help="also save a figure (PNG) here: the test metric against flatness; with several studies, the performance "
        "profiles (default <root>/compare/profiles_<studies>.png)",
    ),
    tau_max: Optional[float] = typer.Option(
        None,
        "--tau-max",
        help="with several studies: the right end of the profiles' tau axis (default just above the largest ratio)",
    ),
    tracking_uri: Optional[str] = typer.Option(None, envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI"),
    root: Optional[Path] = typer.Option(None, help=ROOT_HELP),
) -> None:
    """The paper table: per arm mean ± std and CI over seeds of the test metric, flatness and epochs or
    steps to target (final-stage trials, else each arm's best configuration), and paired per-seed
    differences against a reference arm, Holm-adjusted within each quantity.

    With several studies (one workload each): one summary over them, per arm and workload the rank by
    the test metric, the test metric and each shared flatness measure relative to the reference arm,
    and the arms' performance profiles (a PNG)."""
    from flatlab.analysis import compare as cmp
    from flatlab.tracking import runs
    from flatlab.tracking.trials import trials_frame

    uri = tracking_uri or runs.default_tracking_uri(_root(root).resolve())
    try:
        check_rank_by(rank_by)
        check_confidence(confidence)
        if fmt not in cmp.FORMATS:
            raise FlatlabError(f"--format {fmt!r} is not supported; expected one of {', '.join(cmp.FORMATS)}")
        if len(studies) > 1:
            if against is not None:
                raise FlatlabError("--against compares one grid study with a search study; give one STUDY with it")
            if measure:
                raise FlatlabError(
                    "--measure selects rows of one study's table; the summary of several shows every shared measure"
                )
            _compare_workloads(
                studies,
                uri,
                reference=reference,
                metric=metric,
                rank_by=rank_by,
                fmt=fmt,
                plot=plot,
                tau_max=tau_max,
                root=_root(root),
            )
            return
        if tau_max is not None:
            raise FlatlabError("--tau-max is for the performance profiles of several studies; give two or more")
        study = studies[0]
        df = trials_frame(uri, study)
        comparison = cmp.compare_table(
            df,
            metric=metric,
            reference=reference,
            confidence=confidence,
            study=study,
            rank_by=rank_by,
            measures=measure or None,
        )
        efficiency = None
        if against is not None:
            other = trials_frame(uri, against)
            searched = [set(f.loc[f["stage"] != "final", "arm"]) for f in (df, other)]  # final stages are not search
            common = sorted(searched[0] & searched[1])
            if not common:
                raise FlatlabError(
                    f"--against {against}: no arm has search or grid trials in both studies; arms of {study}: "
                    f"{', '.join(sorted(searched[0])) or '(none)'}; of {against}: {', '.join(sorted(searched[1])) or '(none)'}"
                )
            m, mode = df.attrs.get("metric", "val/accuracy"), df.attrs.get("mode", "max")
            efficiency = {
                a: cmp.hpo_efficiency(df, other, metric=m, mode=mode, tolerance=tolerance, arm=a) for a in common
            }
        if fmt == "table":
            cmp.render(comparison, console)
        else:
            sys.stdout.write(cmp.format_comparison(comparison, fmt))
        if efficiency is not None:
            _print_efficiency(efficiency, fmt, study, against)
        if plot is not None:
            cmp.plot_metric_vs_flatness(comparison, plot)
            err.print(f"wrote {plot}")
    except (FlatlabError, ValueError) as exc:
        _fail(exc)


def _compare_workloads(
    studies: List[str],
    uri: str,
    *,
    reference,
    metric,
    rank_by: str,
    fmt: str,
    plot: Optional[Path],
    tau_max: Optional[float],
    root: Path,
) -> None:
    """``flatlab compare A B ...``: the summary over the studies (:mod:`flatlab.analysis.compare.multi`)
    in ``fmt``, and the performance profiles saved to ``plot`` (default under ``root``; the path goes to
    stderr)."""
    import re

    from flatlab.analysis.compare import multi, multi_text, profiles
    from flatlab.tracking.trials import trials_frame

    repeated = sorted({s for s in studies if studies.count(s) > 1})
    if repeated:
        raise FlatlabError(f"study {', '.join(repeated)} given twice; each study is one workload")
    frames = {s: trials_frame(uri, s) for s in studies}
    summary = multi.summary_from_frames(frames, reference=reference, metric=metric, rank_by=rank_by)
    if fmt == "table":
        multi_text.render(summary, console)
    else:
        sys.stdout.write(multi_text.format_summary(summary, fmt))
    if plot is None:
        plot = root / "compare" / ("profiles_" + re.sub(r"[^A-Za-z0-9_.+-]+", "_", "+".join(studies)) + ".png")
    profiles.plot_profiles(summary.ratios, plot, tau_max=tau_max)
    err.print(f"wrote the performance profiles to {plot}", soft_wrap=True)


def _print_efficiency(efficiency, fmt: str, grid: str, search: str) -> None:
    """The ``--against`` table in ``fmt`` (csv: a second CSV block after one empty line)."""
    import pandas as pd

    from flatlab.analysis import compare as cmp

    head, body = cmp.efficiency_cells(efficiency)
    title = f"HPO efficiency: {search} (search) against {grid} (grid), trial-epochs to reach the grid's best"
    if fmt == "table":
        from flatlab.analysis.console_table import make_table, print_table

        print_table(console, make_table(head, body, title=title), "use --format markdown")
    elif fmt == "markdown":
        sys.stdout.write(f"\n### {title}\n\n{cmp.markdown_table(head, body)}\n")
    elif fmt == "latex":
        sys.stdout.write("\n" + cmp.latex_table(head, body, title))
    else:
        sys.stdout.write("\n" + pd.DataFrame([{"arm": a, **r} for a, r in efficiency.items()]).to_csv(index=False))
