"""Chained studies: search-space values read from another study's results when a study is launched.

A study file writes ``sp.best_of("tsam_table1_cifar100", arm="tsam", param="lr")`` where a constant would
go (:class:`~flatlab.study.space.BestOf`). At launch, before the searcher is built, :func:`resolve_chained`
looks the value up in MLflow:

* the source study's latest FINISHED launch (running, failed and killed launches are skipped);
* in it, the arm's best trial by the SOURCE study's own metric and mode: the best trial of its best
  configuration (:mod:`flatlab.analysis.selection`; pruned, diverged, failed and final-stage trials
  never count);
* that trial's logged param, parsed as the field's declared type and checked against its range; with
  ``param=None``, the trial's run as ``run:<run_id>`` (what ``clip_interpolate``'s ``finetuned`` reads).

The resolved study is what the searcher and the trials see: the dimension becomes a
:class:`~flatlab.study.space.Resolved` constant next to a ``<field>.source`` constant
(``<study>/<run_id>``), so every child run logs ``lr`` and ``lr.source``; the launch run logs
``<arm>.lr`` and ``<arm>.lr.source`` (:func:`chained_params`). ``flatlab run --dry-run`` prints what
would be resolved (:func:`describe_chained`).

A checkpoint parameter of the workload (``Workload.checkpoint_params``) may instead name one trial with
a reference ``mlflow:<study>/<arm>[?<param>=<value>&...]`` (:func:`find_trial_run`), resolved at launch
to that trial's run; the trial fetches its checkpoint (:mod:`flatlab.tracking.checkpoints`). A workload
never reads MLflow itself.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Iterator, List, Optional, Tuple

from flatlab.analysis.selection import best_trial_rows
from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.study.space import SOURCE_SUFFIX, BestOf, Choice, Conditional, Dim, Fixed, Resolved, ResolvedChoice
from flatlab.study.spec import Arm, Study
from flatlab.study.trial_spec import declared as declared_fields
from flatlab.tracking import runs
from flatlab.tracking.checkpoints import RUN_PREFIX, is_reference, parse_reference
from flatlab.tracking.trials import parent_runs, trials_frame
from flatlab.workloads.registry import get_workload


def finished_launch(tracking_uri: str, study: str) -> Any:
    """The latest launch run (``flatlab.role=study``) of ``study`` whose status is ``FINISHED``.

    Raises:
        ConfigError: no MLflow store at a SQLite URI, no study of that name, or no finished launch (the
            message lists the statuses of the launches there are).
    """
    parents = parent_runs(tracking_uri, study)
    for parent in parents:
        if parent.info.status == "FINISHED":
            return parent
    seen = ", ".join(p.info.status for p in parents[:5]) or "none"
    raise ConfigError(
        f"study {study!r} has no FINISHED launch in {tracking_uri} (its launches, newest first: {seen}); "
        f"run it to the end (`flatlab run <its file>`, or `--resume` an interrupted launch) first"
    )


def best_trial(
    tracking_uri: str, study: str, arm: str, where: Tuple[Tuple[str, Any], ...] = ()
) -> Tuple[str, str, float]:
    """``(run_id, metric, value)`` of the best trial of ``arm`` in ``study``'s latest finished launch
    (:func:`flatlab.analysis.selection.best_trial_rows`, by that study's metric and mode), among the
    trials whose params equal ``where``'s values (numbers compared as numbers).

    Raises:
        ConfigError: as :func:`finished_launch`; the arm has no trial in that launch (the arms it has
            are listed), none matching ``where``, or none of them completed.
    """
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
        df = (
            df[df[column].map(lambda logged, wanted=wanted: same_value(logged, wanted))]
            if column in df.columns
            else df.iloc[0:0]
        )
    condition = f" with {', '.join(f'{k}={v!r}' for k, v in where)}" if where else ""
    if df.empty:
        raise ConfigError(f"{launch}: no trial of arm {arm!r}{condition}")
    row = best_trial_rows(df)
    if row.empty:
        raise ConfigError(
            f"{launch}: no trial of arm {arm!r}{condition} completed (pruned, diverged or failed); "
            "nothing to chain from"
        )
    value = row.iloc[0][metric]
    return str(row.iloc[0]["run_id"]), metric, float(value) if value is not None else math.nan


def same_value(logged: Any, wanted: Any) -> bool:
    """A logged param (a number after trials_frame's conversion, or text) equals ``wanted``: as numbers
    when both read as numbers, else as text."""
    try:
        return math.isclose(float(logged), float(wanted), rel_tol=1e-9, abs_tol=0.0)
    except (TypeError, ValueError):
        return str(logged) == str(wanted)


def find_trial_run(tracking_uri: str, study: str, arm: str, params: Dict[str, str]) -> Any:
    """The one FINISHED trial run of ``arm`` in the latest finished launch of ``study`` whose params match
    ``params`` (:func:`same_value`: numbers compared as numbers, so ``lr=1e-5`` matches a logged ``1e-05``).

    This is what a reference ``mlflow:<study>/<arm>[?<param>=<value>&...]`` names
    (:func:`flatlab.tracking.checkpoints.parse_reference`), written in a checkpoint parameter of the
    study's workload, as a constant or among the values of a ``choice``/``grid``, in an arm's space or in
    ``workload_params``. At launch each reference becomes ``run:<run_id>``: a constant as a
    :class:`~flatlab.study.space.Resolved` with a ``<field>.source`` constant (the reference), a choice as
    a :class:`~flatlab.study.space.ResolvedChoice`; the launch run logs ``<arm>.<field>.<i>`` and
    ``<arm>.<field>.<i>.source`` for the i-th value of a choice.

    Raises:
        ConfigError: as :func:`finished_launch`; no match (the arm's finished trials are listed with their
            params) or several matches (add a distinguishing param, e.g. ``seed``).
    """
    parent = finished_launch(tracking_uri, study)
    client = runs.client(tracking_uri)
    candidates = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`{runs.PARENT}` = '{parent.info.run_id}' and tags.`{runs.TAG_ARM}` = '{arm}'",
        max_results=50000,
    )
    finished = [r for r in candidates if r.info.status == "FINISHED"]
    matches = [
        r for r in finished if all(k in r.data.params and same_value(r.data.params[k], v) for k, v in params.items())
    ]
    wanted = "&".join(f"{k}={v}" for k, v in params.items()) or "(no params)"
    if not matches:
        shown = "; ".join(
            ", ".join(
                f"{k}={v}" for k, v in sorted(r.data.params.items()) if k != "arm" and not runs.is_resolved_param(k)
            )
            for r in finished[:8]
        )
        raise ConfigError(
            f"no FINISHED trial of study {study!r}, arm {arm!r} (latest finished launch) has {wanted}; "
            f"finished trials of that arm: {shown or '(none)'}"
        )
    if len(matches) > 1:
        raise ConfigError(
            f"{len(matches)} trials of study {study!r}, arm {arm!r} match {wanted}; add a param that tells them "
            "apart (e.g. seed=0)"
        )
    return matches[0]


def resolve_reference(ref: str, tracking_uri: str) -> str:
    """``run:<run_id>`` of the trial the reference ``ref`` names (:func:`find_trial_run`).

    Raises:
        ConfigError: as :func:`parse_reference` and :func:`find_trial_run`.
    """
    study, arm, params = parse_reference(ref)
    return f"{RUN_PREFIX}{find_trial_run(tracking_uri, study, arm, params).info.run_id}"


def _checkpoint_fields(study: Study) -> Tuple[str, ...]:
    """The study's workload's checkpoint parameters (``()`` for an unknown workload)."""
    try:
        return tuple(get_workload(study.workload).checkpoint_params)
    except Exception:  # noqa: BLE001 - an unknown workload is reported by study validation
        return ()


def _references(dim: Dim) -> List[str]:
    """The references among the values ``dim`` can take (a constant's, a choice's; inside a ``when``)."""
    dim = dim.dim if isinstance(dim, Conditional) else dim
    if isinstance(dim, Resolved):
        return []
    if isinstance(dim, Fixed):
        return [dim.value] if is_reference(dim.value) else []
    if isinstance(dim, Choice) and isinstance(dim.values, tuple):
        return [v for v in dim.values if is_reference(v)]
    return []


def _chained_references(study: Study) -> Iterator[Tuple[Optional[Arm], str, str]]:
    """``(arm, field, reference)`` of every reference in a checkpoint parameter of ``study``; ``arm`` is
    ``None`` for ``workload_params``."""
    fields = _checkpoint_fields(study)
    for key in fields:
        value = study.workload_params.get(key) if hasattr(study.workload_params, "get") else None
        if is_reference(value):
            yield None, key, value
    for arm in study.arms:
        for key, dim in arm.dims.items():
            if key in fields:
                for ref in _references(dim):
                    yield arm, key, ref


def _with_runs(dim: Dim, runs_of: Dict[str, str]) -> Dim:
    """``dim`` with every reference replaced by its run (``runs_of``): a constant as :class:`Resolved`
    (source: the reference), a choice as :class:`ResolvedChoice`; a ``when`` keeps its conditions."""
    if isinstance(dim, Conditional):
        return Conditional(_with_runs(dim.dim, runs_of), dim.conditions)
    if isinstance(dim, Fixed) and not isinstance(dim, Resolved) and is_reference(dim.value) and dim.value in runs_of:
        return Resolved(runs_of[dim.value], source=dim.value)
    if isinstance(dim, Choice) and any(is_reference(v) and v in runs_of for v in dim.values):
        found = [is_reference(v) and v in runs_of for v in dim.values]
        return ResolvedChoice(
            tuple(runs_of[v] if f else v for v, f in zip(dim.values, found)),
            dim.is_grid,
            sources=tuple(v if f else "" for v, f in zip(dim.values, found)),
        )
    return dim


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
    run_id, _, _ = best_trial(tracking_uri, dim.study, dim.arm, dim.where)
    source = f"{dim.study}/{run_id}"
    if dim.param is None:
        return Resolved(f"run:{run_id}", source=source)
    params = runs.client(tracking_uri).get_run(run_id).data.params
    if dim.param not in params:
        shown = ", ".join(sorted(k for k in params if k not in ("arm", "seed")))
        raise ConfigError(
            f"{where}: {dim.describe()}: the best trial {source} has no param {dim.param!r}; its params: {shown}"
        )
    return Resolved(parse_param(params[dim.param], hp, where), source=source)


def resolve_chained(study: Study, tracking_uri: str) -> Study:
    """``study`` with every :class:`BestOf` replaced by its value from MLflow (plus a
    ``<field>.source`` constant naming the source run) and every reference in a checkpoint parameter by
    its run (module docstring); ``study`` itself when it has none (MLflow is then not touched). Every
    chained value of the study is looked up before anything starts.

    Raises:
        ConfigError: ONE error listing every value that cannot be resolved: a missing or unfinished
            source study, a missing arm or param, a value the field does not allow, a study that names
            itself as its source, a malformed reference, one that matches no trial or several, two
            references of one choice that name the same run.
    """
    references = list(_chained_references(study))
    if not references and not any(isinstance(d, BestOf) for arm in study.arms for d in arm.dims.values()):
        return study
    errors: List[str] = []
    runs_of: Dict[str, str] = {}  # reference -> run:<run_id>, each looked up once
    for arm, key, ref in references:
        where = f"study {study.name!r}, " + (
            f"arm {arm.name!r}, field {key!r}" if arm is not None else f"workload_params {key!r}"
        )
        if ref in runs_of:
            continue
        try:
            if parse_reference(ref)[0] == study.name:
                errors.append(f"{where}: {ref!r} names this study itself; chain to an earlier study")
                continue
            runs_of[ref] = resolve_reference(ref, tracking_uri)
        except ConfigError as exc:
            errors.append(f"{where}: {exc}")
    arms: List[Arm] = []
    for arm in study.arms:
        space: Dict[str, Any] = dict(arm.dims)
        declared = declared_fields(study, arm)
        for key, dim in arm.dims.items():
            where = f"study {study.name!r}, arm {arm.name!r}, field {key!r}"
            if _references(dim):
                space[key] = _with_runs(dim, runs_of)
                _add_source(space, key)
                values = getattr(space[key], "values", ())
                if isinstance(space[key], Choice) and len(set(map(repr, values))) != len(values):
                    errors.append(f"{where}: two references of {dim.describe()} name the same trial run")
                continue
            if not isinstance(dim, BestOf):
                continue
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
    workload_params = {k: runs_of.get(v, v) if is_reference(v) else v for k, v in dict(study.workload_params).items()}
    return dataclasses.replace(study, arms=tuple(arms), workload_params=workload_params)


def _add_source(space: Dict[str, Any], key: str) -> None:
    """A resolved constant reference gets its ``<field>.source`` constant (under the same ``when``)."""
    dim = space[key]
    resolved = dim.dim if isinstance(dim, Conditional) else dim
    if isinstance(resolved, Resolved):
        source = Fixed(resolved.source)
        space[key + SOURCE_SUFFIX] = Conditional(source, dim.conditions) if isinstance(dim, Conditional) else source


def chained_params(study: Study) -> Dict[str, str]:
    """The launch run's params of a resolved study: ``<arm>.<field>`` (the value) and
    ``<arm>.<field>.source`` (``<study>/<run_id>``, or the reference) for every chained constant;
    ``<arm>.<field>.<i>`` and ``<arm>.<field>.<i>.source`` for the i-th value of a choice that held a
    reference; ``{}`` if there is none."""
    out: Dict[str, str] = {}
    for arm in study.arms:
        for key, dim in arm.dims.items():
            dim = dim.dim if isinstance(dim, Conditional) else dim
            if isinstance(dim, Resolved):
                out[f"{arm.name}.{key}"] = str(dim.value)
                out[f"{arm.name}.{key}{SOURCE_SUFFIX}"] = dim.source
            elif isinstance(dim, ResolvedChoice):
                for i, (value, source) in enumerate(zip(dim.values, dim.sources)):
                    if source:
                        out[f"{arm.name}.{key}.{i}"] = str(value)
                        out[f"{arm.name}.{key}.{i}{SOURCE_SUFFIX}"] = source
    return out


def describe_chained(study: Study, tracking_uri: str) -> List[str]:
    """One line per chained value of ``study`` for ``flatlab run --dry-run``: what would be resolved at
    launch and its value now, or why it cannot be resolved now. Never raises for a missing store or
    source."""
    lines: List[str] = []
    for arm in study.arms:
        declared = declared_fields(study, arm)
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
    for arm, key, ref in _chained_references(study):
        owner = f"arm {arm.name!r}" if arm is not None else "workload_params"
        head = f"chained: {owner}, {key} = {ref}, resolved at launch"
        try:
            lines.append(f"{head}; now {resolve_reference(ref, tracking_uri)}")
        except ConfigError as exc:
            lines.append(f"{head}; not available now: {exc}")
    return lines
