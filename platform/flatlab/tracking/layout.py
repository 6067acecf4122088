"""The MLflow run layout of a study: the names every run carries, shared by the driver, the workers and
the result queries.

One experiment per study name; one parent run per study launch (tag ``flatlab.role=study``); one
nested child run per trial (``mlflow.parentRunId``, ``flatlab.role=trial``, ``flatlab.trial_id``).
The tags (:data:`TAG_ARM`, :data:`TAG_STAGE` ...), the metric keys and steps of a trial's reports, and
its MLflow params (:func:`trial_params`). Where the store lives and how it is opened:
:mod:`flatlab.tracking.store`; which code a launch ran: :mod:`flatlab.tracking.provenance`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Mapping, Optional

from flatlab.analysis.sample import (  # noqa: F401 - the names of a trial record, read as runs.<name> too
    AT_TARGET_PREFIX,
    FLAT_PREFIX,
    STAGE_FINAL,
    STAGE_KEY,
    STAGE_SEARCH,
    TUNING_KEY,
)
from flatlab.tracking.param_text import flat_params

TAG_ROLE = "flatlab.role"
TAG_TRIAL = "flatlab.trial_id"
TAG_STUDY = "flatlab.study"
TAG_ARM = "flatlab.arm"
TAG_OPT = "flatlab.optimizer"
TAG_WORKLOAD = "flatlab.workload"
TAG_SEED = "flatlab.seed"
TAG_COMMIT = "flatlab.git_commit"
TAG_DIRTY = "flatlab.git_dirty"  # "true" when the package's tracked files differ from that commit
TAG_SOURCE = "flatlab.source_digest"  # source_digest(): which flatlab code ran, with or without git
TAG_VERSION = "flatlab.version"
TAG_OUTCOME = "flatlab.outcome"  # completed | pruned | diverged | error | interrupted
TAG_TUNING = "flatlab.tuning"  # the trial's independent tuning, 1..S (flatlab.study.tunings)
TAG_STAGE = "flatlab.stage"  # search (tuning trials) | final (each arm's best configuration over fresh seeds)
TAG_ERROR = "flatlab.error"  # a failed trial's "Type: message" (full traceback: its error.txt artifact)
TAG_CONFIG = "flatlab.config_digest"  # config_digest of the trial's configuration, set as its run is created
PARENT = "mlflow.parentRunId"
# STAGE_KEY and TUNING_KEY: trial config keys (not hyperparameters; never logged as params), defined with
# the record they name (flatlab.analysis.sample)
# A trial's last report names the metrics it holds about the final model only (test/* unless the
# trainer tests every epoch, flat/*, time/measures_s, train/target_reached, train/epochs_to_target:
# what study/trainable.py's _final_metrics adds), comma-separated under this key (not a metric: no "/").
# They are logged at step 0, which is how MLflow tells a run's summary values from its curves: its UI
# draws a metric whose steps are all 0 as one bar per run, not as a one-point line on an epoch axis
# (``train/steps_to_target`` and ``train/speedup``, logged after the study by reports/speedup.py, are
# at step 0 too). The epoch they were measured at is the run's last ``epoch``.
SUMMARY_KEY = "summary_metrics"


def summary_keys(report: Dict[str, Any]) -> frozenset:
    """The summary metrics a report names under :data:`SUMMARY_KEY` (none for a per-epoch report)."""
    return frozenset(k for k in str(report.get(SUMMARY_KEY) or "").split(",") if k)


def metric_step(key: str, epoch: int, summary: frozenset = frozenset()) -> int:
    """The MLflow step of metric ``key`` in the report of ``epoch`` whose summary metrics are ``summary``
    (:func:`summary_keys`): 0 for a summary value, else the epoch."""
    return 0 if key in summary else epoch


# A final report's key for the id of the trial's MLflow logged model (:mod:`flatlab.tracking.logged_model`),
# which the worker logs before it reports: the driver links the report's metrics to that model. Metrics
# reach a trial's run from the driver only, so a relaunch never finds epochs logged that Tune never saw.
MODEL_ID_KEY = "logged_model_id"


# The flatness measures a trial with the trainer parameter ``measure_at_train_loss`` ran on the model of the
# first epoch reaching that training loss: each ``flat/<name>`` of the measures under this prefix
# (``flat_at_target/fisher_trace``; MLflow allows letters, digits, ``_ - . /``, space and colon), their time
# as ``time/measures_at_target_s``. Summary values of the last report (step 0), like ``flat/*``; the epoch
# they were measured at is ``train/epochs_to_target``.
AT_TARGET_TIME_KEY = "time/measures_at_target_s"


def at_target(measured: Mapping[str, float]) -> Dict[str, float]:
    """The measures of a model at the training-loss target under their at-target names: ``flat/<name>``
    -> ``flat_at_target/<name>``, ``time/measures_s`` -> :data:`AT_TARGET_TIME_KEY` (anything else dropped)."""
    out = {AT_TARGET_PREFIX + k[len(FLAT_PREFIX) :]: float(v) for k, v in measured.items() if k.startswith(FLAT_PREFIX)}
    if "time/measures_s" in measured:
        out[AT_TARGET_TIME_KEY] = float(measured["time/measures_s"])
    return out


def on_split(measured: Mapping[str, float], split: str) -> Dict[str, float]:
    """The measures of a model on a study's extra split (``Study.measure_extra_splits``) under their names
    for it: ``flat/<name>`` -> ``flat_<split>/<name>`` (``flat_test/sam_objective``), ``time/measures_s`` ->
    ``time/measures_<split>_s`` (anything else dropped)."""
    out = {f"flat_{split}/{k[len(FLAT_PREFIX) :]}": float(v) for k, v in measured.items() if k.startswith(FLAT_PREFIX)}
    if "time/measures_s" in measured:
        out[f"time/measures_{split}_s"] = float(measured["time/measures_s"])
    return out


#: the prefix of the measures taken during training (``Study.measure_every``), logged with step = epoch
CURVE_PREFIX = "flat_curve"


def over_training(measured: Mapping[str, float]) -> Dict[str, float]:
    """A model's measures as a point of the curve over training: ``flat/<name>`` -> ``flat_curve/<name>``,
    ``flat_<split>/<name>`` -> ``flat_curve_<split>/<name>``, ``time/measures_s`` ->
    ``time/measures_curve_s`` (``flat_at_target/*`` and anything else dropped). Per-epoch values (MLflow
    step = epoch), never summary values, so they do not shadow the final model's ``flat/*``."""
    out: Dict[str, float] = {}
    for k, v in measured.items():
        head, sep, tail = k.partition("/")
        if sep and (head == "flat" or head.startswith("flat_")) and not k.startswith(AT_TARGET_PREFIX):
            out[f"{CURVE_PREFIX}{head[len('flat') :]}/{tail}"] = float(v)
    if "time/measures_s" in measured:
        out["time/measures_curve_s"] = float(measured["time/measures_s"])
    return out


# A report's key for the time its epoch ended (seconds since 1970, ``time.time()`` on the worker): the
# timestamp of the epoch's metrics in MLflow. Not a metric (no "/"), never logged as one.
EPOCH_END_KEY = "epoch_end_time"

# A trial's MLflow params: its config as the searcher gave it under the plain names (``arm``, ``seed``,
# ``lr`` ...: what queries such as ``params.lr`` use), and every resolved value, defaults included, under
# a prefix per section (``opt.momentum``, ``train.batch_size``, ``wl.width``). Field names never hold a
# dot, so a dotted param is always a resolved one.
RESOLVED_PREFIX = {"optimizer": "opt.", "trainer": "train.", "workload": "wl."}
PARAM_VALUE_LIMIT = 6000  # MLflow's limit on a param value's length (characters)

# MLflow 3's UI opens an experiment by this tag: training runs, not the GenAI (traces) overview.
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def is_resolved_param(name: str) -> bool:
    """Whether an MLflow param of a trial is one of its resolved values (``opt.*``, ``train.*``, ``wl.*``)."""
    return name.startswith(tuple(RESOLVED_PREFIX.values()))


def trial_params(config: Dict[str, Any], resolved: Optional[Dict[str, Dict[str, Any]]] = None) -> Dict[str, str]:
    """The MLflow params of a trial: ``config``'s entries under their own names (except the stage and the
    tuning, which are tags), then ``resolved`` (:func:`flatlab.study.trial_spec.resolved_config`) as
    ``<prefix><name>`` (:data:`RESOLVED_PREFIX`). Values are ``str(value)``, cut to MLflow's limit: the
    same config always gives the same strings, as MLflow requires of a resumed run. A mapping value is
    flattened to one param per entry (``<name>.<key>``, :func:`flatlab.tracking.param_text.flat_params`),
    never logged as a Python repr."""

    def params(values: Dict[str, Any], prefix: str = "") -> Dict[str, str]:
        out: Dict[str, str] = {}
        for k, v in sorted(values.items()):
            out.update(flat_params({k: v}, prefix) if isinstance(v, Mapping) else {f"{prefix}{k}": str(v)})
        return out

    out = params({k: v for k, v in config.items() if k not in (STAGE_KEY, TUNING_KEY)})
    for section, values in (resolved or {}).items():
        out.update(params(values, RESOLVED_PREFIX[section]))
    return {k: v[:PARAM_VALUE_LIMIT] for k, v in out.items()}


def config_digest(config: Dict[str, Any]) -> str:
    """A short digest (16 hex digits of SHA-256) of :func:`trial_params` of ``config``: the same
    configuration always gives the same digest. A trial run carries it as the tag :data:`TAG_CONFIG` from
    the moment it is created (params follow in a second call), so a resume after the driver was killed
    between the two still recognises the run (:mod:`flatlab.study.recovery`)."""
    text = json.dumps(trial_params(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_params(params: Dict[str, str]) -> Dict[str, str]:
    """A trial run's configuration among its MLflow params: what the searcher gave it, without ``arm``
    and ``seed`` and without the resolved values (:func:`is_resolved_param`)."""
    return {k: v for k, v in params.items() if k not in ("arm", "seed") and not is_resolved_param(k)}
