"""The Tune function trainable: one trial = one :class:`~flatlab.train.trainer.Trainer` run.

Uses only ``ray.tune`` APIs (``tune.report``, ``tune.Checkpoint``, ``tune.get_checkpoint``). Data
arrives through ``tune.with_parameters`` (Ray's object store, loaded once per study). Every epoch
reports the workload's metrics; the last report (after ``max_epochs``, or at the first epoch whose mean
training loss reaches the trainer's ``stop_at_train_loss``) adds the test metrics, the study's flatness
measures on the final model and ``completed = 1``; a checkpoint (model, optimizer, scheduler, RNG states) goes with every
``checkpoint_every``-th report and the last, so a restarted trial resumes where it stopped.
Evaluation-only workloads (``trains = False``) report without checkpoints and upload no model.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from typing import Any, Dict, Optional

import torch
from ray import tune

from flatlab.study.searchers import COMPLETED_KEY, DIVERGED_KEY
from flatlab.study.spec import Study
from flatlab.tracking.artifacts import WorkerTracking, log_trial_artifacts
from flatlab.train.checkpoint import CHECKPOINT_FILES
from flatlab.train.trainer import Diverged, Trainer
from flatlab.workloads.base import Data

CKPT_FILES = CHECKPOINT_FILES  # trainer.safetensors + trainer.json (no pickle)


def run_trial(config: Dict[str, Any], *, study: Study, data: Data, tracking: Optional[WorkerTracking] = None) -> None:
    """Train the trial described by ``config`` (``{"arm", "seed", field: value ...}``) under Tune."""
    threads = max(1, int(study.resources.cpu))
    torch.set_num_threads(threads)  # Ray sets OMP_NUM_THREADS=1; follow the trial's CPU allocation
    device = "cuda" if study.resources.gpu > 0 and torch.cuda.is_available() else "cpu"
    spec = study.trial_spec(config, device=device)
    trainer = Trainer(spec, data)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            trainer.load(d)  # safetensors + JSON only; anything else raises CheckpointError: the trial fails
    trial_id = tune.get_context().get_trial_id()
    target = trainer.hp.get("stop_at_train_loss")
    while trainer.epoch < study.max_epochs:
        try:
            metrics = trainer.run_epoch()
        except Diverged as exc:
            worst = -math.inf if study.mode == "max" else math.inf
            tune.report({"epoch": trainer.epoch + 1, study.metric: worst, DIVERGED_KEY: 1, "diverged_step": exc.step})
            return
        metrics[DIVERGED_KEY] = 0
        if not math.isfinite(metrics.get(study.metric, 0.0)):
            metrics[study.metric] = -math.inf if study.mode == "max" else math.inf
        reached = target is not None and trainer.trains and metrics.get("train/loss", math.inf) <= target
        last = reached or trainer.epoch == study.max_epochs
        if last:
            metrics.update(_final_metrics(trainer, study, target, reached))
            if tracking is not None and trial_id:
                if not trainer.trains:  # evaluation-only: the model is rebuilt from its inputs, not uploaded
                    tracking = dataclasses.replace(tracking, log_models=False)
                log_trial_artifacts(tracking, trial_id, trainer.model, spec, metrics, curve=trainer.curve.points())
        if trainer.trains and (last or trainer.epoch % study.checkpoint_every == 0):
            with tempfile.TemporaryDirectory() as d:
                trainer.save(d)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(metrics)
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
