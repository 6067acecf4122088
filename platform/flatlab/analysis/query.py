"""Selecting, ranking and shaping a study's trials table: the filters of ``flatlab results`` and
:func:`flatlab.results`.

The order of operations (one rule for the CLI and the Python API):

1. ``tuning`` and ``arms``: keep the trials of this independent tuning and of these arms;
2. ``metric``/``mode``: rank by this metric instead of the study's (completed trials still first,
   :func:`flatlab.analysis.results.sort_trials`);
3. ``filter``: a pandas :meth:`DataFrame.query` expression over the trial rows;
4. ``by_config`` then ``best`` on what is left: :func:`~flatlab.analysis.results.by_config`, and each
   arm's answer by the rules of :mod:`flatlab.analysis.selection`: its best trial
   (:func:`~flatlab.analysis.selection.best_trial_rows`) or, with ``by_config``, its best
   configuration's row (:func:`~flatlab.analysis.results.chosen_configurations`); ``rank_by`` chooses
   how a trial scores (``final``, the rule, or ``best-epoch``);
5. ``sort`` then ``columns`` on the final table.
"""

from __future__ import annotations

import re
from typing import Iterable, List, Optional, Sequence, Union

from flatlab.analysis import results as res
from flatlab.analysis import selection
from flatlab.analysis.results import sort_trials
from flatlab.errors import ConfigError, did_you_mean

MODES = ("min", "max")

# Metric names whose smaller values are better when --metric is given without --mode.
_MIN_PATTERN = re.compile(r"(^|/)(flat/|time/)|loss|perplexity|_to_target$|error")

BACKTICK_HINT = "column names with '/' or '.' need backticks, e.g. \"`val/accuracy` > 0.9 and `param.lr` < 0.1\""


def infer_mode(metric: str) -> str:
    """``"min"`` for metrics where smaller is better, else ``"max"``.

    Smaller is better for: flatness measures (``flat/*``), times (``time/*``), losses (any name with
    ``loss``), perplexities, ``train/steps_to_target`` and ``train/epochs_to_target``, and error rates
    (names with ``error``). Everything else (accuracies, F1, correlations, ``train/speedup``) is ``max``.
    """
    return "min" if _MIN_PATTERN.search(metric) else "max"


def as_list(value: Union[None, str, Iterable[str]], split_commas: bool = False) -> List[str]:
    """``None`` -> ``[]``; a string -> ``[it]`` (or its comma-separated items); an iterable -> a list."""
    if value is None:
        return []
    if isinstance(value, str):
        items = value.split(",") if split_commas else [value]
    else:
        items = [item for v in value for item in (v.split(",") if split_commas else [v])]
    return [i.strip() for i in items if i.strip()]


def select_arms(df, arms: Sequence[str]):
    """The rows of ``df`` whose ``arm`` is one of ``arms`` (all rows when ``arms`` is empty).

    Raises:
        ConfigError: an arm that the table does not have (the message lists the study's arms).
    """
    if not arms or df.empty:
        return df
    known = list(dict.fromkeys(df["arm"]))
    missing = [a for a in arms if a not in known]
    if missing:
        hint = did_you_mean(missing[0], known)
        raise ConfigError(
            f"--arm {', '.join(missing)}: no such arm{hint}; arms of this study: {', '.join(sorted(known))}"
        )
    return df[df["arm"].isin(arms)].reset_index(drop=True)


def rank_by_metric(df, metric: Optional[str], mode: Optional[str]):
    """``df`` ranked by ``metric`` (completed trials first; see :func:`sort_trials`), its ``attrs``
    updated so that ``by_config``, ``best`` and the table follow the same metric.

    ``metric`` ``None`` keeps the study's metric (and ``mode``, when given, overrides the study's
    direction); ``mode`` ``None`` with a ``metric`` is the study's mode for the study's own metric,
    else :func:`infer_mode`.

    Raises:
        ConfigError: ``mode`` not ``min``/``max``; ``metric`` not a column of the table (the message
            lists the metric columns).
    """
    if mode is not None and mode not in MODES:
        raise ConfigError(f"--mode {mode!r} is not supported; expected one of {', '.join(MODES)}")
    if (metric is None and mode is None) or df.empty:
        return df
    study_metric, study_mode = df.attrs.get("metric", "val/accuracy"), df.attrs.get("mode", "max")
    metric = metric or study_metric
    if metric not in df.columns:
        metrics = metric_columns(df)
        raise ConfigError(
            f"--metric {metric!r} is not a metric of this "
            f"study{did_you_mean(metric, metrics)}; its metrics: {', '.join(metrics)}"
        )
    mode = mode or (study_mode if metric == study_metric else infer_mode(metric))
    out = sort_trials(df, metric, mode)
    out.attrs.update(df.attrs)
    out.attrs["metric"], out.attrs["mode"] = metric, mode
    return out


def metric_columns(df) -> List[str]:
    """The numeric result columns of a trials table (metrics, not params, ids or times)."""
    skip = {"epochs", "seed", "start_time", "end_time"}
    return [c for c in df.select_dtypes("number").columns if not c.startswith("param.") and c not in skip]


def apply_filter(df, expression: Optional[str]):
    """The rows of ``df`` for which the pandas :meth:`DataFrame.query` ``expression`` holds.

    Column names that are not Python identifiers (``val/accuracy``, ``param.lr``) go in backticks:
    ``"outcome == 'completed' and `param.lr` < 0.1"``. The ``attrs`` (metric, mode) are kept.

    Raises:
        ConfigError: an expression pandas cannot evaluate, or one that is not true/false per row;
            one line naming the expression and pandas' reason, with the backtick rule.
    """
    if not expression or df.empty:
        return df
    try:
        keep = df.eval(expression)
    except Exception as exc:  # noqa: BLE001 - pandas raises SyntaxError, UndefinedVariableError, KeyError, TypeError ...
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(f"--filter {expression!r}: {type(exc).__name__}: {reason}; {BACKTICK_HINT}") from None
    if not (hasattr(keep, "dtype") and getattr(keep, "ndim", 0) == 1 and str(keep.dtype) in ("bool", "boolean")):
        raise ConfigError(f"--filter {expression!r}: not a condition (true or false for each trial); {BACKTICK_HINT}")
    out = df[keep.fillna(False).astype(bool)].reset_index(drop=True)
    out.attrs.update(df.attrs)
    return out


def sort_by(df, keys: Sequence[str]):
    """``df`` sorted by ``keys``: ``"col"`` ascending, ``"-col"`` descending (``"+col"`` ascending too);
    the first key first. Missing values go last; ties keep the previous (best-first) order.

    Raises:
        ConfigError: a key that is not a column (the message lists the columns).
    """
    if not keys or df.empty:
        return df
    names, ascending = [], []
    for key in keys:
        desc = key.startswith("-")
        name = key[1:] if key[:1] in "+-" else key
        _check_columns(df, [name], "--sort")
        names.append(name)
        ascending.append(not desc)
    out = df.sort_values(names, ascending=ascending, na_position="last", kind="stable").reset_index(drop=True)
    out.attrs.update(df.attrs)
    return out


def select_columns(df, columns: Sequence[str]):
    """``df`` with only ``columns``, in that order (all of them when ``columns`` is empty). In a
    per-configuration table (:func:`flatlab.analysis.results.by_config`) a pooled metric's name, as its
    ``mean ± std`` header shows it, stands for its ``<name> mean`` and ``<name> std`` columns.

    Raises:
        ConfigError: unknown columns, all listed, with the available ones.
    """
    if not columns or df.empty:
        return df
    pooled = set(df.attrs.get("pooled", ()))
    columns = [
        part
        for name in columns
        for part in (
            [c for c in (f"{name} mean", f"{name} std") if c in df.columns]
            if name in pooled and name not in df.columns
            else [name]
        )
    ]
    _check_columns(df, columns, "--columns")
    out = df[list(columns)]
    out.attrs.update(df.attrs)
    return out


def _check_columns(df, names: Sequence[str], option: str) -> None:
    unknown = [n for n in names if n not in df.columns]
    if unknown:
        first = unknown[0]
        hint = (
            f" (did you mean 'param.{first}'?)"
            if f"param.{first}" in df.columns
            else did_you_mean(first, [str(c) for c in df.columns])
        )
        raise ConfigError(
            f"{option} {', '.join(unknown)}: no such column{hint}; available columns: {', '.join(map(str, df.columns))}"
        )


def select_tuning(df, tuning: Optional[int]):
    """The rows of ``df`` of independent tuning ``tuning`` (all rows when ``None``).

    Raises:
        ConfigError: the table has no such tuning (the message lists its tunings).
    """
    if tuning is None or df.empty:
        return df
    have = sorted(set(int(t) for t in df["tuning"])) if "tuning" in df.columns else [1]
    if int(tuning) not in have:
        raise ConfigError(f"--tuning {tuning}: no such tuning; tunings of this study: {', '.join(map(str, have))}")
    return df[df["tuning"] == int(tuning)].reset_index(drop=True) if "tuning" in df.columns else df


def select(
    df,
    *,
    tuning: Optional[int] = None,
    arms: Union[None, str, Iterable[str]] = None,
    metric: Optional[str] = None,
    mode: Optional[str] = None,
    filter: Optional[str] = None,  # noqa: A002 - the CLI's name
    best: bool = False,
    by_config: bool = False,
    sort: Union[None, str, Iterable[str]] = None,
    columns: Union[None, str, Iterable[str]] = None,
    rank_by: str = "final",
):
    """A :func:`~flatlab.tracking.trials.trials_frame` table with the filters of ``flatlab results``
    applied in the module's order (tuning, arms, metric, filter, by_config, best, sort, columns).

    ``arms``, ``sort`` and ``columns`` take a list or one string (``columns`` also a comma list). With
    ``best``, an arm none of whose search trials completed has no row.

    Raises:
        ConfigError: as :func:`select_arms`, :func:`rank_by_metric`, :func:`apply_filter`, :func:`sort_by` and
            :func:`select_columns` do; an unknown ``rank_by`` (``--rank-by``).
    """
    selection.value_column("", rank_by)  # an unknown --rank-by fails before anything else
    df = select_tuning(df, tuning)
    df = select_arms(df, as_list(arms, split_commas=True))
    df = rank_by_metric(df, metric, mode)
    df = apply_filter(df, filter)
    attrs = dict(df.attrs)
    if by_config:
        pooled = res.by_config(df, rank_by)
        attrs.update(pooled.attrs)
        df = res.chosen_configurations(pooled, df, rank_by) if best else pooled
    elif best:
        df = selection.best_trial_rows(df, rank_by)
    df.attrs.update(attrs)
    df = sort_by(df, as_list(sort))
    return select_columns(df, as_list(columns, split_commas=True))
