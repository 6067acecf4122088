"""A launch whose trials all ended, as the post-study steps are handed it (:class:`Launched`): what the
launch knows that its trials in MLflow do not, so that no report reaches back into the launch's code."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence

from flatlab.ranges import NO_RANGES, Ranges


@dataclass(frozen=True)
class Launched:
    """One ended launch, for :func:`flatlab.reports.post_study.post_study`.

    Attributes:
        study: its :class:`~flatlab.study.spec.Study` (name, metric, mode, arms, measures, reports ...).
        tracking_uri, experiment_id, parent_run_id: its MLflow store, experiment and parent run.
        out: the study's output folder (``<root>/<study>``: ``optuna.db``; the declared reports write
            into ``out / "report"``).
        log: the driver's log file, named where a report was skipped.
        optuna_studies: arm -> its Optuna study in ``<out>/optuna.db`` (the launch record's; empty: none).
        ranges: the values the workload's quantities can take (:func:`flatlab.workloads.ranges.ranges_of`).
        columns: test metrics -> the columns of the experiment's default MLflow view
            (:func:`flatlab.study.parent_run.study_columns` of the study); ``None``: the view is left as it is.
        console: a rich console for one line per report (``None``: the log only).
    """

    study: Any
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    out: Path
    log: Path
    optuna_studies: Mapping[str, str] = field(default_factory=dict)
    ranges: Ranges = NO_RANGES
    columns: Optional[Callable[[Sequence[str]], List[str]]] = None
    console: Any = None
