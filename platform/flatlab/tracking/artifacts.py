"""Worker-side MLflow logging at a trial's last epoch: the final model (an MLflow logged model,
:mod:`flatlab.tracking.logged_model`), the full configuration (``trial.json``) and the smoothed
training-loss curve, as the metric history ``train_step/loss_smoothed``.

The curve is indexed by optimizer step, not by epoch like every other metric of a trial, so it has a
section of its own in MLflow's charts (``train_step/``). Its points' timestamps are interpolated
between the ends of the epochs that hold their steps (the trainer keeps no clock per step).

Workers do not inherit the driver's tracking URI (ray#36257): the driver passes it explicitly in
:class:`WorkerTracking`. The child run is created by the driver; the worker finds it by trial id.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from flatlab.lazy import lazy
from flatlab.tracking import runs, ui
from flatlab.tracking.logged_model import log_trial_model

mlflow_entities = lazy("mlflow.entities")

logger = logging.getLogger(__name__)

CURVE_METRIC = "train_step/loss_smoothed"  # step = optimizer step (every other metric: step = epoch)
LEGACY_CURVE_METRIC = "train/loss_smoothed"  # the same curve's other name, still read back (tracking.speedup)


@dataclass(frozen=True)
class WorkerTracking:
    """Where a worker logs: tracking URI, experiment and parent run; ``log_models``: upload final weights."""

    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    log_models: bool = True


def log_curve(
    client: Any, run_id: str, curve: Sequence[Tuple[int, float]], times: Sequence[Tuple[int, float]] = ()
) -> None:
    """Log ``curve`` (``(optimizer step, smoothed training loss)`` pairs) as the history of
    :data:`CURVE_METRIC` (step = optimizer step), with ``log_batch`` calls of at most 1000 metrics.

    Args:
        times: ``(optimizer step, seconds since 1970)`` anchors, e.g. the step count and the time at the
            start of the trial and at the end of each epoch: a point's timestamp is linearly
            interpolated between them (held constant outside them); none: every point gets the time now.
    """
    stamps = _timestamps([int(s) for s, _ in curve], times)
    runs.log_metrics(
        client, run_id, [mlflow_entities.Metric(CURVE_METRIC, float(v), t, int(s)) for (s, v), t in zip(curve, stamps)]
    )


def _timestamps(steps: Sequence[int], times: Sequence[Tuple[int, float]]) -> list:
    """Milliseconds since 1970 for each of ``steps``, interpolated in ``times`` (see :func:`log_curve`)."""
    if not times:
        return [int(time.time() * 1000)] * len(steps)
    anchors = sorted(times)
    at = np.interp(steps, [s for s, _ in anchors], [t for _, t in anchors])
    return [int(round(1000 * t)) for t in at]


def log_trial_artifacts(
    tracking: WorkerTracking,
    trial_id: str,
    model: torch.nn.Module,
    spec: Any,
    metrics: Dict[str, Any],
    curve: Optional[Sequence[Tuple[int, float]]] = None,
    curve_times: Sequence[Tuple[int, float]] = (),
    resolved: Optional[Mapping[str, Mapping[str, Any]]] = None,
) -> Optional[str]:
    """Log a trial's end to its run: ``trial.json`` (``spec``: the values the study set; ``resolved``:
    every value the trial ran with, defaults included, as :func:`flatlab.train.resolved.resolve_spec`
    gives it, or ``None`` where the caller could not resolve it; ``final_metrics``), ``model`` as the run's
    MLflow logged model (:func:`flatlab.tracking.logged_model.log_trial_model`, named like the run, at the step of
    ``metrics["epoch"]``; its id is added to ``metrics`` under :data:`flatlab.tracking.runs.MODEL_ID_KEY`,
    so that the driver, which logs the report, links the final metrics to it) and ``curve``
    (``trainer.curve.points()``: ``(optimizer step, smoothed training loss)``, the loss in the
    workload's units, e.g. nats per token) as the metric history :data:`CURVE_METRIC` (timestamps from
    ``curve_times``, see :func:`log_curve`), which :func:`flatlab.reports.speedup.log_steps_to_target`
    reads after the study.

    Returns the run id, or ``None`` if the run could not be found within 60 s (logged, not raised:
    artifacts must never fail a trial; neither does a failure to log the curve, which is logged).
    """
    run_id = runs.find_trial_run(
        tracking.tracking_uri, tracking.experiment_id, trial_id, tracking.parent_run_id, wait_s=60
    )
    if run_id is None:
        logger.warning("no MLflow run found for trial %s; artifacts not logged", trial_id)
        return None

    client = runs.client(tracking.tracking_uri)
    if curve:
        try:
            log_curve(client, run_id, curve, curve_times)
        except Exception:  # noqa: BLE001 - a tracking hiccup must not fail the trial
            logger.warning("could not log %s for trial %s", CURVE_METRIC, trial_id, exc_info=True)
    with tempfile.TemporaryDirectory() as tmp:
        info = {"spec": asdict(spec), "resolved": resolved, "final_metrics": metrics}
        with open(os.path.join(tmp, "trial.json"), "w") as f:
            json.dump(info, f, indent=2, default=str)
        client.log_artifact(run_id, os.path.join(tmp, "trial.json"))
    if tracking.log_models:
        tags = client.get_run(run_id).data.tags
        name = ui.model_name(
            tags.get(runs.TAG_ARM, "model"),
            tags.get(runs.TAG_STAGE, runs.STAGE_SEARCH),
            tags.get(runs.TAG_SEED, ""),
            trial_id,
        )
        metrics[runs.MODEL_ID_KEY] = log_trial_model(
            client, run_id, name, model, spec, step=int(metrics.get("epoch", 0))
        )
    return run_id
