"""Steps to a target training loss and the speed-up over a reference arm, read from and logged to MLflow
(computed by :mod:`flatlab.analysis.speedup`).

Each finished trial has its smoothed training-loss curve in MLflow (metric history
``train_step/loss_smoothed``, step = optimizer step, logged by the worker at the trial's last epoch;
``train/loss_smoothed`` in runs logged before it had a section of its own). Logged here, on each
completed child run:

* ``train/steps_to_target`` and the tag ``flatlab.target_reached`` (``true``/``false``; when false, no
  steps_to_target is logged);
* ``train/speedup`` (with a reference arm): the reference trial's total optimizer steps /
  ``train/steps_to_target`` (> 1: faster than the reference);

and on the parent run, ``reference/train_loss_smoothed`` (the target, step = seed).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from flatlab.analysis import selection
from flatlab.analysis.curve_points import Point
from flatlab.analysis.sample import is_completed
from flatlab.analysis.speedup import CurveTrial, goals, seed_targets, steps_and_speedup
from flatlab.lazy import lazy
from flatlab.tracking import runs
from flatlab.tracking.artifacts import CURVE_METRIC, LEGACY_CURVE_METRIC

mlflow_entities = lazy("mlflow.entities")

logger = logging.getLogger(__name__)

STEPS_METRIC = "train/steps_to_target"
SPEEDUP_METRIC = "train/speedup"
TARGET_METRIC = "reference/train_loss_smoothed"
TAG_REACHED = "flatlab.target_reached"


def log_steps_to_target(tracking_uri: str, experiment_id: str, parent_run_id: str, study: Any) -> Dict[str, Any]:
    """Compute and log steps-to-target (and speed-up) for the completed child runs of ``parent_run_id``.

    Args:
        tracking_uri, experiment_id, parent_run_id: the study launch (``StudyOutcome`` fields).
        study: gives ``reference_arm`` or ``target_loss`` (neither: nothing is done) and ``metric``/
            ``mode``, which pick the reference trial of a seed among the reference arm's completed
            trials (see the module docstring).

    Returns:
        ``{"targets": {seed: {"target": loss, "reference_run": run id or None, "reference_steps": int
        or None}}, "runs": {run_id: {"arm", "seed", "steps_to_target": int or None, "speedup": float
        or None}}, "skipped": {run_id: reason}, "errors": [message]}``. A seed without a usable
        reference trial has no target; its trials are skipped. (A seed run in both stages has a target
        per stage; ``targets`` and the parent run's metric show the final stage's.)

    Never raises for MLflow errors: a failure reading or writing one run is logged as a warning,
    listed under ``errors``, and the other runs are still done.
    """
    summary: Dict[str, Any] = {"targets": {}, "runs": {}, "skipped": {}, "errors": []}
    if study.reference_arm is None and study.target_loss is None:
        return summary

    def fail(what: str, exc: Exception) -> None:
        logger.warning("steps-to-target: %s failed: %s", what, exc)
        summary["errors"].append(f"{what}: {exc}")

    try:
        client = runs.client(tracking_uri)
        children = _finished_children(client, experiment_id, parent_run_id)
    except Exception as exc:  # noqa: BLE001
        fail(f"listing the child runs of {parent_run_id}", exc)
        return summary

    trials = _curve_trials(client, children, study.metric, summary["skipped"], fail)
    by_stage = goals(trials, study.reference_arm, study.target_loss, study.mode)
    targets = summary["targets"] = seed_targets(by_stage)
    for t in trials:
        goal = by_stage.get((t.stage, t.seed))
        if goal is None:
            summary["skipped"][t.run_id] = f"no completed {study.reference_arm!r} {t.stage} trial with seed {t.seed}"
            continue
        steps, speedup = steps_and_speedup(t, goal)
        try:
            _log_trial(client, t.run_id, steps, speedup)
        except Exception as exc:  # noqa: BLE001
            fail(f"logging steps-to-target of run {t.run_id}", exc)
            continue
        summary["runs"][t.run_id] = {"arm": t.arm, "seed": t.seed, "steps_to_target": steps, "speedup": speedup}

    if targets:
        try:
            _log_targets(client, parent_run_id, {seed: g["target"] for seed, g in targets.items()})
        except Exception as exc:  # noqa: BLE001
            fail(f"logging {TARGET_METRIC} to the parent run {parent_run_id}", exc)
    return summary


def _curve_trials(
    client: Any, children: List[Any], metric: str, skipped: Dict[str, str], fail: Callable[[str, Exception], None]
) -> List[CurveTrial]:
    """The trials of ``children`` with their smoothed training-loss curves, each a candidate reference by
    its value of ``metric``; runs without an integer seed tag or a curve go to ``skipped`` (run id ->
    reason), and a run whose curve cannot be read is reported to ``fail`` and left out."""
    trials: List[CurveTrial] = []
    for run in children:
        tags = run.data.tags
        try:
            seed = int(tags.get(runs.TAG_SEED, ""))
        except ValueError:
            skipped[run.info.run_id] = f"no integer {runs.TAG_SEED} tag"
            continue
        value = run.data.metrics.get(metric)
        done = value is not None and math.isfinite(value)
        arm = tags.get(runs.TAG_ARM, "")
        candidate = selection.Trial(
            arm,
            selection.config_key(runs.config_params(run.data.params)),
            seed,
            float(value) if done else None,
            ref=run.info.run_id,
        )
        trial = CurveTrial(run.info.run_id, arm, seed, tags.get(runs.TAG_STAGE, runs.STAGE_SEARCH), candidate)
        try:
            trial.curve = _curve(client, trial.run_id)
        except Exception as exc:  # noqa: BLE001
            fail(f"reading {CURVE_METRIC} of run {trial.run_id}", exc)
            continue
        if not trial.curve:
            skipped[trial.run_id] = f"no {CURVE_METRIC} history"
            continue
        trials.append(trial)
    return trials


def _finished_children(client: Any, experiment_id: str, parent_run_id: str) -> List[Any]:
    """Every completed child run of ``parent_run_id`` (:func:`flatlab.analysis.sample.is_completed`;
    all result pages)."""
    out: List[Any] = []
    token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{runs.PARENT}` = '{parent_run_id}'",
            max_results=1000,
            page_token=token,
        )
        out.extend(r for r in page if is_completed(r.data.tags.get(runs.TAG_OUTCOME), r.info.status))
        token = getattr(page, "token", None)
        if not token:
            return out


def _curve(client: Any, run_id: str) -> List[Point]:
    """The run's :data:`CURVE_METRIC` history by step (the latest value per step, e.g. after a re-log;
    :data:`LEGACY_CURVE_METRIC` for runs logged before the rename)."""
    latest: Dict[int, Tuple[int, float]] = {}  # step -> (timestamp, value)
    for m in client.get_metric_history(run_id, CURVE_METRIC) or client.get_metric_history(run_id, LEGACY_CURVE_METRIC):
        if m.step not in latest or m.timestamp >= latest[m.step][0]:
            latest[m.step] = (m.timestamp, m.value)
    return [(step, latest[step][1]) for step in sorted(latest)]


def _log_trial(client: Any, run_id: str, steps: Optional[int], speedup: Optional[float]) -> None:
    client.set_tag(run_id, TAG_REACHED, "true" if steps is not None else "false")
    if steps is None:
        return
    now = int(time.time() * 1000)
    metrics = [mlflow_entities.Metric(STEPS_METRIC, float(steps), now, 0)]
    if speedup is not None:
        metrics.append(mlflow_entities.Metric(SPEEDUP_METRIC, float(speedup), now, 0))
    client.log_batch(run_id, metrics=metrics)


def _log_targets(client: Any, parent_run_id: str, targets: Dict[int, float]) -> None:
    now = int(time.time() * 1000)
    client.log_batch(
        parent_run_id,
        metrics=[
            mlflow_entities.Metric(TARGET_METRIC, float(v), now, int(seed)) for seed, v in sorted(targets.items())
        ],
    )
