"""``flatlab results``: a study's trials from MLflow as a table, filtered, ranked, pooled or exported."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional, Sequence

import typer

from flatlab.analysis.query import select
from flatlab.analysis.results import export, render
from flatlab.cli.app import ROOT_HELP, _fail, _root, app, check_rank_by, console
from flatlab.errors import FlatlabError
from flatlab.tracking import runs
from flatlab.tracking import trials as stored_trials


def _say_arms_without_answer(trials, best, arms: Sequence[str] = ()) -> None:
    """One line naming the arms a ``--best`` table has no row for (none of their trials completed).

    ``arms``: the arms the launch was to run (a study's, in its order), so that an arm none of whose trials
    reached MLflow (a launch interrupted before it started them) is named too; the arms of ``trials``
    follow."""
    if not (best.empty or "arm" in best.columns):
        return
    seen = list(trials["arm"]) if not trials.empty and "arm" in trials.columns else []
    have = set() if best.empty else set(best["arm"])
    missing = [a for a in dict.fromkeys([*arms, *seen]) if a not in have]
    if missing:
        console.print(
            f"no completed trial (pruned, diverged, failed or unfinished), so no best for: {', '.join(missing)}",
            soft_wrap=True,
        )


def export_format(fmt: Optional[str], output: Optional[Path]) -> str:
    """The format ``flatlab results`` writes: ``--format`` if given, else the suffix of ``--output``
    (``.csv``/``.parquet``), else ``table``.

    Raises:
        FlatlabError: an unknown format; ``--format table`` or ``parquet`` with an impossible
            ``--output``; a suffix that contradicts ``--format``; an ``--output`` suffix that names no
            format when ``--format`` is not given.
    """
    formats = ("table", "csv", "parquet")
    if fmt is not None and fmt not in formats:
        raise FlatlabError(f"--format {fmt!r} is not supported; expected one of {', '.join(formats)}")
    suffix = output.suffix.lower().lstrip(".") if output is not None else ""
    if fmt is None:
        if output is None:
            return "table"
        if suffix not in ("csv", "parquet"):
            raise FlatlabError(
                f"--output {output}: cannot tell the format from its suffix; add --format csv or --format parquet"
            )
        return suffix
    if fmt == "table" and output is not None:
        raise FlatlabError("--format table prints to the terminal; use --format csv or parquet with --output")
    if fmt == "parquet" and output is None:
        raise FlatlabError("--format parquet needs --output PATH (it is a binary file)")
    if output is not None and suffix in ("csv", "parquet") and suffix != fmt:
        raise FlatlabError(f"--format {fmt} but --output {output} ends in .{suffix}; make them agree")
    return fmt


@app.command()
def results(
    study: str = typer.Argument(..., help="study name (the MLflow experiment)"),
    tracking_uri: Optional[str] = typer.Option(None, envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI"),
    root: Optional[Path] = typer.Option(None, help=ROOT_HELP),
    fmt: Optional[str] = typer.Option(
        None,
        "--format",
        help="table, csv or parquet (default: from --output's suffix, else table); csv without --output goes to stdout",
    ),
    output: Optional[Path] = typer.Option(None, help="file for csv/parquet (.csv or .parquet)"),
    all_launches: bool = typer.Option(False, "--all", help="trials of every launch, not only the latest"),
    best: bool = typer.Option(
        False,
        "--best",
        help="only each arm's best trial (or, with --by-config, configuration): the best mean over seeds of "
        "the final validation metric",
    ),
    rank_by: str = typer.Option(
        "final",
        "--rank-by",
        help="what --best and --by-config rank by: final (each trial's final-epoch value, the rule) "
        "or best-epoch (its best epoch's)",
    ),
    per_config: bool = typer.Option(
        False, "--by-config", help="one row per configuration: mean and std over seeds of the completed trials"
    ),
    arm: Optional[List[str]] = typer.Option(None, "--arm", help="only this arm's trials (repeat for several)"),
    tuning: Optional[int] = typer.Option(
        None, "--tuning", min=1, help="only this independent tuning's trials (a study run with --tunings)"
    ),
    metric: Optional[str] = typer.Option(
        None, help="rank by this metric instead of the study's, e.g. flat/fisher_trace (completed trials still first)"
    ),
    mode: Optional[str] = typer.Option(
        None,
        help="min or max for --metric (default: the study's for its metric; "
        "min for flat/*, time/*, losses, perplexity, *_to_target; else max)",
    ),
    filter_: Optional[str] = typer.Option(
        None,
        "--filter",
        help="pandas query over the trials, e.g. \"outcome == 'completed' and epochs > 5\"; "
        "names with '/' or '.' in backticks: \"`val/accuracy` > 0.9 and `param.lr` < 0.1\"",
    ),
    sort: Optional[List[str]] = typer.Option(
        None,
        "--sort",
        help="sort the table by COLUMN (ascending) or -COLUMN (descending); "
        "repeat for ties, e.g. --sort arm --sort -param.lr",
    ),
    columns: Optional[str] = typer.Option(
        None, help="comma list of the columns to show or export, e.g. arm,val/accuracy,param.lr"
    ),
) -> None:
    """Print a study's trials from MLflow (params, final and best metrics, status), best first.

    Filters apply in this order: --tuning, --arm, --metric (ranking), --filter (on the trial rows), --by-config,
    --best, --sort, --columns.
    """
    uri = tracking_uri or runs.default_tracking_uri(_root(root).resolve())
    try:
        check_rank_by(rank_by)
        fmt = export_format(fmt, output)
        df = stored_trials.trials_frame(uri, study, all_launches=all_launches)
        rows = "configurations" if per_config else "trials"
        shown = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
        trials = df
        df = select(
            df,
            tuning=tuning,
            arms=arm,
            metric=metric,
            mode=mode,
            filter=filter_,
            best=best,
            by_config=per_config,
            sort=sort,
            columns=shown,
            rank_by=rank_by,
        )
        if fmt == "table":
            hidden = 0
            if per_config and "seeds" in df.columns:  # configurations no seed completed (pruned, diverged, failed)
                hidden = int((df["seeds"] == 0).sum()) if not df.empty else 0
                df = df[df["seeds"] > 0] if hidden else df
            if df.empty and (filter_ or arm):
                console.print(f"no {rows} of {study} match the given --arm/--filter")
            else:
                render(
                    df,
                    console,
                    columns=shown,
                    title=f"{study} ({len(df)} {rows})",
                    hint="use --columns or --format csv",
                )
            if best and not filter_:  # arms --best has no row for (none of their trials completed)
                _say_arms_without_answer(trials[trials["arm"].isin(arm)] if arm and not trials.empty else trials, df)
            if hidden:
                console.print(
                    f"{hidden} configuration(s) with no completed trial (pruned, diverged or failed) not shown; "
                    "`flatlab results` lists every trial, and csv/parquet exports include them (seeds 0)"
                )
        elif output is None:  # csv to stdout, for pipes and redirection
            sys.stdout.write(df.to_csv(index=False))
        else:
            export(df, str(output), fmt)
            console.print(f"wrote {len(df)} {rows} to {output}")
    except (FlatlabError, ValueError) as exc:
        _fail(exc)
