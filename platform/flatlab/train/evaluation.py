"""Evaluation-only trials: a workload that trains nothing (``trains = False``, e.g. ``clip_interpolate``).

Such a trial builds the workload's model (seeded as a training trial is), calls the workload's
:meth:`~flatlab.workloads.base.Workload.evaluate_only` once and evaluates the test split, if there is
one: no optimizer, no schedule, no checkpoint. The study's trial around it is
:func:`flatlab.study.trial_loop.evaluation_trial`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.train.precision import Precision
from flatlab.train.resolved import resolve_trainer
from flatlab.train.seeding import seed_everything
from flatlab.train.trainer import TrialSpec
from flatlab.workloads.base import Data, Workload
from flatlab.workloads.registry import build_workload


@dataclass
class Evaluation:
    """What an evaluation-only trial measured (``metrics``, with ``epoch`` = 1 and ``time/epoch_s``, the
    seconds of :meth:`~flatlab.workloads.base.Workload.evaluate_only`) and the ``model`` it measured."""

    metrics: Dict[str, float]
    model: nn.Module


def evaluate_trial(spec: TrialSpec, data: Data, workload: Optional[Workload] = None) -> Evaluation:
    """Run the evaluation-only trial ``spec`` on ``data`` (``workload``: built from ``spec`` if not given).

    The test split, when ``data`` has one, adds ``test/<key>`` metrics, evaluated under the trial's
    ``precision`` as a training trial's final model is.

    Raises:
        ConfigError: the workload trains (use :class:`~flatlab.train.trainer.Trainer`) or has no
            ``evaluate_only``; a trainer parameter outside its range; whatever ``evaluate_only`` raises.
    """
    workload = workload or build_workload(spec.workload, **dict(spec.workload_params))
    if workload.trains:
        raise ConfigError(
            f"workload {spec.workload!r} trains; an evaluation-only trial is for workloads with trains = False"
        )
    if type(workload).evaluate_only is Workload.evaluate_only:
        raise ConfigError(f"workload {spec.workload!r} declares trains=False but has no evaluate_only(model, data)")
    hp = resolve_trainer(workload.train_defaults, spec.trainer_params)
    device = torch.device(spec.device)
    seed_everything(spec.seed)
    model = workload.build_model().to(device)
    t0 = time.perf_counter()
    metrics: Dict[str, float] = dict(workload.evaluate_only(model, data))
    metrics["epoch"] = 1
    metrics["time/epoch_s"] = time.perf_counter() - t0
    if data.test is not None:
        with Precision(hp["precision"], device).autocast():
            metrics.update({f"test/{k}": v for k, v in workload.evaluate(model, data.test).items()})
    return Evaluation(metrics, model)
