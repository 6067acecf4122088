"""Running a study: local or remote Ray, Tune + ArmSearcher + ASHA, MLflow parent/child runs, resume.

Output root layout (``--root``, default ``./flatlab-runs``)::

    mlflow.db, mlartifacts/          MLflow tracking (SQLite default; one experiment per study)
    <study>/launch.json              the latest launch: Tune experiment path, MLflow parent run
    <study>/optuna.db                the Optuna studies (one per arm)
    <study>/ray/<experiment>/        Tune storage: trial checkpoints, results, trial logs
    <study>/logs/flatlab.log         driver logs (Ray's and Tune's included)
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from flatlab.errors import ConfigError
from flatlab.study.spec import Study
from flatlab.tracking import runs

logger = logging.getLogger("flatlab")

# Trial checkpoints kept per trial. Tune re-writes the whole experiment state (every trial's JSON and the
# searcher's pickle) each time a trial has saved this many checkpoints, so that the state never points
# at a deleted checkpoint; with 1 that is once per epoch per trial, the largest cost of the driver for
# short epochs. 2 halves it for one extra checkpoint on disk per trial.
KEEP_CHECKPOINTS = 2


@dataclass
class RunOptions:
    """How to run a study (the ``flatlab run`` options)."""

    root: Path = Path("flatlab-runs")
    address: Optional[str] = None
    tracking_uri: Optional[str] = None
    storage: Optional[str] = None
    resume: bool = False
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


def _setup_file_logging(log_dir: Path) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    path = str((log_dir / "flatlab.log").resolve())
    existing = [h for h in logging.getLogger("flatlab").handlers if getattr(h, "flatlab_study_log", False) and h.baseFilename == path]
    handler = existing[0] if existing else logging.FileHandler(path)
    handler.flatlab_study_log = True  # type: ignore[attr-defined]
    # Tune's per-result JSON/CSV files are off (the results live in MLflow), so its end-of-run analysis
    # warns that it found none for every trial: expected, not worth alarming anyone in the log.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("flatlab", "ray", "ray.tune", "ray.train", "ray.data", "optuna", "mlflow", "alembic"):
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

    from flatlab.study.ray_messages import route_ray_errors_to_log

    route_ray_errors_to_log()  # Ray's "A worker died ..." broadcasts: to logs/flatlab.log, not the terminal

    if ray.is_initialized():
        return
    env = {"MLFLOW_TRACKING_URI": tracking_uri, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    kwargs: Dict[str, Any] = dict(
        log_to_driver=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": env},
    )
    if opts.address:
        ray.init(address=opts.address, **kwargs)
    elif os.environ.get("RAY_ADDRESS"):  # inside a Ray Job: join the cluster that runs it
        ray.init(**kwargs)
    else:
        ray.init(num_cpus=opts.num_cpus, include_dashboard=False, **kwargs)


def _post_study(study: Study, tracking_uri: str, experiment_id: str, parent_run_id: str, out: Path, console: Any) -> None:
    """What runs after a launch whose trials all ended: steps-to-target, then the workload's hook."""
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
    _after_study(study, tracking_uri, out, console)


def _after_study(study: Study, tracking_uri: str, out: Path, console: Any) -> None:
    """The workload's :meth:`~flatlab.workloads.base.Workload.after_study` hook. A failure there is
    reported, not raised: every trial is already recorded in MLflow."""
    from flatlab.workloads.registry import get_workload

    try:
        lines = get_workload(study.workload).after_study(tracking_uri, study.name, str(out / "report"))
    except Exception as exc:  # noqa: BLE001 - the study's results stand; say how to retry
        logger.exception("after-study step of workload %s failed", study.workload)
        if console is not None:
            console.print(f"[yellow]warning:[/yellow] the after-study step of workload {study.workload!r} failed: {exc}")
        return
    for line in lines:
        logger.info("%s", line)
        if console is not None:
            console.print(line)


def _launch_file(out: Path) -> Path:
    return out / "launch.json"


def _open_launch(
    study: Study, opts: RunOptions, tracking_uri: str, root: Path, tags: Dict[str, str], previous: Dict[str, Any]
) -> Tuple[str, str, str]:
    """Experiment and parent run of this launch: ``(experiment_id, parent_run_id, tune_experiment_name)``.

    A new launch gets a new parent run (params: the study's settings; artifacts: the plan and the study
    file); ``--resume`` reopens the previous launch's parent run.
    """
    from mlflow.entities import Param

    from flatlab.study.plan import plan

    experiment_id = runs.get_or_create_experiment(tracking_uri, study.name, runs.artifact_location(root))
    client = runs.client(tracking_uri)
    if previous:
        client.update_run(previous["parent_run_id"], status="RUNNING")
        client.set_tag(previous["parent_run_id"], "flatlab.resumed", "true")
        return experiment_id, previous["parent_run_id"], previous["experiment_name"]
    exp_name = f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    parent = client.create_run(
        experiment_id, run_name=f"{study.name} {time.strftime('%Y-%m-%d %H:%M')}", tags={**tags, runs.TAG_ROLE: "study"}
    )
    p = plan(study)
    params = {k: p[k] for k in ("workload", "metric", "mode", "searcher", "scheduler", "max_epochs", "total_trials", "seeds")}
    params.update({"source": opts.source, "workload_params": p["workload_params"], "train": p["train"]})
    client.log_batch(parent.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    client.log_dict(parent.info.run_id, p, "plan.json")
    if opts.source and Path(opts.source).is_file():
        client.log_artifact(parent.info.run_id, opts.source, artifact_path="study")
    return experiment_id, parent.info.run_id, exp_name


def run_study(study: Study, opts: RunOptions, console: Any = None) -> StudyOutcome:
    """Run (or ``opts.resume``) ``study``; returns when every trial has ended or on interruption.

    Raises:
        ConfigError: ``--resume`` with nothing to resume.
    """
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no CSV/JSON/TBX loggers per result
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")  # per-epoch checkpoints are by design
    import mlflow  # noqa: F401  (imported before the log set-up, which then moves its handlers to the log file)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter honours verbose=0: our own progress only
    import optuna

    optuna.logging.disable_default_handler()  # Optuna's messages go to the log file
    from concurrent.futures import ThreadPoolExecutor

    from ray import tune

    from flatlab import __version__
    from flatlab.study.progress import ProgressPrinter
    from flatlab.study.searchers import ArmSearcher
    from flatlab.study.trainable import run_trial
    from flatlab.tracking.artifacts import WorkerTracking
    from flatlab.tracking.callback import MLflowTrialLogger
    from flatlab.workloads.registry import build_workload

    t0 = time.monotonic()
    root = Path(opts.root).resolve()
    out = root / study.name
    out.mkdir(parents=True, exist_ok=True)
    tracking_uri = opts.tracking_uri or runs.default_tracking_uri(root)
    storage_path = opts.storage or str(out / "ray")
    launch = _launch_file(out)

    previous: Dict[str, Any] = {}
    if opts.resume:
        if not launch.exists():
            raise ConfigError(f"--resume: no earlier launch of study {study.name!r} under {out} (missing {launch.name})")
        previous = json.loads(launch.read_text())
        if previous.get("status") == "finished" and previous.get("num_errors", 1) == 0:
            # every trial completed: nothing to continue and no Ray to start; the post-study steps are
            # re-done (they are idempotent), in case they were cut short the first time
            if console is not None:
                console.print(f"study [bold]{study.name}[/bold]: its latest launch already finished; nothing to resume")
            _setup_file_logging(out / "logs")
            _post_study(study, tracking_uri, previous.get("experiment_id", ""), previous["parent_run_id"], out, console)
            return StudyOutcome(
                study=study.name, tracking_uri=tracking_uri, experiment_id=previous.get("experiment_id", ""),
                parent_run_id=previous["parent_run_id"], experiment_path=previous["experiment_path"], interrupted=False,
                num_trials=study.num_total_trials(), num_errors=0, wall_s=time.monotonic() - t0,
            )
        if not tune.Tuner.can_restore(previous["experiment_path"]):
            raise ConfigError(f"--resume: the Tune experiment at {previous['experiment_path']} cannot be restored")

    _setup_file_logging(out / "logs")
    logger.info("launch %s: tracking %s", study.name, tracking_uri)
    common_tags = {
        runs.TAG_STUDY: study.name,
        runs.TAG_WORKLOAD: study.workload,
        runs.TAG_COMMIT: runs.git_commit(),
        runs.TAG_VERSION: __version__,
        **opts.extra_tags,
    }
    # MLflow set-up (seconds on a fresh SQLite store) overlaps Ray's start-up and the data loading.
    with ThreadPoolExecutor(max_workers=1) as pool:
        opened = pool.submit(_open_launch, study, opts, tracking_uri, root, common_tags, previous)
        _init_ray(opts, tracking_uri)
        _setup_file_logging(out / "logs")  # ray.init reconfigures logging
        logger.info("Ray ready (%.1f s)", time.monotonic() - t0)
        workload = build_workload(study.workload, **dict(study.workload_params))
        data = workload.load_data(study.seed)  # once per study; reaches trials through the object store
        experiment_id, parent_run_id, exp_name = opened.result()
    logger.info("MLflow ready, data loaded (%.1f s)", time.monotonic() - t0)
    client = runs.client(tracking_uri)
    experiment_path = str(Path(storage_path) / exp_name) if "://" not in storage_path else f"{storage_path.rstrip('/')}/{exp_name}"
    launch.write_text(
        json.dumps(
            {"experiment_path": experiment_path, "experiment_name": exp_name, "parent_run_id": parent_run_id,
             "tracking_uri": tracking_uri, "experiment_id": experiment_id, "status": "running"},
            indent=2,
        )
    )
    tracking = WorkerTracking(tracking_uri, experiment_id, parent_run_id, log_models=opts.log_models)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, study=study, data=data, tracking=tracking), study.resources.as_dict()
    )
    total = study.num_total_trials()
    mlflow_cb = MLflowTrialLogger(
        tracking_uri,
        experiment_id,
        parent_run_id,
        tags=common_tags,
        arm_optimizer={a.name: a.optimizer for a in study.arms},
        max_epochs=study.max_epochs,
        metric=study.metric,
        mode=study.mode,
    )
    progress = ProgressPrinter(total, study.metric, study.mode, max_epochs=study.max_epochs)
    if opts.resume:
        tuner = tune.Tuner.restore(experiment_path, trainable=trainable, resume_unfinished=True, resume_errored=True)
        callbacks = tuner._local_tuner.get_run_config().callbacks  # restored with the experiment
        for i, cb in enumerate(callbacks):  # swap in live instances bound to this launch
            if isinstance(cb, MLflowTrialLogger):
                callbacks[i] = mlflow_cb
            elif isinstance(cb, ProgressPrinter):
                callbacks[i] = progress
    else:
        scheduler = None
        if study.scheduler == "asha":
            from ray.tune.schedulers import ASHAScheduler

            scheduler = ASHAScheduler(
                time_attr="training_iteration",
                max_t=study.max_epochs,
                grace_period=study.grace_period,
                reduction_factor=study.reduction_factor,
            )
        searcher = ArmSearcher(study, optuna_storage=f"sqlite:///{out / 'optuna.db'}", launch=exp_name)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                metric=study.metric,
                mode=study.mode,
                search_alg=searcher,
                scheduler=scheduler,
                num_samples=total,
                max_concurrent_trials=study.max_concurrent,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=exp_name,
                storage_path=storage_path,
                callbacks=[mlflow_cb, progress],
                verbose=0,
                log_to_file=True,
                checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
                failure_config=tune.FailureConfig(max_failures=0),
            ),
        )
    if console is not None:
        console.print(
            f"study [bold]{study.name}[/bold]: {total} trials, tracking {tracking_uri}, logs {out / 'logs'}"
            + (" (resumed)" if opts.resume else "")
        )
    logger.info("starting Tune (%.1f s)", time.monotonic() - t0)
    interrupted, failed = False, False
    num_errors = 0
    try:
        grid = tuner.fit()
        num_errors = grid.num_errors
        ended = grid.num_terminated + grid.num_errors
        interrupted = ended < total
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
        client.set_terminated(parent_run_id, status=status)
        state = json.loads(launch.read_text())
        state["status"] = status.lower()
        state["num_errors"] = num_errors
        launch.write_text(json.dumps(state, indent=2))
        for err in mlflow_cb.errors:
            logger.warning("MLflow: %s", err)
    if not interrupted:
        _post_study(study, tracking_uri, experiment_id, parent_run_id, out, console)
    if console is not None and interrupted:
        console.print(f"[yellow]interrupted[/yellow]: continue with `flatlab run {opts.source or '<study file>'} --resume`")
    return StudyOutcome(
        study=study.name,
        tracking_uri=tracking_uri,
        experiment_id=experiment_id,
        parent_run_id=parent_run_id,
        experiment_path=experiment_path,
        interrupted=interrupted,
        num_trials=total,
        num_errors=num_errors,
        wall_s=time.monotonic() - t0,
    )
