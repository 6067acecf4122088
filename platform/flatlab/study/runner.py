"""Running a study: one launch as one object with a lifecycle (:class:`StudyLaunch`); a study file's
studies are launched one after the other by :func:`flatlab.study.run_file.run_file`.

A launch's stages, in order (:meth:`StudyLaunch.run`)::

    find        which launch this is (new, --resume, --continue) and its MLflow store (launch_record.py)
    check       chained values resolved, the workload's data checked, the driver's log file
    open        Ray started while the MLflow parent run opens (ray_start.py, parent_run.py); the data
                loaded; launch.json written "running"; the Tuner built or restored (tuner.py)
    tune        the search, then the final stage (final_stage.py)
    close       how the launch ended, in MLflow and launch.json (always, also on a failure or Ctrl-C)
    post_study  the reports: the trials read once, analysed, written to the launch's run (flatlab.reports)

Output root layout (``--root``, default ``./flatlab-runs``)::

    mlflow.db, mlartifacts/          MLflow tracking (SQLite default; one experiment per study)
    <study>/launch.json              the latest launch: Tune experiment path, MLflow parent run
    <study>/optuna.db                the Optuna studies (one per arm)
    <study>/ray/<experiment>/        Tune storage: trial checkpoints, results, trial logs
    <study>/logs/flatlab.log         driver logs (Ray's and Tune's included)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shlex
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Optional

from flatlab.interpolation import report as _interpolation_report  # noqa: F401 (registers the interpolation report)
from flatlab.reports.launched import Launched
from flatlab.reports.post_study import post_study
from flatlab.study.budget import budget_record
from flatlab.study.chain import resolve_chained
from flatlab.study.driver_log import quiet_libraries, setup_file_logging
from flatlab.study.final_stage import final_stage_tuner
from flatlab.study.launch_record import grown_studies, launch_tracking_uri, previous_launch
from flatlab.study.launches import Launch, launch_file, log_file
from flatlab.study.options import RunOptions, StudyOutcome
from flatlab.study.parent_run import common_tags, open_parent_run, study_columns
from flatlab.study.ray_compat import check_ray_version, retry_system_failures_only
from flatlab.study.ray_start import check_local_resources, init_ray
from flatlab.study.searchers import optuna_study_name
from flatlab.study.spec import Study
from flatlab.study.trial_spec import with_arm_epochs
from flatlab.study.tuner import Started, build_tuner, experiment_path
from flatlab.study.tunings import study_lanes
from flatlab.tracking import runs
from flatlab.workloads.ranges import ranges_of
from flatlab.workloads.registry import build_workload

__all__ = ["RunOptions", "StudyLaunch", "StudyOutcome", "resume_command", "run_study"]

logger = logging.getLogger("flatlab")


def run_study(study: Study, opts: RunOptions, console: Any = None) -> StudyOutcome:
    """Run (or ``opts.resume``) ``study``: :meth:`StudyLaunch.run`; returns when every trial has ended or
    on interruption.

    Raises:
        ConfigError, DataUnavailable: as :meth:`StudyLaunch.run`.
    """
    return StudyLaunch(study, opts, console).run()


def resume_command(opts: RunOptions) -> str:
    """The ``flatlab run ... --resume`` line that finishes the launch ``opts`` started: the study file,
    and ``--root`` and ``--address`` where they are not the defaults (the MLflow store and the budget
    options are read back from the launch record)."""
    words = ["flatlab", "run", opts.source or "<study file>", "--resume", *_root_option(opts.root)]
    if opts.address:
        words += ["--address", opts.address]
    return " ".join(w if w == "<study file>" else shlex.quote(w) for w in words)


def _root_option(root: Any) -> List[str]:
    """``["--root", ROOT]`` where ``root`` is not the default output root (``./flatlab-runs``), else ``[]``."""
    root = Path(root).resolve()
    return ["--root", str(root)] if root != Path(RunOptions.root).resolve() else []


class StudyLaunch:
    """One launch of ``study``: an object with a lifecycle whose stages are its methods and whose state
    (the study, the options, the launch record, the MLflow store and run, the Tuner, how it ended) is its
    fields, in the shape of torchtune's recipes (set up, train, clean up on one object).

    :meth:`run` goes through the stages: :meth:`find`, :meth:`check`, :meth:`open`, :meth:`tune` (the
    search, :meth:`final_stage`), :meth:`close`, :meth:`post_study`.

    Attributes:
        study: the study (once :meth:`check` ran, its chained values resolved; once :meth:`open` ran, each
            arm's epochs under a pass budget).
        opts: how it runs (:class:`RunOptions`); ``console``: a rich console, or ``None``.
        root, out: the output root and the study's folder (``<root>/<study>``).
        storage_path: Tune's storage (``--storage``, else ``<out>/ray``).
        previous: the launch a ``--resume`` finishes or a ``--continue`` grows (``None``: a new launch).
        grown: for ``--continue``, what it grows (:func:`~flatlab.study.launch_record.grown_studies`).
        tracking_uri: the launch's MLflow store.
        record: its launch record (launch.json), once written.
        started: its Tuner and callbacks (:class:`~flatlab.study.tuner.Started`), once built.
        interrupted, failed, num_errors: how the search and the final stage ended.
    """

    def __init__(self, study: Study, opts: RunOptions, console: Any = None) -> None:
        self.study, self.opts, self.console = study, opts, console
        self.t0 = time.monotonic()
        self.root = Path(opts.root).resolve()
        self.out = self.root / study.name  # made once the checks pass: a refused launch leaves no folder
        self.storage_path = opts.storage or str(self.out / "ray")
        self.previous: Optional[Launch] = None
        self.grown: Optional[Dict[str, Any]] = None
        self.tracking_uri = ""
        self.record: Optional[Launch] = None
        self.started: Optional[Started] = None
        self.interrupted, self.failed, self.num_errors = False, False, 0

    def run(self) -> StudyOutcome:
        """Run (or ``opts.resume``) the launch; returns when every trial has ended or on interruption.

        ``opts.resume`` finishes the latest launch: its Tune experiment is restored (at the budget it was
        launched with, which :func:`flatlab.study.prepare.prepare` gave the study and ``opts.overrides``)
        and what is left runs: search trials, then the final stage; a launch that already finished is left
        as it is (:meth:`already_finished`). ``opts.continue_`` starts a new launch whose arms add trials to
        the previous launch's Optuna studies.

        A failure before Tune starts (Ray, the data, the searcher) ends the launch's parent run FAILED
        (KILLED on Ctrl-C) and launch.json ``failed`` (``killed``) before it propagates; from Tune on, the
        launch ends FINISHED, KILLED (interrupted: ``--resume`` finishes it) or FAILED.

        Raises:
            ConfigError: ``--resume`` with nothing to resume; ``--continue`` without a previous launch or
                with a changed space (:func:`flatlab.study.launches.continued_studies`); both at once; a
                chained value that cannot be resolved.
            DataUnavailable: the workload's data is missing (``Workload.check_data``), before Ray or
                MLflow start.
        """
        quiet_libraries()
        check_ray_version(self.console)  # says so when this Ray is not one flatlab's workarounds were tested on
        retry_system_failures_only()  # FailureConfig's retries: for lost nodes and workers, not the trial's own errors
        self.t0 = time.monotonic()
        self.find()
        if self.opts.resume and self.previous is not None and self.previous.done:
            return self.already_finished()
        workload = self.check()
        self.open(workload)
        self.tune()
        if not self.interrupted:
            self.post_study()
        elif self.console is not None:
            self.console.print(f"[yellow]interrupted[/yellow]: continue with `{resume_command(self.opts)}`")
        return self.outcome(self.started.total if self.started else 0)

    def find(self) -> None:
        """Which launch this is (:attr:`previous`) and its MLflow store (:attr:`tracking_uri`), checked
        before anything starts (:mod:`flatlab.study.launch_record`)."""
        self.previous = previous_launch(self.study, self.opts, self.root)
        self.tracking_uri = launch_tracking_uri(self.opts, self.previous, self.root)

    def check(self) -> Any:
        """The checks before Ray or MLflow start: chained values resolved (a new launch), the workload's
        data present (one ``DataUnavailable``), then the study's folder and log file made. Returns the
        workload."""
        if not self.opts.resume:
            self.study = resolve_chained(self.study, self.tracking_uri)  # best_of(...) values, before anything starts
        workload = build_workload(self.study.workload, **dict(self.study.workload_params))
        workload.check_data()  # missing data: one error (DataUnavailable) before Ray, MLflow or a trial starts
        self.out.mkdir(parents=True, exist_ok=True)
        setup_file_logging(self.out)
        logger.info("launch %s: tracking %s", self.study.name, self.tracking_uri)
        return workload

    def already_finished(self) -> StudyOutcome:
        """``--resume`` of a launch whose trials all completed: nothing runs (no Ray, no post-study, nothing
        logged to MLflow); says so and where its results are. The outcome has ``already_finished`` set."""
        self.record = self.previous
        if self.console is not None:
            name = self.study.name
            self.console.print(f"study [bold]{name}[/bold]: its latest launch already finished; nothing to resume")
            self.console.print(
                f"its results: `{self.read_command('compare')}` (the table), `{self.read_command('results')}` "
                f"(the trials); MLflow run {self.record.parent_run_id} in {self.tracking_uri}",
                soft_wrap=True,
                markup=False,
            )
        return dataclasses.replace(self.outcome(self.study.num_total_trials()), already_finished=True)

    def read_command(self, command: str) -> str:
        """``flatlab <command> <study>`` with the ``--root`` or ``--tracking-uri`` that reads this launch's
        store (none where it is the default root's)."""
        words = ["flatlab", command, self.study.name]
        words += ["--tracking-uri", self.tracking_uri] if self.opts.tracking_uri else _root_option(self.root)
        return shlex.join(words)

    def open(self, workload: Any) -> None:
        """Open the launch and build its Tuner: the MLflow parent run (in a thread, overlapping Ray's
        start-up and the data loading), launch.json (``running``, :meth:`write_record`), the trainable,
        the MLflow and progress callbacks, and the Tuner (new, or restored for ``--resume``). Any failure
        here ends the launch FAILED (KILLED on Ctrl-C) before it propagates (:meth:`end_unstarted`)."""
        study, opts = self.study, self.opts
        resumed = self.previous if opts.resume else None
        self.grown = grown_studies(study, self.previous, self.root) if opts.continue_ else None
        tags = common_tags(study, opts)
        with ThreadPoolExecutor(max_workers=1) as pool:  # MLflow set-up (seconds on a fresh SQLite store)
            opened = pool.submit(
                open_parent_run, study, opts, self.tracking_uri, self.root, tags, resumed, self._continue_tags()
            )
            try:
                init_ray(opts, self.tracking_uri)
                setup_file_logging(self.out)  # ray.init reconfigures logging
                check_local_resources(study, opts)  # a GPU study on a CPU machine fails here, not by waiting for ever
                logger.info("Ray ready (%.1f s)", time.monotonic() - self.t0)
                data = workload.load_data(study.seed)  # once per study; reaches trials through the object store
                self.study = with_arm_epochs(study, len(data.train))  # a pass budget as each arm's epochs
                experiment_id, parent_run_id, exp_name = opened.result()
                logger.info("MLflow ready, data loaded (%.1f s)", time.monotonic() - self.t0)
                self.write_record(experiment_id, parent_run_id, exp_name)
                self.started = build_tuner(self.study, opts, self.record, self.storage_path, data, tags)
            except BaseException as exc:
                self.end_unstarted(opened, exc)
                raise
        self._say_opened()
        logger.info("starting Tune (%.1f s)", time.monotonic() - self.t0)

    def _continue_tags(self) -> Dict[str, str]:
        """The parent run's tags of a ``--continue`` launch: the launch and the Optuna studies it grows."""
        if not self.grown:
            return {}
        return {
            "flatlab.continues": self.grown["parent_run_id"],
            "flatlab.optuna_studies": ",".join(self.grown["optuna_studies"].values()),
        }

    def _say_opened(self) -> None:
        """The console's line on an opened launch: its trials, store and logs."""
        if self.console is None:
            return
        study = self.study
        self.console.print(
            f"study [bold]{study.name}[/bold]: {self.started.total} trials"
            + (f", then {study.num_final_trials()} final-seed trials" if study.final_seeds else "")
            + f", tracking {self.tracking_uri}, logs {self.out / 'logs'}"
            + (" (resumed)" if self.opts.resume else "")
            + (f" (adding to the Optuna studies of launch {self.grown['experiment_name']})" if self.grown else "")
        )

    def write_record(self, experiment_id: str, parent_run_id: str, exp_name: str) -> Launch:
        """launch.json of this launch (:attr:`record`), written ``running``. A resume keeps what the launch
        recorded (its budget, Optuna studies, what it continues, its final stage), with this run's
        checkpoint cadence."""
        study, opts = self.study, self.opts
        if opts.resume and self.previous is not None:
            launch, prefix = self.previous, self.previous.optuna_prefix or exp_name
            overrides = launch.overrides if launch.overrides is not None else dict(opts.overrides)
        else:
            launch = Launch(
                path=launch_file(self.root, study.name),
                experiment_name=exp_name,
                experiment_path=experiment_path(self.storage_path, exp_name),
                parent_run_id=parent_run_id,
            )
            prefix, overrides = (self.grown or {}).get("optuna_prefix") or exp_name, dict(opts.overrides)
            if self.grown:
                launch.continues = {k: self.grown[k] for k in ("experiment_name", "parent_run_id", "optuna_studies")}
        self.record = launch.write(
            tracking_uri=self.tracking_uri,
            experiment_id=experiment_id,
            status="running",
            overrides=overrides,
            checkpoint_every=study.checkpoint_every,  # --resume keeps it (launches.resume_checkpoint_every)
            budget=budget_record(study.budget, study.max_epochs),  # which unit: epochs, passes or seconds
            optuna_storage=f"sqlite:///{self.out / 'optuna.db'}",
            optuna_prefix=prefix,
            optuna_studies={lane: optuna_study_name(prefix, lane) for lane in study_lanes(study)}
            if study.searcher != "grid"
            else {},
        )
        return self.record

    def end_unstarted(self, opened: Future, exc: BaseException) -> None:
        """End a launch that failed before Tune started (``exc``): its parent run FAILED (KILLED on Ctrl-C)
        and launch.json ``failed`` (``killed``), never RUNNING/``running``. Nothing to end where MLflow
        itself failed (no parent run). Never raises: ``exc`` is what the caller sees."""
        try:
            experiment_id, parent_run_id, exp_name = opened.result()
        except BaseException:  # noqa: BLE001 - MLflow itself failed: no parent run was opened
            return
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        logger.error("launch failed before Tune started: %s: %s", type(exc).__name__, exc, exc_info=exc)
        try:
            runs.client(self.tracking_uri).set_terminated(parent_run_id, status=status)
            launch = self.record or Launch(
                path=self.out / "launch.json",
                experiment_name=exp_name,
                experiment_path=experiment_path(self.storage_path, exp_name),
                parent_run_id=parent_run_id,
                experiment_id=experiment_id,
                tracking_uri=self.tracking_uri,
            )
            launch.write(status=status.lower())
        except Exception:  # noqa: BLE001 - report the original error, not this one
            logger.exception("could not record the failed launch in MLflow / %s", self.out / "launch.json")

    def tune(self) -> None:
        """The search, then (all of it ended) :meth:`final_stage`; :meth:`close` records how the launch
        ended whatever happens. Ctrl-C ends it interrupted (KILLED)."""
        started = self.started
        try:
            grid = started.tuner.fit()
            self.num_errors = grid.num_errors
            self.interrupted = grid.num_terminated + grid.num_errors < started.total
            if self.study.final_seeds and not self.interrupted:
                self.final_stage(grid)
            if started.records is not None and not self.interrupted:  # a killed driver's runs no trial took over
                for run_id in started.records.end_unclaimed():
                    logger.warning(
                        "resume: run %s of a trial started before the kill, never resumed, ended KILLED", run_id
                    )
        except KeyboardInterrupt:
            self.interrupted = True
        except BaseException:
            self.failed = True
            raise
        finally:
            self.close()

    def final_stage(self, grid: Any) -> None:
        """Each arm's best configuration (per tuning) of the search ``grid`` re-run on the final seeds
        (:mod:`flatlab.study.final_stage`)."""
        final = final_stage_tuner(self.study, self.opts, self.started, grid).fit()
        self.num_errors += final.num_errors
        self.interrupted = final.num_terminated + final.num_errors < len(final)

    def close(self) -> None:
        """Record how the launch ended: the MLflow callback flushed, the parent run FINISHED, KILLED
        (interrupted) or FAILED, and launch.json with the same status and the trials' errors."""
        logger.info("Tune done (%.1f s)", time.monotonic() - self.t0)
        mlflow_cb, launch = self.started.mlflow_cb, self.started.launch
        mlflow_cb.close(interrupted=self.interrupted, failed=self.failed)
        logger.info("MLflow flushed (%.1f s)", time.monotonic() - self.t0)
        status = "FAILED" if self.failed else "KILLED" if self.interrupted else "FINISHED"
        runs.client(launch.tracking_uri).set_terminated(launch.parent_run_id, status=status)
        launch.write(status=status.lower(), num_errors=self.num_errors)
        for err in mlflow_cb.errors:
            logger.warning("MLflow: %s", err)

    def post_study(self) -> None:
        """The post-study pipeline (:func:`flatlab.reports.post_study.post_study`), handed what the launch
        knows that its trials do not (:class:`~flatlab.reports.launched.Launched`)."""
        record, study = self.record, self.study
        optuna_studies = record.optuna_studies or {
            a.name: optuna_study_name(record.experiment_name, a.name) for a in study.arms
        }  # a --continue launch adds its trials to the previous launch's studies
        launched = Launched(
            study=study,
            tracking_uri=self.tracking_uri,
            experiment_id=record.experiment_id,
            parent_run_id=record.parent_run_id,
            out=self.out,
            log=log_file(self.out),
            optuna_studies=optuna_studies,
            ranges=ranges_of(study.workload),
            columns=functools.partial(study_columns, study),
            console=self.console,
        )
        post_study(launched)

    def outcome(self, num_trials: int) -> StudyOutcome:
        """What the launch produced, ``num_trials`` its search's budget."""
        record = self.record
        return StudyOutcome(
            study=self.study.name,
            tracking_uri=self.tracking_uri,
            experiment_id=record.experiment_id,
            parent_run_id=record.parent_run_id,
            experiment_path=record.experiment_path,
            interrupted=self.interrupted,
            num_trials=num_trials,
            num_errors=self.num_errors,
            wall_s=time.monotonic() - self.t0,
        )
