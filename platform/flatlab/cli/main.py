"""The ``flatlab`` command line: run, resume, submit and inspect studies."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import typer

from flatlab.cli.app import ROOT_HELP, _fail, _root, app, check_confidence, check_rank_by, console, err
from flatlab.errors import FlatlabError


@app.command()
def run(
    study_file: Path = typer.Argument(..., help="a study file, e.g. studies/digits_demo.py"),
    study: Optional[List[str]] = typer.Option(None, "--study", help="run only these studies of the file"),
    scale: Optional[str] = typer.Option(None, help="scale of a study file that defines several (e.g. smoke, paper)"),
    trials: Optional[int] = typer.Option(None, min=1, help="trials per arm (overrides the study)"),
    epochs: Optional[int] = typer.Option(None, min=1, help="epochs per trial (overrides the study)"),
    final_seeds: Optional[int] = typer.Option(
        None, "--final-seeds", min=0, help="run only the first N of the study's final seeds (0: no final stage)"
    ),
    address: Optional[str] = typer.Option(None, help="address of an existing Ray cluster (default: start a local one)"),
    tracking_uri: Optional[str] = typer.Option(
        None, envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI (default: SQLite under the root)"
    ),
    storage: Optional[str] = typer.Option(None, help="Ray Tune storage path (shared storage on a multi-node cluster)"),
    root: Optional[Path] = typer.Option(None, help=ROOT_HELP),
    resume: bool = typer.Option(
        False, "--resume", help="finish the latest launch at its budget (finished trials are not re-run)"
    ),
    continue_: bool = typer.Option(
        False, "--continue", help="a new launch whose arms add trials to the previous launch's Optuna studies"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and print the trial plan; start nothing"),
    num_cpus: Optional[int] = typer.Option(None, help="CPUs of the local Ray instance (default: all)"),
    checkpoint_every: Optional[int] = typer.Option(
        None,
        "--checkpoint-every",
        min=1,
        help="epochs between trial checkpoints, Tune's checkpoint frequency (overrides the study; the last epoch is always "
        "checkpointed; --resume keeps the launch's unless given)",
    ),
) -> None:
    """Run the studies of STUDY_FILE on Ray Tune (Optuna searcher, ASHA, MLflow tracking).

    Exit status: 0 when the launch ended (a line at the end says how many trials failed, if any); 1 when
    every trial of a study failed; 2 for invalid input (study file, options, cluster address) before any
    trial; 130 when interrupted (``--resume`` continues).
    """
    from flatlab.study.launches import log_file
    from flatlab.study.plan import render as render_plan
    from flatlab.study.prepare import prepare

    given = {
        "trials": trials,
        "epochs": epochs,
        "final_seeds": final_seeds,
        "scale": scale,
        "checkpoint_every": checkpoint_every,
    }
    try:  # --resume: the launch's scale, budget and checkpoint cadence (study/prepare.py, as flatlab.run)
        prepared = prepare(str(study_file), given, _root(root), resume=resume, continue_=continue_, only=study or ())
    except (FlatlabError, ValueError) as exc:
        _fail(exc)
    studies = [p.study for p in prepared]
    for s in studies:
        for warning in s.warnings():
            err.print(f"[yellow]warning:[/yellow] study {s.name!r}, {warning}", soft_wrap=True)
    if dry_run:
        from flatlab.study.chain import describe_chained
        from flatlab.tracking.runs import default_tracking_uri

        for s in studies:
            render_plan(s, console)
            for line in describe_chained(s, tracking_uri or default_tracking_uri(_root(root).resolve())):
                console.print(line, soft_wrap=True)
        return
    if (
        not resume
    ):  # missing data: one line within seconds, before Ray and MLflow are even imported (run_study checks again)
        from flatlab.workloads.registry import build_workload

        try:
            for s in studies:
                build_workload(s.workload, **dict(s.workload_params)).check_data()
        except FlatlabError as exc:
            _fail(exc)
    if address:  # one line and exit 2 within seconds for an unreachable head; the cluster's auth mode (cluster.py)
        from flatlab.cluster import check_address

        try:
            check_address(address)
        except FlatlabError as exc:
            _fail(exc)
    from flatlab.analysis.query import select
    from flatlab.analysis.results import render
    from flatlab.study.runner import RunOptions, run_study
    from flatlab.tracking.trials import trials_frame
    from flatlab.tracking.ui import where_to_look

    opts = RunOptions(
        root=_root(root),
        address=address,
        tracking_uri=tracking_uri,
        storage=storage,
        resume=resume,
        source=str(study_file),
        num_cpus=num_cpus,
    )
    interrupted = all_failed = False
    for s, budget in ((p.study, p.budget) for p in prepared):
        try:
            outcome = run_study(s, dataclasses.replace(opts, overrides=budget, continue_=continue_), console=console)
        except FlatlabError as exc:
            _fail(exc)
        except ConnectionError as exc:  # Ray's, e.g. a head that wants a token we do not have
            if not address:
                raise
            _fail(
                FlatlabError(
                    f"--address {address}: {exc}; a head with token authentication needs its token here "
                    "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
                )
            )
        interrupted |= outcome.interrupted
        df = trials_frame(outcome.tracking_uri, s.name)
        pooled = s.searcher == "grid" and len(s.seeds) > 1  # every grid point ran with every seed
        console.print(
            f"\n[bold]{s.name}[/bold] ran {outcome.wall_s:.0f} s (wall, Ray and MLflow start-up included); "
            + (
                f"best configuration per arm, mean and std over {len(s.seeds)} seeds"
                if pooled
                else "best trial per arm"
            )
            + " (from MLflow):"
        )
        best = select(df, best=True, by_config=pooled)
        render(
            best, console, hint=f"use flatlab results {s.name} --best{' --by-config' if pooled else ''} --format csv"
        )
        _say_arms_without_answer(df, best, [a.name for a in s.arms])
        if not outcome.interrupted and (pooled or s.final_seeds):
            _print_comparison(df, s, console)
        console.print(where_to_look(outcome.tracking_uri, outcome.experiment_id), soft_wrap=True)  # the training view
        line = failure_line(
            s.name, outcome.num_errors, len(df), str(study_file), log_file(_root(root).resolve() / s.name)
        )
        if line:  # the last line: how many trials failed
            console.print(line, soft_wrap=True)
        all_failed |= outcome.num_errors > 0 and outcome.num_errors >= len(df)
        if interrupted:
            break
    if interrupted:
        raise typer.Exit(130)
    if all_failed:
        raise typer.Exit(1)


def failure_line(study: str, errors: int, trials: int, source: str, log: Path) -> str:
    """The last line of a launch whose trials failed (raised, or lost their node more often than Tune
    retries): how many, and where to look; ``""`` when none failed. ``trials``: the launch's trials in
    MLflow (``errors`` counts when the store holds fewer); ``log``: the study's log file
    (:func:`flatlab.study.launches.log_file` of its output folder), named when every trial failed."""
    if errors <= 0:
        return ""
    n = max(trials, errors)
    if errors >= n:
        return f"every trial of {study} failed ({errors} of {n}); see {log} and `flatlab results {study}`"
    return (
        f"{errors} of {n} trials of {study} failed; `flatlab results {study}` shows their errors, "
        f"`flatlab run {source} --resume` retries them"
    )


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


def _print_comparison(df, study, out) -> None:
    """The ``flatlab compare`` table of a launch that just ended (a failure here is one warning line)."""
    from flatlab.analysis import compare as cmp

    try:
        comparison = cmp.compare_table(df, study=study.name)  # the launch's reference arm (selection.reference_arm)
    except (FlatlabError, ValueError) as exc:
        err.print(f"[yellow]warning:[/yellow] no comparison table: {exc}", soft_wrap=True)
        return
    out.print(f"\n[bold]{study.name}[/bold]: `flatlab compare {study.name}` (also logged to the launch's MLflow run):")
    cmp.render(comparison, out)


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
    metric: Optional[str] = typer.Option(
        None, help="rank by this metric instead of the study's, e.g. flat/fisher_trace (completed trials still first)"
    ),
    mode: Optional[str] = typer.Option(
        None,
        help="min or max for --metric (default: the study's for its metric; min for flat/*, time/*, losses, perplexity, *_to_target; else max)",
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
        help="sort the table by COLUMN (ascending) or -COLUMN (descending); repeat for ties, e.g. --sort arm --sort -param.lr",
    ),
    columns: Optional[str] = typer.Option(
        None, help="comma list of the columns to show or export, e.g. arm,val/accuracy,param.lr"
    ),
) -> None:
    """Print a study's trials from MLflow (params, final and best metrics, status), best first.

    Filters apply in this order: --arm, --metric (ranking), --filter (on the trial rows), --by-config,
    --best, --sort, --columns.
    """
    from flatlab.analysis.query import select
    from flatlab.analysis.results import export, render
    from flatlab.tracking import runs
    from flatlab.tracking.trials import trials_frame

    uri = tracking_uri or runs.default_tracking_uri(_root(root).resolve())
    try:
        check_rank_by(rank_by)
        fmt = export_format(fmt, output)
        df = trials_frame(uri, study, all_launches=all_launches)
        rows = "configurations" if per_config else "trials"
        shown = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
        trials = df
        df = select(
            df,
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


@app.command("interpolation-report")
def interpolation_report(
    study: str = typer.Argument(..., help="an alpha study (workload clip_interpolate), e.g. rft_clip_alpha"),
    tracking_uri: Optional[str] = typer.Option(None, envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI"),
    root: Optional[Path] = typer.Option(None, help=ROOT_HELP),
    output: Optional[Path] = typer.Option(None, help="folder for the figures (default: <root>/<study>/report)"),
    split: str = typer.Option("ood", help="the OOD split shown in the accuracy/loss figures"),
) -> None:
    """Plot an alpha study's curves (seed paper Figs. 1, 3, 4, 5) and log them on its launch run."""
    from flatlab.interpolation.report import interpolation_report as build
    from flatlab.tracking import runs

    base = _root(root).resolve()
    uri = tracking_uri or runs.default_tracking_uri(base)
    try:
        rep = build(uri, study, out_dir=output or base / study / "report", split=split)
    except (FlatlabError, ValueError) as exc:
        _fail(exc)
    for path in (*rep.figures, rep.summary_path):
        console.print(str(path))
    console.print(f"logged under report/ on run {rep.parent_run_id}")


STUDIES_LEGEND = (
    "scales: the values of `flatlab run FILE --scale NAME`, the first the default; -: no --scale (one setting); "
    "(module): not a study file, a module the study files next to it import"
)


def _study_folders(directory: Path) -> List[Tuple[Path, List[Path]]]:
    """``directory`` and each of its subfolders (``examples/``), with their ``*.py`` files; names that
    start with ``_`` or ``.`` are skipped (shared code such as ``_flatness_arms.py``, ``__pycache__``)."""

    def listed(folder: Path) -> List[Path]:
        return sorted(p for p in folder.glob("*.py") if not p.name.startswith(("_", ".")))

    subs = (
        sorted(d for d in directory.iterdir() if d.is_dir() and not d.name.startswith(("_", ".")))
        if directory.is_dir()
        else []
    )
    return [
        (folder, files) for folder, files in [(directory, listed(directory))] + [(d, listed(d)) for d in subs] if files
    ]


@app.command()
def studies(directory: Path = typer.Argument(Path("studies"), help="folder of study files")) -> None:
    """List the study files, one line each: the file, its scales (`flatlab run --scale`, the first the
    default) and its docstring's summary; then, a section each, those of the folder's
    subfolders (studies/examples/). Files are parsed, never run."""
    from flatlab.study.loader import describe_file

    folders = _study_folders(directory)
    if not folders:
        _fail(FlatlabError(f"no study files in {directory} or its subfolders"))
    described = {p: describe_file(str(p)) for _, files in folders for p in files}
    scales = {
        p: "(module)" if not d.is_study else "(computed)" if d.scales is None else ", ".join(d.scales) or "-"
        for p, d in described.items()
    }
    width = max(len(str(p)) for p in described)
    sw = max(len("scales"), *map(len, scales.values()))
    console.print(f"{'file':{width}s}  {'scales':{sw}s}  about", style="bold", markup=False)
    for i, (folder, files) in enumerate(folders):
        if i:
            console.print(f"\n{folder.name} ({folder}/):", style="bold", markup=False)
        for p in files:
            console.print(f"{str(p):{width}s}  {scales[p]:{sw}s}  {described[p].summary}", soft_wrap=True, markup=False)
    console.print(f"\n{STUDIES_LEGEND}", soft_wrap=True, markup=False)


def _fail_unknown(exc: FlatlabError, study_file: Optional[Path]) -> None:
    """Fail (exit 2) on an unknown optimizer/workload/measure name; without ``study_file``, the message
    also says how to list the entries a study file registers."""
    hint = "; one that a study file registers is listed with --study-file FILE"
    _fail(exc if study_file is not None else FlatlabError(f"{exc}{hint}"))


def _entries(registry, name: Optional[str], study_file: Optional[Path] = None) -> List[str]:
    """The names ``flatlab optimizers/workloads NAME`` shows: all without NAME; NAME itself; or, for a
    family prefix such as ``glue`` or ``lm``, its members (``glue/cola`` ...). An unknown NAME fails
    with the valid names (exit 2), and without ``study_file`` says how to list a study file's own."""
    if name is None:
        return registry.names()
    family = [n for n in registry.names() if n.startswith(f"{name}/")]
    if name not in registry and family:
        return family
    try:
        registry.get(name)
    except FlatlabError as exc:
        _fail_unknown(exc, study_file)
    return [name]


_STUDY_FILE_HELP = (
    "also the workloads, optimizers and measures this study file registers (it is run, as `flatlab run` runs it)"
)


def _load_extensions(study_file: Optional[Path]) -> None:
    """Run ``study_file`` (if given) so that the entries it registers are listed with flatlab's own
    (:func:`flatlab.study.loader.load_module`, as ``flatlab run`` loads it); a bad file fails with its
    error (exit 2)."""
    if study_file is None:
        return
    from flatlab.study.loader import load_module

    try:
        load_module(str(study_file))
    except (FlatlabError, ValueError) as exc:
        _fail(exc)


@app.command()
def optimizers(
    name: Optional[str] = typer.Argument(None, help="show only this optimizer, e.g. tsam"),
    study_file: Optional[Path] = typer.Option(None, "--study-file", help=_STUDY_FILE_HELP),
) -> None:
    """List the registered optimizers with their hyperparameters, defaults and allowed ranges."""
    from flatlab.optim.registry import OPTIMIZERS

    _load_extensions(study_file)

    for name in _entries(OPTIMIZERS, name, study_file):
        spec = OPTIMIZERS.get(name)
        console.print(f"[bold]{name}[/bold]  {spec.doc}")
        _hparam_table(spec.hparams)


@app.command()
def workloads(
    name: Optional[str] = typer.Argument(
        None,
        help="show only this workload (e.g. cifar10), a family (glue, lm), or 'trainer' for the trainer's parameters",
    ),
    study_file: Optional[Path] = typer.Option(None, "--study-file", help=_STUDY_FILE_HELP),
) -> None:
    """List the registered workloads with their parameters, defaults and allowed ranges, then the
    trainer's parameters (any study or arm may set these)."""
    from flatlab.train.config import TRAINER_HPARAMS
    from flatlab.workloads.registry import WORKLOADS

    _load_extensions(study_file)

    names = [] if name == "trainer" else _entries(WORKLOADS, name, study_file)
    for n in names:
        cls = WORKLOADS.get(n)
        console.print(f"[bold]{n}[/bold]  {cls.doc}  metrics: {', '.join(cls.metrics)}")
        _hparam_table(cls.hparams)
    if name is None or name == "trainer":
        console.print("[bold]trainer[/bold] (any study or arm may set these)")
        _hparam_table(TRAINER_HPARAMS)
    else:
        console.print(
            "the trainer's parameters (batch_size, schedule, ...; any study or arm may set them): `flatlab workloads trainer`"
        )


@app.command()
def measures(
    name: Optional[str] = typer.Argument(None, help="show only this measure"),
    study_file: Optional[Path] = typer.Option(None, "--study-file", help=_STUDY_FILE_HELP),
) -> None:
    """List the registered flatness measures (a study's `measures=`) with their parameters, defaults,
    allowed ranges, source and the metrics they log."""
    from flatlab.sharpness.measures import TIME_KEY, get_measure, list_measures

    _load_extensions(study_file)

    try:
        names = [get_measure(name).name] if name is not None else list(list_measures())
    except FlatlabError as exc:
        _fail_unknown(exc, study_file)
    for n in names:
        m = get_measure(n)
        console.print(f"[bold]{m.name}[/bold]  {m.doc}", soft_wrap=True)
        console.print(f"  source: {m.source}", soft_wrap=True)
        console.print(f"  metrics: {', '.join(m.metrics)}", soft_wrap=True)
        _hparam_table(m.hparams)
    console.print(f"\nEvery trial that measures also logs {TIME_KEY}: the wall seconds all its measures took together.")


def _hparam_table(hparams) -> None:
    from flatlab.analysis.console_table import make_table, print_table

    rows = [(h.name, repr(h.default), h.allowed(), h.doc) for h in hparams]
    print_table(
        console, make_table(("name", "default", "allowed", "meaning"), rows, prose=(3,), box=None, pad_edge=False)
    )


@app.command()
def submit(
    study_file: Path = typer.Argument(..., help="study file, relative to the working directory that is uploaded"),
    address: str = typer.Option(..., help="Ray dashboard address of the cluster, e.g. http://HEAD:8265"),
    follow: bool = typer.Option(False, "--follow", help="stream the job's logs until it ends"),
    args: Optional[List[str]] = typer.Option(
        None, "--arg", help="extra `flatlab run` arguments, e.g. --arg=--trials=4"
    ),
    working_dir: Path = typer.Option(Path("."), help="folder uploaded as the job's working directory"),
) -> None:
    """Submit `flatlab run STUDY_FILE` as a Ray Job to a cluster and print the job id."""
    from flatlab.cluster import enable_token_auth_if_available

    enable_token_auth_if_available()  # before Ray reads its auth mode
    from flatlab.cluster import submit_study

    try:
        job_id = submit_study(address, study_file, working_dir, list(args or []), follow=follow, console=console)
    except (FlatlabError, ValueError) as exc:
        _fail(exc)
    console.print(job_id)


from flatlab.cli import curves as _curves  # noqa: E402,F401  - registers `flatlab curves` (published curves) on app


def main() -> None:
    """Console-script entry point: the CLI, then a quick exit (see :func:`exit_without_teardown`)."""
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    exit_without_teardown(code)


def exit_without_teardown(code: object = 0) -> None:
    """End the process like ``sys.exit(code)`` but without the interpreter's module teardown.

    Everything a normal exit does for correctness still happens, in the same order: the threading
    exit callbacks run and non-daemon threads are joined, ``atexit`` handlers run (Ray's shutdown,
    ``logging.shutdown``, MLflow's), and the standard streams are flushed. Only the final freeing of
    every module and object is skipped; with torch, Ray, MLflow and Optuna loaded that teardown alone
    takes 1-2 s, which the OS does for free. ``code`` follows ``sys.exit``: ``None`` is 0, an int is
    the status, anything else is printed to stderr and gives 1.
    """
    import atexit
    import threading

    # What the interpreter's exit does first: the callbacks registered with threading (they stop
    # idle concurrent.futures workers), then a join of every non-daemon thread.
    threading._shutdown()  # type: ignore[attr-defined]
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken pipe: nothing left to write to
                pass
        os._exit(status)


if __name__ == "__main__":  # pragma: no cover
    main()
