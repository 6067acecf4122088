"""``flatlab run`` and ``flatlab submit``: launch, resume or submit a study file's studies."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import typer

from flatlab.analysis import compare as cmp
from flatlab.analysis import design_table, tunings_text
from flatlab.analysis.query import select
from flatlab.analysis.results import render as render_results
from flatlab.analysis.sample import Sample
from flatlab.analysis.tunings import compare_tunings
from flatlab.cli.app import ROOT_HELP, _fail, _root, app, console, err
from flatlab.cli.results import _say_arms_without_answer
from flatlab.cluster import check_address, enable_token_auth_if_available, submit_study
from flatlab.errors import FlatlabError
from flatlab.lazy import lazy
from flatlab.study.launches import log_file
from flatlab.study.options import RunOptions, StudyOutcome
from flatlab.study.spec import Study
from flatlab.tracking import trials as stored_trials
from flatlab.tracking.runs import default_tracking_uri
from flatlab.tracking.ui import where_to_look

# torch loads with the studies' validation, Ray and MLflow with the runner: `flatlab --help` starts without them
study_run_file = lazy("flatlab.study.run_file")
study_chain = lazy("flatlab.study.chain")  # torch (the trial routing): loaded by --dry-run only
study_plan = lazy("flatlab.study.plan")
workload_registry = lazy("flatlab.workloads.registry")  # torch: loaded once a launch is under way
workload_ranges = lazy("flatlab.workloads.ranges")  # torch: the registries that declare the ranges


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
    tunings: Optional[int] = typer.Option(
        None,
        min=1,
        help="independent tunings per arm, each with its own search, seeds and final stage (overrides the study)",
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
        help="epochs between trial checkpoints, Tune's checkpoint frequency (overrides the study; the last epoch is "
        "always checkpointed; --resume keeps the launch's unless given)",
    ),
) -> None:
    """Run the studies of STUDY_FILE on Ray Tune (Optuna searcher, ASHA, MLflow tracking).

    Exit status: 0 when the launch ended (a line at the end says how many trials failed, if any); 1 when
    every trial of a study failed; 2 for invalid input (study file, options, cluster address) before any
    trial; 130 when interrupted (``--resume`` continues).
    """
    given = {
        "trials": trials,
        "epochs": epochs,
        "final_seeds": final_seeds,
        "tunings": tunings,
        "scale": scale,
        "checkpoint_every": checkpoint_every,
    }
    opts = RunOptions(
        root=_root(root),
        address=address,
        tracking_uri=tracking_uri,
        storage=storage,
        resume=resume,
        continue_=continue_,
        source=str(study_file),
        num_cpus=num_cpus,
    )
    interrupted, all_failed = _launch_file(study_file, given, opts, study or (), dry_run)
    if interrupted:
        raise typer.Exit(130)
    if all_failed:
        raise typer.Exit(1)


def _launch_file(
    study_file: Path, given: Dict[str, Any], opts: RunOptions, only: Sequence[str], dry_run: bool
) -> Tuple[bool, bool]:
    """:func:`flatlab.study.run_file.run_file` of STUDY_FILE, with the CLI's checks (the studies' warnings,
    then the dry run's plans, or the checks before a launch) and each launch's report; a bad study file,
    option or address is one line and exit 2. Returns ``(interrupted, every trial of a study failed)``."""
    prepared: List[Study] = []  # the studies, once the file was prepared: errors after that are the launch's
    all_failed: List[bool] = []

    def check(studies: List[Study]) -> bool:
        prepared.extend(studies)
        for s in studies:
            for warning in s.warnings():
                err.print(f"[yellow]warning:[/yellow] study {s.name!r}, {warning}", soft_wrap=True)
        if dry_run:
            _print_plans(studies, opts.tracking_uri or default_tracking_uri(Path(opts.root).resolve()))
            return False
        _check_before_launch(studies, opts.resume, opts.address)
        return True

    def report(s: Study, outcome: StudyOutcome) -> None:
        if not outcome.already_finished:  # a --resume that did nothing: the runner said where its results are
            all_failed.append(_report(s, outcome, str(study_file), Path(opts.root).resolve()))

    try:
        outcomes = study_run_file.run_file(
            str(study_file), given, opts, only=only, console=console, check=check, report=report
        )
    except FlatlabError as exc:
        _fail(exc)
    except ValueError as exc:  # a study file's own error; one raised by a launch is not the input's
        if prepared:
            raise
        _fail(exc)
    except ConnectionError as exc:  # Ray's, e.g. a head that wants a token we do not have
        if not (prepared and opts.address):
            raise
        _fail(
            FlatlabError(
                f"--address {opts.address}: {exc}; a head with token authentication needs its token here "
                "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
            )
        )
    return any(o.interrupted for o in outcomes), any(all_failed)


def _print_plans(studies: List[Study], tracking_uri: str) -> None:
    """``--dry-run``: each study's trial plan, and what its chained values would resolve to in ``tracking_uri``."""
    for s in studies:
        study_plan.render(s, console)
        for line in study_chain.describe_chained(s, tracking_uri):
            console.print(line, soft_wrap=True)
        for line in _planned_power(s, tracking_uri):
            console.print(line, soft_wrap=True, markup=False)


def _planned_power(study: Study, tracking_uri: str) -> List[str]:
    """``--dry-run``: the effect the planned tunings x final seeds detect, when an earlier launch of the study
    with two or more tunings gives the variance components; nothing otherwise."""
    if not study.final_seeds:
        return []
    try:
        sample = stored_trials.read_sample(tracking_uri, study.name)
    except FlatlabError:
        return []
    if len(sample.tunings) < 2:
        return []
    try:
        c = compare_tunings(sample, study=study.name)
    except FlatlabError:
        return []
    return design_table.planned_lines(c, sample, (study.tunings, len(study.final_seeds)))


def _check_before_launch(studies: List[Study], resume: bool, address: Optional[str]) -> None:
    """One line and exit 2 within seconds, before Ray and MLflow are even imported: the workloads' data
    missing (``run_study`` checks again; a resume already had it), or a cluster address that does not
    answer (and the cluster's auth mode, :mod:`flatlab.cluster`)."""
    try:
        if not resume:
            for s in studies:
                workload_registry.build_workload(s.workload, **dict(s.workload_params)).check_data()
        if address:
            check_address(address)
    except FlatlabError as exc:
        _fail(exc)


def _report(study: Study, outcome: StudyOutcome, source: str, root: Path) -> bool:
    """What a launch that ended printed last: its best trial (or configuration) per arm from MLflow, the
    comparison table where it has one, where to look in MLflow's UI and how many trials failed. True
    when every trial failed."""
    df = stored_trials.trials_frame(outcome.tracking_uri, study.name)
    pooled = study.searcher == "grid" and len(study.seeds) > 1  # every grid point ran with every seed
    console.print(
        f"\n[bold]{study.name}[/bold] ran {outcome.wall_s:.0f} s (wall, Ray and MLflow start-up included); "
        + (
            f"best configuration per arm, mean and std over {len(study.seeds)} seeds"
            if pooled
            else "best trial per arm"
        )
        + " (from MLflow):"
    )
    best = select(df, best=True, by_config=pooled)
    hint = f"use flatlab results {study.name} --best{' --by-config' if pooled else ''} --format csv"
    render_results(best, console, hint=hint)
    _say_arms_without_answer(df, best, [a.name for a in study.arms])
    if not outcome.interrupted and (pooled or study.final_seeds):
        _print_comparison(df, study, console)
    console.print(where_to_look(outcome.tracking_uri, outcome.experiment_id), soft_wrap=True)  # the training view
    line = failure_line(study.name, outcome.num_errors, len(df), source, log_file(root / study.name))
    if line:  # the last line: how many trials failed
        console.print(line, soft_wrap=True)
    return outcome.num_errors > 0 and outcome.num_errors >= len(df)


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


def _print_comparison(df, study, out) -> None:
    """The ``flatlab compare`` table of a launch that just ended, over its tunings where it has several (a
    failure here is one warning line)."""
    try:  # the launch's reference arm (selection.reference_arm)
        sample = Sample.of(df)
        several = len(sample.tunings) > 1
        ranges = workload_ranges.ranges_of(study.workload)
        comparison = (
            compare_tunings(sample, study=study.name, ranges=ranges)
            if several
            else cmp.compare_table(df, study=study.name, ranges=ranges)
        )
    except (FlatlabError, ValueError) as exc:
        err.print(f"[yellow]warning:[/yellow] no comparison table: {exc}", soft_wrap=True)
        return
    out.print(f"\n[bold]{study.name}[/bold]: `flatlab compare {study.name}` (also logged to the launch's MLflow run):")
    (tunings_text.render if several else cmp.render)(comparison, out)


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
    enable_token_auth_if_available()  # before Ray reads its auth mode
    try:
        job_id = submit_study(address, study_file, working_dir, list(args or []), follow=follow, console=console)
    except (FlatlabError, ValueError) as exc:
        _fail(exc)
    console.print(job_id)
