"""Chained studies: search-space values read from another study's results when a study is launched.

A study file writes ``sp.best_of("tsam_table1_cifar100", arm="tsam", param="lr")`` where a constant would
go (:class:`~flatlab.study.space.BestOf`). At launch, :func:`resolve_chained` (called once by
``flatlab.study.runner.run_study``, before the searcher is built) looks the value up in MLflow:

* the source study's latest FINISHED launch (parent run with status ``FINISHED``; running, failed and
  killed launches are skipped);
* in it, the arm's best trial by the SOURCE study's own metric and mode (logged on its launch run):
  the best trial of its best configuration (:mod:`flatlab.tracking.selection`: the best mean over seeds
  of the final validation value among completed search trials; pruned, diverged and failed trials
  never count, nor final-stage re-runs);
* that trial's logged param, parsed as the field's declared type and checked against its range; with
  ``param=None``, the trial's run as ``run:<run_id>`` (what ``clip_interpolate``'s ``finetuned`` reads).

The resolved study is what the searcher and the trials see: the dimension becomes a
:class:`~flatlab.study.space.Resolved` constant, next to a ``<field>.source`` constant
(``<study>/<run_id>``), so every child run logs param ``lr`` and param ``lr.source``; the launch run logs
``<arm>.lr`` and ``<arm>.lr.source`` (:func:`chained_params`). ``flatlab run --dry-run`` prints what
would be resolved and, when the store has it, the current value (:func:`describe_chained`).

Another reader of earlier results, ``clip_interpolate``'s ``mlflow:<study>/<arm>?param=value``
references (flatlab.workloads.clip_refs), picks a named trial rather than the best one, in each
trial; it uses the same launch rule (:func:`finished_launch`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.study.space import SOURCE_SUFFIX, BestOf, Fixed, Resolved
from flatlab.study.spec import Arm, Study


def finished_launch(tracking_uri: str, study: str) -> Any:
    """The latest launch run (``flatlab.role=study``) of ``study`` whose status is ``FINISHED``.

    Raises:
        ConfigError: no MLflow store at a SQLite URI, no study of that name, or no finished launch (the
            message lists the statuses of the launches there are).
    """
    from flatlab.tracking.results import parent_runs

    parents = parent_runs(tracking_uri, study)
    for parent in parents:
        if parent.info.status == "FINISHED":
            return parent
    seen = ", ".join(p.info.status for p in parents[:5]) or "none"
    raise ConfigError(
        f"study {study!r} has no FINISHED launch in {tracking_uri} (its launches, newest first: {seen}); "
        f"run it to the end (`flatlab run <its file>`, or `--resume` an interrupted launch) first"
    )


def best_trial(tracking_uri: str, study: str, arm: str, where: Tuple[Tuple[str, Any], ...] = ()) -> Tuple[str, str, float]:
    """``(run_id, metric, value)`` of the best trial of ``arm`` in ``study``'s latest finished launch
    (:func:`flatlab.tracking.selection.best_trial_rows`, by that study's metric and mode), among the
    trials whose params equal ``where``'s values (numbers compared as numbers).

    Raises:
        ConfigError: as :func:`finished_launch`; the arm has no trial in that launch (the arms it has
            are listed), none matching ``where``, or none of them completed.
    """
    from flatlab.tracking.results import trials_frame
    from flatlab.tracking.selection import best_trial_rows

    parent = finished_launch(tracking_uri, study)
    metric = parent.data.params.get("metric", "val/accuracy")
    mode = parent.data.params.get("mode", "max")
    df = trials_frame(tracking_uri, study, all_launches=True, metric=metric, mode=mode)
    if not df.empty:
        df = df[df["launch"] == parent.info.run_id]
    launch = f"study {study!r}, launch {parent.info.run_id}"
    if df.empty or arm not in set(df["arm"]):
        arms = sorted(set(df["arm"])) if not df.empty else []
        raise ConfigError(f"{launch} has no trial of arm {arm!r}; its arms: {', '.join(arms) or '(no trials)'}")
    df = df[df["arm"] == arm]
    for key, wanted in where:
        column = f"param.{key}"
        df = df[df[column].map(lambda logged: _same_value(logged, wanted))] if column in df.columns else df.iloc[0:0]
    condition = f" with {', '.join(f'{k}={v!r}' for k, v in where)}" if where else ""
    if df.empty:
        raise ConfigError(f"{launch}: no trial of arm {arm!r}{condition}")
    row = best_trial_rows(df)
    if row.empty:
        raise ConfigError(f"{launch}: no trial of arm {arm!r}{condition} completed (pruned, diverged or failed); nothing to chain from")
    value = row.iloc[0][metric]
    return str(row.iloc[0]["run_id"]), metric, float(value) if value is not None else math.nan


def _same_value(logged: Any, wanted: Any) -> bool:
    """A logged param (a number after trials_frame's conversion, or text) equals ``wanted``: as numbers
    when both read as numbers, else as text."""
    try:
        return math.isclose(float(logged), float(wanted), rel_tol=1e-9, abs_tol=0.0)
    except (TypeError, ValueError):
        return str(logged) == str(wanted)


def parse_param(raw: str, hp: Optional[HParam], where: str) -> Any:
    """An MLflow param string as the value of ``hp`` (its kind and range checked); without a
    declaration, a number where ``raw`` reads as one, else the text.

    Raises:
        ConfigError: ``raw`` is not a value ``hp`` allows (naming ``where`` and the allowed values).
    """
    if hp is None:
        try:
            return float(raw) if any(ch in raw for ch in ".eEn") else int(raw)
        except ValueError:
            return raw
    value: Any = raw
    if raw == "None" and hp.nullable:
        value = None
    elif hp.choices is not None:
        value = next((c for c in hp.choices if str(c) == raw), raw)
    elif hp.kind is bool:
        value = {"True": True, "False": False}.get(raw, raw)
    elif hp.kind in (int, float):
        try:
            number = float(raw)
            value = int(number) if hp.kind is int and number.is_integer() else number
        except ValueError:
            value = raw
    return hp.validate(value, where)


def resolve_one(dim: BestOf, tracking_uri: str, hp: Optional[HParam] = None, where: str = "") -> Resolved:
    """The value of one :class:`BestOf` (see the module docstring), as a :class:`Resolved` constant.

    Raises:
        ConfigError: as :func:`best_trial`; the best trial has no such param; the value is not allowed
            for ``hp``.
    """
    from flatlab.tracking import runs

    run_id, _, _ = best_trial(tracking_uri, dim.study, dim.arm, dim.where)
    source = f"{dim.study}/{run_id}"
    if dim.param is None:
        return Resolved(f"run:{run_id}", source=source)
    params = runs.client(tracking_uri).get_run(run_id).data.params
    if dim.param not in params:
        shown = ", ".join(sorted(k for k in params if k not in ("arm", "seed")))
        raise ConfigError(f"{where}: {dim.describe()}: the best trial {source} has no param {dim.param!r}; its params: {shown}")
    return Resolved(parse_param(params[dim.param], hp, where), source=source)


def resolve_chained(study: Study, tracking_uri: str) -> Study:
    """``study`` with every :class:`BestOf` replaced by its value from MLflow (plus a
    ``<field>.source`` constant naming the source run); ``study`` itself when it has none (MLflow is
    then not touched). Every chained value of the study is looked up before anything starts.

    Raises:
        ConfigError: ONE error listing every value that cannot be resolved: a missing or unfinished
            source study, a missing arm or param, a value the field does not allow, a study that names
            itself as its source.
    """
    if not any(isinstance(d, BestOf) for arm in study.arms for d in arm.dims.values()):
        return study
    errors: List[str] = []
    arms: List[Arm] = []
    for arm in study.arms:
        space: Dict[str, Any] = dict(arm.dims)
        declared = study.declared(arm)
        for key, dim in arm.dims.items():
            if not isinstance(dim, BestOf):
                continue
            where = f"study {study.name!r}, arm {arm.name!r}, field {key!r}"
            if dim.study == study.name:
                errors.append(f"{where}: {dim.describe()} names this study itself; chain to an earlier study")
                continue
            try:
                resolved = resolve_one(dim.valid(where), tracking_uri, declared.get(key), where)
            except ConfigError as exc:
                errors.append(str(exc) if str(exc).startswith(where) else f"{where}: {dim.describe()}: {exc}")
                continue
            space[key] = resolved
            space[key + SOURCE_SUFFIX] = Fixed(resolved.source)
        arms.append(Arm(arm.optimizer, space=space, name=arm.name))
    if errors:
        raise ConfigError("chained values cannot be resolved (nothing was started):\n  " + "\n  ".join(errors))
    return dataclasses.replace(study, arms=tuple(arms))


def chained_params(study: Study) -> Dict[str, str]:
    """The launch run's params of a resolved study: ``<arm>.<field>`` (the value) and
    ``<arm>.<field>.source`` (``<study>/<run_id>``) for every chained value; ``{}`` if there is none."""
    out: Dict[str, str] = {}
    for arm in study.arms:
        for key, dim in arm.dims.items():
            if isinstance(dim, Resolved):
                out[f"{arm.name}.{key}"] = str(dim.value)
                out[f"{arm.name}.{key}{SOURCE_SUFFIX}"] = dim.source
    return out


def describe_chained(study: Study, tracking_uri: str) -> List[str]:
    """One line per chained value of ``study`` for ``flatlab run --dry-run``: what would be resolved at
    launch and its value now, or why it cannot be resolved now. Never raises for a missing store or
    source."""
    lines: List[str] = []
    for arm in study.arms:
        declared = study.declared(arm)
        for key, dim in arm.dims.items():
            if not isinstance(dim, BestOf):
                continue
            head = f"chained: arm {arm.name!r}, {key} = {dim.describe()}, resolved at launch"
            try:
                r = resolve_one(dim, tracking_uri, declared.get(key), f"arm {arm.name!r}, field {key!r}")
            except ConfigError as exc:
                lines.append(f"{head}; not available now: {exc}")
                continue
            lines.append(f"{head}; now {r.value!r} from {r.source}")
    return lines
