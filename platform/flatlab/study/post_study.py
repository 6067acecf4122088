"""What runs after a launch whose trials all ended, in order: steps-to-target, the comparison table and
plot (artifacts of the parent run, as ``flatlab compare`` shows them), what the trials say about flatness
and tuning, the published-curve comparison, the flatness sweep, the study report, then the reports the
study asks for. Each step logs to the launch's parent run; none fails the launch."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from flatlab.analysis.sample import Sample
from flatlab.interpolation import report as _interpolation_report  # noqa: F401 (registers the interpolation report)
from flatlab.study.report import log_study_report
from flatlab.study.spec import Study
from flatlab.tracking.publish import log_comparison, log_flatness_sweep, log_study_analysis
from flatlab.tracking.published_runs import log_curves
from flatlab.tracking.reports import run_reports
from flatlab.tracking.speedup import log_steps_to_target
from flatlab.tracking.trials import read_sample
from flatlab.workloads.ranges import ranges_of

logger = logging.getLogger("flatlab")


def post_study(
    study: Study, tracking_uri: str, experiment_id: str, parent_run_id: str, out: Path, console: Any
) -> None:
    """Every post-study step of launch ``parent_run_id`` (see the module docstring); ``out``: the study's
    output folder (``<root>/<study>``), whose ``report`` folder the study's reports write into."""
    if study.reference_arm is not None or study.target_loss is not None:
        _steps_to_target(study, tracking_uri, experiment_id, parent_run_id, console)
    sample = _launch_sample(tracking_uri, study.name, parent_run_id)  # read once, after steps-to-target logged
    ranges = ranges_of(study.workload)
    if sample is not None and (study.final_seeds or (study.searcher == "grid" and len(study.seeds) > 1)):
        log_comparison(tracking_uri, parent_run_id, sample, study=study.name, ranges=ranges)
    log_study_analysis(tracking_uri, parent_run_id, study.name, console, sample, ranges)  # correlation/, tuning_curves/
    if study.published is not None:  # flatlab's per-epoch curves beside the declared published ones
        log_curves(tracking_uri, parent_run_id, study, console, ranges)
    log_flatness_sweep(tracking_uri, parent_run_id, study, console, sample)  # TSAM Fig. 2, when measures sweep sigma
    trials = sample.trials if sample is not None else None
    log_study_report(study, tracking_uri, parent_run_id, out, console, trials)  # best per arm and plots
    run_reports(study, tracking_uri, out / "report", console)  # the reports the study asks for (Study.reports)


def _launch_sample(tracking_uri: str, study: str, parent_run_id: str) -> Optional[Sample]:
    """The launch's trials, read once for every step below (``None`` where they cannot be read: each step
    then reads, or skips, on its own and says why in the log)."""
    try:
        return read_sample(tracking_uri, study, launch=parent_run_id)
    except Exception as exc:  # noqa: BLE001 - no report fails the launch
        logger.warning("post-study: trials of run %s not read: %s", parent_run_id, exc)
        return None


def _steps_to_target(study: Study, tracking_uri: str, experiment_id: str, parent_run_id: str, console: Any) -> None:
    """Log steps-to-target (and speed-up) on the launch's trials; one line says how many reached it."""
    summary = log_steps_to_target(tracking_uri, experiment_id, parent_run_id, study)
    reached = sum(r["steps_to_target"] is not None for r in summary["runs"].values())
    line = (
        f"steps-to-target: {reached} of {len(summary['runs'])} trials reached the target"
        + (f"; {len(summary['skipped'])} skipped (no curve or no reference)" if summary["skipped"] else "")
        + (f"; {len(summary['errors'])} MLflow errors (see the log)" if summary["errors"] else "")
    )
    logger.info("%s", line)
    if console is not None:
        console.print(line)
