"""Multi-worker trials: one Tune trial runs a Ray Train ``TorchTrainer`` (DDP) over ``workers`` ranks.

Ray 2.43+ (Train V2) supports starting a ``TorchTrainer`` inside a Tune function trainable: the Tune
trial reserves nothing itself (:meth:`Resources.as_dict`), the Train workers reserve ``cpu``/``gpu``
each (:meth:`Resources.worker_dict`), and ``ray.tune.integration.ray_train.TuneReportCallback``
forwards rank 0's per-epoch reports to Tune, so the driver's MLflow callback, the searcher and ASHA see
a multi-worker trial exactly like a single-process one (plus the metric ``world_size``).

Every rank runs :func:`flatlab.study.trial_loop.trial_loop` on a :class:`~flatlab.train.trainer.Trainer`
built with its :class:`~flatlab.train.parallel.DataParallel` (gloo on CPU, NCCL on GPUs, chosen by
Ray Train). Rank 0 writes the checkpoints (the same safetensors + JSON as a single-process trial) and
uploads the final model; Ray Train stores the checkpoints under the trial's folder
(``<trial dir>/ddp/checkpoint_<time>``), and a restarted trial (``flatlab run --resume``) finds the
latest complete one there (:func:`latest_checkpoint`; Ray Train does not hand it to a new run itself)
and continues from it on every rank. On a multi-node cluster that folder must be on shared storage,
as Tune's ``storage_path`` must.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import ray
from pyarrow import fs as pafs
from ray import tune

from flatlab.extensions import install
from flatlab.lazy import lazy
from flatlab.study.placement import choose_device, node_label, placement
from flatlab.study.ray_compat import train_session_storage
from flatlab.study.spec import Study
from flatlab.study.trial_loop import trial_loop
from flatlab.study.trial_spec import trial_spec
from flatlab.tracking.artifacts import WorkerTracking
from flatlab.tracking.placement_tags import PLACEMENT_KEY, encode
from flatlab.train.checkpoint import CHECKPOINT_FILES, StateSnapshot, written
from flatlab.train.cpu_threads import configure as configure_cpu
from flatlab.train.parallel import DataParallel
from flatlab.train.trainer import Trainer
from flatlab.workloads.base import Data

# Ray Train: a trial of one worker (most of them) never loads it
ray_train = lazy("ray.train")
train_torch = lazy("ray.train.torch")
tune_ray_train = lazy("ray.tune.integration.ray_train")

#: folder (under the Tune trial's folder) where Ray Train keeps a multi-worker trial's checkpoints
TRAIN_RUN_NAME = "ddp"


def run_ddp_trial(
    config: Dict[str, Any],
    *,
    study: Study,
    data: Data,
    tracking: Optional[WorkerTracking] = None,
    extensions: Optional[Dict[str, Dict[str, Any]]] = None,
) -> None:
    """Run the trial ``config`` as a ``TorchTrainer`` with ``study.resources.workers`` workers; returns
    when it ends. Called by :func:`flatlab.study.trainable.run_trial` inside the Tune trial.

    Raises:
        ray.train.TrainingFailedError: a worker failed (Tune then marks the trial as errored).
    """
    res = study.resources
    ctx = tune.get_context()
    # the trial's folder on the experiment's storage (get_trial_dir() is a per-session local copy,
    # empty again when a resumed experiment restarts the trial)
    storage = train_session_storage()
    filesystem, run_dir = storage.storage_filesystem, train_run_dir(storage.trial_fs_path)
    loop_config = {
        "resume": latest_checkpoint(run_dir, filesystem),
        "config": dict(config),
        "study": study,
        "data": ray.put(data),  # once into the object store; every worker reads it from there
        "tracking": tracking,
        "trial_id": ctx.get_trial_id(),
        "extensions": extensions or {},  # the study's own entries, registered on every worker
    }
    trainer = train_torch.TorchTrainer(
        _worker_loop,
        train_loop_config=loop_config,
        scaling_config=ray_train.ScalingConfig(
            num_workers=res.workers, use_gpu=res.gpu > 0, resources_per_worker=res.worker_dict()
        ),
        run_config=ray_train.RunConfig(
            name=TRAIN_RUN_NAME,
            storage_path=storage.trial_fs_path,
            storage_filesystem=filesystem,
            callbacks=[tune_ray_train.TuneReportCallback()],
            checkpoint_config=ray_train.CheckpointConfig(num_to_keep=2),
            failure_config=ray_train.FailureConfig(max_failures=0),
        ),
    )
    trainer.fit()


def _worker_loop(loop_config: Dict[str, Any]) -> None:
    """One rank of a multi-worker trial (runs in a Ray Train worker, the process group started)."""
    install(loop_config.get("extensions") or {})  # the study's own workloads, optimizers, measures
    study: Study = loop_config["study"]
    ctx = ray_train.get_context()
    parallel = DataParallel(ctx.get_world_rank(), ctx.get_world_size())
    # the subnormal mode, then the thread count (Ray sets OMP_NUM_THREADS=1), before any computation
    denormals = configure_cpu(max(1, int(study.resources.cpu)), study.resources.flush_denormal)
    device, fallback = choose_device(study.resources, where=node_label())  # fails at once without usable CUDA
    if device == "cuda":
        device = str(train_torch.get_device())
    spec = trial_spec(study, loop_config["config"], device=device)
    data = ray.get(loop_config["data"])
    trainer = Trainer(spec, data, parallel=parallel)
    checkpoint = ray_train.get_checkpoint()  # Ray Train's own restarts of this run
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            trainer.load(d)  # every rank loads rank 0's checkpoint: the same state everywhere
    elif loop_config["resume"] is not None:  # a restarted Tune trial: the previous run's latest
        path, filesystem = loop_config["resume"]
        with ray_train.Checkpoint(path, filesystem=filesystem).as_directory() as d:
            trainer.load(d)

    def report(metrics: Dict[str, Any], snapshot: Optional[StateSnapshot]) -> None:
        with written(snapshot) as folder:  # removed once Ray Train has copied it into the run's storage
            saved = ray_train.Checkpoint.from_directory(folder) if folder else None
            ray_train.report(metrics, checkpoint=saved)  # every rank reports; rank 0's metrics reach Tune

    trial_loop(
        trainer,
        study,
        report,
        tracking=loop_config["tracking"],
        trial_id=loop_config["trial_id"],
        main=parallel.is_main,
        extra={
            "world_size": parallel.world,
            PLACEMENT_KEY: encode(
                placement(
                    device,
                    study.resources,
                    world_size=parallel.world,
                    start_epoch=trainer.epoch,
                    fallback=fallback,
                    denormals=denormals,
                )
            ),
        },
    )


def latest_checkpoint(run_dir: str, filesystem: Any = None) -> Optional[Tuple[str, Any]]:
    """``(path, filesystem)`` of the newest complete checkpoint folder under ``run_dir`` (a
    ``checkpoint_<time>`` folder holding every file of :data:`~flatlab.train.checkpoint.CHECKPOINT_FILES`)
    on ``filesystem`` (a ``pyarrow.fs.FileSystem``; ``None``: the local one); ``None`` if there is none."""
    filesystem = filesystem or pafs.LocalFileSystem()
    infos = filesystem.get_file_info(pafs.FileSelector(run_dir, allow_not_found=True, recursive=True))
    files: Dict[str, set] = {}
    for info in infos:
        parent, name = info.path.rsplit("/", 1) if "/" in info.path else ("", info.path)
        if info.type == pafs.FileType.File and parent.rsplit("/", 1)[-1].startswith("checkpoint_"):
            files.setdefault(parent, set()).add(name)
    complete = [d for d, names in files.items() if set(CHECKPOINT_FILES) <= names]
    # Ray names them checkpoint_<YYYY-MM-DD_HH-MM-SS.ffffff>: the name order is the time order
    return (max(complete, key=lambda d: d.rsplit("/", 1)[-1]), filesystem) if complete else None


def train_run_dir(trial_dir: str) -> str:
    """Where Ray Train keeps a multi-worker trial's run (and its checkpoints) for a Tune trial folder."""
    return os.path.join(trial_dir, TRAIN_RUN_NAME)
