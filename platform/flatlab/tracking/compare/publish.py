"""A launch's comparison as artifacts of its MLflow parent run (``compare/``)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import List, Optional

from flatlab.tracking.compare.plot import plot_metric_vs_flatness
from flatlab.tracking.compare.statistics import CONFIDENCE
from flatlab.tracking.compare.table import compare_table
from flatlab.tracking.compare.text import cells, headers, to_csv, to_markdown

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

    ``reference`` defaults to :func:`flatlab.tracking.selection.reference_arm` of the compared arms and
    the launch's ``reference_arm`` (``df.attrs``, as ``trials_frame`` reads it). Never raises (and never creates a store): a failure is logged as a warning and that artifact is
    skipped.

    Returns:
        The artifact paths logged.
    """
    from flatlab.tracking import runs

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
