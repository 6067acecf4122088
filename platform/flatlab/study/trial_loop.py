"""The epochs of one trial, without Ray: the loop that the single-process Tune trial
(:func:`flatlab.study.trainable.run_trial`) and every rank of a multi-worker (DDP) trial
(:mod:`flatlab.study.ddp_trial`) run on a :class:`~flatlab.train.trainer.Trainer`.

Every epoch reports the workload's metrics and the trial's compute so far (``compute/*``,
:mod:`flatlab.train.compute`) through the caller's ``report`` (Tune's or Ray Train's); the trial ends when its
trainer is :attr:`~flatlab.train.trainer.Trainer.finished` (its epochs, or its budget in passes or seconds:
:mod:`flatlab.study.budget`). The last report (at that end, or at the first epoch whose mean training loss
reaches the trainer's ``stop_at_train_loss``) adds the test metrics (every report holds them with the
trainer's ``test_every_epoch``), the study's flatness measures on the final model and ``completed = 1``. With
the trainer's ``measure_at_train_loss`` the first epoch whose mean training loss reaches it runs the measures
on that epoch's model (:func:`measure_trial`, the one measuring function), keeps them in the trainer's state
(``Trainer.target_metrics``) and trains on; the last report adds them as ``flat_at_target/*``
(:func:`flatlab.tracking.runs.at_target`) beside the final model's ``flat/*``. With the study's
``measure_every`` = k every k-th epoch's report adds the measures of that epoch's model as ``flat_curve/*``
(:func:`flatlab.tracking.runs.over_training`; MLflow step = epoch). A checkpoint (model, optimizer,
scheduler, RNG states, the target's state) goes with the report of every epoch :func:`checkpoint_due` picks
(the study's ``checkpoint_every``: every n-th epoch, or by default the first epoch ending
:data:`CHECKPOINT_INTERVAL_S` seconds after the previous checkpoint), with the epoch measured at the target (a
restarted trial never measures twice) and with the last, so a restarted trial resumes where it stopped. A
diverged epoch reports the worst metric and ends the trial. An evaluation-only workload (``trains = False``)
has no epochs: its trial is :func:`evaluation_trial`, one evaluation and one report.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from flatlab.analysis.selection import COMPLETED_KEY, DIVERGED_KEY
from flatlab.errors import ConfigError
from flatlab.sharpness.measures import compute_measures, measure_subset, resolve_measures
from flatlab.study.spec import Study
from flatlab.study.trial_spec import trial_spec
from flatlab.tracking.artifacts import WorkerTracking, log_trial_artifacts
from flatlab.tracking.checkpoints import local_params
from flatlab.tracking.runs import EPOCH_END_KEY, SUMMARY_KEY, at_target, on_split, over_training
from flatlab.train.checkpoint import StateSnapshot
from flatlab.train.compute import TOTAL_PREFIX
from flatlab.train.evaluation import evaluate_trial
from flatlab.train.resolved import resolve_spec
from flatlab.train.trainer import Diverged, Trainer
from flatlab.workloads.base import Data, Split
from flatlab.workloads.registry import build_workload, get_workload

logger = logging.getLogger(__name__)

#: With ``Study.checkpoint_every=None`` (the default), a trial checkpoints at the first epoch that ends at
#: least this many seconds after its previous checkpoint (or its start), and at its last epoch: a
#: restarted trial loses at most this much work plus one epoch, and short epochs do not each pay for a
#: checkpoint (a copy of the state, its write, Tune's copy into its storage and round trips to the driver).
CHECKPOINT_INTERVAL_S = 10.0


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


def trial_loop(
    trainer: Trainer,
    study: Study,
    report: Report,
    *,
    tracking: Optional[WorkerTracking] = None,
    trial_id: Optional[str] = None,
    main: bool = True,
    extra: Optional[Mapping[str, Any]] = None,
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
        extra: added to every report (DDP: ``world_size``; the trial's placement,
            :data:`flatlab.tracking.placement_tags.PLACEMENT_KEY`).
    """
    stops = trainer.hp.get("stop_at_train_loss") is not None  # the trial ends at its training-loss target
    measures_at_target = trainer.hp.get("measure_at_train_loss") is not None and bool(study.measures)
    extra = dict(extra or {})
    saved_at = time.monotonic()
    curve_times = [(trainer.curve.step, time.time())]  # (optimizer step, time): the curve's timestamps
    while not trainer.finished:
        try:
            metrics = trainer.run_epoch()
        except Diverged as exc:
            report(
                {
                    "epoch": trainer.epoch + 1,
                    study.metric: _worst(study),
                    DIVERGED_KEY: 1,
                    "diverged_step": exc.step,
                    EPOCH_END_KEY: time.time(),
                    **extra,
                },
                None,
            )
            return
        metrics.update(extra)
        metrics[EPOCH_END_KEY] = time.time()  # the epoch's metrics are timed when it ended, not when sent
        curve_times.append((trainer.curve.step, metrics[EPOCH_END_KEY]))
        _not_diverged(metrics, study)
        last = (stops and trainer.reached_target) or trainer.finished
        measured, point = _measure_epoch(trainer, study, metrics, measures_at_target and main, main)
        if last and not main:  # DDP: Tune takes rank 0's report; the others only keep the report count
            metrics[COMPLETED_KEY] = 1
        elif last:
            final = _final_metrics(trainer, study, measured if measured is not None else point)
            metrics.update(final)
            # what only this report holds, about the final model: summary values, at step 0 in MLflow
            metrics[SUMMARY_KEY] = ",".join(sorted(k for k in final if k != COMPLETED_KEY))
            metrics.update(trainer.compute.metrics())  # this epoch's compute/*, with the test and measures' time
            if tracking is not None and trial_id:
                log_trial_artifacts(
                    tracking,
                    trial_id,
                    trainer.model,
                    trainer.spec,
                    metrics,
                    curve=trainer.curve.points(),
                    curve_times=curve_times,
                    resolved=_resolved(trainer.spec, trial_id),
                )
        if measured is not None or checkpoint_due(
            study.checkpoint_every, trainer.epoch, last, time.monotonic() - saved_at
        ):
            report(metrics, trainer.snapshot() if main else None)  # written and sent by the report
            saved_at = time.monotonic()
        else:
            report(metrics, None)
        if last:
            return


def _measure_epoch(
    trainer: Trainer, study: Study, metrics: Dict[str, Any], at_target_due: bool, main: bool
) -> Tuple[Optional[Dict[str, float]], Optional[Dict[str, float]]]:
    """This epoch's measurements: at the training-loss target (the first epoch that reaches it; kept in the
    trainer's state, so never measured twice) and the ``measure_every`` point of the curve, each added to
    ``metrics`` with the compute spent so far. Returns ``(measured at the target, curve point)``, ``None``
    where not measured."""
    measured: Optional[Dict[str, float]] = None
    if at_target_due and trainer.reached_target:
        measured = measure_trial(trainer, study)
        trainer.target_metrics = at_target(measured)  # in the state from now on: never measured again
    point = _curve_point(trainer, study, measured) if main else None  # measure_every: a point of the curve
    if point is not None:
        metrics.update(over_training(point))
    if measured is not None or point is not None:
        metrics.update(trainer.compute.metrics())  # with the measures' seconds
    return measured, point


def _curve_point(trainer: Trainer, study: Study, measured: Optional[Dict[str, float]]) -> Optional[Dict[str, float]]:
    """The measures of this epoch's model when ``Study.measure_every`` makes it a point of the curve over
    training (``measured``: already taken on it, at the target), else ``None``."""
    every = study.measure_every
    if not study.measures or every is None or trainer.epoch % every != 0:
        return None
    return measured if measured is not None else measure_trial(trainer, study)


def _worst(study: Study) -> float:
    """The worst value of the study's metric (what a diverged or non-finite epoch reports)."""
    return -math.inf if study.mode == "max" else math.inf


def _not_diverged(metrics: Dict[str, Any], study: Study) -> None:
    """Mark ``metrics`` as not diverged and replace a non-finite value of the study metric by :func:`_worst`."""
    metrics[DIVERGED_KEY] = 0
    if not math.isfinite(metrics.get(study.metric, 0.0)):
        metrics[study.metric] = _worst(study)


def evaluation_trial(
    config: Mapping[str, Any],
    study: Study,
    data: Data,
    report: Report,
    *,
    device: str = "cpu",
    tracking: Optional[WorkerTracking] = None,
    trial_id: Optional[str] = None,
) -> None:
    """One trial of an evaluation-only workload (``trains = False``): its checkpoint parameters made local
    (:func:`flatlab.tracking.checkpoints.local_params`: ``run:<run_id>`` values fetched from MLflow), one
    :func:`~flatlab.train.evaluation.evaluate_trial`, one ``report`` of its metrics (as epoch 1, with
    ``completed = 1``; a non-finite study metric reports the worst value), ``trial.json`` uploaded to the
    trial's run without the model (it is rebuilt from its inputs).

    Raises:
        ConfigError: from :func:`~flatlab.tracking.checkpoints.local_params` or the workload (the trial
            fails).
    """
    spec = trial_spec(study, config, device=device)
    names = get_workload(spec.workload).checkpoint_params
    params = local_params(spec.workload_params, names, tracking.tracking_uri if tracking is not None else "")
    done = evaluate_trial(spec, data, build_workload(spec.workload, **params))
    metrics: Dict[str, Any] = dict(done.metrics)
    _not_diverged(metrics, study)
    metrics[COMPLETED_KEY] = 1
    if tracking is not None and trial_id:
        untracked = dataclasses.replace(tracking, log_models=False)
        log_trial_artifacts(untracked, trial_id, done.model, spec, metrics, resolved=_resolved(spec, trial_id))
    report(metrics, None)


def _final_metrics(trainer: Trainer, study: Study, measured: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """What a trial adds to its last report: the test metrics, the study's flatness measures on the final
    model (``flat/<measure>``, ``time/measures_s``; ``measured``: already computed on it, at the target of
    its last epoch), the measures at the training-loss target (``flat_at_target/*``, from the trainer's
    state), the target's outcome (``train/target_reached`` 1/0 and ``train/epochs_to_target``), the
    trial's compute totals (``compute_total/*``, :mod:`flatlab.train.compute`) and the completion flag."""
    # with test_every_epoch the last epoch's report already holds the test metrics of this model
    out: Dict[str, float] = {} if trainer.hp["test_every_epoch"] else dict(trainer.evaluate_test())
    if study.measures:
        out.update(measured if measured is not None else measure_trial(trainer, study))
    out.update(trainer.target_metrics)
    if trainer.loss_target is not None:
        out["train/target_reached"] = 1.0 if trainer.target_epoch is not None else 0.0
        if trainer.target_epoch is not None:
            out["train/epochs_to_target"] = float(trainer.target_epoch)
    out.update(trainer.compute.metrics(TOTAL_PREFIX))  # the totals, as summary values
    out[COMPLETED_KEY] = 1
    return out


def measure_trial(trainer: Trainer, study: Study) -> Dict[str, float]:
    """The study's flatness measures on ``trainer``'s current model, over the study's fixed evaluation
    subset (``measure_examples`` rows of the ``measure_split`` split chosen with ``measure_seed``: the
    same examples, noise and probes for every trial), with the unsmoothed training loss: ``flat/*`` and
    ``time/measures_s`` (:func:`flatlab.sharpness.measures.compute_measures`), then the same on each of
    ``measure_extra_splits`` (``flat_<split>/*``, :func:`flatlab.tracking.runs.on_split`). The trial loop
    calls it on the final model, with ``measure_at_train_loss`` on the model at the target, and with
    ``measure_every`` on the model of every k-th epoch.

    Raises:
        ConfigError: a split the workload's data does not have (e.g. ``test``)."""
    resolved = resolve_measures(study.measures, f"study {study.name!r}: measures")

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return trainer.workload.loss(outputs, targets, 0.0)

    def on(name: str) -> Dict[str, float]:
        subset = measure_subset(
            _split(trainer.data, name, study.name), study.measure_examples, study.measure_seed, device=trainer.device
        )
        return compute_measures(trainer.model, subset, loss_fn, resolved, seed=study.measure_seed)

    t0 = time.perf_counter()
    out = on(study.measure_split)
    for name in study.measure_extra_splits:
        out.update(on_split(on(name), name))
    trainer.compute.measure_s += time.perf_counter() - t0  # compute/measure_s
    return out


def _split(data: Data, name: str, study: str) -> Split:
    """The split ``name`` (``train``, ``test`` or an evaluation split) of a trial's data.

    Raises:
        ConfigError: the workload has no such split (e.g. no test split), naming the study's fields.
    """
    if name == "train":
        return data.train
    found = data.test if name == "test" else data.eval_splits().get(name)
    if found is None:
        raise ConfigError(
            f"study {study!r}: measure_split or measure_extra_splits names {name!r}, which this workload's data "
            f"does not have (it has train, {', '.join(data.eval_splits())}{', test' if data.test is not None else ''})"
        )
    return found


def _resolved(spec: Any, trial_id: str) -> Optional[Dict[str, Dict[str, Any]]]:
    """``spec``'s resolved configuration for ``trial.json``, or ``None`` (logged) where it cannot be resolved."""
    try:
        return resolve_spec(spec)
    except Exception:  # noqa: BLE001 - artifacts must never fail a trial
        logger.warning("could not resolve the configuration of trial %s", trial_id, exc_info=True)
        return None
