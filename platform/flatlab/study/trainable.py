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
import time
from typing import Any, Dict, Optional

import torch
from ray import tune

from flatlab.study.spec import Study
from flatlab.study.trial_loop import evaluation_trial, trial_loop
from flatlab.tracking.artifacts import WorkerTracking
from flatlab.train.trainer import Trainer
from flatlab.workloads.base import Data

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


def make_trainable(study: Study, data: Data, tracking: Optional[WorkerTracking] = None,
                   buffer_s: float = RESULT_BUFFER_S, max_batch: int = 1000) -> type:
    """The Tune trainable of ``study``'s trials: :func:`run_trial` with ``study``, ``data`` (through Ray's
    object store, ``tune.with_parameters``) and ``tracking`` bound, the study's resources attached, as a
    function-trainable class whose reports travel in batches of up to ``buffer_s`` seconds and
    ``max_batch`` reports (when :func:`tune_env` has turned Tune's result buffering on). A batch ends early
    at the epochs where the trial's scheduler decides (:func:`flatlab.study.schedulers.decision_epochs`),
    at a checkpoint and at the end; a report that carries a checkpoint travels alone (the batch before
    it goes first). It never loses a report to an error: an exception raised while a batch is
    collected is held, the reports before it are returned, and the next call raises it (Tune then fails
    the trial with it, as without buffering).

    The batch's limits are this function's arguments, not the ones Tune's controller passes:
    Ray 2.60's controller calls ``train_buffered(buffer_length, buffer_time_s)`` while
    ``Trainable.train_buffered`` takes ``(buffer_time_s, max_buffer_length)``, so Ray's own method ends
    every batch after one report (measured: 1029 of 1029 batches held one report). And a checkpoint
    travels alone because that controller, given a batch that ends with a checkpoint, acts on the
    earlier reports' CONTINUE before the checkpoint's ``save`` resolves and runs two trains at once.
    Both are Ray 2.60 faults; when Ray fixes them this class can shrink to the error handling.

    Returns:
        A ``ray.tune`` ``FunctionTrainable`` subclass, named ``run_trial`` like the function it wraps.
    """
    from ray.tune.result import DONE, RESULT_DUPLICATE, SHOULD_CHECKPOINT, TRAINING_ITERATION
    from ray.tune.trainable.function_trainable import wrap_function

    from flatlab.study.schedulers import decision_epochs

    fn = tune.with_resources(tune.with_parameters(run_trial, study=study, data=data, tracking=tracking),
                             study.resources.as_dict())
    decide_at = decision_epochs(study)

    class BatchedTrial(wrap_function(fn)):  # type: ignore[misc, valid-type]
        _held_error: Optional[BaseException] = None
        _held_result: Optional[Dict[str, Any]] = None

        def train_buffered(self, *_tune_args: Any, **_tune_kwargs: Any) -> list:
            if self._held_error is not None:
                error, self._held_error = self._held_error, None
                raise error
            if self._held_result is not None:
                result, self._held_result = self._held_result, None
                return [result]
            results: list = []
            send_at = time.time() + buffer_s
            while True:
                try:
                    result = self.train()
                except Exception as exc:  # deliver what was reported before it; raise it on the next call
                    if not results:
                        raise
                    self._held_error = exc
                    return results
                if result.get(SHOULD_CHECKPOINT) and results:
                    # a checkpoint travels alone: Ray 2.60's controller would act on the CONTINUE of the
                    # batch's earlier results before the checkpoint's save resolves, and run two trains
                    # at once (measured: "non-training future scheduled" warnings, then 30 s stalls)
                    self._held_result = result
                    return results
                results.append(result)
                if (result.get(DONE) or result.get(SHOULD_CHECKPOINT) or result.get(RESULT_DUPLICATE)
                        or result.get(TRAINING_ITERATION) in decide_at or len(results) >= max_batch
                        or time.time() >= send_at):
                    return results

        def reset_config(self, new_config: Dict[str, Any]) -> bool:
            self._held_error = self._held_result = None  # a reused actor starts its next trial clean
            return super().reset_config(new_config)

    BatchedTrial.__name__ = BatchedTrial.__qualname__ = "run_trial"
    return BatchedTrial


def run_trial(config: Dict[str, Any], *, study: Study, data: Data, tracking: Optional[WorkerTracking] = None) -> None:
    """Train the trial described by ``config`` (``{"arm", "seed", field: value ...}``) under Tune: one
    ``tune.report`` per epoch, a checkpoint where :func:`~flatlab.study.trial_loop.checkpoint_due` says so; a checkpoint from
    ``tune.get_checkpoint()`` (a restarted trial) is loaded first.

    With ``Resources(workers > 1)`` the trial runs as a Ray Train ``TorchTrainer`` (DDP) started from
    here (:mod:`flatlab.study.ddp_trial`); its ranks run the same :func:`~flatlab.study.trial_loop.trial_loop`.
    A trial of an evaluation-only workload (``trains = False``) is
    :func:`~flatlab.study.trial_loop.evaluation_trial`, in this process.

    Raises:
        CheckpointError: the checkpoint to resume from is not flatlab's safe form (the trial fails).
    """
    from flatlab.workloads.registry import get_workload

    if get_workload(study.workload).trains and study.resources.workers > 1:
        from flatlab.study.ddp_trial import run_ddp_trial

        run_ddp_trial(config, study=study, data=data, tracking=tracking)
        return
    threads = max(1, int(study.resources.cpu))
    torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS=1; follow the trial's CPU allocation
    device = "cuda" if study.resources.gpu > 0 and torch.cuda.is_available() else "cpu"
    if not get_workload(study.workload).trains:  # evaluation-only: one evaluation, one report
        evaluation_trial(config, study, data, lambda metrics, _: tune.report(metrics), device=device, tracking=tracking,
                         trial_id=tune.get_context().get_trial_id())
        return
    spec = study.trial_spec(config, device=device)
    trainer = Trainer(spec, data)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            trainer.load(d)  # safetensors + JSON only; anything else raises CheckpointError: the trial fails

    def send(metrics: Dict[str, Any], checkpoint_dir: Optional[str]) -> None:
        if checkpoint_dir is None:
            tune.report(metrics)
        else:
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(checkpoint_dir))

    from flatlab.study.reporter import BackgroundReporter
    from flatlab.study.schedulers import decision_epochs

    # training goes on while the reports travel; it waits at its scheduler's decision epochs
    reporter = BackgroundReporter(send, wait_at=decision_epochs(study))
    try:
        trial_loop(trainer, study, reporter, tracking=tracking, trial_id=tune.get_context().get_trial_id())
    finally:
        reporter.close()  # every report goes out (in order) before the trial returns or raises
