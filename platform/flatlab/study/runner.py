"""Running a study: local or remote Ray, Tune + ArmSearcher + ASHA, MLflow parent/child runs, resume.

Output root layout (``--root``, default ``./flatlab-runs``)::

    mlflow.db, mlartifacts/          MLflow tracking (SQLite default; one experiment per study)
    <study>/launch.json              the latest launch: Tune experiment path, MLflow parent run
    <study>/optuna.db                the Optuna studies (one per arm)
    <study>/ray/<experiment>/        Tune storage: trial checkpoints, results, trial logs
    <study>/logs/flatlab.log         driver logs (Ray's and Tune's included)
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from flatlab.errors import ConfigError
from flatlab.study.chain import chained_params, resolve_chained
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
        # "local": always a new local instance, never a `ray start` head that happens to run on this machine
        ray.init(address="local", num_cpus=opts.num_cpus, include_dashboard=False, **kwargs)


def _post_study(study: Study, tracking_uri: str, experiment_id: str, parent_run_id: str, out: Path, console: Any) -> None:
    """What runs after a launch whose trials all ended: steps-to-target, the comparison table and plot
    (artifacts of the parent run, as ``flatlab compare`` shows them), the published-curve comparison
    (``flatlab curves``, when the study declares a reference), then the workload's hook."""
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
    if study.final_seeds or (study.searcher == "grid" and len(study.seeds) > 1):
        from flatlab.tracking.compare import log_comparison
        from flatlab.tracking.results import trials_frame

        log_comparison(tracking_uri, parent_run_id, trials_frame(tracking_uri, study.name), study.reference_arm,
                       study=study.name)
    if study.published is not None:  # flatlab's per-epoch curves beside the declared published ones
        from flatlab.tracking.published_runs import log_curves
        log_curves(tracking_uri, parent_run_id, study, console)
    from flatlab.tracking.flatness_sweep import log_flatness_sweep  # TSAM Fig. 2, when the study's measures sweep sigma
    log_flatness_sweep(tracking_uri, parent_run_id, study, console)
    from flatlab.tracking.study_report import log_study_report  # best per arm and plots on the parent run
    log_study_report(study, tracking_uri, parent_run_id, out, console)
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
    study: Study, opts: RunOptions, tracking_uri: str, root: Path, tags: Dict[str, str], previous: Dict[str, Any],
    launch_tags: Optional[Dict[str, str]] = None,
) -> Tuple[str, str, str]:
    """Experiment and parent run of this launch: ``(experiment_id, parent_run_id, tune_experiment_name)``.

    A new launch gets a new parent run (params: the study's settings, nested ones under dotted names,
    :mod:`flatlab.tracking.param_text`; artifacts: the plan and the study file; ``launch_tags``: e.g. the
    Optuna studies it grows) and becomes the experiment's default view in MLflow's UI
    (:func:`flatlab.tracking.ui.set_default_view`); ``--resume`` reopens the previous launch's parent run.
    """
    from mlflow.entities import Param

    from flatlab.study.plan import plan
    from flatlab.tracking.environment import log_packages
    from flatlab.tracking.param_text import flat_params
    from flatlab.tracking.published_runs import launch_param
    from flatlab.tracking.ui import set_default_view

    experiment_id = runs.get_or_create_experiment(tracking_uri, study.name, runs.artifact_location(root))
    client = runs.client(tracking_uri)
    if previous:
        client.update_run(previous["parent_run_id"], status="RUNNING")
        client.set_tag(previous["parent_run_id"], "flatlab.resumed", "true")
        return experiment_id, previous["parent_run_id"], previous["experiment_name"]
    exp_name = f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    parent = client.create_run(
        experiment_id, run_name=f"{study.name} {time.strftime('%Y-%m-%d %H:%M')}",
        tags={**tags, **(launch_tags or {}), runs.TAG_ROLE: "study"},
    )
    p = plan(study)
    params = {k: p[k] for k in ("workload", "metric", "mode", "searcher", "scheduler", "max_epochs", "total_trials", "seeds")}
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


def _update_launch(launch: Path, **changes: Any) -> None:
    state = json.loads(launch.read_text())
    state.update(changes)
    launch.write_text(json.dumps(state, indent=2))


def _ddp_concurrency(study: Study) -> Optional[int]:
    """Multi-worker trials reserve their workers outside Tune: cap them at what the cluster holds."""
    import ray

    return study.resources.concurrent_trials(ray.cluster_resources()) if study.resources.workers > 1 else None


def _new_tuner(study: Study, trainable: Any, searcher: Any, scheduler: Any, name: str, storage_path: str,
               callbacks: List[Any], num_samples: int) -> Any:
    from ray import tune

    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric=study.metric,
            mode=study.mode,
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=num_samples,
            max_concurrent_trials=study.max_concurrent or _ddp_concurrency(study),  # multi-worker trials (ddp)
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path,
            callbacks=callbacks,
            verbose=0,
            log_to_file=True,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=KEEP_CHECKPOINTS),
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )


def _restore_tuner(path: str, trainable: Any, callbacks: List[Any]) -> Any:
    """Restore the Tune experiment at ``path``, with this launch's live callbacks swapped in."""
    from ray import tune

    tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
    restored = tuner._local_tuner.get_run_config().callbacks  # pickled with the experiment
    for i, cb in enumerate(restored):
        for live in callbacks:
            if type(cb) is type(live):
                restored[i] = live
    return tuner


def _searcher_of(tuner: Any) -> Any:
    """The flatlab searcher inside a tuner (Tune may wrap it)."""
    alg = tuner._local_tuner._tune_config.search_alg
    while hasattr(alg, "searcher"):
        alg = alg.searcher
    return alg


def final_configs(study: Study, grid: Any) -> List[Dict[str, Any]]:
    """The final stage's trial configs: for each arm, its best completed search trial's configuration (by
    the study metric's final value; pruned, diverged and errored trials are never chosen) once per seed
    of ``study.final_seeds``, with ``stage = final``. An arm with no completed trial gets none (logged).

    Args:
        grid: the search's Tune ``ResultGrid`` (each result's ``config`` and last ``metrics``).
    """
    from flatlab.study.searchers import trial_outcome

    best: Dict[str, Tuple[float, Dict[str, Any]]] = {}
    sign = 1.0 if study.mode == "max" else -1.0
    for result in grid:
        config, metrics = result.config or {}, result.metrics or {}
        if trial_outcome(metrics, result.error is not None, study.metric) != "completed":
            continue
        arm, value = config.get("arm"), sign * float(metrics[study.metric])
        if arm not in best or value > best[arm][0]:
            best[arm] = (value, config)
    configs: List[Dict[str, Any]] = []
    for arm in study.arms:
        if arm.name not in best:
            logger.warning("final stage: arm %s has no completed search trial; it gets no final trials", arm.name)
            continue
        chosen = {k: v for k, v in best[arm.name][1].items() if k not in ("seed", runs.STAGE_KEY)}
        configs += [{**chosen, "seed": seed, runs.STAGE_KEY: runs.STAGE_FINAL} for seed in study.final_seeds]
    return configs


class _LaunchGuard:
    """Ends a launch that fails between opening its MLflow parent run and Tune's start (Ray start-up, data
    loading, building the searcher and the Tuner): the parent run ends FAILED (KILLED on Ctrl-C) and
    launch.json says ``failed`` (``killed``), never RUNNING/``running``. From ``tuner.fit()`` on,
    :func:`run_study`'s own ``finally`` records the outcome, and the guard is disarmed."""

    def __init__(self) -> None:
        self.opened: Any = None  # the future of _open_launch: (experiment_id, parent_run_id, tune name)
        self.launch: Optional[Path] = None
        self.tracking_uri = ""
        self.storage_path = ""

    def arm(self, opened: Any, launch: Path, tracking_uri: str, storage_path: str) -> None:
        self.opened, self.launch, self.tracking_uri, self.storage_path = opened, launch, tracking_uri, storage_path

    def disarm(self) -> None:
        self.opened = None

    def end(self, exc: BaseException) -> None:
        """Record ``exc``'s launch as failed (or killed); never raises (``exc`` is what the caller sees)."""
        if self.opened is None or self.launch is None:
            return
        opened, self.opened = self.opened, None
        try:
            experiment_id, parent_run_id, exp_name = opened.result()
        except BaseException:  # noqa: BLE001 - MLflow itself failed: no parent run was opened
            return
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        logger.error("launch failed before Tune started: %s: %s", type(exc).__name__, exc, exc_info=exc)
        try:
            runs.client(self.tracking_uri).set_terminated(parent_run_id, status=status)
            self.launch.write_text(json.dumps(
                {"experiment_path": _experiment_path(self.storage_path, exp_name), "experiment_name": exp_name,
                 "parent_run_id": parent_run_id, "tracking_uri": self.tracking_uri, "experiment_id": experiment_id,
                 "status": status.lower(), "num_errors": 0},
                indent=2,
            ))
        except Exception:  # noqa: BLE001 - report the original error, not this one
            logger.exception("could not record the failed launch in MLflow / %s", self.launch)


_GUARD: "contextvars.ContextVar[_LaunchGuard]" = contextvars.ContextVar("flatlab_launch_guard")


def _ends_failed_launches(fn: Any) -> Any:
    """Decorator of :func:`run_study`: any exception it raises after the launch was opened first ends the
    launch through :class:`_LaunchGuard` (armed by ``run_study`` once ``_open_launch`` is submitted)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        guard = _LaunchGuard()
        token = _GUARD.set(guard)
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            guard.end(exc)
            raise
        finally:
            _GUARD.reset(token)

    return wrapper


@_ends_failed_launches
def run_study(study: Study, opts: RunOptions, console: Any = None) -> StudyOutcome:
    """Run (or ``opts.resume``) ``study``; returns when every trial has ended or on interruption.

    Any exception after the launch was opened (Ray start-up, data loading, the searcher ...) ends its
    MLflow parent run FAILED and launch.json ``failed`` before it propagates (:class:`_LaunchGuard`).

    ``opts.resume`` restores the latest launch's Tune experiment (at the budget it was launched with:
    ``opts.overrides`` as :func:`flatlab.study.launches.resume_budget` gives them) and runs what is left:
    search trials, then the final stage. ``opts.continue_`` starts a new launch whose arms add trials to
    the previous launch's Optuna studies.

    Raises:
        ConfigError: ``--resume`` with nothing to resume; ``--continue`` without a previous launch or with
            a changed space (:func:`flatlab.study.launches.continued_studies`); both at once.
        DataUnavailable: the workload's data is missing (``Workload.check_data``), before Ray or MLflow start.
    """
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no CSV/JSON/TBX loggers per result
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")  # frequent checkpoints (checkpoint_every=1) are a choice, not a misconfiguration
    import mlflow  # noqa: F401  (imported before the log set-up, which then moves its handlers to the log file)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter honours verbose=0: our own progress only
    import optuna

    optuna.logging.disable_default_handler()  # Optuna's messages go to the log file
    from concurrent.futures import ThreadPoolExecutor

    from ray import tune

    from flatlab import __version__
    from flatlab.study.launches import continued_studies, read_launch
    from flatlab.study.progress import ProgressPrinter
    from flatlab.study.schedulers import build_scheduler
    from flatlab.study.searchers import ArmSearcher, FixedSearcher, optuna_study_name
    from flatlab.study.trainable import make_trainable, tune_env
    from flatlab.tracking.artifacts import WorkerTracking
    from flatlab.tracking.callback import MLflowTrialLogger
    from flatlab.tracking.environment import environment_tags
    from flatlab.workloads.registry import build_workload

    for key, value in tune_env().items():  # Tune's result buffering (FLATLAB_RESULT_BUFFER_S, default 1 s)
        os.environ.setdefault(key, value)
    t0 = time.monotonic()
    root = Path(opts.root).resolve()
    out = root / study.name
    out.mkdir(parents=True, exist_ok=True)
    tracking_uri = opts.tracking_uri or runs.default_tracking_uri(root)
    study = study if opts.resume else resolve_chained(study, tracking_uri)  # best_of(...) values, before anything starts
    storage_path = opts.storage or str(out / "ray")
    launch = _launch_file(out)

    previous: Dict[str, Any] = {}
    # the Optuna studies of this launch's arms: <prefix>.<arm>; --continue grows the previous launch's
    optuna_prefix: Optional[str] = None
    launch_tags: Dict[str, str] = {}
    continues: Dict[str, Any] = {}
    if opts.resume and opts.continue_:
        raise ConfigError("--resume and --continue exclude each other: --resume finishes the latest launch, "
                          "--continue starts a new one that adds trials to its Optuna studies")
    if opts.continue_:
        before = read_launch(root, study.name)
        optuna_prefix, names = continued_studies(before, study, str(launch))
        assert before is not None  # continued_studies raised otherwise
        continues = {"experiment_name": before.get("experiment_name"), "parent_run_id": before.get("parent_run_id"),
                     "optuna_studies": names}
        launch_tags = {"flatlab.continues": str(before.get("parent_run_id", "")),
                       "flatlab.optuna_studies": ",".join(names[a.name] for a in study.arms)}
    if opts.resume:
        if not launch.exists():
            raise ConfigError(f"--resume: no earlier launch of study {study.name!r} under {out} (missing {launch.name})")
        previous = read_launch(root, study.name) or {}
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

    workload = build_workload(study.workload, **dict(study.workload_params))
    workload.check_data()  # missing data: one error (DataUnavailable) before Ray, MLflow or a trial starts
    _setup_file_logging(out / "logs")
    logger.info("launch %s: tracking %s", study.name, tracking_uri)
    common_tags = {
        runs.TAG_STUDY: study.name,
        runs.TAG_WORKLOAD: study.workload,
        runs.TAG_COMMIT: runs.git_commit(),
        runs.TAG_VERSION: __version__,
        **environment_tags(),  # python, torch, CUDA, Ray ... versions (tracking/environment.py)
        **opts.extra_tags,
    }
    # MLflow set-up (seconds on a fresh SQLite store) overlaps Ray's start-up and the data loading.
    with ThreadPoolExecutor(max_workers=1) as pool:
        opened = pool.submit(_open_launch, study, opts, tracking_uri, root, common_tags, previous, launch_tags)
        _GUARD.get(_LaunchGuard()).arm(opened, launch, tracking_uri, storage_path)  # a failure from here on ends it FAILED
        _init_ray(opts, tracking_uri)
        _setup_file_logging(out / "logs")  # ray.init reconfigures logging
        logger.info("Ray ready (%.1f s)", time.monotonic() - t0)
        data = workload.load_data(study.seed)  # once per study; reaches trials through the object store
        experiment_id, parent_run_id, exp_name = opened.result()
    logger.info("MLflow ready, data loaded (%.1f s)", time.monotonic() - t0)
    client = runs.client(tracking_uri)
    experiment_path = _experiment_path(storage_path, exp_name)
    if previous:  # a resume keeps what the launch recorded: its budget, its Optuna studies, what it continued
        optuna_prefix = previous.get("optuna_prefix") or exp_name
        continues = previous.get("continues") or {}
    optuna_prefix = optuna_prefix or exp_name
    record: Dict[str, Any] = {
        "experiment_path": experiment_path, "experiment_name": exp_name, "parent_run_id": parent_run_id,
        "tracking_uri": tracking_uri, "experiment_id": experiment_id, "status": "running",
        "optuna_storage": f"sqlite:///{out / 'optuna.db'}",
        "overrides": previous.get("overrides", opts.overrides) if previous else dict(opts.overrides),
        "checkpoint_every": study.checkpoint_every,  # --resume keeps it (launches.resume_checkpoint_every)
        "optuna_prefix": optuna_prefix,
        "optuna_studies": {a.name: optuna_study_name(optuna_prefix, a.name) for a in study.arms} if study.searcher != "grid" else {},
    }
    if continues:
        record["continues"] = continues
    if previous.get("final_experiment_path"):
        record["final_experiment_path"] = previous["final_experiment_path"]
    launch.write_text(json.dumps(record, indent=2, default=str))
    tracking = WorkerTracking(tracking_uri, experiment_id, parent_run_id, log_models=opts.log_models)
    trainable = make_trainable(study, data, tracking)
    mlflow_cb = MLflowTrialLogger(
        tracking_uri,
        experiment_id,
        parent_run_id,
        tags=common_tags,
        arm_optimizer={a.name: a.optimizer for a in study.arms},
        metric=study.metric,
        mode=study.mode,
        study=study,  # child runs' params: the resolved configuration too
    )
    progress = ProgressPrinter(study.num_total_trials() + len(study.arms) * len(study.final_seeds), study.metric,
                               study.mode)
    callbacks = [mlflow_cb, progress]
    if opts.resume:
        tuner = _restore_tuner(experiment_path, trainable, callbacks)
    else:
        searcher = ArmSearcher(study, optuna_storage=f"sqlite:///{out / 'optuna.db'}", launch=optuna_prefix)
        tuner = _new_tuner(study, trainable, searcher, build_scheduler(study), exp_name, storage_path, callbacks,
                           study.num_total_trials())
    searcher = _searcher_of(tuner)
    searcher.run_id_of = mlflow_cb.run_id_of
    # the search's real budget: a restored experiment keeps the one it was launched with
    total = searcher.total_trials() if hasattr(searcher, "total_trials") else study.num_total_trials()
    progress.total = total + len(study.arms) * len(study.final_seeds)
    if console is not None:
        console.print(
            f"study [bold]{study.name}[/bold]: {total} trials"
            + (f", then {len(study.arms) * len(study.final_seeds)} final-seed trials" if study.final_seeds else "")
            + f", tracking {tracking_uri}, logs {out / 'logs'}"
            + (" (resumed)" if opts.resume else "")
            + (f" (adding to the Optuna studies of launch {continues.get('experiment_name')})" if opts.continue_ else "")
        )
    logger.info("starting Tune (%.1f s)", time.monotonic() - t0)
    interrupted, failed = False, False
    num_errors = 0
    _GUARD.get(_LaunchGuard()).disarm()  # the finally below records the outcome from here on
    try:
        grid = tuner.fit()
        num_errors = grid.num_errors
        interrupted = grid.num_terminated + grid.num_errors < total
        if study.final_seeds and not interrupted:
            final_name = f"{exp_name}-final"
            final_path = _experiment_path(storage_path, final_name)
            _update_launch(launch, final_experiment_path=final_path)
            if opts.resume and tune.Tuner.can_restore(final_path):
                final = _restore_tuner(final_path, trainable, callbacks)
            else:
                configs = final_configs(study, grid)
                logger.info("final stage: %d trials (%s)", len(configs), ", ".join(sorted({c["arm"] for c in configs})))
                final = _new_tuner(study, trainable, FixedSearcher(configs, study.metric, study.mode), None, final_name,
                                   storage_path, callbacks, len(configs))
            final_grid = final.fit()
            num_errors += final_grid.num_errors
            interrupted = final_grid.num_terminated + final_grid.num_errors < len(final_grid)
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
        _update_launch(launch, status=status.lower(), num_errors=num_errors)
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
