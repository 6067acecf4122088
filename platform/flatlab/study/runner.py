"""Running a study: local or remote Ray, Tune + ArmSearcher + ASHA, MLflow parent/child runs, resume.

Output root layout (``--root``, default ``./flatlab-runs``)::

    mlflow.db, mlartifacts/          MLflow tracking (SQLite default; one experiment per study)
    <study>/launch.json              the latest launch: Tune experiment path, MLflow parent run
    <study>/optuna.db                the Optuna studies (one per arm)
    <study>/ray/<experiment>/        Tune storage: trial checkpoints, results, trial logs
    <study>/logs/flatlab.log         driver logs (Ray's and Tune's included)
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from flatlab.errors import ConfigError
from flatlab.study.chain import chained_params, resolve_chained
from flatlab.study.launches import Launch, continued_studies, launch_file, log_file
from flatlab.study.spec import Study
from flatlab.study.tunings import tuning_seeds, with_tuning
from flatlab.tracking import runs

logger = logging.getLogger("flatlab")

# Trial checkpoints kept per trial. Tune re-writes the whole experiment state (every trial's JSON and the
# searcher's pickle) each time a trial has saved this many checkpoints, so that the state never points
# at a deleted checkpoint; with 1 that is once per epoch per trial, the largest cost of the driver for
# short epochs. 2 halves it for one extra checkpoint on disk per trial.
KEEP_CHECKPOINTS = 2

#: Times Tune restarts a trial from its last checkpoint after the loss of its node, worker or actor
#: (a trial whose own code raises fails at once: :func:`flatlab.study.ray_compat.retry_system_failures_only`).
SYSTEM_RETRIES = 3


@dataclass
class RunOptions:
    """How to run a study (the ``flatlab run`` options)."""

    root: Path = Path("flatlab-runs")
    address: Optional[str] = None
    tracking_uri: Optional[str] = None
    storage: Optional[str] = None
    resume: bool = False
    continue_: bool = False  # --continue: a new launch that adds trials to the previous launch's Optuna studies
    overrides: Dict[str, Any] = field(default_factory=dict)  # budget options (launches.BUDGET_KEYS), kept for --resume
    source: str = ""
    log_models: bool = True
    num_cpus: Optional[int] = None
    extra_tags: Dict[str, str] = field(default_factory=dict)


@dataclass
class StudyOutcome:
    """What a launch produced."""

    study: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    experiment_path: str
    interrupted: bool
    num_trials: int
    num_errors: int
    wall_s: float


def _setup_file_logging(out: Path) -> None:
    """Send the driver's logging (flatlab, Ray, Tune, Optuna, MLflow, warnings) to the study's log file,
    :func:`flatlab.study.launches.log_file` of its output folder ``out``."""
    log = log_file(out)
    log.parent.mkdir(parents=True, exist_ok=True)
    path = str(log.resolve())
    existing = [
        h
        for h in logging.getLogger("flatlab").handlers
        if getattr(h, "flatlab_study_log", False) and h.baseFilename == path
    ]
    handler = existing[0] if existing else logging.FileHandler(path)
    handler.flatlab_study_log = True  # type: ignore[attr-defined]
    # Tune's per-result JSON/CSV files are off (the results live in MLflow), so its end-of-run analysis
    # warns that it found none for every trial: expected, not worth alarming anyone in the log.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # Python warnings of the driver (e.g. Optuna's "step already reported" after a resume) go to the log too
    logging.captureWarnings(True)
    for name in ("flatlab", "ray", "ray.tune", "ray.train", "ray.data", "optuna", "mlflow", "alembic", "py.warnings"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                lg.removeHandler(h)
            elif getattr(h, "flatlab_study_log", False) and h.baseFilename != handler.baseFilename:
                lg.removeHandler(h)  # the previous study's log (several studies in one file or process)
                h.close()
        if not any(isinstance(h, logging.FileHandler) and h.baseFilename == handler.baseFilename for h in lg.handlers):
            lg.addHandler(handler)
        lg.propagate = False
        lg.disabled = False
        if name in ("flatlab", "ray.tune"):
            lg.setLevel(logging.INFO)


def _init_ray(opts: RunOptions, tracking_uri: str) -> None:
    import ray

    from flatlab.study.ray_compat import init_local_ray, is_loopback_address, loopback_node_ip, route_ray_errors_to_log

    route_ray_errors_to_log()  # Ray's "A worker died ..." broadcasts: to logs/flatlab.log, not the terminal

    if ray.is_initialized():
        return
    env = {"MLFLOW_TRACKING_URI": tracking_uri, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    kwargs: Dict[str, Any] = dict(
        log_to_driver=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": env},
    )
    joined = _joined_address(opts)
    if joined:
        # a cluster on this machine's loopback only is joined as 127.0.0.1 (Ray would rewrite the address)
        with loopback_node_ip() if is_loopback_address(joined) else contextlib.nullcontext():
            ray.init(**({"address": opts.address} if opts.address else {}), **kwargs)
    else:
        # always a new local instance, never a `ray start` head that happens to run on this machine; every
        # socket of it on 127.0.0.1
        init_local_ray(num_cpus=opts.num_cpus, include_dashboard=False, **kwargs)


def _joined_address(opts: RunOptions) -> Optional[str]:
    """The cluster a launch joins: ``--address``, else ``RAY_ADDRESS`` (inside a Ray Job, the cluster that
    runs it); ``None`` when it starts a local instance of its own (neither, or ``local``)."""
    address = opts.address or os.environ.get("RAY_ADDRESS")
    return None if address in (None, "", "local") else address


def _check_local_resources(study: Study, opts: RunOptions) -> None:
    """On a Ray instance this launch started itself, one trial must fit: nothing will add resources
    later, as a cluster's autoscaler may (there the progress line says what pending trials wait for).

    Raises:
        ConfigError: a trial needs more of a resource (a GPU on a CPU machine) than the local Ray has;
            the message names the resource and the ways out.
    """
    if _joined_address(opts):
        return
    import ray

    from flatlab.study.placement import local_shortfall
    from flatlab.study.prepare import scales_that_fit

    cluster = ray.cluster_resources()
    if local_shortfall(study.name, study.resources, cluster) is not None:  # name the file's scales that would fit
        scales = scales_that_fit(opts.source, opts.overrides.get("scale"), cluster) if opts.source else []
        raise ConfigError(local_shortfall(study.name, study.resources, cluster, scales))


def _post_study(
    study: Study, tracking_uri: str, experiment_id: str, parent_run_id: str, out: Path, console: Any
) -> None:
    """What runs after a launch whose trials all ended: steps-to-target, the comparison table and plot
    (artifacts of the parent run, as ``flatlab compare`` shows them), the published-curve comparison
    (``flatlab curves``, when the study declares a reference), then the study's own reports."""
    if study.reference_arm is not None or study.target_loss is not None:
        from flatlab.tracking.speedup import log_steps_to_target

        summary = log_steps_to_target(tracking_uri, experiment_id, parent_run_id, study)
        reached = sum(r["steps_to_target"] is not None for r in summary["runs"].values())
        line = (
            f"steps-to-target: {reached} of {len(summary['runs'])} trials reached the target"
            + (f"; {len(summary['skipped'])} skipped (no curve or no reference)" if summary["skipped"] else "")
            + (f"; {len(summary['errors'])} MLflow errors (see the log)" if summary["errors"] else "")
        )
        logger.info("%s", line)
        if console is not None:
            console.print(line)
    from flatlab.tracking.publish import log_comparison, log_study_analysis

    if study.final_seeds or (study.searcher == "grid" and len(study.seeds) > 1):
        from flatlab.tracking.trials import trials_frame

        log_comparison(tracking_uri, parent_run_id, trials_frame(tracking_uri, study.name), study=study.name)
    log_study_analysis(tracking_uri, parent_run_id, study.name, console)  # correlation/, tuning_curves/
    if study.published is not None:  # flatlab's per-epoch curves beside the declared published ones
        from flatlab.tracking.published_runs import log_curves

        log_curves(tracking_uri, parent_run_id, study, console)
    from flatlab.tracking.publish import log_flatness_sweep  # TSAM Fig. 2, when the study's measures sweep sigma

    log_flatness_sweep(tracking_uri, parent_run_id, study, console)
    from flatlab.study.report import log_study_report  # best per arm and plots on the parent run

    log_study_report(study, tracking_uri, parent_run_id, out, console)
    from flatlab.tracking.reports import run_reports  # the reports the study asks for (Study.reports)

    run_reports(study, tracking_uri, out / "report", console)


def _open_launch(
    study: Study,
    opts: RunOptions,
    tracking_uri: str,
    root: Path,
    tags: Dict[str, str],
    resumed: Optional[Launch],
    launch_tags: Dict[str, str],
) -> Tuple[str, str, str]:
    """Experiment and parent run of this launch: ``(experiment_id, parent_run_id, tune_experiment_name)``.

    A new launch gets a new parent run (params: the study's settings, nested ones under dotted names,
    :mod:`flatlab.tracking.param_text`; artifacts: the plan and the study file; ``launch_tags``: e.g. the
    Optuna studies it grows) and becomes the experiment's default view in MLflow's UI
    (:func:`flatlab.tracking.ui.set_default_view`); ``--resume`` reopens the ``resumed`` launch's parent run.
    """
    from mlflow.entities import Param

    from flatlab.study.plan import plan
    from flatlab.tracking.environment import log_packages
    from flatlab.tracking.param_text import flat_params
    from flatlab.tracking.published_runs import launch_param
    from flatlab.tracking.ui import set_default_view

    experiment_id = runs.get_or_create_experiment(tracking_uri, study.name, runs.artifact_location(root))
    client = runs.client(tracking_uri)
    if resumed is not None:
        client.update_run(resumed.parent_run_id, status="RUNNING")
        client.set_tag(resumed.parent_run_id, "flatlab.resumed", "true")
        return experiment_id, resumed.parent_run_id, resumed.experiment_name
    exp_name = f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    parent = client.create_run(
        experiment_id,
        run_name=f"{study.name} {time.strftime('%Y-%m-%d %H:%M')}",
        tags={**tags, **launch_tags, runs.TAG_ROLE: "study"},
    )
    p = plan(study)
    params = {
        k: p[k] for k in ("workload", "metric", "mode", "searcher", "scheduler", "max_epochs", "total_trials", "seeds")
    }
    params.update(final_seeds=p["final_seeds"], measures=p["measures"] or "none")
    params.update(chained_params(study))  # <arm>.<field> and <arm>.<field>.source of chained values
    if study.reference_arm is not None:
        params["reference_arm"] = study.reference_arm
    params.update(launch_param(study.published))  # `flatlab curves STUDY` finds the reference here (JSON)
    params.update({"source": opts.source, "wl": p["workload_params"], "train": p["train"]})
    # readable values: wl.width = 128, measures.neighbourhood_loss.sigma = 0.03, final_seeds = 1, 2, 3
    client.log_batch(parent.info.run_id, params=[Param(k, v) for k, v in flat_params(params).items()])
    set_default_view(client, experiment_id, study, parent.info.run_id)  # the runs table MLflow's UI opens
    client.log_dict(parent.info.run_id, p, "plan.json")
    log_packages(client, parent.info.run_id)  # environment/requirements.txt (tracking/environment.py)
    if opts.source and Path(opts.source).is_file():
        client.log_artifact(parent.info.run_id, opts.source, artifact_path="study")
    return experiment_id, parent.info.run_id, exp_name


def _experiment_path(storage_path: str, name: str) -> str:
    """The Tune experiment folder (or URI) of launch ``name`` under ``storage_path``."""
    return str(Path(storage_path) / name) if "://" not in storage_path else f"{storage_path.rstrip('/')}/{name}"


def _concurrency(study: Study) -> int:
    """Trials at once: as many as the cluster holds when the launch starts (Tune starts one trial at a
    time with a custom searcher unless given a limit; multi-worker trials reserve their workers outside
    Tune, which cannot count them). On an autoscaling cluster, ``Study.max_concurrent`` allows more."""
    import ray

    return study.resources.concurrent_trials(ray.cluster_resources())


def _new_tuner(
    study: Study,
    trainable: Any,
    searcher: Any,
    scheduler: Any,
    name: str,
    storage_path: str,
    callbacks: List[Any],
    num_samples: int,
) -> Any:
    from ray import tune

    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric=study.metric,
            mode=study.mode,
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=num_samples,
            max_concurrent_trials=study.max_concurrent or _concurrency(study),
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path,
            callbacks=callbacks,
            verbose=0,
            log_to_file=True,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
            failure_config=tune.FailureConfig(max_failures=SYSTEM_RETRIES),  # system failures only
        ),
    )


def _restore_tuner(path: str, trainable: Any, callbacks: List[Any], records: Any = None) -> Any:
    """Restore the Tune experiment at ``path``, with this launch's live callbacks swapped in and, given
    ``records`` (:class:`~flatlab.study.recovery.LaunchRecords`), its scheduler told which trials ended
    before the previous driver was killed."""
    from ray import tune

    from flatlab.study.ray_compat import restored_callbacks, tuner_scheduler
    from flatlab.study.schedulers import ArmScheduler

    tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
    restored = restored_callbacks(tuner)  # pickled with the experiment
    for i, cb in enumerate(restored):
        for live in callbacks:
            if type(cb) is type(live):
                restored[i] = live
    scheduler = tuner_scheduler(tuner)
    if records is not None and isinstance(scheduler, ArmScheduler):  # an older launch's FIFOScheduler: as before
        scheduler.recorded = records.on_add
    return tuner


def _scheduler(study: Study, records: Any, fifo: bool = False) -> Any:
    """:func:`~flatlab.study.schedulers.build_scheduler`'s, told (on a resume) which trials ended before."""
    from flatlab.study.schedulers import build_scheduler

    scheduler = build_scheduler(study, fifo=fifo)
    if records is not None:
        scheduler.recorded = records.on_add
    return scheduler


def _searcher_of(tuner: Any) -> Any:
    """The flatlab searcher inside a tuner (Tune may wrap it)."""
    from flatlab.study.ray_compat import tuner_searcher

    return tuner_searcher(tuner)


def final_configs(study: Study, grid: Any) -> List[Dict[str, Any]]:
    """The final stage's trial configs: for each arm and tuning, its best configuration
    (:func:`flatlab.analysis.selection.best_configurations` over that tuning's completed search trials:
    the best mean over seeds of the study metric's final value) once per seed of ``study.final_seeds``
    (tuning k's seeds, :func:`flatlab.study.tunings.tuning_seed`), with ``stage = final``. An arm with no
    completed trial in a tuning gets none there (logged).

    Args:
        grid: the search's Tune results (``ResultGrid``: each result's ``config``, last ``metrics`` and
            ``error``).
    """
    from flatlab.analysis import selection

    results = [(r.config or {}, r.metrics or {}, r.error is not None) for r in grid]
    configs: List[Dict[str, Any]] = []
    for tuning in range(1, study.tunings + 1):
        trials = [
            selection.search_trial(config, metrics, error, study.metric)
            for config, metrics, error in results
            if int(config.get(runs.TUNING_KEY, 1)) == tuning
        ]
        best = selection.best_configurations([t for t in trials if t is not None], study.mode)
        for arm in study.arms:
            if arm.name not in best:
                logger.warning("final stage: arm %s has no completed search trial in tuning %d", arm.name, tuning)
                continue
            chosen = {k: v for k, v in selection.best_trial(best[arm.name]).ref.items() if k != "seed"}
            seeds = tuning_seeds(study.final_seeds, tuning)
            configs += [
                with_tuning({**chosen, "seed": seed, runs.STAGE_KEY: runs.STAGE_FINAL}, tuning, study.tunings)
                for seed in seeds
            ]
    return configs


def run_study(study: Study, opts: RunOptions, console: Any = None) -> StudyOutcome:
    """Run (or ``opts.resume``) ``study``; returns when every trial has ended or on interruption.

    In order: open the launch (its MLflow parent run and launch.json, while Ray starts and the data
    loads; :func:`_open`), tune (the search, then the final stage; :func:`_tune`), report (steps to
    target, the comparison, the study report; :func:`_post_study`).

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
    from flatlab.study.ray_compat import check_ray_version, retry_system_failures_only
    from flatlab.workloads.registry import build_workload

    _quiet_libraries()
    check_ray_version(console)  # says so when this Ray is not one flatlab's workarounds were tested on
    retry_system_failures_only()  # FailureConfig's retries: for lost nodes and workers, not the trial's own errors
    t0 = time.monotonic()
    root = Path(opts.root).resolve()
    out = root / study.name  # made once the checks below pass: a refused launch leaves no folder
    previous = _previous_launch(study, opts, root)
    tracking_uri = _tracking_uri(opts, previous, root)
    if opts.resume and previous is not None and previous.done:
        return _already_finished(study, previous, tracking_uri, out, console, t0)
    study = (
        study if opts.resume else resolve_chained(study, tracking_uri)
    )  # best_of(...) values, before anything starts
    workload = build_workload(study.workload, **dict(study.workload_params))
    workload.check_data()  # missing data: one error (DataUnavailable) before Ray, MLflow or a trial starts
    out.mkdir(parents=True, exist_ok=True)
    _setup_file_logging(out)
    logger.info("launch %s: tracking %s", study.name, tracking_uri)
    started = _open(study, workload, opts, previous, root, tracking_uri, console, t0)
    outcome = _tune(study, opts, started, t0)
    if not outcome.interrupted:
        _post_study(study, tracking_uri, outcome.experiment_id, outcome.parent_run_id, out, console)
    elif console is not None:
        console.print(f"[yellow]interrupted[/yellow]: continue with `{resume_command(opts)}`")
    return outcome


def resume_command(opts: RunOptions) -> str:
    """The ``flatlab run ... --resume`` line that finishes the launch ``opts`` started: the study file,
    and ``--root`` and ``--address`` where they are not the defaults (the MLflow store and the budget
    options are read back from the launch record)."""
    import shlex

    words = ["flatlab", "run", opts.source or "<study file>", "--resume"]
    root = Path(opts.root).resolve()
    if root != Path(RunOptions.root).resolve():
        words += ["--root", str(root)]
    if opts.address:
        words += ["--address", opts.address]
    return " ".join(w if w == "<study file>" else shlex.quote(w) for w in words)


def _tracking_uri(opts: RunOptions, previous: Optional[Launch], root: Path) -> str:
    """The MLflow store of this launch: ``--tracking-uri``, else (``--resume``, ``--continue``) the one
    the previous launch recorded, else ``MLFLOW_TRACKING_URI`` or ``<root>/mlflow.db``.

    Raises:
        ConfigError: ``--resume`` with a ``--tracking-uri`` other than the launch's (its trials' runs
            are in the launch's store; finishing them elsewhere would split the launch in two).
    """
    recorded = previous.tracking_uri if previous is not None else ""
    if opts.resume and recorded and opts.tracking_uri and opts.tracking_uri != recorded:
        raise ConfigError(
            f"--resume: --tracking-uri {opts.tracking_uri} is not the store of the launch it "
            f"finishes ({recorded}); leave --tracking-uri out to use the launch's"
        )
    return opts.tracking_uri or recorded or runs.default_tracking_uri(root)


def _quiet_libraries() -> None:
    """The driver's environment for Tune, Optuna and MLflow: no per-result loggers, Tune's legacy
    reporter (our own progress lines only), Optuna's messages to the log file, result buffering."""
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no CSV/JSON/TBX loggers per result
    os.environ.setdefault(
        "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0"
    )  # frequent checkpoints (checkpoint_every=1) are a choice, not a misconfiguration
    import mlflow  # noqa: F401  (imported before the log set-up, which then moves its handlers to the log file)

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter honours verbose=0: our own progress only
    import optuna

    from flatlab.study.trainable import tune_env

    optuna.logging.disable_default_handler()  # Optuna's messages go to the log file
    for key, value in tune_env().items():  # Tune's result buffering (FLATLAB_RESULT_BUFFER_S, default 1 s)
        os.environ.setdefault(key, value)


def _previous_launch(study: Study, opts: RunOptions, root: Path) -> Optional[Launch]:
    """The launch a ``--resume`` finishes or a ``--continue`` grows (``None`` for a new launch), checked
    before anything starts.

    A launch whose driver was killed before Tune saved its experiment is resumed too: its experiment
    starts again, in the same launch (:func:`_build_tuner`).

    Raises:
        ConfigError: both options; ``--resume`` without a launch; ``--continue`` that cannot grow the
            previous launch's Optuna studies.
    """
    if opts.resume and opts.continue_:
        raise ConfigError(
            "--resume and --continue exclude each other: --resume finishes the latest launch, "
            "--continue starts a new one that adds trials to its Optuna studies"
        )
    if not (opts.resume or opts.continue_):
        return None
    previous = Launch.read(root, study.name)
    where = launch_file(root, study.name)
    if opts.continue_:
        return previous  # what it grows is checked by _grown_studies, before anything starts
    if previous is None:
        raise ConfigError(
            f"--resume: no earlier launch of study {study.name!r} under {where.parent} (missing {where.name})"
        )
    return previous


def _already_finished(
    study: Study, launch: Launch, tracking_uri: str, out: Path, console: Any, t0: float
) -> StudyOutcome:
    """``--resume`` of a launch whose trials all completed: nothing to continue and no Ray to start. The
    post-study steps are re-done (they are idempotent), in case they were cut short the first time."""
    if console is not None:
        console.print(f"study [bold]{study.name}[/bold]: its latest launch already finished; nothing to resume")
    _setup_file_logging(out)
    _post_study(study, tracking_uri, launch.experiment_id, launch.parent_run_id, out, console)
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


@dataclass
class _Started:
    """A launch whose Tuner is ready: its record, Tune's storage, the Tuner with its trainable and
    callbacks, and the search's real budget."""

    launch: Launch
    storage_path: str
    tuner: Any
    trainable: Any
    callbacks: List[Any]
    mlflow_cb: Any
    total: int
    records: Any = None  # a resume's LaunchRecords (flatlab.study.recovery)


def _open(
    study: Study,
    workload: Any,
    opts: RunOptions,
    previous: Optional[Launch],
    root: Path,
    tracking_uri: str,
    console: Any,
    t0: float,
) -> _Started:
    """Open the launch and build its Tuner: the MLflow parent run (in a thread, overlapping Ray's start-up
    and the data loading), launch.json (``running``), the trainable, the MLflow and progress callbacks,
    and the Tuner (new, or restored for ``--resume``). Any failure here ends the launch FAILED (KILLED on
    Ctrl-C) before it propagates (:func:`_end_unstarted`)."""
    from concurrent.futures import ThreadPoolExecutor

    out = root / study.name
    storage_path = opts.storage or str(out / "ray")
    resumed = previous if opts.resume else None
    grown = _grown_studies(study, previous, root) if opts.continue_ else None
    launch_tags = (
        {
            "flatlab.continues": grown["parent_run_id"],
            "flatlab.optuna_studies": ",".join(grown["optuna_studies"][a.name] for a in study.arms),
        }
        if grown
        else {}
    )
    tags = _common_tags(study, opts)
    launch: Optional[Launch] = None
    with ThreadPoolExecutor(max_workers=1) as pool:  # MLflow set-up (seconds on a fresh SQLite store)
        opened = pool.submit(_open_launch, study, opts, tracking_uri, root, tags, resumed, launch_tags)
        try:
            _init_ray(opts, tracking_uri)
            _setup_file_logging(out)  # ray.init reconfigures logging
            _check_local_resources(study, opts)  # a GPU study on a CPU machine fails here, not by waiting for ever
            logger.info("Ray ready (%.1f s)", time.monotonic() - t0)
            data = workload.load_data(study.seed)  # once per study; reaches trials through the object store
            experiment_id, parent_run_id, exp_name = opened.result()
            logger.info("MLflow ready, data loaded (%.1f s)", time.monotonic() - t0)
            launch = _record_launch(
                study, opts, resumed, grown, root, storage_path, tracking_uri, experiment_id, parent_run_id, exp_name
            )
            started = _build_tuner(study, opts, launch, storage_path, data, tags)
        except BaseException as exc:
            _end_unstarted(launch, opened, exc, root / study.name, storage_path, tracking_uri)
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


def _common_tags(study: Study, opts: RunOptions) -> Dict[str, str]:
    """The tags of the launch's parent run and of every trial run."""
    from flatlab._version import __version__
    from flatlab.tracking.environment import environment_tags

    return {
        runs.TAG_STUDY: study.name,
        runs.TAG_WORKLOAD: study.workload,
        **runs.provenance_tags(),  # commit, dirty or not, and the digest of the package's source
        runs.TAG_VERSION: __version__,
        **environment_tags(),  # python, torch, CUDA, Ray ... versions (tracking/environment.py)
        **opts.extra_tags,
    }


def _grown_studies(study: Study, previous: Optional[Launch], root: Path) -> Dict[str, Any]:
    """For ``--continue``: the launch it grows and, per arm, the Optuna study it adds trials to
    (``continues`` in launch.json), with the prefix of those studies (``optuna_prefix``).

    Raises:
        ConfigError: as :func:`flatlab.study.launches.continued_studies`.
    """
    prefix, names = continued_studies(previous, study, str(launch_file(root, study.name)))
    assert previous is not None  # continued_studies raised otherwise
    return {
        "experiment_name": previous.experiment_name,
        "parent_run_id": previous.parent_run_id,
        "optuna_studies": names,
        "optuna_prefix": prefix,
    }


def _record_launch(
    study: Study,
    opts: RunOptions,
    resumed: Optional[Launch],
    grown: Optional[Dict[str, Any]],
    root: Path,
    storage_path: str,
    tracking_uri: str,
    experiment_id: str,
    parent_run_id: str,
    exp_name: str,
) -> Launch:
    """launch.json of this launch, written ``running``. A resume keeps what the launch recorded (its
    budget, Optuna studies, what it continues, its final stage), with this run's checkpoint cadence."""
    from flatlab.study.searchers import optuna_study_name

    out = root / study.name
    if resumed is not None:
        launch, prefix = resumed, resumed.optuna_prefix or exp_name
        overrides = resumed.overrides if resumed.overrides is not None else dict(opts.overrides)
    else:
        launch = Launch(
            path=launch_file(root, study.name),
            experiment_name=exp_name,
            experiment_path=_experiment_path(storage_path, exp_name),
            parent_run_id=parent_run_id,
        )
        prefix, overrides = (grown or {}).get("optuna_prefix") or exp_name, dict(opts.overrides)
        if grown:
            launch.continues = {k: grown[k] for k in ("experiment_name", "parent_run_id", "optuna_studies")}
    return launch.write(
        tracking_uri=tracking_uri,
        experiment_id=experiment_id,
        status="running",
        overrides=overrides,
        checkpoint_every=study.checkpoint_every,  # --resume keeps it (launches.resume_checkpoint_every)
        optuna_storage=f"sqlite:///{out / 'optuna.db'}",
        optuna_prefix=prefix,
        optuna_studies={a.name: optuna_study_name(prefix, a.name) for a in study.arms}
        if study.searcher != "grid"
        else {},
    )


def _build_tuner(
    study: Study, opts: RunOptions, launch: Launch, storage_path: str, data: Any, tags: Dict[str, str]
) -> _Started:
    """The trainable, the MLflow and progress callbacks and the Tuner of ``launch`` (restored for
    ``--resume``, once Tune saved it), with the searcher pointed at the MLflow runs."""
    from flatlab.study.progress import ProgressPrinter
    from flatlab.study.ray_compat import can_resume
    from flatlab.study.recovery import LaunchRecords
    from flatlab.study.searchers import ArmSearcher
    from flatlab.study.trainable import make_trainable
    from flatlab.study.trial_spec import resolved_config
    from flatlab.tracking.artifacts import WorkerTracking
    from flatlab.tracking.callback import MLflowTrialLogger

    tracking = WorkerTracking(
        launch.tracking_uri, launch.experiment_id, launch.parent_run_id, log_models=opts.log_models
    )
    trainable = make_trainable(study, data, tracking)
    mlflow_cb = MLflowTrialLogger(
        launch.tracking_uri,
        launch.experiment_id,
        launch.parent_run_id,
        tags=tags,
        arm_optimizer={a.name: a.optimizer for a in study.arms},
        metric=study.metric,
        mode=study.mode,
        study=study,
        resolve=resolved_config,  # child runs' params: the resolved configuration too
        log=log_file(launch.path.parent),  # a failed launch's runs name the log file
    )
    finals = study.num_final_trials()
    progress = ProgressPrinter(study.num_total_trials() + finals, study.metric, study.mode)
    callbacks = [mlflow_cb, progress]
    # a resume reconciles what a killed driver left in MLflow and Optuna with Tune's saved experiment
    records = LaunchRecords(launch.tracking_uri, launch.experiment_id, launch.parent_run_id) if opts.resume else None
    if records is not None:
        mlflow_cb.claimed = records.claimed
        progress.took_over = records.took_over
    if opts.resume and can_resume(launch.experiment_path):
        tuner = _restore_tuner(launch.experiment_path, trainable, callbacks, records)
    else:
        if opts.resume:  # killed before Tune saved its experiment: it starts again, in the same launch
            logger.warning("resume: the launch ended before Tune saved its experiment; starting it again")
        searcher = ArmSearcher(
            study, optuna_storage=launch.optuna_storage, launch=launch.optuna_prefix, experiment=launch.experiment_name
        )
        tuner = _new_tuner(
            study,
            trainable,
            searcher,
            _scheduler(study, records),
            launch.experiment_name,
            storage_path,
            callbacks,
            study.num_total_trials(),
        )
    searcher = _searcher_of(tuner)
    searcher.run_id_of = mlflow_cb.run_id_of
    # the search's real budget: a restored experiment keeps the one it was launched with
    total = searcher.total_trials() if hasattr(searcher, "total_trials") else study.num_total_trials()
    progress.total = total + finals
    return _Started(launch, storage_path, tuner, trainable, callbacks, mlflow_cb, total, records)


def _end_unstarted(
    launch: Optional[Launch], opened: Any, exc: BaseException, out: Path, storage_path: str, tracking_uri: str
) -> None:
    """End a launch that failed before Tune started (``exc``): its parent run FAILED (KILLED on Ctrl-C)
    and launch.json ``failed`` (``killed``), never RUNNING/``running``. Nothing to end where MLflow itself
    failed (no parent run). Never raises: ``exc`` is what the caller sees."""
    try:
        experiment_id, parent_run_id, exp_name = opened.result()
    except BaseException:  # noqa: BLE001 - MLflow itself failed: no parent run was opened
        return
    status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
    logger.error("launch failed before Tune started: %s: %s", type(exc).__name__, exc, exc_info=exc)
    try:
        runs.client(tracking_uri).set_terminated(parent_run_id, status=status)
        if launch is None:
            launch = Launch(
                path=out / "launch.json",
                experiment_name=exp_name,
                experiment_path=_experiment_path(storage_path, exp_name),
                parent_run_id=parent_run_id,
                experiment_id=experiment_id,
                tracking_uri=tracking_uri,
            )
        launch.write(status=status.lower())
    except Exception:  # noqa: BLE001 - report the original error, not this one
        logger.exception("could not record the failed launch in MLflow / %s", out / "launch.json")


def _tune(study: Study, opts: RunOptions, started: _Started, t0: float) -> StudyOutcome:
    """Run the search, then (all of it ended) the final stage; record how the launch ended, in MLflow and
    launch.json, whatever happens. Ctrl-C ends it interrupted (KILLED)."""
    launch, mlflow_cb = started.launch, started.mlflow_cb
    interrupted, failed, num_errors = False, False, 0
    try:
        grid = started.tuner.fit()
        num_errors = grid.num_errors
        interrupted = grid.num_terminated + grid.num_errors < started.total
        if study.final_seeds and not interrupted:
            final = _final_stage(study, opts, started, grid).fit()
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


def _final_stage(study: Study, opts: RunOptions, started: _Started, grid: Any) -> Any:
    """The final stage's Tuner: each arm's best configuration over the final seeds (:func:`final_configs`),
    or, for a ``--resume`` that stopped in it after Tune saved it, the final stage's experiment restored."""
    from flatlab.study.ray_compat import can_resume
    from flatlab.study.searchers import FixedSearcher

    name = f"{started.launch.experiment_name}-final"
    path = _experiment_path(started.storage_path, name)
    started.launch.write(final_experiment_path=path)
    if opts.resume and can_resume(path):
        return _restore_tuner(path, started.trainable, started.callbacks, started.records)
    configs = final_configs(study, grid)
    logger.info("final stage: %d trials (%s)", len(configs), ", ".join(sorted({c["arm"] for c in configs})))
    return _new_tuner(
        study,
        started.trainable,
        FixedSearcher(configs, study.metric, study.mode),
        _scheduler(study, started.records, fifo=True),
        name,
        started.storage_path,
        started.callbacks,
        len(configs),
    )
