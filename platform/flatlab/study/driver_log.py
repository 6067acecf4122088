"""The driver's log file and the environment it gives Tune, Optuna and MLflow.

A launch writes everything its driver logs (flatlab, Ray, Tune, Optuna, MLflow, Python warnings) to
``<root>/<study>/logs/flatlab.log`` (:func:`flatlab.study.launches.log_file`); the terminal shows only
flatlab's own progress lines and the summary.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import mlflow  # noqa: F401 - imported before setup_file_logging, which then moves its handlers to the log file
import optuna

from flatlab.study.launches import log_file
from flatlab.study.trainable import tune_env


def setup_file_logging(out: Path) -> None:
    """Send the driver's logging (flatlab, Ray, Tune, Optuna, MLflow, warnings) to the study's log file,
    :func:`flatlab.study.launches.log_file` of its output folder ``out``."""
    log = log_file(out)
    log.parent.mkdir(parents=True, exist_ok=True)
    path = str(log.resolve())
    existing = [
        h
        for h in logging.getLogger("flatlab").handlers
        if getattr(h, "flatlab_study_log", False) and h.baseFilename == path
    ]
    handler = existing[0] if existing else logging.FileHandler(path)
    handler.flatlab_study_log = True  # type: ignore[attr-defined]
    # Tune's per-result JSON/CSV files are off (the results live in MLflow), so its end-of-run analysis
    # warns that it found none for every trial: expected, not worth alarming anyone in the log.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # Python warnings of the driver (e.g. Optuna's "step already reported" after a resume) go to the log too
    logging.captureWarnings(True)
    for name in ("flatlab", "ray", "ray.tune", "ray.train", "ray.data", "optuna", "mlflow", "alembic", "py.warnings"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                lg.removeHandler(h)
            elif getattr(h, "flatlab_study_log", False) and h.baseFilename != handler.baseFilename:
                lg.removeHandler(h)  # the previous study's log (several studies in one file or process)
                h.close()
        if not any(isinstance(h, logging.FileHandler) and h.baseFilename == handler.baseFilename for h in lg.handlers):
            lg.addHandler(handler)
        lg.propagate = False
        lg.disabled = False
        if name in ("flatlab", "ray.tune"):
            lg.setLevel(logging.INFO)


def quiet_libraries() -> None:
    """The driver's environment for Tune, Optuna and MLflow: no per-result loggers, Tune's legacy
    reporter (our own progress lines only), Optuna's messages to the log file, result buffering."""
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no CSV/JSON/TBX loggers per result
    os.environ.setdefault(
        "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0"
    )  # frequent checkpoints (checkpoint_every=1) are a choice, not a misconfiguration
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter honours verbose=0: our own progress only
    optuna.logging.disable_default_handler()  # Optuna's messages go to the log file
    for key, value in tune_env().items():  # Tune's result buffering (FLATLAB_RESULT_BUFFER_S, default 1 s)
        os.environ.setdefault(key, value)
