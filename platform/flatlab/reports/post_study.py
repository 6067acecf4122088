"""What runs after a launch whose trials all ended: one pipeline over the trials, read once.

::

    Launched ──> read_sample ──> Sample   (tracking/trials.py: the launch's trials, once)
                                  │
                                  v
                           steps to target  (the trials' training-loss curves; logs on each trial run and
                                  │          hands back the sample with train/steps_to_target, train/speedup)
                                  │
                  ┌───────────────┼──────────────────────┬─────────────────┬───────────────┐
                  v               v                      v                 v               v
              comparison   correlation, tuning    published curves   flatness sweep   study report
                           and cost curves
                  (each computed by flatlab.analysis, then written once to the launch's parent run)
                                  │
                                  v
                  the reports the study declares (Study.reports; each handed the sample's trials)

Steps to target runs first, on the sample: it reads each trial's loss curve (the one thing the sample
cannot hold), logs ``train/steps_to_target`` and ``train/speedup`` on the trial runs, and sets them in
the sample's columns of those names, so every later step sees them as a sample read after the logging
would. Each step logs to the launch's parent run; none fails the launch. Where the trials cannot be
read, every step is skipped, with the reason in the log.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Tuple

from flatlab.analysis.sample import Sample
from flatlab.reports.declared import run_reports
from flatlab.reports.launched import Launched
from flatlab.reports.publish import log_comparison, log_flatness_sweep, log_study_analysis
from flatlab.reports.published_runs import log_curves
from flatlab.reports.speedup import log_steps_to_target
from flatlab.reports.study_report import log_study_report
from flatlab.tracking.trials import read_sample

logger = logging.getLogger("flatlab")


def post_study(launched: Launched) -> None:
    """Every post-study step of ``launched`` (see the module docstring), in order, over one read of its
    trials; none raises."""
    sample = _launch_sample(launched)
    if sample is None:
        return
    study = launched.study
    if study.reference_arm is not None or study.target_loss is not None:
        sample = _steps_to_target(launched, sample)
    for _, step in STEPS:
        step(launched, sample)
    run_reports(study, launched.tracking_uri, launched.out / "report", launched.parent_run_id, sample, launched.console)


def _comparison(launched: Launched, sample: Sample) -> None:
    """The comparison table and plot (``compare/``), for a launch with a final stage or a seeded grid."""
    study = launched.study
    if study.final_seeds or (study.searcher == "grid" and len(study.seeds) > 1):
        log_comparison(launched.tracking_uri, launched.parent_run_id, sample, study=study.name, ranges=launched.ranges)


def _analysis(launched: Launched, sample: Sample) -> None:
    """``correlation/``, ``tuning_curves/``, ``cost_curves/``."""
    log_study_analysis(
        launched.tracking_uri, launched.parent_run_id, launched.study.name, sample, launched.console, launched.ranges
    )


def _published(launched: Launched, sample: Sample) -> None:
    """flatlab's per-epoch curves beside the declared published ones."""
    if launched.study.published is not None:
        log_curves(
            launched.tracking_uri,
            launched.parent_run_id,
            launched.study,
            launched.console,
            launched.ranges,
            trials=sample.trials,
        )


def _sweep(launched: Launched, sample: Sample) -> None:
    """TSAM Fig. 2, when the study's measures sweep sigma."""
    log_flatness_sweep(launched.tracking_uri, launched.parent_run_id, launched.study, sample, launched.console)


def _study_report(launched: Launched, sample: Sample) -> None:
    """Best per arm, learning curves, Optuna's plots, the default MLflow view."""
    log_study_report(launched, sample.trials)


STEPS: Tuple[Tuple[str, Callable[[Launched, Sample], None]], ...] = (
    ("comparison", _comparison),
    ("analysis", _analysis),
    ("published curves", _published),
    ("flatness sweep", _sweep),
    ("study report", _study_report),
)
"""The steps over the launch's sample, in order: each computes with :mod:`flatlab.analysis` and writes
to the launch's parent run once; none raises."""


def _launch_sample(launched: Launched) -> Optional[Sample]:
    """The launch's trials, read once for every step (``None`` where they cannot be read: every step is
    skipped, and the log says why)."""
    try:
        return read_sample(launched.tracking_uri, launched.study.name, launch=launched.parent_run_id)
    except Exception as exc:  # noqa: BLE001 - no report fails the launch
        logger.warning(
            "post-study: trials of run %s not read (%s): skipped %s",
            launched.parent_run_id,
            exc,
            ", ".join(["steps to target", *(name for name, _ in STEPS), "declared reports"]),
        )
        return None


def _steps_to_target(launched: Launched, sample: Sample) -> Sample:
    """Log steps-to-target (and speed-up) on the launch's trials; one line says how many reached it.

    Returns:
        ``sample`` with the logged values in its columns (:func:`~flatlab.reports.speedup.log_steps_to_target`).
    """
    sample, summary = log_steps_to_target(launched.tracking_uri, launched.parent_run_id, launched.study, sample)
    reached = sum(r["steps_to_target"] is not None for r in summary["runs"].values())
    line = (
        f"steps-to-target: {reached} of {len(summary['runs'])} trials reached the target"
        + (f"; {len(summary['skipped'])} skipped (no curve or no reference)" if summary["skipped"] else "")
        + (f"; {len(summary['errors'])} MLflow errors (see the log)" if summary["errors"] else "")
    )
    logger.info("%s", line)
    if launched.console is not None:
        launched.console.print(line)
    return sample
