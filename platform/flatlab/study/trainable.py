"""The Tune function trainable: one trial = one :class:`~flatlab.train.trainer.Trainer` run.

Uses only ``ray.tune`` APIs (``tune.report``, ``tune.Checkpoint``, ``tune.get_checkpoint``). Data
arrives through ``tune.with_parameters`` (Ray's object store, loaded once per study). Every epoch
reports the workload's metrics; the last report (after ``max_epochs``, or at the first epoch whose mean
training loss reaches the trainer's ``stop_at_train_loss``) adds the test metrics (every report holds
them with the trainer's ``test_every_epoch``), the study's flatness measures on the final model and
``completed = 1``. A checkpoint (model, optimizer, scheduler, RNG
states) goes with the report of every epoch :func:`checkpoint_due` picks (the study's
``checkpoint_every``: every n-th epoch, or by default the first epoch ending
:data:`CHECKPOINT_INTERVAL_S` seconds after the previous checkpoint) and with the last, so a restarted
trial resumes where it stopped. Evaluation-only workloads (``trains = False``) report without
checkpoints and upload no model.

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
One trial loop (:func:`trial_loop`) serves the single-process trial and every rank of a multi-worker
(DDP) trial (:mod:`flatlab.study.ddp_trial`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional

import torch
from ray import tune

from flatlab.study.searchers import COMPLETED_KEY, DIVERGED_KEY
from flatlab.study.spec import Study
from flatlab.tracking.artifacts import WorkerTracking, log_trial_artifacts
from flatlab.tracking.runs import EPOCH_END_KEY, SUMMARY_KEY
from flatlab.train.checkpoint import CHECKPOINT_FILES, StateSnapshot
from flatlab.train.trainer import Diverged, Trainer
from flatlab.workloads.base import Data

CKPT_FILES = CHECKPOINT_FILES  # trainer.safetensors + trainer.json (no pickle)

#: With ``Study.checkpoint_every=None`` (the default), a trial checkpoints at the first epoch that ends at
#: least this many seconds after its previous checkpoint (or its start), and at its last epoch: a
#: restarted trial loses at most this much work plus one epoch, and short epochs do not each pay for a
#: checkpoint (a copy of the state, its write, Tune's copy into its storage and round trips to the driver).
CHECKPOINT_INTERVAL_S = 10.0

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


def checkpoint_due(every: Optional[int], epoch: int, last: bool, since_s: float) -> bool:
    """Whether the report of ``epoch`` (1-based, just completed) carries a checkpoint.

    Args:
        every: ``Study.checkpoint_every``: every ``every``-th epoch (Tune's checkpoint frequency); ``None``:
            when ``since_s`` (seconds since the trial's previous checkpoint, or its start) has reached
            :data:`CHECKPOINT_INTERVAL_S`.
        last: the trial's last epoch, which is always checkpointed (Tune's ``checkpoint_at_end``).
    """
    if last:
        return True
    if every is None:
        return since_s >= CHECKPOINT_INTERVAL_S
    return epoch % every == 0


#: ``report(metrics, checkpoint)``: one report of the trial (``checkpoint``: this epoch's state,
#: :meth:`~flatlab.train.trainer.Trainer.snapshot`, or ``None``; the report writes it to a folder of its
#: own, :func:`~flatlab.train.checkpoint.written`, and removes it once sent). Tune's, from a
#: :class:`~flatlab.study.reporter.BackgroundReporter`, in a single process; Ray Train's on every DDP rank.
Report = Callable[[Dict[str, Any], Optional[StateSnapshot]], None]


def run_trial(config: Dict[str, Any], *, study: Study, data: Data, tracking: Optional[WorkerTracking] = None) -> None:
    """Train the trial described by ``config`` (``{"arm", "seed", field: value ...}``) under Tune: one
    ``tune.report`` per epoch, a checkpoint where :func:`checkpoint_due` says so; a checkpoint from
    ``tune.get_checkpoint()`` (a restarted trial) is loaded first.

    With ``Resources(workers > 1)`` the trial runs as a Ray Train ``TorchTrainer`` (DDP) started from
    here (:mod:`flatlab.study.ddp_trial`); its ranks run the same :func:`trial_loop`.

    Raises:
        CheckpointError: the checkpoint to resume from is not flatlab's safe form (the trial fails).
    """
    if study.resources.workers > 1:
        from flatlab.study.ddp_trial import run_ddp_trial

        run_ddp_trial(config, study=study, data=data, tracking=tracking)
        return
    threads = max(1, int(study.resources.cpu))
    torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS=1; follow the trial's CPU allocation
    device = "cuda" if study.resources.gpu > 0 and torch.cuda.is_available() else "cpu"
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


def trial_loop(
    trainer: Trainer,
    study: Study,
    report: Report,
    *,
    tracking: Optional[WorkerTracking] = None,
    trial_id: Optional[str] = None,
    main: bool = True,
    extra: Optional[Mapping[str, float]] = None,
) -> None:
    """The epochs of one trial from wherever ``trainer`` stands (a resumed trial continues): one
    ``report`` per epoch, with a checkpoint where :func:`checkpoint_due` says so and at the last; the last
    report adds :func:`_final_metrics`; a diverged epoch reports the worst metric and ends the trial.
    Every report carries the time its epoch ended (``epoch_end_time``, seconds since 1970: the
    timestamp of its metrics in MLflow, however late the report reaches the driver); the last names
    the metrics :func:`_final_metrics` added (``summary_metrics``: logged at step 0, MLflow's summary
    values).

    Args:
        main: this process writes checkpoints, evaluates the final model (test split, flatness measures)
            and uploads it (DDP: rank 0 only; every rank still runs every epoch and calls ``report``, with
            ``None`` as the folder and without the final metrics on the others).
        extra: added to every report (DDP: ``world_size``).
    """
    target = trainer.hp.get("stop_at_train_loss")
    extra = dict(extra or {})
    saved_at = time.monotonic()
    curve_times = [(trainer.curve.step, time.time())]  # (optimizer step, time): the curve's timestamps
    while trainer.epoch < study.max_epochs:
        try:
            metrics = trainer.run_epoch()
        except Diverged as exc:
            worst = -math.inf if study.mode == "max" else math.inf
            report({"epoch": trainer.epoch + 1, study.metric: worst, DIVERGED_KEY: 1, "diverged_step": exc.step,
                    EPOCH_END_KEY: time.time(), **extra}, None)
            return
        metrics.update(extra)
        metrics[EPOCH_END_KEY] = time.time()  # the epoch's metrics are timed when it ended, not when sent
        curve_times.append((trainer.curve.step, metrics[EPOCH_END_KEY]))
        metrics[DIVERGED_KEY] = 0
        if not math.isfinite(metrics.get(study.metric, 0.0)):
            metrics[study.metric] = -math.inf if study.mode == "max" else math.inf
        reached = target is not None and trainer.trains and metrics.get("train/loss", math.inf) <= target
        last = reached or trainer.epoch == study.max_epochs
        if last and not main:  # DDP: Tune takes rank 0's report; the others only keep the report count
            metrics[COMPLETED_KEY] = 1
        elif last:
            final = _final_metrics(trainer, study, target, reached)
            metrics.update(final)
            # what only this report holds, about the final model: summary values, at step 0 in MLflow
            metrics[SUMMARY_KEY] = ",".join(sorted(k for k in final if k != COMPLETED_KEY))
            if tracking is not None and trial_id:
                if not trainer.trains:  # evaluation-only: the model is rebuilt from its inputs, not uploaded
                    tracking = dataclasses.replace(tracking, log_models=False)
                log_trial_artifacts(tracking, trial_id, trainer.model, trainer.spec, metrics, curve=trainer.curve.points(),
                                    curve_times=curve_times)
        if trainer.trains and checkpoint_due(study.checkpoint_every, trainer.epoch, last, time.monotonic() - saved_at):
            report(metrics, trainer.snapshot() if main else None)  # written and sent by the report
            saved_at = time.monotonic()
        else:
            report(metrics, None)
        if last:
            return


def _final_metrics(trainer: Trainer, study: Study, target: Optional[float], reached: bool) -> Dict[str, float]:
    """What a trial adds to its last report: the test metrics, the study's flatness measures on the final
    model (``flat/<measure>``, ``time/measures_s``), the training-loss target's outcome
    (``train/target_reached`` 1/0 and ``train/epochs_to_target``) and the completion flag."""
    # with test_every_epoch the last epoch's report already holds the test metrics of this model
    out: Dict[str, float] = {} if trainer.hp["test_every_epoch"] else dict(trainer.evaluate_test())
    if study.measures and trainer.trains:
        out.update(measure_trial(trainer, study))
    if target is not None:
        out["train/target_reached"] = 1.0 if reached else 0.0
        if reached:
            out["train/epochs_to_target"] = float(trainer.epoch)
    out[COMPLETED_KEY] = 1
    return out


def measure_trial(trainer: Trainer, study: Study) -> Dict[str, float]:
    """The study's flatness measures on ``trainer``'s current model, over the study's fixed evaluation
    subset (``measure_examples`` rows of the ``measure_split`` split chosen with ``measure_seed``: the
    same examples, noise and probes for every trial), with the unsmoothed training loss."""
    from flatlab.sharpness.measures import compute_measures, measure_subset, resolve_measures

    split = trainer.data.train if study.measure_split == "train" else trainer.data.eval_splits()[study.measure_split]
    subset = measure_subset(split, study.measure_examples, study.measure_seed, device=trainer.device)
    resolved = resolve_measures(study.measures, f"study {study.name!r}: measures")

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return trainer.workload.loss(outputs, targets, 0.0)

    return compute_measures(trainer.model, subset, loss_fn, resolved, seed=study.measure_seed)
