"""Analysis outputs as artifacts of a launch's MLflow parent run: the comparison (``compare/``) and the
flatness sweep (``flatness_sweep/``). Computed by :mod:`flatlab.analysis`; nothing here raises, since every
trial is already recorded."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, List, Optional

from flatlab.analysis.compare.plot import plot_metric_vs_flatness
from flatlab.analysis.compare.statistics import CONFIDENCE
from flatlab.analysis.compare.table import compare_table
from flatlab.analysis.compare.text import cells, headers, to_csv, to_markdown
from flatlab.analysis.flatness_sweep import ARTIFACT_DIR, MEAN_PREFIX, STEM, plot_sweep, sweep_table, wants_sweep
from flatlab.tracking import runs
from flatlab.tracking.trials import trials_frame

logger = logging.getLogger(__name__)


def log_comparison(
    tracking_uri: str,
    parent_run_id: str,
    df,
    reference: Optional[str] = None,
    *,
    metric: Optional[str] = None,
    confidence: float = CONFIDENCE,
    artifact_path: str = "compare",
    study: str = "",
) -> List[str]:
    """Log the comparison of ``df`` to the launch's parent run: ``<artifact_path>/comparison.md``,
    ``comparison.csv``, ``comparison.json`` (the text table through ``log_table``, which MLflow's UI
    shows as a table) and, where flatness was measured, ``metric_vs_flatness.png``
    (``MlflowClient.log_text``/``log_artifact``).

    ``reference`` defaults to :func:`flatlab.analysis.selection.reference_arm` of the compared arms and
    the launch's ``reference_arm`` (``df.attrs``, as ``trials_frame`` reads it). Never raises (and never creates a store): a failure is logged as a warning and that artifact is
    skipped.

    Returns:
        The artifact paths logged.
    """
    logged: List[str] = []
    try:
        client = runs.client(runs.existing_store(tracking_uri))  # never creates a store
        comparison = compare_table(df, metric=metric, reference=reference, confidence=confidence, study=study)
    except Exception as exc:  # noqa: BLE001
        logger.warning("compare: no comparison table for run %s: %s", parent_run_id, exc)
        return logged
    for name, write in (("comparison.md", to_markdown), ("comparison.csv", to_csv)):
        try:
            client.log_text(parent_run_id, write(comparison), f"{artifact_path}/{name}")
            logged.append(f"{artifact_path}/{name}")
        except Exception as exc:  # noqa: BLE001
            logger.warning("compare: logging %s to run %s failed: %s", name, parent_run_id, exc)
    try:  # the text table as an MLflow table artifact: the UI shows every column (its csv preview cuts them)
        import pandas as pd

        client.log_table(
            parent_run_id,
            data=pd.DataFrame(cells(comparison), columns=headers(comparison)),
            artifact_file=f"{artifact_path}/comparison.json",
        )
        logged.append(f"{artifact_path}/comparison.json")
    except Exception as exc:  # noqa: BLE001
        logger.warning("compare: logging comparison.json to run %s failed: %s", parent_run_id, exc)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            png = plot_metric_vs_flatness(comparison, Path(tmp) / "metric_vs_flatness.png")
            client.log_artifact(parent_run_id, str(png), artifact_path)
            logged.append(f"{artifact_path}/{png.name}")
    except Exception as exc:  # noqa: BLE001
        logger.warning("compare: no metric-vs-flatness plot for run %s: %s", parent_run_id, exc)
    return logged


def log_flatness_sweep(tracking_uri: str, parent_run_id: str, study: Any, console: Optional[Any] = None) -> List[str]:
    """After a study: log the sweep's CSV and figure (module docstring) on ``parent_run_id``, if the study
    asked for a sweep (:func:`wants_sweep`); otherwise do nothing.

    Never raises: a failure is logged as a warning (the trials are already recorded).

    Returns:
        The artifact paths logged.
    """
    if not wants_sweep(getattr(study, "measures", None)):
        return []
    logged: List[str] = []
    try:
        table = sweep_table(trials_frame(tracking_uri, study.name))
        if table.empty:
            logger.warning("flatness sweep: no trial of %s logged %s*", study.name, MEAN_PREFIX)
            return logged
        client = runs.client(runs.existing_store(tracking_uri))
        client.log_text(parent_run_id, table.to_csv(index=False), f"{ARTIFACT_DIR}/{STEM}.csv")
        logged.append(f"{ARTIFACT_DIR}/{STEM}.csv")
        with tempfile.TemporaryDirectory() as tmp:
            png = plot_sweep(
                table, Path(tmp) / f"{STEM}.png", title=f"{study.name}: loss around the solution (TSAM Fig. 2)"
            )
            client.log_artifact(parent_run_id, str(png), ARTIFACT_DIR)
        logged.append(f"{ARTIFACT_DIR}/{STEM}.png")
    except Exception as exc:  # noqa: BLE001 - the study's results stand
        logger.warning("flatness sweep: not logged for run %s: %s", parent_run_id, exc)
    if console is not None and logged:
        console.print(f"flatness sweep (TSAM Fig. 2): {', '.join(logged)} on run {parent_run_id}")
    return logged


__all__ = ["log_flatness_sweep", "plot_sweep", "sweep_table", "wants_sweep"]
