"""Reading a study's trials from MLflow: its launches (parent runs) and one row per trial (child run),
the table ``flatlab results`` shows and every analysis reads (:class:`flatlab.analysis.sample.Sample`)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from flatlab.analysis.results import sort_trials
from flatlab.analysis.sample import Sample, StudyInfo
from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.tracking import runs

pd = lazy("pandas")

# Final metrics whose plain name reads like a hyperparameter: the scheduled learning rate of the last
# epoch is ``last_lr``, next to the searched ``param.lr``.
FINAL_NAMES = {"lr": "last_lr"}

# Where a command's store comes from: said where a study is not found in it.
STORE_HINT = (
    "the store is the one under --root, else FLATLAB_ROOT, else ./flatlab-runs; --tracking-uri / "
    "MLFLOW_TRACKING_URI names another"
)

# Magnitudes MLflow gives back for an infinite metric (it stores +-inf as +-1.797e308): never a real value.
SENTINEL = 1e300


def parent_runs(tracking_uri: str, study: str) -> List[Any]:
    """Parent (launch) runs of ``study``, newest first.

    Raises:
        ConfigError: the study is unknown, or the tracking URI names a SQLite file that does not exist
            (nothing is created).
    """
    c = runs.client(runs.existing_store(tracking_uri))
    exp = c.get_experiment_by_name(study)
    if exp is None:
        names = sorted(e.name for e in c.search_experiments() if e.name != "Default")
        raise ConfigError(
            f"no study {study!r} in {tracking_uri}; studies there: {', '.join(names) or '(none)'} ({STORE_HINT})"
        )
    return c.search_runs(
        [exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'study'", order_by=["attributes.start_time DESC"]
    )


def trials_frame(
    tracking_uri: str,
    study: str,
    *,
    all_launches: bool = False,
    metric: Optional[str] = None,
    mode: Optional[str] = None,
):
    """One row per trial (child run) of the latest launch (or all launches), best first.

    Columns: ``arm``, ``optimizer``, ``status``, ``outcome``, ``error`` (a failed trial's ``Type: message``,
    else empty), ``epochs``, ``seed``, ``stage`` (tag ``flatlab.stage``, default ``search``), ``tuning``
    (tag ``flatlab.tuning``, default 1), the final ``<metric>`` and ``best/<metric>``, every other final
    metric (the last epoch's scheduled learning rate as ``last_lr``), the trial's params as
    ``param.<name>`` (numbers where every value is one; integers as nullable ``Int64``), ``run_id``,
    ``trial_id``, ``launch`` (the parent run id), ``start_time`` and ``end_time`` (ms since the epoch;
    NaN while running).
    ``metric``/``mode`` default to the study's, read from the launch run; ``attrs`` hold ``metric``,
    ``mode``, the study's ``reference_arm`` and ``workload`` and its trainer's training-loss target
    (``measure_at_train_loss``,
    ``stop_at_train_loss``) as the launch recorded them (text; ``None`` when not set).
    """
    parents = parent_runs(tracking_uri, study)
    if not parents:
        raise ConfigError(f"study {study!r} has no launches recorded in {tracking_uri}")
    metric = metric or parents[0].data.params.get("metric", "val/accuracy")
    mode = mode or parents[0].data.params.get("mode", "max")
    chosen = parents if all_launches else parents[:1]
    c = runs.client(tracking_uri)
    rows = []
    for parent in chosen:
        children = c.search_runs(
            [parent.info.experiment_id],
            filter_string=f"tags.`{runs.PARENT}` = '{parent.info.run_id}'",
            max_results=50000,
        )
        for r in children:
            m = r.data.metrics
            row = {
                "arm": r.data.tags.get(runs.TAG_ARM, ""),
                "optimizer": r.data.tags.get(runs.TAG_OPT, ""),
                "status": r.info.status,
                "outcome": r.data.tags.get(runs.TAG_OUTCOME, ""),
                "error": r.data.tags.get(runs.TAG_ERROR, ""),  # "Type: message" of a failed trial
                "epochs": int(m.get("epoch", 0)),
                "seed": r.data.tags.get(runs.TAG_SEED, ""),
                "stage": r.data.tags.get(runs.TAG_STAGE, runs.STAGE_SEARCH),
                "tuning": _tuning(r.data.tags.get(runs.TAG_TUNING)),
                metric: m.get(metric),
                f"best/{metric}": m.get(f"best/{metric}"),
            }
            for k in sorted(m):
                if k not in row and k not in ("epoch",):
                    row[FINAL_NAMES.get(k, k)] = m[k]
            for k, v in sorted(runs.config_params(r.data.params).items()):  # not opt.*, train.*, wl.*
                row[f"param.{k}"] = v
            row["run_id"] = r.info.run_id
            row["trial_id"] = r.data.tags.get(runs.TAG_TRIAL, "")
            row["launch"] = parent.info.run_id
            row["start_time"] = r.info.start_time  # ms since the epoch (MLflow's unit)
            row["end_time"] = r.info.end_time  # None while the run is still running
            rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    for col in [c for c in df.columns if c.startswith("param.")] + ["seed"]:
        df[col] = _numeric_if_possible(df[col])
    numeric = df.select_dtypes("number").columns
    df[numeric] = df[numeric].mask(df[numeric].abs() >= SENTINEL)  # +-inf as older MLflow stores kept it
    df = sort_trials(df, metric, mode)
    df.attrs.update(_launch_attrs(parents[0].data.params, metric, mode))
    return df


def _launch_attrs(params: Dict[str, str], metric: str, mode: str) -> Dict[str, Any]:
    """What the launch's parent run recorded that the analysis needs (:class:`~flatlab.analysis.sample.StudyInfo`):
    the metric and mode, the reference arm, the workload (the range of its loss), the training-loss target
    (measured there and trained on, or stopped there), the searcher and scheduler (whether the trials are an
    i.i.d. pool, :mod:`flatlab.analysis.pool`), the equivalence margins, the target of the metric and the study
    file it was launched from."""
    out: Dict[str, Any] = {"metric": metric, "mode": mode}
    for key in ("reference_arm", "workload", "searcher", "scheduler"):
        out[key] = params.get(key)
    for key in ("measure_at_train_loss", "stop_at_train_loss"):
        out[key] = params.get(f"train.{key}")
    out["margins"] = {k[len("margins.") :]: float(v) for k, v in params.items() if k.startswith("margins.")}
    out["target_metric"] = float(params["target_metric"]) if params.get("target_metric") else None
    out["study_file"] = params.get("source") or None  # as `flatlab run` was given it
    return out


_INTEGER = re.compile(r"[+-]?\d+")


def _numeric_if_possible(col):
    """MLflow stores params as strings: give back numbers where every value parses as one.

    A column whose every present value is an integer literal (``"3"``, ``"-10"``) becomes pandas'
    nullable ``Int64``, so that an arm without the param (a missing value) does not turn it into
    floats (``s = 3.0``); other numeric columns become ``float64``; anything else stays text.
    """
    present = col.dropna()
    if len(present) and all(isinstance(v, str) and _INTEGER.fullmatch(v.strip()) for v in present):
        try:
            return pd.array([None if pd.isna(v) else int(v) for v in col], dtype="Int64")
        except (OverflowError, TypeError, ValueError):  # beyond int64: as floats below
            pass
    try:
        return pd.to_numeric(col)
    except (ValueError, TypeError):
        return col


def _tuning(tag: Any) -> int:
    """A run's tuning from its ``flatlab.tuning`` tag: 1 for runs of a single-tuning study or logged before
    studies had tunings."""
    try:
        return int(tag) if tag not in (None, "") else 1
    except ValueError:
        return 1


def read_sample(tracking_uri: str, study: str, *, all_launches: bool = False, launch: Optional[str] = None) -> Sample:
    """The typed sample of ``study``'s trials (:class:`flatlab.analysis.sample.Sample`), read once: the
    latest launch's (``all_launches``: every launch's; ``launch``: that parent run's, with only the
    ``param.*`` columns its trials have).

    Raises:
        ConfigError: as :func:`trials_frame`.
    """
    df = trials_frame(tracking_uri, study, all_launches=all_launches or launch is not None)
    info = StudyInfo.from_attrs({**df.attrs, "name": study})
    if launch is not None and "launch" in df.columns:
        df = df[df["launch"] == launch]
        # a parameter only other launches searched is not one of this launch's
        df = df.drop(columns=[c for c in df.columns if c.startswith("param.") and df[c].isna().all()])
    return Sample.of(df, info)
