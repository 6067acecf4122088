"""The Tune function trainable: one trial = one :class:`~flatlab.train.trainer.Trainer` run.

Uses only ``ray.tune`` APIs (``tune.report``, ``tune.Checkpoint``, ``tune.get_checkpoint``). Data
arrives through ``tune.with_parameters`` (Ray's object store, loaded once per study). The epochs, their
reports and checkpoints are :func:`flatlab.study.trial_loop.trial_loop`'s (Ray-free; every rank of a
multi-worker trial, :mod:`flatlab.study.ddp_trial`, runs it too); a checkpoint from
``tune.get_checkpoint()`` (a restarted trial) is loaded first. Evaluation-only workloads (``trains =
False``) report without checkpoints and upload no model.

Per-epoch cost: training does not wait on the driver. The trial's reports are queued and sent from a
thread of their own (:class:`~flatlab.study.reporter.BackgroundReporter`); the trial waits only at an
epoch where its ASHA rung decides (:func:`flatlab.study.schedulers.decision_epochs`: a stopped trial
never trains past its rung) and before it ends. The reports travel to the driver in batches (Tune's
result buffering, :func:`tune_env`, up to :data:`RESULT_BUFFER_S` seconds) that the trainable class of
:func:`make_trainable` ends early at those decision epochs, at a checkpoint (which travels alone) and
at the end; a trial that raises first delivers every report it made, then fails with its error.
A checkpoint costs the trial a copy of its state in memory (:meth:`~flatlab.train.trainer.Trainer.snapshot`);
writing it (safetensors + JSON), Tune's copy into the trial's storage and the round trips happen in the
reporting thread.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from ray import tune

from flatlab.extensions import capture, install
from flatlab.study.ddp_trial import run_ddp_trial
from flatlab.study.placement import choose_device, node_label, placement
from flatlab.study.ray_compat import buffered_trainable
from flatlab.study.reporter import BackgroundReporter
from flatlab.study.schedulers import decision_epochs
from flatlab.study.spec import Study
from flatlab.study.trial_loop import evaluation_trial, trial_loop
from flatlab.study.trial_spec import trial_spec
from flatlab.tracking.artifacts import WorkerTracking
from flatlab.tracking.placement_tags import PLACEMENT_KEY, encode
from flatlab.train.cpu_threads import configure as configure_cpu
from flatlab.train.trainer import Trainer
from flatlab.workloads.base import Data
from flatlab.workloads.registry import get_workload

#: Seconds a trial's reports may wait in its worker before they go to the driver together (Tune's
#: result buffering), from the environment variable ``FLATLAB_RESULT_BUFFER_S`` (default 1; 0 sends every
#: report at once). The batch also ends at every ASHA decision epoch, checkpoint and error (see the module
#: docstring), so buffering delays only what nothing waits on: the progress line and MLflow's curves.
RESULT_BUFFER_S = float(os.environ.get("FLATLAB_RESULT_BUFFER_S", "1") or 0)


def tune_env(buffer_s: float = RESULT_BUFFER_S) -> Dict[str, str]:
    """Environment of the Tune driver set by :func:`flatlab.study.runner.run_study` (``setdefault``: a
    value already in the environment wins), read by Tune's controller when ``Tuner.fit`` starts: for
    ``buffer_s`` > 0 the controller asks a trial for batches (``train_buffered``), otherwise for one
    report at a time. A batch's limits are :func:`make_trainable`'s, so Tune's
    ``TUNE_RESULT_BUFFER_*_TIME_S`` are not set: its controller's values never reach the batch."""
    return {"TUNE_RESULT_BUFFER_LENGTH": "1000" if buffer_s > 0 else "1"}


def make_trainable(
    study: Study,
    data: Data,
    tracking: Optional[WorkerTracking] = None,
    buffer_s: float = RESULT_BUFFER_S,
    max_batch: int = 1000,
) -> type:
    """The Tune trainable of ``study``'s trials: :func:`run_trial` with ``study``, ``data`` (through Ray's
    object store, ``tune.with_parameters``) and ``tracking`` bound, the study's resources attached, as a
    function-trainable class whose reports travel in batches of up to ``buffer_s`` seconds and
    ``max_batch`` reports (when :func:`tune_env` has turned Tune's result buffering on). A batch ends early
    at the epochs where the trial's scheduler decides (:func:`flatlab.study.schedulers.decision_epochs`),
    at a checkpoint and at the end; a report that carries a checkpoint travels alone (the batch before
    it goes first). It never loses a report to an error: an exception raised while a batch is
    collected is held, the reports before it are returned, and the next call raises it (Tune then fails
    the trial with it, as without buffering).

    The batch's limits are this function's arguments, not the ones Tune's controller passes (Ray 2.60
    faults that :func:`flatlab.study.ray_compat.buffered_trainable` works around). The study's own
    workloads, optimizers and measures (:func:`flatlab.extensions.capture`) are bound too.

    Returns:
        A ``ray.tune`` ``FunctionTrainable`` subclass, named ``run_trial`` like the function it wraps.
    """
    # the study's own workloads, optimizers and measures reach the trials' processes by value
    fn = tune.with_resources(
        tune.with_parameters(run_trial, study=study, data=data, tracking=tracking, extensions=capture()),
        study.resources.as_dict(),
    )
    BatchedTrial = buffered_trainable(fn, decision_epochs(study), buffer_s, max_batch)
    BatchedTrial.__name__ = BatchedTrial.__qualname__ = "run_trial"
    return BatchedTrial


def run_trial(
    config: Dict[str, Any],
    *,
    study: Study,
    data: Data,
    tracking: Optional[WorkerTracking] = None,
    extensions: Optional[Dict[str, Dict[str, Any]]] = None,
) -> None:
    """Train the trial described by ``config`` (``{"arm", "seed", field: value ...}``) under Tune: one
    ``tune.report`` per epoch, a checkpoint where :func:`~flatlab.study.trial_loop.checkpoint_due` says so;
    a checkpoint from ``tune.get_checkpoint()`` (a restarted trial) is loaded first.

    With ``Resources(workers > 1)`` the trial runs as a Ray Train ``TorchTrainer`` (DDP) started from
    here (:mod:`flatlab.study.ddp_trial`); its ranks run the same :func:`~flatlab.study.trial_loop.trial_loop`.
    A trial of an evaluation-only workload (``trains = False``) is
    :func:`~flatlab.study.trial_loop.evaluation_trial`, in this process.

    The trial's device follows :func:`flatlab.study.placement.choose_device`; every report carries its
    placement (:data:`flatlab.tracking.placement_tags.PLACEMENT_KEY`), which the driver tags on its run.
    ``extensions``: the study's own registered entries (:func:`flatlab.extensions.capture`), registered
    in this process first.

    Raises:
        CheckpointError: the checkpoint to resume from is not flatlab's safe form (the trial fails).
        DeviceUnavailableError: the trial reserved a GPU, CUDA is not usable on its node, and the study has
            no ``Resources(cpu_fallback=True)`` (the trial fails at once).
    """
    install(extensions or {})
    if get_workload(study.workload).trains and study.resources.workers > 1:
        run_ddp_trial(config, study=study, data=data, tracking=tracking, extensions=extensions)
        return
    # before any computation: the subnormal mode first (the thread pool inherits it), then the thread
    # count (Ray sets OMP_NUM_THREADS=1; a trial follows its CPU allocation)
    denormals = configure_cpu(max(1, int(study.resources.cpu)), study.resources.flush_denormal)
    # a reserved GPU without usable CUDA fails the trial here, unless Resources(cpu_fallback=True)
    device, fallback = choose_device(study.resources, where=node_label())
    if not get_workload(study.workload).trains:  # evaluation-only: one evaluation, one report
        evaluation_trial(
            config,
            study,
            data,
            lambda metrics, _: tune.report(metrics),
            device=device,
            tracking=tracking,
            trial_id=tune.get_context().get_trial_id(),
        )
        return
    spec = trial_spec(study, config, device=device)
    trainer = Trainer(spec, data)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            trainer.load(d)  # safetensors + JSON only; anything else raises CheckpointError: the trial fails
    # where this (re)start runs, in every report: the driver tags the trial's run with it
    placed = {
        PLACEMENT_KEY: encode(
            placement(device, study.resources, start_epoch=trainer.epoch, fallback=fallback, denormals=denormals)
        )
    }

    def send(metrics: Dict[str, Any], checkpoint_dir: Optional[str]) -> None:
        if checkpoint_dir is None:
            tune.report(metrics)
        else:
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(checkpoint_dir))

    # training goes on while the reports travel; it waits at its scheduler's decision epochs
    reporter = BackgroundReporter(send, wait_at=decision_epochs(study))
    try:
        trial_loop(
            trainer, study, reporter, tracking=tracking, trial_id=tune.get_context().get_trial_id(), extra=placed
        )
    finally:
        reporter.close()  # every report goes out (in order) before the trial returns or raises
