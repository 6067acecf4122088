"""A launch's Tune Tuner, new or restored: the trainable, the MLflow and progress callbacks, the searcher
and the scheduler, and what Tune keeps of each trial.

The Tune experiment of launch ``<name>`` lives under the launch's storage (``<root>/<study>/ray`` unless
``--storage`` says otherwise, :func:`experiment_path`); ``--resume`` restores it there once Tune has saved
it, and starts it again in the same launch when the driver was killed before that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import ray
from ray import tune

from flatlab.study.launches import Launch, log_file
from flatlab.study.options import RunOptions
from flatlab.study.progress import ProgressPrinter
from flatlab.study.ray_compat import can_resume, restored_callbacks, tuner_scheduler, tuner_searcher
from flatlab.study.recovery import LaunchRecords
from flatlab.study.schedulers import ArmScheduler, build_scheduler
from flatlab.study.searchers import ArmSearcher
from flatlab.study.spec import Study
from flatlab.study.trainable import make_trainable
from flatlab.study.trial_spec import resolved_config
from flatlab.tracking.artifacts import WorkerTracking
from flatlab.tracking.callback import MLflowTrialLogger

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
class Started:
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


def experiment_path(storage_path: str, name: str) -> str:
    """The Tune experiment folder (or URI) of launch ``name`` under ``storage_path``."""
    return str(Path(storage_path) / name) if "://" not in storage_path else f"{storage_path.rstrip('/')}/{name}"


def build_tuner(
    study: Study, opts: RunOptions, launch: Launch, storage_path: str, data: Any, tags: Dict[str, str]
) -> Started:
    """The trainable, the MLflow and progress callbacks and the Tuner of ``launch`` (restored for
    ``--resume``, once Tune saved it), with the searcher pointed at the MLflow runs."""
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
        tuner = restore_tuner(launch.experiment_path, trainable, callbacks, records)
    else:
        if opts.resume:  # killed before Tune saved its experiment: it starts again, in the same launch
            logger.warning("resume: the launch ended before Tune saved its experiment; starting it again")
        searcher = ArmSearcher(
            study, optuna_storage=launch.optuna_storage, launch=launch.optuna_prefix, experiment=launch.experiment_name
        )
        tuner = new_tuner(
            study,
            trainable,
            searcher,
            make_scheduler(study, records),
            launch.experiment_name,
            storage_path,
            callbacks,
            study.num_total_trials(),
        )
    searcher = tuner_searcher(tuner)  # the flatlab searcher inside the tuner (Tune may wrap it)
    searcher.run_id_of = mlflow_cb.run_id_of
    # the search's real budget: a restored experiment keeps the one it was launched with
    total = searcher.total_trials() if hasattr(searcher, "total_trials") else study.num_total_trials()
    progress.total = total + finals
    return Started(launch, storage_path, tuner, trainable, callbacks, mlflow_cb, total, records)


def new_tuner(
    study: Study,
    trainable: Any,
    searcher: Any,
    scheduler: Any,
    name: str,
    storage_path: str,
    callbacks: List[Any],
    num_samples: int,
) -> Any:
    """A new Tuner: ``num_samples`` trials suggested by ``searcher`` and scheduled by ``scheduler``, as
    many at once as the cluster holds (or ``Study.max_concurrent``), stored as ``name`` under
    ``storage_path``."""
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            metric=study.metric,
            mode=study.mode,
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=num_samples,
            max_concurrent_trials=study.max_concurrent or concurrency(study),
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


def restore_tuner(path: str, trainable: Any, callbacks: List[Any], records: Any = None) -> Any:
    """Restore the Tune experiment at ``path``, with this launch's live callbacks swapped in and, given
    ``records`` (:class:`~flatlab.study.recovery.LaunchRecords`), its scheduler told which trials ended
    before the previous driver was killed."""
    tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
    restored = restored_callbacks(tuner)  # pickled with the experiment
    for i, cb in enumerate(restored):
        for live in callbacks:
            if type(cb) is type(live):
                restored[i] = live
    scheduler = tuner_scheduler(tuner)
    if records is not None and isinstance(scheduler, ArmScheduler):  # a plain FIFOScheduler: left as restored
        scheduler.recorded = records.on_add
    return tuner


def make_scheduler(study: Study, records: Any, fifo: bool = False) -> Any:
    """:func:`~flatlab.study.schedulers.build_scheduler`'s, told (on a resume) which trials ended before."""
    scheduler = build_scheduler(study, fifo=fifo)
    if records is not None:
        scheduler.recorded = records.on_add
    return scheduler


def concurrency(study: Study) -> int:
    """Trials at once: as many as the cluster holds when the launch starts (Tune starts one trial at a
    time with a custom searcher unless given a limit; multi-worker trials reserve their workers outside
    Tune, which cannot count them). On an autoscaling cluster, ``Study.max_concurrent`` allows more."""
    return study.resources.concurrent_trials(ray.cluster_resources())
