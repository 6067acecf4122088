"""The Tune function trainable: one trial = one :class:`~flatlab.train.trainer.Trainer` run.

Uses only ``ray.tune`` APIs (``tune.report``, ``tune.Checkpoint``, ``tune.get_checkpoint``). Data
arrives through ``tune.with_parameters`` (Ray's object store, loaded once per study). Every epoch
reports the workload's metrics; the last report (after ``max_epochs``, or at the first epoch whose mean
training loss reaches the trainer's ``stop_at_train_loss``) adds the test metrics, the study's flatness
measures on the final model and ``completed = 1``. A checkpoint (model, optimizer, scheduler, RNG
states) goes with the report of every epoch :func:`checkpoint_due` picks (the study's
``checkpoint_every``: every n-th epoch, or by default the first epoch ending
:data:`CHECKPOINT_INTERVAL_S` seconds after the previous checkpoint) and with the last, so a restarted
trial resumes where it stopped. Evaluation-only workloads (``trains = False``) report without
checkpoints and upload no model.

Per-epoch cost: each report is one round trip to the driver; with ``FLATLAB_RESULT_BUFFER_S`` > 0 the
runner lets Tune collect a trial's reports for up to that many seconds (or until a report carries a
checkpoint) before they travel together (``TUNE_RESULT_BUFFER_*``, see :func:`tune_env`). A checkpoint costs a save (safetensors + JSON), Tune's copy into the trial's storage
and a round trip to the driver.
One trial loop (:func:`trial_loop`) serves the single-process trial and every rank of a multi-worker
(DDP) trial (:mod:`flatlab.study.ddp_trial`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import time
from typing import Any, Callable, Dict, Mapping, Optional

import torch
from ray import tune

from flatlab.study.searchers import COMPLETED_KEY, DIVERGED_KEY
from flatlab.study.spec import Study
from flatlab.tracking.artifacts import WorkerTracking, log_trial_artifacts
from flatlab.train.checkpoint import CHECKPOINT_FILES
from flatlab.train.trainer import Diverged, Trainer
from flatlab.workloads.base import Data

CKPT_FILES = CHECKPOINT_FILES  # trainer.safetensors + trainer.json (no pickle)

#: With ``Study.checkpoint_every=None`` (the default), a trial checkpoints at the first epoch that ends at
#: least this many seconds after its previous checkpoint (or its start), and at its last epoch: a
#: restarted trial loses at most this much work plus one epoch, and short epochs do not each pay for a
#: checkpoint (a save, a copy into Tune's storage and a round trip to the driver).
CHECKPOINT_INTERVAL_S = 10.0

#: Seconds a trial's reports may wait in its worker before they go to the driver together (Tune's
#: result buffering), from the environment variable ``FLATLAB_RESULT_BUFFER_S``; 0 (the default) sends
#: every report at once. Buffering is opt-in because a trial that raises loses the reports of its last
#: unsent batch (measured: a two-worker trial raising at epoch 2 lost epoch 1), and ASHA sees an epoch
#: up to that late (a stopped trial may train that long past its rung; those epochs are dropped).
RESULT_BUFFER_S = float(os.environ.get("FLATLAB_RESULT_BUFFER_S", "0") or 0)


def tune_env(buffer_s: float = RESULT_BUFFER_S) -> Dict[str, str]:
    """Environment of the Tune driver set by :func:`flatlab.study.runner.run_study` (``setdefault``: a
    value already in the environment wins), read by Tune's controller when ``Tuner.fit`` starts: Tune's
    result buffering for ``buffer_s`` > 0, none otherwise."""
    if buffer_s <= 0:
        return {"TUNE_RESULT_BUFFER_LENGTH": "1"}
    return {
        "TUNE_RESULT_BUFFER_LENGTH": "1000",
        "TUNE_RESULT_BUFFER_MIN_TIME_S": str(buffer_s),
        "TUNE_RESULT_BUFFER_MAX_TIME_S": str(buffer_s),
    }


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


#: ``report(metrics, checkpoint_dir)``: one report of the trial (``checkpoint_dir``: a folder holding
#: this epoch's checkpoint, or ``None``). Tune's in a single process; Ray Train's on every DDP rank.
Report = Callable[[Dict[str, Any], Optional[str]], None]


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

    def report(metrics: Dict[str, Any], checkpoint_dir: Optional[str]) -> None:
        if checkpoint_dir is None:
            tune.report(metrics)
        else:
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(checkpoint_dir))

    trial_loop(trainer, study, report, tracking=tracking, trial_id=tune.get_context().get_trial_id())


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

    Args:
        main: this process writes checkpoints and uploads the final model (DDP: rank 0 only; every rank
            still runs every epoch and calls ``report``, with ``None`` as the folder on the others).
        extra: added to every report (DDP: ``world_size``).
    """
    target = trainer.hp.get("stop_at_train_loss")
    extra = dict(extra or {})
    saved_at = time.monotonic()
    while trainer.epoch < study.max_epochs:
        try:
            metrics = trainer.run_epoch()
        except Diverged as exc:
            worst = -math.inf if study.mode == "max" else math.inf
            report({"epoch": trainer.epoch + 1, study.metric: worst, DIVERGED_KEY: 1, "diverged_step": exc.step, **extra}, None)
            return
        metrics.update(extra)
        metrics[DIVERGED_KEY] = 0
        if not math.isfinite(metrics.get(study.metric, 0.0)):
            metrics[study.metric] = -math.inf if study.mode == "max" else math.inf
        reached = target is not None and trainer.trains and metrics.get("train/loss", math.inf) <= target
        last = reached or trainer.epoch == study.max_epochs
        if last:
            metrics.update(_final_metrics(trainer, study, target, reached))
            if main and tracking is not None and trial_id:
                if not trainer.trains:  # evaluation-only: the model is rebuilt from its inputs, not uploaded
                    tracking = dataclasses.replace(tracking, log_models=False)
                log_trial_artifacts(tracking, trial_id, trainer.model, trainer.spec, metrics, curve=trainer.curve.points())
        if trainer.trains and checkpoint_due(study.checkpoint_every, trainer.epoch, last, time.monotonic() - saved_at):
            with tempfile.TemporaryDirectory() as d:
                if main:
                    trainer.save(d)
                report(metrics, d if main else None)
            saved_at = time.monotonic()
        else:
            report(metrics, None)
        if last:
            return


def _final_metrics(trainer: Trainer, study: Study, target: Optional[float], reached: bool) -> Dict[str, float]:
    """What a trial adds to its last report: the test metrics, the study's flatness measures on the final
    model (``flat/<measure>``, ``time/measures_s``), the training-loss target's outcome
    (``train/target_reached`` 1/0 and ``train/epochs_to_target``) and the completion flag."""
    out: Dict[str, float] = dict(trainer.evaluate_test())
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
