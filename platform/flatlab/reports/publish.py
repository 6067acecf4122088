"""Analysis outputs as artifacts of a launch's MLflow parent run: the comparison (``compare/``, over the
tunings where there are several), whether flatness predicts generalisation (``correlation/``), a random
pool's tuning curves (``tuning_curves/``), the curves against passes and seconds (``cost_curves/``) and the
flatness sweep (``flatness_sweep/``). Each is computed by :mod:`flatlab.analysis` from the launch's trials
as it is handed them (a :class:`~flatlab.analysis.sample.Sample`); nothing here raises, since every trial
is already recorded."""

from __future__ import annotations

import functools
import logging
import tempfile
from pathlib import Path
from typing import Any, List, Optional

from flatlab.analysis import generalisation, pool, tunings_text
from flatlab.analysis.compare.plot import plot_metric_vs_flatness
from flatlab.analysis.compare.statistics import CONFIDENCE
from flatlab.analysis.compare.table import compare_table
from flatlab.analysis.compare.text import cells, headers, to_csv, to_markdown
from flatlab.analysis.flatness_sweep import ARTIFACT_DIR, plot_sweep, stem, sweep_table, wants_sweep
from flatlab.analysis.histories import UNITS
from flatlab.analysis.sample import Sample
from flatlab.analysis.tunings import compare_tunings
from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.ranges import NO_RANGES, SWEEPS, Ranges
from flatlab.tracking import runs
from flatlab.tracking.histories import sample_histories, write_cost_curves

pd = lazy("pandas")

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
    ranges: Ranges = NO_RANGES,
) -> List[str]:
    """Log the comparison of ``df`` to the launch's parent run: ``<artifact_path>/comparison.md``,
    ``comparison.csv``, ``comparison.json`` (the text table through ``log_table``, which MLflow's UI
    shows as a table) and, where flatness was measured, ``metric_vs_flatness.png``
    (``MlflowClient.log_text``/``log_artifact``).

    ``reference`` defaults to :func:`flatlab.analysis.selection.reference_arm` of the compared arms and
    the launch's ``reference_arm`` (``df.attrs``, as ``trials_frame`` reads it); ``ranges``: the values the
    quantities can take (:func:`flatlab.analysis.compare.table.compare_table`). Never raises (and never creates a
    store): a failure is logged as a warning and that artifact is
    skipped.

    Returns:
        The artifact paths logged.
    """
    logged: List[str] = []
    try:
        client = runs.client(runs.existing_store(tracking_uri))  # never creates a store
        texts, head, body, table = _comparison(df, metric, reference, confidence, study, ranges)
    except Exception as exc:  # noqa: BLE001
        logger.warning("compare: no comparison table for run %s: %s", parent_run_id, exc)
        return logged
    for name, text in texts.items():
        try:
            client.log_text(parent_run_id, text, f"{artifact_path}/{name}")
            logged.append(f"{artifact_path}/{name}")
        except Exception as exc:  # noqa: BLE001
            logger.warning("compare: logging %s to run %s failed: %s", name, parent_run_id, exc)
    try:  # the text table as an MLflow table artifact: the UI shows every column (its csv preview cuts them)
        client.log_table(
            parent_run_id, data=pd.DataFrame(body, columns=head), artifact_file=f"{artifact_path}/comparison.json"
        )
        logged.append(f"{artifact_path}/comparison.json")
    except Exception as exc:  # noqa: BLE001
        logger.warning("compare: logging comparison.json to run %s failed: %s", parent_run_id, exc)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            png = plot_metric_vs_flatness(table, Path(tmp) / "metric_vs_flatness.png")
            client.log_artifact(parent_run_id, str(png), artifact_path)
            logged.append(f"{artifact_path}/{png.name}")
    except Exception as exc:  # noqa: BLE001
        logger.warning("compare: no metric-vs-flatness plot for run %s: %s", parent_run_id, exc)
    return logged


def _comparison(
    df: Any, metric: Optional[str], reference: Optional[str], confidence: float, study: str, ranges: Ranges
):
    """``(texts by file name, headers, cells, one tuning's table)`` of the study's comparison: over its
    tunings where it has several (:func:`flatlab.analysis.tunings.compare_tunings`), else the one table."""
    sample = Sample.of(df)
    kwargs = dict(metric=metric, reference=reference, confidence=confidence, study=study, ranges=ranges)
    if len(sample.tunings) > 1:
        c = compare_tunings(sample, **kwargs)
        texts = {"comparison.md": tunings_text.to_markdown(c), "comparison.csv": tunings_text.to_csv(c)}
        return texts, tunings_text.headers(c), tunings_text.cells(c), c.per_tuning[0]
    c = compare_table(sample.trials, **kwargs)
    return {"comparison.md": to_markdown(c), "comparison.csv": to_csv(c)}, headers(c), cells(c), c


def log_study_analysis(
    tracking_uri: str,
    parent_run_id: str,
    study: str,
    sample: Sample,
    console: Optional[Any] = None,
    ranges: Ranges = NO_RANGES,
) -> List[str]:
    """Log what the launch's trials say beyond the paper table, where it applies: whether flatness predicts
    generalisation (``correlation/``: :mod:`flatlab.analysis.generalisation`, when trials measured
    flatness) and the tuning curves of a random-search pool (``tuning_curves/``: :mod:`flatlab.analysis.pool`,
    for ``searcher="random"``, ``scheduler="fifo"``) and each arm's quantities against passes and training
    seconds (``cost_curves/``: :mod:`flatlab.analysis.cost_curves`, where final trials logged their compute).
    ``sample``: the launch's trials (:func:`flatlab.tracking.trials.read_sample`); ``ranges``: the values the
    validation metric can take (the tuning curves' support). Never raises; returns the artifact paths logged."""
    logged: List[str] = []
    try:
        client = runs.client(runs.existing_store(tracking_uri))
    except Exception as exc:  # noqa: BLE001 - the study's results stand
        logger.warning("analysis: no store for run %s: %s", parent_run_id, exc)
        return logged
    curves = functools.partial(_write_curves, ranges=ranges)
    writers = (
        ("correlation", _write_correlation),
        ("tuning_curves", curves),
        ("cost_curves", lambda s, folder: _write_cost_curves(tracking_uri, s, folder)),
    )
    for folder, write in writers:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                paths = write(sample, Path(tmp))
                if paths:
                    client.log_artifacts(parent_run_id, tmp, folder)
                    logged += [f"{folder}/{p.name}" for p in paths]
        except Exception as exc:  # noqa: BLE001
            logger.warning("analysis: %s not logged to run %s: %s", folder, parent_run_id, exc)
    if console is not None and logged:
        folders = ", ".join(f"{folder}/" for folder in dict.fromkeys(p.split("/")[0] for p in logged))
        console.print(f"analysis: {len(logged)} files on the launch run ({folders})")
    return logged


def _write_cost_curves(tracking_uri: str, sample: Sample, folder: Path) -> List[Path]:
    """Each arm's per-epoch quantities against passes and seconds, where the final trials logged compute."""
    final = sample.final().completed()
    if final.empty or not final.has_values(UNITS["passes"]):
        return []
    return write_cost_curves(sample_histories(tracking_uri, sample), sample.info.metric, folder, title=sample.info.name)


def _write_correlation(sample: Sample, folder: Path) -> List[Path]:
    if not sample.completed().measures():
        return []
    p = generalisation.flatness_correlations(sample)
    p.frame().to_csv(folder / "flatness_correlation.csv", index=False)
    (folder / "flatness_correlation.md").write_text(generalisation.to_markdown(p))
    scatters = [
        generalisation.plot_scatter(sample, m, folder / f"scatter_{m.replace('/', '_')}.png")
        for m in dict.fromkeys(r.measure for r in p.rows)
    ]
    return [folder / "flatness_correlation.csv", folder / "flatness_correlation.md", *scatters]


def _write_curves(sample: Sample, folder: Path, ranges: Ranges) -> List[Path]:
    try:
        pool.check_independent(sample)
    except ConfigError:
        return []  # not a pool of independent trials: no tuning curves
    return pool.write_curves(pool.pool_curves(sample, ranges=ranges), folder)


def log_flatness_sweep(
    tracking_uri: str, parent_run_id: str, study: Any, sample: Sample, console: Optional[Any] = None
) -> List[str]:
    """After a study: log each sweep's CSV and figure (:mod:`flatlab.analysis.flatness_sweep`) on
    ``parent_run_id``, for every measure the study asked to sweep (:data:`flatlab.ranges.SWEEPS`,
    :func:`wants_sweep`); otherwise do nothing. ``sample``: the launch's trials.

    Never raises: a failure is logged as a warning (the trials are already recorded).

    Returns:
        The artifact paths logged.
    """
    measures = getattr(study, "measures", None)
    swept = [(m, param) for m, (many, param) in SWEEPS.items() if wants_sweep(measures, m, many)]
    if not swept:
        return []
    logged: List[str] = []
    try:
        frame = sample.trials
        client = runs.client(runs.existing_store(tracking_uri))
        for measure, param in swept:
            logged += _log_sweep(client, parent_run_id, study.name, frame, measure, param)
    except Exception as exc:  # noqa: BLE001 - the study's results stand
        logger.warning("flatness sweep: not logged for run %s: %s", parent_run_id, exc)
    if console is not None and logged:
        console.print(f"flatness sweeps (TSAM Figs. 2, 5-6): {', '.join(logged)} on run {parent_run_id}")
    return logged


def _log_sweep(client: Any, run_id: str, name: str, frame: Any, measure: str, param: str) -> List[str]:
    """One sweep's ``flatness_sweep/<stem>.csv`` and ``.png`` on ``run_id``; the paths logged."""
    table = sweep_table(frame, measure, param)
    if table.empty:
        logger.warning("flatness sweep: no trial of %s logged flat/%s/%s_*", name, measure, param)
        return []
    name_stem = stem(measure, param)
    client.log_text(run_id, table.to_csv(index=False), f"{ARTIFACT_DIR}/{name_stem}.csv")
    what = "loss around the solution (TSAM Fig. 2)" if measure == "neighbourhood_loss" else f"{measure} against {param}"
    with tempfile.TemporaryDirectory() as tmp:
        png = plot_sweep(table, Path(tmp) / f"{name_stem}.png", title=f"{name}: {what}", measure=measure, param=param)
        client.log_artifact(run_id, str(png), ARTIFACT_DIR)
    return [f"{ARTIFACT_DIR}/{name_stem}.csv", f"{ARTIFACT_DIR}/{name_stem}.png"]


__all__ = ["log_flatness_sweep", "plot_sweep", "sweep_table", "wants_sweep"]
