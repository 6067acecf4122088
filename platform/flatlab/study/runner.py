"""Running a study: the launch sequence, from the checks before anything starts to the reports after.

In order (:func:`run_study`): the driver's environment and log file (:mod:`~flatlab.study.driver_log`);
which launch this is (new, ``--resume``, ``--continue``) and its MLflow store
(:mod:`~flatlab.study.launch_record`); the data checked; Ray started (:mod:`~flatlab.study.ray_start`)
while the MLflow parent run opens (:mod:`~flatlab.study.parent_run`); launch.json written
``running``; the Tuner built or restored (:mod:`~flatlab.study.tuner`); the search, then the final
stage (:mod:`~flatlab.study.final_stage`); how the launch ended, in MLflow and launch.json; the
post-study reports (:mod:`~flatlab.study.post_study`).

Output root layout (``--root``, default ``./flatlab-runs``)::

    mlflow.db, mlartifacts/          MLflow tracking (SQLite default; one experiment per study)
    <study>/launch.json              the latest launch: Tune experiment path, MLflow parent run
    <study>/optuna.db                the Optuna studies (one per arm)
    <study>/ray/<experiment>/        Tune storage: trial checkpoints, results, trial logs
    <study>/logs/flatlab.log         driver logs (Ray's and Tune's included)
"""

from __future__ import annotations

import logging
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from flatlab.study.chain import resolve_chained
from flatlab.study.driver_log import quiet_libraries, setup_file_logging
from flatlab.study.final_stage import final_stage_tuner
from flatlab.study.launch_record import (
    end_unstarted,
    grown_studies,
    launch_tracking_uri,
    previous_launch,
    record_launch,
)
from flatlab.study.launches import Launch
from flatlab.study.options import RunOptions, StudyOutcome
from flatlab.study.parent_run import common_tags, open_parent_run
from flatlab.study.post_study import post_study
from flatlab.study.ray_compat import check_ray_version, retry_system_failures_only
from flatlab.study.ray_start import check_local_resources, init_ray
from flatlab.study.spec import Study
from flatlab.study.trial_spec import with_arm_epochs
from flatlab.study.tuner import Started, build_tuner
from flatlab.tracking import runs
from flatlab.workloads.registry import build_workload

__all__ = ["RunOptions", "StudyOutcome", "resume_command", "run_study"]

logger = logging.getLogger("flatlab")


def run_study(study: Study, opts: RunOptions, console: Any = None) -> StudyOutcome:
    """Run (or ``opts.resume``) ``study``; returns when every trial has ended or on interruption.

    In order: open the launch (its MLflow parent run and launch.json, while Ray starts and the data
    loads; :func:`_open`), tune (the search, then the final stage; :func:`_tune`), report (steps to
    target, the comparison, the study report; :func:`~flatlab.study.post_study.post_study`).

    ``opts.resume`` finishes the latest launch: its Tune experiment is restored (at the budget it was
    launched with, which :func:`flatlab.study.prepare.prepare` gave the study and ``opts.overrides``)
    and what is left runs: search trials, then the final stage. ``opts.continue_`` starts a new launch
    whose arms add trials to the previous launch's Optuna studies.

    A failure before Tune starts (Ray, the data, the searcher) ends the launch's parent run FAILED
    (KILLED on Ctrl-C) and launch.json ``failed`` (``killed``) before it propagates; from Tune on, the
    launch ends FINISHED, KILLED (interrupted: ``--resume`` finishes it) or FAILED.

    Raises:
        ConfigError: ``--resume`` with nothing to resume; ``--continue`` without a previous launch or with
            a changed space (:func:`flatlab.study.launches.continued_studies`); both at once; a chained
            value that cannot be resolved.
        DataUnavailable: the workload's data is missing (``Workload.check_data``), before Ray or MLflow start.
    """
    quiet_libraries()
    check_ray_version(console)  # says so when this Ray is not one flatlab's workarounds were tested on
    retry_system_failures_only()  # FailureConfig's retries: for lost nodes and workers, not the trial's own errors
    t0 = time.monotonic()
    root = Path(opts.root).resolve()
    out = root / study.name  # made once the checks below pass: a refused launch leaves no folder
    previous = previous_launch(study, opts, root)
    tracking_uri = launch_tracking_uri(opts, previous, root)
    if opts.resume and previous is not None and previous.done:
        return _already_finished(study, previous, tracking_uri, out, console, t0)
    if not opts.resume:
        study = resolve_chained(study, tracking_uri)  # best_of(...) values, before anything starts
    workload = build_workload(study.workload, **dict(study.workload_params))
    workload.check_data()  # missing data: one error (DataUnavailable) before Ray, MLflow or a trial starts
    out.mkdir(parents=True, exist_ok=True)
    setup_file_logging(out)
    logger.info("launch %s: tracking %s", study.name, tracking_uri)
    started = _open(study, workload, opts, previous, root, tracking_uri, console, t0)
    outcome = _tune(study, opts, started, t0)
    if not outcome.interrupted:
        post_study(study, tracking_uri, outcome.experiment_id, outcome.parent_run_id, out, console)
    elif console is not None:
        console.print(f"[yellow]interrupted[/yellow]: continue with `{resume_command(opts)}`")
    return outcome


def resume_command(opts: RunOptions) -> str:
    """The ``flatlab run ... --resume`` line that finishes the launch ``opts`` started: the study file,
    and ``--root`` and ``--address`` where they are not the defaults (the MLflow store and the budget
    options are read back from the launch record)."""
    words = ["flatlab", "run", opts.source or "<study file>", "--resume"]
    root = Path(opts.root).resolve()
    if root != Path(RunOptions.root).resolve():
        words += ["--root", str(root)]
    if opts.address:
        words += ["--address", opts.address]
    return " ".join(w if w == "<study file>" else shlex.quote(w) for w in words)


def _already_finished(
    study: Study, launch: Launch, tracking_uri: str, out: Path, console: Any, t0: float
) -> StudyOutcome:
    """``--resume`` of a launch whose trials all completed: nothing to continue and no Ray to start. The
    post-study steps are re-done (they are idempotent), in case they were cut short the first time."""
    if console is not None:
        console.print(f"study [bold]{study.name}[/bold]: its latest launch already finished; nothing to resume")
    setup_file_logging(out)
    post_study(study, tracking_uri, launch.experiment_id, launch.parent_run_id, out, console)
    return StudyOutcome(
        study=study.name,
        tracking_uri=tracking_uri,
        experiment_id=launch.experiment_id,
        parent_run_id=launch.parent_run_id,
        experiment_path=launch.experiment_path,
        interrupted=False,
        num_trials=study.num_total_trials(),
        num_errors=0,
        wall_s=time.monotonic() - t0,
    )


def _open(
    study: Study,
    workload: Any,
    opts: RunOptions,
    previous: Optional[Launch],
    root: Path,
    tracking_uri: str,
    console: Any,
    t0: float,
) -> Started:
    """Open the launch and build its Tuner: the MLflow parent run (in a thread, overlapping Ray's start-up
    and the data loading), launch.json (``running``), the trainable, the MLflow and progress callbacks,
    and the Tuner (new, or restored for ``--resume``). Any failure here ends the launch FAILED (KILLED on
    Ctrl-C) before it propagates (:func:`~flatlab.study.launch_record.end_unstarted`)."""
    out = root / study.name
    storage_path = opts.storage or str(out / "ray")
    resumed = previous if opts.resume else None
    grown = grown_studies(study, previous, root) if opts.continue_ else None
    launch_tags = (
        {
            "flatlab.continues": grown["parent_run_id"],
            "flatlab.optuna_studies": ",".join(grown["optuna_studies"].values()),
        }
        if grown
        else {}
    )
    tags = common_tags(study, opts)
    launch: Optional[Launch] = None
    with ThreadPoolExecutor(max_workers=1) as pool:  # MLflow set-up (seconds on a fresh SQLite store)
        opened = pool.submit(open_parent_run, study, opts, tracking_uri, root, tags, resumed, launch_tags)
        try:
            init_ray(opts, tracking_uri)
            setup_file_logging(out)  # ray.init reconfigures logging
            check_local_resources(study, opts)  # a GPU study on a CPU machine fails here, not by waiting for ever
            logger.info("Ray ready (%.1f s)", time.monotonic() - t0)
            data = workload.load_data(study.seed)  # once per study; reaches trials through the object store
            study = with_arm_epochs(study, len(data.train))  # a pass budget as each arm's epochs (study.budget)
            experiment_id, parent_run_id, exp_name = opened.result()
            logger.info("MLflow ready, data loaded (%.1f s)", time.monotonic() - t0)
            launch = record_launch(
                study, opts, resumed, grown, root, storage_path, tracking_uri, experiment_id, parent_run_id, exp_name
            )
            started = build_tuner(study, opts, launch, storage_path, data, tags)
        except BaseException as exc:
            end_unstarted(launch, opened, exc, root / study.name, storage_path, tracking_uri)
            raise
    if console is not None:
        finals = study.num_final_trials()
        console.print(
            f"study [bold]{study.name}[/bold]: {started.total} trials"
            + (f", then {finals} final-seed trials" if study.final_seeds else "")
            + f", tracking {tracking_uri}, logs {out / 'logs'}"
            + (" (resumed)" if opts.resume else "")
            + (f" (adding to the Optuna studies of launch {grown['experiment_name']})" if grown else "")
        )
    logger.info("starting Tune (%.1f s)", time.monotonic() - t0)
    return started


def _tune(study: Study, opts: RunOptions, started: Started, t0: float) -> StudyOutcome:
    """Run the search, then (all of it ended) the final stage; record how the launch ended, in MLflow and
    launch.json, whatever happens. Ctrl-C ends it interrupted (KILLED)."""
    launch, mlflow_cb = started.launch, started.mlflow_cb
    interrupted, failed, num_errors = False, False, 0
    try:
        grid = started.tuner.fit()
        num_errors = grid.num_errors
        interrupted = grid.num_terminated + grid.num_errors < started.total
        if study.final_seeds and not interrupted:
            final = final_stage_tuner(study, opts, started, grid).fit()
            num_errors += final.num_errors
            interrupted = final.num_terminated + final.num_errors < len(final)
        if started.records is not None and not interrupted:  # runs of a killed driver's trials no trial took over
            for run_id in started.records.end_unclaimed():
                logger.warning("resume: run %s of a trial started before the kill, never resumed, ended KILLED", run_id)
    except KeyboardInterrupt:
        interrupted = True
    except BaseException:
        failed = True
        raise
    finally:
        logger.info("Tune done (%.1f s)", time.monotonic() - t0)
        mlflow_cb.close(interrupted=interrupted, failed=failed)
        logger.info("MLflow flushed (%.1f s)", time.monotonic() - t0)
        status = "FAILED" if failed else "KILLED" if interrupted else "FINISHED"
        runs.client(launch.tracking_uri).set_terminated(launch.parent_run_id, status=status)
        launch.write(status=status.lower(), num_errors=num_errors)
        for err in mlflow_cb.errors:
            logger.warning("MLflow: %s", err)
    return StudyOutcome(
        study=study.name,
        tracking_uri=launch.tracking_uri,
        experiment_id=launch.experiment_id,
        parent_run_id=launch.parent_run_id,
        experiment_path=launch.experiment_path,
        interrupted=interrupted,
        num_trials=started.total,
        num_errors=num_errors,
        wall_s=time.monotonic() - t0,
    )
