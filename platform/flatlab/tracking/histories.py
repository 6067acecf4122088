"""A study's per-epoch histories read from MLflow: the table of :mod:`flatlab.analysis.histories`.

For each completed final-stage trial of the latest launch (``Study(final_seeds=...)``), the MLflow
metric histories (step = epoch; the latest value per step where a step was logged twice) of the
cumulative compute ``compute/passes`` and ``compute/train_s``, the study's validation metric, the test
metrics where they were logged every epoch (``test_every_epoch``: a test metric with a single point is
the final model's and is left out) and the flatness measures over training (``flat_curve*/``).
:func:`write_cost_curves` writes the curves against passes and seconds that a launch logs as artifacts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from flatlab.analysis import cost_curves, equal_compute
from flatlab.analysis.histories import UNITS
from flatlab.analysis.sample import Sample, StudyInfo
from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.tracking import runs
from flatlab.tracking.trials import read_sample

pd = lazy("pandas")


def read_histories(tracking_uri: str, study: str) -> Tuple[Any, StudyInfo]:
    """The per-epoch histories of ``study``'s completed final trials, and what the launch recorded.

    Returns:
        ``(frame, info)``: the long table (``run_id``, ``arm``, ``tuning``, ``seed``, ``epoch``,
        ``compute/passes``, ``compute/train_s``, the metrics) and the study's :class:`StudyInfo`.
    Raises:
        ConfigError: an unknown study, no completed final-stage trial, or no trial that logged its compute.
    """
    sample = read_sample(tracking_uri, study)
    return sample_histories(tracking_uri, sample), sample.info


def sample_histories(tracking_uri: str, sample: Sample) -> Any:
    """The per-epoch histories of the completed final trials of ``sample`` (one launch's, say), as
    :func:`read_histories`'s table.

    Raises:
        ConfigError: no completed final-stage trial, or none that logged its compute.
    """
    study = sample.info.name
    final = sample.final().completed().trials
    if final.empty:
        raise ConfigError(
            f"study {study!r} has no completed final-stage trial; time to target and equal-compute comparisons "
            "read the final stage (Study(final_seeds=...))"
        )
    metrics = [*UNITS.values(), sample.info.metric]
    metrics += [c for c in final.columns if c.startswith(("test/", "flat_curve")) and c not in metrics]
    client = runs.client(tracking_uri)
    rows: List[Dict[str, Any]] = []
    for _, t in final.iterrows():
        by_epoch: Dict[int, Dict[str, float]] = {}
        for m in metrics:
            history = _history(client, t["run_id"], m)
            if m.startswith("test/") and len(history) < 2:
                continue  # the final model's test metric, not a per-epoch one
            for step, value in history.items():
                by_epoch.setdefault(step, {})[m] = value
        key = {"run_id": t["run_id"], "arm": t["arm"], "tuning": int(t["tuning"]), "seed": t["seed"]}
        rows += [{**key, "epoch": e, **values} for e, values in sorted(by_epoch.items())]
    frame = pd.DataFrame(rows)
    if frame.empty or UNITS["passes"] not in frame.columns:
        raise ConfigError(f"no final trial of {study!r} logged compute/passes per epoch (runs before compute counting)")
    return frame.reindex(columns=[*frame.columns, *[m for m in metrics if m not in frame.columns]])


def write_cost_curves(
    histories: Any,
    metric: str,
    folder: Path,
    *,
    units: Sequence[str] = tuple(UNITS),
    metrics: Optional[Sequence[str]] = None,
    points: int = 50,
    title: str = "",
) -> List[Path]:
    """Each arm's curves against each of ``units`` (:mod:`flatlab.analysis.cost_curves`) of ``metrics``
    (default: ``metric`` and every other quantity the histories hold per epoch,
    :func:`~flatlab.analysis.equal_compute.quantities_of`): a CSV and a PNG each, in ``folder``
    (``<metric>_by_<unit>.csv``/``.png``).

    Raises:
        ConfigError: a metric without a per-epoch history (naming those with one), an unknown unit.
    """
    known = equal_compute.quantities_of(histories, metric)
    for m in metrics or ():
        if m not in known:
            raise ConfigError(f"metric {m!r} has no per-epoch history here; these have: {', '.join(known)}")
    folder.mkdir(parents=True, exist_ok=True)
    paths: List[Path] = []
    for m in metrics or known:
        for unit in units:
            c = cost_curves.cost_curves(histories, m, unit, points)
            stem = folder / f"{m.replace('/', '_')}_by_{unit}"
            c.to_csv(f"{stem}.csv", index=False)
            label = f"{title}: {m} against {unit}" if title else ""
            paths += [Path(f"{stem}.csv"), cost_curves.plot_cost_curves(c, m, Path(f"{stem}.png"), label)]
    return paths


def _history(client: Any, run_id: str, metric: str) -> Dict[int, float]:
    """step -> the latest value logged at that step."""
    latest: Dict[int, Tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, metric):
        if m.step not in latest or m.timestamp >= latest[m.step][0]:
            latest[m.step] = (m.timestamp, m.value)
    return {step: v for step, (_ts, v) in sorted(latest.items())}
