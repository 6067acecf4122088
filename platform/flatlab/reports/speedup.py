"""Steps to a target training loss and the speed-up over a reference arm, computed by
:mod:`flatlab.analysis.speedup` over a launch's sample and logged to MLflow.

The completed trials come from the launch's :class:`~flatlab.analysis.sample.Sample` (run id, arm, seed,
stage, the study metric and the ``param.*`` columns); what the sample cannot hold is read per trial: its
smoothed training-loss curve, the metric history ``train_step/loss_smoothed`` (step = optimizer step,
logged by the worker at the trial's last epoch; ``train/loss_smoothed`` in runs logged before it had a
section of its own). Logged here, on each completed child run:

* ``train/steps_to_target`` and the tag ``flatlab.target_reached`` (``true``/``false``; when false, no
  steps_to_target is logged);
* ``train/speedup`` (with a reference arm): the reference trial's total optimizer steps /
  ``train/steps_to_target`` (> 1: faster than the reference);

and on the parent run, ``reference/train_loss_smoothed`` (the target, step = seed). The sample handed
back holds the two metrics in its columns of the same names, as a sample read after the logging would.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from flatlab.analysis import selection
from flatlab.analysis.compare.statistics import finite
from flatlab.analysis.curve_points import Point
from flatlab.analysis.sample import Sample
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

Summary = Dict[str, Any]
"""What :func:`log_steps_to_target` did (see its ``Returns``)."""


def log_steps_to_target(tracking_uri: str, parent_run_id: str, study: Any, sample: Sample) -> Tuple[Sample, Summary]:
    """Compute and log steps-to-target (and speed-up) for the completed trials of ``sample``.

    Args:
        tracking_uri, parent_run_id: the launch's MLflow store and parent run (``Launched`` fields).
        study: gives ``reference_arm`` or ``target_loss`` (neither: nothing is done) and ``metric``/
            ``mode``, which pick the reference trial of a seed among the reference arm's completed
            trials (see the module docstring).
        sample: the launch's trials (:func:`flatlab.tracking.trials.read_sample` with ``launch``); its
            completed rows are the trials, with their ``run_id``, ``arm``, ``seed``, ``stage``, the
            column of ``study.metric`` and the ``param.*`` columns.

    Returns:
        ``(sample, summary)``: ``sample`` with the logged ``train/steps_to_target`` and ``train/speedup``
        set in its columns of those names on the trials they were logged for (every other value as it
        was; ``sample`` itself when nothing was logged), and ``{"targets": {seed: {"target": loss,
        "reference_run": run id or None, "reference_steps": int or None}}, "runs": {run_id: {"arm",
        "seed", "steps_to_target": int or None, "speedup": float or None}}, "skipped": {run_id: reason},
        "errors": [message]}``. A seed without a usable reference trial has no target; its trials are
        skipped. (A seed run in both stages has a target per stage; ``targets`` and the parent run's
        metric show the final stage's.)

    Never raises for MLflow errors: a failure reading or writing one run is logged as a warning,
    listed under ``errors``, and the other runs are still done.
    """
    summary: Summary = {"targets": {}, "runs": {}, "skipped": {}, "errors": []}
    if study.reference_arm is None and study.target_loss is None:
        return sample, summary

    def fail(what: str, exc: Exception) -> None:
        logger.warning("steps-to-target: %s failed: %s", what, exc)
        summary["errors"].append(f"{what}: {exc}")

    try:
        client = runs.client(tracking_uri)
    except Exception as exc:  # noqa: BLE001
        fail(f"opening the tracking store of run {parent_run_id}", exc)
        return sample, summary

    trials = _curve_trials(client, sample, study.metric, summary["skipped"], fail)
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
    return with_logged(sample, summary["runs"]), summary


def with_logged(sample: Sample, logged: Dict[str, Dict[str, Any]]) -> Sample:
    """``sample`` with the metrics :func:`log_steps_to_target` logged (``logged``: its summary's ``runs``)
    in the columns :data:`STEPS_METRIC` and :data:`SPEEDUP_METRIC`: a trial's value where one was logged
    (a target never reached logs none), every other value as it was. ``sample`` itself when nothing was
    logged."""
    values = {
        STEPS_METRIC: {r: float(v["steps_to_target"]) for r, v in logged.items() if v["steps_to_target"] is not None},
        SPEEDUP_METRIC: {r: float(v["speedup"]) for r, v in logged.items() if v["speedup"] is not None},
    }
    if not any(values.values()):
        return sample
    df = sample.trials.copy()
    for column, by_run in values.items():
        if not by_run:
            continue
        new = df["run_id"].map(by_run)
        df[column] = new.where(new.notna(), df[column]) if column in df.columns else new.astype(float)
    df.attrs = dict(sample.trials.attrs)
    return Sample(sample.info, df)


def _curve_trials(
    client: Any, sample: Sample, metric: str, skipped: Dict[str, str], fail: Callable[[str, Exception], None]
) -> List[CurveTrial]:
    """The completed trials of ``sample`` with their smoothed training-loss curves, each a candidate
    reference by its value of ``metric``; trials without an integer seed or a curve go to ``skipped``
    (run id -> reason), and a trial whose curve cannot be read is reported to ``fail`` and left out."""
    if sample.empty or "run_id" not in sample.trials.columns:
        return []
    rows = sample.trials[sample.trials["completed"].astype(bool)]
    params = [c for c in rows.columns if c.startswith("param.")]
    trials: List[CurveTrial] = []
    for _, row in rows.iterrows():
        run_id = str(row["run_id"])
        seed = _seed(row.get("seed"))
        if seed is None:
            skipped[run_id] = f"no integer {runs.TAG_SEED} tag"
            continue
        value = float(row[metric]) if finite(row.get(metric)) else None
        arm = str(row["arm"])
        candidate = selection.Trial(arm, selection.row_config(row, params), seed, value, ref=run_id)
        trial = CurveTrial(run_id, arm, seed, str(row["stage"]), candidate)
        try:
            trial.curve = _curve(client, run_id)
        except Exception as exc:  # noqa: BLE001
            fail(f"reading {CURVE_METRIC} of run {run_id}", exc)
            continue
        if not trial.curve:
            skipped[run_id] = f"no {CURVE_METRIC} history"
            continue
        trials.append(trial)
    return trials


def _seed(value: Any) -> Optional[int]:
    """A trial's seed as the sample holds it (an integer, or the tag's text where the column is text);
    ``None`` where it is missing or not an integer."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) and number.is_integer() else None


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
    metrics = [mlflow_entities.Metric(TARGET_METRIC, float(v), now, int(seed)) for seed, v in sorted(targets.items())]
    client.log_batch(parent_run_id, metrics=metrics)
