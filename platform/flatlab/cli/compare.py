"""``flatlab compare``: the paper table of one study (over its tunings where it has several, with tuning
curves and flatness-generalisation correlations on request), or the summary of several studies."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List, Optional

import typer

from flatlab.analysis import compare as cmp
from flatlab.analysis import design_table, generalisation, pool, tunings_text
from flatlab.analysis.compare import multi, multi_text, profiles
from flatlab.analysis.compare.columns import number
from flatlab.analysis.compare.text import markdown_table
from flatlab.analysis.console_table import make_table, print_table
from flatlab.analysis.tunings import compare_tunings
from flatlab.cli import equal
from flatlab.cli.app import ROOT_HELP, _fail, _root, app, check_confidence, check_rank_by, console, err
from flatlab.errors import FlatlabError
from flatlab.lazy import lazy
from flatlab.tracking import runs
from flatlab.tracking import trials as stored_trials

pd = lazy("pandas")
workload_ranges = lazy("flatlab.workloads.ranges")  # torch: the registries that declare the ranges


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
        help="a search study (Optuna + ASHA) of the same arms: the share of this grid "
        "study's trial-epochs it needed to reach the grid's best validation metric",
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
    tuning: Optional[int] = typer.Option(
        None, "--tuning", min=1, help="with several tunings: the table of this tuning alone (seed intervals only)"
    ),
    tuning_curves: bool = typer.Option(
        False,
        "--tuning-curves",
        help="tuning curves of a random-search pool (searcher='random', scheduler='fifo'): per arm, what a search of "
        "n trials finds, with bands; a CSV and PNG per quantity (--output, default <root>/<study>/tuning_curves)",
    ),
    correlation: bool = typer.Option(
        False,
        "--correlation",
        help="whether flatness predicts generalisation: Kendall's tau of each measure against the test metric and "
        "the generalisation gap over every completed trial, with cluster bootstrap intervals and p-values (tunings, "
        "then configurations, resampled), Holm over the table (and Psi for a grid)",
    ),
    output: Optional[Path] = typer.Option(
        None, help="with --tuning-curves or --correlation: the folder for the CSVs and PNGs"
    ),
    margin: Optional[List[str]] = typer.Option(
        None,
        "--margin",
        metavar="QUANTITY=M",
        help="over tunings: the equivalence margin of a quantity, in its units (repeatable), over the study's "
        "margins; default 1 point of an accuracy, else 10 percent of the reference arm's mean",
    ),
    design: bool = typer.Option(
        False,
        "--design",
        help="over tunings: per claim, the variance components and run costs this launch measured, the effect its "
        "design detects at power 0.8, and the cheapest (tunings x final seeds) for --effect (default: the margin)",
    ),
    effect: Optional[List[str]] = typer.Option(
        None, "--effect", metavar="QUANTITY=DELTA", help="with --design: the effect to detect (repeatable)"
    ),
    time_to_target: bool = typer.Option(
        False,
        "--time-to-target",
        help="AlgoPerf-style: per arm the median passes and training seconds its final runs took to reach the "
        "validation target (a miss is infinite), and the speed-up over the reference with its interval over tunings",
    ),
    target: Optional[float] = typer.Option(
        None,
        help="with --time-to-target: the target of the study metric (default: the median final value of the "
        "reference arm's final runs)",
    ),
    at_equal: Optional[str] = typer.Option(
        None,
        "--at-equal",
        help="passes or seconds: the arms compared at the largest budget every final run reached (the study metric, "
        "test metrics logged every epoch, flat_curve measures), with the main table's claims",
    ),
    tracking_uri: Optional[str] = typer.Option(None, envvar="MLFLOW_TRACKING_URI", help="MLflow tracking URI"),
    root: Optional[Path] = typer.Option(None, help=ROOT_HELP),
) -> None:
    """The paper table: per arm mean ± std and CI over seeds of the test metric, flatness and epochs or
    steps to target (final-stage trials, else each arm's best configuration), and paired per-seed
    differences against a reference arm, Holm-adjusted within each quantity. A study of several tunings
    takes the tuning as its unit of replication: each claim is tested over the tunings (Holm across arms),
    labelled shown, no difference larger than ±m, or inconclusive, with its heterogeneity across tunings;
    --design says what effect the design detects and which tunings x seeds would detect a stated one.

    With several studies (one workload each): one summary over them, per arm and workload the rank by
    the test metric, the test metric and each shared flatness measure relative to the reference arm,
    and the arms' performance profiles (a PNG)."""
    uri = tracking_uri or runs.default_tracking_uri(_root(root).resolve())
    try:
        check_rank_by(rank_by)
        check_confidence(confidence)
        if fmt not in cmp.FORMATS:
            raise FlatlabError(f"--format {fmt!r} is not supported; expected one of {', '.join(cmp.FORMATS)}")
        if len(studies) > 1:
            _check_single_study_options(against, measure, tuning_curves, correlation, tuning, at_equal)
            if time_to_target:
                _time_profiles(studies, uri, reference, target, confidence, fmt, plot, _root(root))
                return
            _compare_workloads(
                studies, uri, reference=reference, metric=metric, rank_by=rank_by, fmt=fmt, plot=plot,
                tau_max=tau_max, root=_root(root),
            )  # fmt: skip
            return
        if tau_max is not None:
            raise FlatlabError("--tau-max is for the performance profiles of several studies; give two or more")
        study = studies[0]
        folder = output or _root(root) / study
        if tuning_curves or correlation:
            _extras(uri, study, reference, measure, confidence, fmt, folder, tuning_curves, correlation)
            return
        margins, effects = _pairs(margin, "--margin"), _pairs(effect, "--effect")
        if time_to_target or at_equal is not None:
            _at_cost(uri, study, reference, confidence, fmt, margins, time_to_target, target, at_equal)
            return
        if design:
            _print_design(uri, study, reference, metric, confidence, measure, margins, effects, fmt)
            return
        _compare_one(uri, study, reference, metric, rank_by, fmt, confidence, measure, plot, tuning, margins)
        if against is not None:
            _print_efficiency(_efficiency(uri, study, against, tolerance), fmt, study, against)
    except (FlatlabError, ValueError) as exc:
        _fail(exc)


def _at_cost(uri, study, reference, confidence, fmt, margins, time_to_target: bool, target, at_equal) -> None:
    """``--time-to-target`` and ``--at-equal``: the compute-based tables (:mod:`flatlab.cli.equal`)."""
    if fmt == "latex":
        raise FlatlabError("--time-to-target and --at-equal are written as table, markdown or csv")
    if time_to_target:
        equal.print_time_to_target(uri, study, reference=reference, target=target, confidence=confidence, fmt=fmt)
    if at_equal is not None:
        equal.print_at_equal(uri, study, at_equal, reference=reference, confidence=confidence, margins=margins, fmt=fmt)


def _time_profiles(studies, uri, reference, target, confidence, fmt, plot, root: Path) -> None:
    """``flatlab compare A B --time-to-target``: the median time to target per arm and study, and the
    performance profiles in passes and in seconds (PNGs in ``plot``'s folder, default ``<root>/compare``)."""
    if fmt == "latex":
        raise FlatlabError("--time-to-target is written as table, markdown or csv")
    folder = plot.parent if plot is not None else root / "compare"
    paths = equal.time_profiles(
        uri, studies, reference=reference, target=target, confidence=confidence, fmt=fmt, folder=folder
    )
    err.print(f"wrote the performance profiles to {', '.join(map(str, paths))}", soft_wrap=True)


def _check_single_study_options(against, measure, tuning_curves: bool, correlation: bool, tuning, at_equal) -> None:
    """Options that only one study's table takes, refused with several studies."""
    if against is not None:
        raise FlatlabError("--against compares one grid study with a search study; give one STUDY with it")
    if measure:
        raise FlatlabError(
            "--measure selects rows of one study's table; the summary of several shows every shared measure"
        )
    if tuning_curves or correlation or tuning is not None or at_equal is not None:
        raise FlatlabError(
            "--tuning-curves, --correlation, --tuning and --at-equal read one study; give one STUDY with them"
        )


def _pairs(given: Optional[List[str]], option: str) -> dict:
    """``QUANTITY=NUMBER`` options as a dict of positive numbers.

    Raises:
        FlatlabError: an item without ``=``, or a value that is not a positive number.
    """
    out = {}
    for item in given or ():
        q, sep, v = item.rpartition("=")
        try:
            value = float(v)
        except ValueError:
            value = float("nan")
        if not sep or not q or not value > 0 or value == float("inf"):
            raise FlatlabError(
                f"{option} {item!r}: expected QUANTITY=NUMBER with a positive number, e.g. test/accuracy=0.005"
            )
        out[q] = value
    return out


def _print_design(uri, study, reference, metric, confidence, measure, margins, effects, fmt) -> None:
    """``--design``: the design table of a study of several tunings."""
    sample = stored_trials.read_sample(uri, study)
    if len(sample.tunings) < 2:
        raise FlatlabError(f"--design needs a study of several tunings; {study!r} has {len(sample.tunings)}")
    c = compare_tunings(
        sample, study=study, metric=metric, reference=reference, confidence=confidence, measures=measure or None,
        margins=margins, ranges=workload_ranges.ranges_of(sample.info.workload),
    )  # fmt: skip
    rows = design_table.study_design(c, sample, effects=effects)
    if fmt == "csv":
        sys.stdout.write(_design_frame(rows).to_csv(index=False))
    elif fmt == "table":
        print_table(console, make_table(list(design_table.HEADERS), design_table.cells(rows)), "use --format markdown")
        for line in design_table.caption(c):
            console.print(line, soft_wrap=True, markup=False)
    else:
        sys.stdout.write(design_table.to_markdown(c, rows))


def _design_frame(rows):
    out = []
    for d in rows:
        a = d.allocation
        out.append(
            {
                **{k: getattr(d, k) for k in ("quantity", "arm", "sigma2_tuning", "sigma2_seed", "tunings", "seeds")},
                "detectable": d.detectable,
                "effect": d.effect,
                "cost_tuning": d.cost_tuning,
                "cost_seed": d.cost_seed,
                "best_tunings": a.tunings if a else None,
                "best_seeds": a.seeds if a else None,
                "best_power": a.power if a else None,
                "best_cost": a.cost if a else None,
            }  # fmt: skip
        )
    return pd.DataFrame(out)


def _compare_one(uri, study, reference, metric, rank_by, fmt, confidence, measure, plot, tuning, margins) -> None:
    """One study's table: over its tunings where it has several (and ``tuning`` is not given), else the
    table of its one (or the given) tuning."""
    sample = stored_trials.read_sample(uri, study)
    if tuning is not None:
        if tuning not in sample.tunings:
            raise FlatlabError(f"--tuning {tuning}: study {study!r} has tunings {sample.tunings}")
        sample = sample.tuning(tuning)
    ranges = workload_ranges.ranges_of(sample.info.workload)
    kwargs = dict(metric=metric, reference=reference, confidence=confidence, measures=measure or None, ranges=ranges)
    if len(sample.tunings) > 1:
        if fmt == "latex":
            raise FlatlabError("--format latex is for one tuning's table (add --tuning K); use markdown or csv")
        comparison = compare_tunings(sample, study=study, margins=margins, **kwargs)
        if fmt == "table":
            tunings_text.render(comparison, console)
        else:
            sys.stdout.write(tunings_text.format_tunings(comparison, fmt))
        table = comparison.per_tuning[0]
    else:
        table = cmp.compare_table(sample.trials, study=study, rank_by=rank_by, **kwargs)
        if fmt == "table":
            cmp.render(table, console)
        else:
            sys.stdout.write(cmp.format_comparison(table, fmt))
    if plot is not None:
        cmp.plot_metric_vs_flatness(table, plot)
        err.print(f"wrote {plot}")


def _extras(uri, study, reference, measure, confidence, fmt, folder: Path, curves: bool, correlation: bool) -> None:
    """``--tuning-curves`` and ``--correlation``: the tables printed, the CSVs and PNGs written to ``folder``."""
    sample = stored_trials.read_sample(uri, study)
    if curves:
        ranges = workload_ranges.ranges_of(sample.info.workload)
        c = pool.pool_curves(
            sample, reference=reference, measures=measure or None, confidence=confidence, ranges=ranges
        )
        paths = pool.write_curves(c, folder / "tuning_curves")
        _print_curves(c, fmt)
        err.print(f"wrote {len(paths)} files to {folder / 'tuning_curves'}", soft_wrap=True)
    if correlation:
        p = generalisation.flatness_correlations(sample, measures=measure or None, confidence=confidence)
        if fmt == "table":
            generalisation.render(p, console)
        elif fmt == "csv":
            sys.stdout.write(p.frame().to_csv(index=False))
        else:
            sys.stdout.write(generalisation.to_markdown(p))
        out = folder / "correlation"
        out.mkdir(parents=True, exist_ok=True)
        p.frame().to_csv(out / "flatness_correlation.csv", index=False)
        for m in dict.fromkeys(r.measure for r in p.rows):
            generalisation.plot_scatter(sample, m, out / f"scatter_{m.replace('/', '_')}.png")
        err.print(f"wrote the correlation table and scatter plots to {out}", soft_wrap=True)


def _print_curves(curves, fmt: str) -> None:
    """The tuning curves at a few budgets (n = 1, N/4, N/2, N): one table per quantity (terminal or
    markdown), or every row of every quantity as CSV."""
    frames = {q: pool.curves_frame(curves, q) for q in (curves.metric, *curves.quantities)}
    if fmt == "csv":
        sys.stdout.write(pd.concat([f.assign(quantity=q) for q, f in frames.items()]).to_csv(index=False))
        return
    for q, f in frames.items():
        top = int(f["n"].max())
        shown = f[f["n"].isin(sorted({1, max(1, top // 4), max(1, top // 2), top}))]
        body = [[v if isinstance(v, str) else number(v) for v in row] for row in shown.itertuples(index=False)]
        title = f"{curves.study}: {q}, by the number of trials n in the search"
        if fmt == "table":
            print_table(
                console, make_table(list(shown.columns), body, title=title, title_justify="left"), "use --format csv"
            )
        else:
            sys.stdout.write(f"### {title}\n\n{markdown_table(list(shown.columns), body, left=1)}\n\n")
    lines = [pool.CAPTION.format(confidence=f"{curves.confidence:.0%}", reference=curves.reference), *curves.notes]
    for line in lines:
        if fmt == "table":
            console.print(line, soft_wrap=True, markup=False)
        else:
            sys.stdout.write(f"- {line}\n")


def _efficiency(uri: str, study: str, against: str, tolerance: float):
    """``--against``: per arm searched in both, the search study's share of the grid's trial-epochs."""
    df, other = stored_trials.trials_frame(uri, study), stored_trials.trials_frame(uri, against)
    searched = [set(f.loc[f["stage"] != "final", "arm"]) for f in (df, other)]  # final stages are not search
    common = sorted(searched[0] & searched[1])
    if not common:
        raise FlatlabError(
            f"--against {against}: no arm has search or grid trials in both studies; arms of {study}: "
            f"{', '.join(sorted(searched[0])) or '(none)'}; of {against}: {', '.join(sorted(searched[1])) or '(none)'}"
        )
    m, mode = df.attrs.get("metric", "val/accuracy"), df.attrs.get("mode", "max")
    return {a: cmp.hpo_efficiency(df, other, metric=m, mode=mode, tolerance=tolerance, arm=a) for a in common}


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
    repeated = sorted({s for s in studies if studies.count(s) > 1})
    if repeated:
        raise FlatlabError(f"study {', '.join(repeated)} given twice; each study is one workload")
    frames = {s: stored_trials.trials_frame(uri, s) for s in studies}
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
    head, body = cmp.efficiency_cells(efficiency)
    title = f"HPO efficiency: {search} (search) against {grid} (grid), trial-epochs to reach the grid's best"
    if fmt == "table":
        print_table(console, make_table(head, body, title=title), "use --format markdown")
    elif fmt == "markdown":
        sys.stdout.write(f"\n### {title}\n\n{cmp.markdown_table(head, body)}\n")
    elif fmt == "latex":
        sys.stdout.write("\n" + cmp.latex_table(head, body, title))
    else:
        sys.stdout.write("\n" + pd.DataFrame([{"arm": a, **r} for a, r in efficiency.items()]).to_csv(index=False))
