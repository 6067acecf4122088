"""Worker-side MLflow logging at a trial's last epoch: the final model and the full configuration, as
artifacts, and the smoothed training-loss curve, as the metric history ``train/loss_smoothed``.

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
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from flatlab.tracking import runs

logger = logging.getLogger(__name__)

CURVE_METRIC = "train/loss_smoothed"


@dataclass(frozen=True)
class WorkerTracking:
    """Where a worker logs: tracking URI, experiment and parent run; ``log_models``: upload final weights."""

    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    log_models: bool = True


def log_curve(client: Any, run_id: str, curve: Sequence[Tuple[int, float]]) -> None:
    """Log ``curve`` (``(optimizer step, smoothed training loss)`` pairs) as the history of
    ``train/loss_smoothed`` (step = optimizer step), with ``log_batch`` calls of at most 1000 metrics."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    runs.log_metrics(client, run_id, [Metric(CURVE_METRIC, float(v), now, int(s)) for s, v in curve])


def log_trial_artifacts(
    tracking: WorkerTracking,
    trial_id: str,
    model: torch.nn.Module,
    spec: Any,
    metrics: Dict[str, Any],
    curve: Optional[Sequence[Tuple[int, float]]] = None,
) -> Optional[str]:
    """Upload ``model/model.safetensors`` and ``trial.json`` (``spec``: the values the study set;
    ``resolved``: every value the trial ran with, defaults included, as
    :func:`flatlab.train.resolved.resolve_spec` gives it; ``final_metrics``) to the trial's run,
    and log ``curve`` (``trainer.curve.points()``: ``(optimizer step, smoothed training loss)``, the
    loss in the workload's units, e.g. nats per token) as the metric history ``train/loss_smoothed``,
    which :func:`flatlab.tracking.speedup.log_steps_to_target` reads after the study.

    Returns the run id, or ``None`` if the run could not be found within 60 s (logged, not raised:
    artifacts must never fail a trial; neither does a failure to log the curve, which is logged).
    """
    run_id = runs.find_trial_run(tracking.tracking_uri, tracking.experiment_id, trial_id, tracking.parent_run_id, wait_s=60)
    if run_id is None:
        logger.warning("no MLflow run found for trial %s; artifacts not logged", trial_id)
        return None
    from safetensors.torch import save_file

    client = runs.client(tracking.tracking_uri)
    if curve:
        try:
            log_curve(client, run_id, curve)
        except Exception:  # noqa: BLE001 - a tracking hiccup must not fail the trial
            logger.warning("could not log %s for trial %s", CURVE_METRIC, trial_id, exc_info=True)
    with tempfile.TemporaryDirectory() as tmp:
        info = {"spec": asdict(spec), "resolved": _resolved(spec, trial_id), "final_metrics": metrics}
        with open(os.path.join(tmp, "trial.json"), "w") as f:
            json.dump(info, f, indent=2, default=str)
        client.log_artifact(run_id, os.path.join(tmp, "trial.json"))
        if tracking.log_models:
            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            os.makedirs(os.path.join(tmp, "model"))
            save_file(state, os.path.join(tmp, "model", "model.safetensors"))
            client.log_artifacts(run_id, os.path.join(tmp, "model"), artifact_path="model")
    return run_id


def _resolved(spec: Any, trial_id: str) -> Optional[Dict[str, Dict[str, Any]]]:
    """``spec``'s resolved configuration, or ``None`` (logged) where it cannot be resolved."""
    from flatlab.train.resolved import resolve_spec

    try:
        return resolve_spec(spec)
    except Exception:  # noqa: BLE001 - artifacts must never fail a trial
        logger.warning("could not resolve the configuration of trial %s", trial_id, exc_info=True)
        return None
