"""How a launch is run (:class:`RunOptions`, the ``flatlab run`` options) and what it produced
(:class:`StudyOutcome`); :mod:`flatlab.study.runner` re-exports both."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional


@dataclass
class RunOptions:
    """How to run a study (the ``flatlab run`` options)."""

    root: Path = Path("flatlab-runs")
    address: Optional[str] = None
    tracking_uri: Optional[str] = None
    storage: Optional[str] = None
    resume: bool = False
    continue_: bool = False  # --continue: a new launch that adds trials to the previous launch's Optuna studies
    overrides: Dict[str, Any] = field(default_factory=dict)  # budget options (launches.BUDGET_KEYS), kept for --resume
    source: str = ""
    log_models: bool = True
    num_cpus: Optional[int] = None
    extra_tags: Dict[str, str] = field(default_factory=dict)


@dataclass
class StudyOutcome:
    """What a launch produced; ``already_finished``: a ``--resume`` that found the launch finished and did
    nothing (its results are those the launch logged)."""

    study: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    experiment_path: str
    interrupted: bool
    num_trials: int
    num_errors: int
    wall_s: float
    already_finished: bool = False
