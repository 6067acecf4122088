"""One summary over several studies that share arms (``flatlab compare STUDY_A STUDY_B ...``).

Each study is one workload. From each study's paper table (:func:`~flatlab.analysis.compare.table.compare_table`:
its final seeds, or each arm's best configuration, by the rules of :mod:`flatlab.analysis.selection`)
only the means over seeds are kept, in a plain table (:func:`workload_table`: one row per workload,
arm and quantity). :func:`summarize` then gives, per arm and workload:

* ``rank``: by the test metric's mean among the arms of that workload with a value (1 = best, by the
  metric's direction; tied arms share the best of their ranks: 1, 2, 2, 4);
* ``diff`` and ``ratio``: the test metric's mean minus, and over, the reference arm's;
* ``<flat/m> ratio``: each flatness measure recorded in every workload, the arm's mean over the
  reference arm's (< 1: flatter than the reference); in a workload whose study measured at a matched
  training loss, its ``flat_at_target/m`` (the IRE paper's comparison), else its ``flat/m``;
* ``error`` and ``r``: the test error and its performance ratio to the workload's best arm
  (:mod:`~flatlab.analysis.compare.profiles`);

and per arm, ``average``: the mean of its test-metric means over the workloads (the AVG column of the
TSAM paper's GLUE table), defined where the arm has a value in every workload and every workload's
metric has the same direction (an average of accuracies and losses means nothing).

A ratio is defined where both means are positive (else NaN, shown ``-``). An arm absent from a study
(or without a value there) shows NaN/``-`` for that workload and counts as not solved (``r = inf``) in
the profiles. These are differences between means over seeds, not tests: ``flatlab compare STUDY``
has each workload's paired tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from flatlab.analysis.compare.profiles import error_matrix, performance_ratios, rho
from flatlab.analysis.compare.statistics import finite
from flatlab.analysis.compare.table import AT_TARGET_PREFIX, FLAT_PREFIX, Comparison, compare_table
from flatlab.analysis.selection import reference_arm
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")

COLUMNS = ("workload", "arm", "quantity", "mean", "higher_is_better", "test_metric")
"""The plain table's columns: one row per (workload, arm, quantity); ``test_metric`` marks the rows of
the workload's test metric."""


@dataclass(frozen=True)
class MultiSummary:
    """The summary of several workloads, as computed by :func:`summarize`.

    Attributes:
        reference: the arm every other is related to (in every workload).
        workloads: in the order given.
        arms: the reference first, then the others alphabetically.
        metrics: each workload's test metric.
        measures: the ``flat/*`` measures recorded in every workload.
        frame: one row per (arm, workload), arm-major: ``arm``, ``workload``, ``metric``, ``mean``,
            ``rank``, ``ranked`` (arms with a value in the workload), ``diff``, ``ratio``, ``error``,
            ``r`` and one ``<measure> ratio`` column per shared measure; NaN where the arm has no value.
        ratios: the performance ratios (arms × workloads; ``inf``: not solved).
        averages: arm -> the mean of its test-metric means over the workloads (NaN where it lacks one;
            empty where the workloads' metrics differ in direction).
        notes: what is missing and why.
    """

    reference: str
    workloads: Tuple[str, ...]
    arms: Tuple[str, ...]
    metrics: Mapping[str, str]
    measures: Tuple[str, ...]
    frame: Any = field(repr=False)
    ratios: Any = field(repr=False)
    averages: Mapping[str, float] = field(default_factory=dict)
    notes: Tuple[str, ...] = ()


def workload_table(comparisons: Mapping[str, Comparison]):
    """The plain table of several studies' paper tables (``{workload: Comparison}``): one row per
    workload, arm and quantity with the mean over seeds (NaN without a value), the quantity's
    direction and whether it is the workload's test metric (:data:`COLUMNS`)."""
    rows = [
        {
            "workload": w,
            "arm": r.arm,
            "quantity": r.quantity,
            "mean": r.summary.mean,
            "higher_is_better": bool(c.higher_is_better[r.quantity]),
            "test_metric": r.quantity == c.metric,
        }
        for w, c in comparisons.items()
        for r in c.rows
    ]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def summarize(table, *, reference: Optional[str] = None, recorded: Optional[str] = None) -> MultiSummary:
    """The summary over the workloads of a plain table (see the module docstring).

    Args:
        table: :data:`COLUMNS`, one row per (workload, arm, quantity); each workload has exactly one
            test-metric quantity.
        reference: the arm to relate every other to; must be in every workload.
        recorded: the studies' own reference arm, used by default where every workload has it
            (:func:`flatlab.analysis.selection.reference_arm` of the arms in every workload).
    Returns:
        A :class:`MultiSummary`.
    Raises:
        ConfigError: missing columns; a workload without (or with two) test metrics; no arm in
            every workload; ``reference`` not in every workload; a metric that gives no error
            (:func:`~flatlab.analysis.compare.profiles.error_from_metric`).
    """
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise ConfigError(f"the workload table lacks column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}")
    if table.empty:
        raise ConfigError("no workloads to summarize")
    workloads = list(dict.fromkeys(table["workload"]))
    metrics = _test_metrics(table, workloads)
    arms_in = {w: set(table.loc[table["workload"] == w, "arm"]) for w in workloads}
    common = sorted(set.intersection(*arms_in.values()))
    if not common:
        listed = "; ".join(f"{w}: {', '.join(sorted(a))}" for w, a in arms_in.items())
        raise ConfigError(f"the studies share no arm, so there is no reference to relate them to; arms of {listed}")
    if reference is not None and reference not in common:
        raise ConfigError(
            f"reference arm {reference!r} is not in every study; arms in all of them: {', '.join(common)}"
        )
    reference = reference or reference_arm(common, recorded)
    arms = [reference] + sorted(set(table["arm"]) - {reference})
    source, measures, notes = _measure_sources(table, workloads)
    means = table.set_index(["workload", "arm", "quantity"])["mean"]
    means = means[~means.index.duplicated(keep="last")]

    def mean(w: str, arm: str, q: str) -> float:
        value = means.get((w, arm, q), float("nan"))
        return float(value) if finite(value) else float("nan")

    errors = error_matrix(table).reindex(index=arms, columns=workloads)
    ratios = performance_ratios(errors)
    rows = []
    for arm in arms:
        for w in workloads:
            row = _row(table, mean, arm, w, metrics[w], reference, arms_in[w], errors, ratios)
            for f in measures:
                q_f = source[w][f]
                row[f"{f} ratio"] = _ratio(mean(w, arm, q_f), mean(w, reference, q_f))
            rows.append(row)
        absent = [w for w in workloads if arm not in arms_in[w]]
        if absent:
            notes.append(f"{arm}: not in {', '.join(absent)} ('-'; counted as not solved, r = inf, in the profiles).")
        novalue = [w for w in workloads if arm in arms_in[w] and not finite(mean(w, arm, metrics[w]))]
        if novalue:
            notes.append(f"{arm}: no value of the test metric in {', '.join(novalue)} (counted as not solved).")
    frame = pd.DataFrame(rows)
    frame["rank"] = frame["rank"].astype("Int64")
    averages = _averages(table, frame, arms, metrics, notes)
    return MultiSummary(
        reference, tuple(workloads), tuple(arms), metrics, tuple(measures), frame, ratios, averages, tuple(notes)
    )


def _averages(table, frame, arms: Sequence[str], metrics: Mapping[str, str], notes: List[str]) -> Dict[str, float]:
    """arm -> the mean over the workloads of its test-metric means (NaN where one is missing); ``{}``, with a
    note, where the workloads' test metrics differ in direction."""
    tests = table[table["test_metric"].astype(bool)]
    if tests["higher_is_better"].astype(bool).nunique() > 1:
        notes.append("no average over the workloads: their test metrics differ in direction.")
        return {}
    out = {}
    for arm in arms:
        means = frame.loc[frame["arm"] == arm, "mean"]
        out[arm] = float(means.mean()) if len(means) == len(metrics) and means.notna().all() else float("nan")
    return out


def _test_metrics(table, workloads: Sequence[str]) -> Dict[str, str]:
    """workload -> its one test-metric quantity.

    Raises:
        ConfigError: a workload with none, or several.
    """
    metrics = {}
    for w in workloads:
        named = list(dict.fromkeys(table.loc[(table["workload"] == w) & table["test_metric"].astype(bool), "quantity"]))
        if len(named) != 1:
            raise ConfigError(
                f"workload {w!r} has {len(named)} test metrics ({', '.join(named) or 'none'}); expected one"
            )
        metrics[w] = named[0]
    return metrics


def _measure_sources(table, workloads: Sequence[str]) -> Tuple[Dict[str, Dict[str, str]], List[str], List[str]]:
    """``(source, measures, notes)``: per workload, measure ``flat/<m>`` -> the quantity that gives it, at
    the matched training loss where the table has it (``flat_at_target/*``, the IRE paper's comparison),
    else its ``flat/*`` (a study stopping at the target where every seed reached it); the measures every
    workload has; notes on where flatness was taken and on measures not in every study."""
    source: Dict[str, Dict[str, str]] = {}
    for w in workloads:
        recorded_w = set(table.loc[table["workload"] == w, "quantity"])
        source[w] = {FLAT_PREFIX + q[len(FLAT_PREFIX) :]: q for q in recorded_w if q.startswith(FLAT_PREFIX)}
        source[w].update(
            {FLAT_PREFIX + q[len(AT_TARGET_PREFIX) :]: q for q in recorded_w if q.startswith(AT_TARGET_PREFIX)}
        )
    flat = {w: set(source[w]) for w in workloads}
    measures = sorted(set.intersection(*flat.values()))
    notes: List[str] = []
    at_target = [w for w in workloads if any(source[w][m].startswith(AT_TARGET_PREFIX) for m in measures)]
    if at_target:
        notes.append(
            f"flatness in {', '.join(at_target)}: at the matched training loss ({AT_TARGET_PREFIX}*), "
            "not at the end of training."
        )
    partial = sorted(set.union(*flat.values()) - set(measures))
    if partial:
        notes.append(
            "not in every study, so not summarized: "
            + "; ".join(f"{m} (only {', '.join(w for w in workloads if m in flat[w])})" for m in partial)
            + "."
        )
    return source, measures, notes


def _row(table, mean, arm: str, w: str, q: str, reference: str, arms_in_w, errors, ratios) -> Dict[str, Any]:
    """The summary row of ``arm`` on workload ``w`` (test metric ``q``): its mean, its rank among the arms
    with a value, its difference and ratio to ``reference``, its error and performance ratio."""
    higher = bool(table.loc[(table["workload"] == w) & (table["quantity"] == q), "higher_is_better"].iloc[0])
    values = {a: mean(w, a, q) for a in arms_in_w}
    ranked = {a: v for a, v in values.items() if finite(v)}
    m, ref = mean(w, arm, q), mean(w, reference, q)
    rank = (1 + sum((v > m) if higher else (v < m) for v in ranked.values())) if finite(m) else float("nan")
    return {
        "arm": arm,
        "workload": w,
        "metric": q,
        "mean": m,
        "rank": rank,
        "ranked": len(ranked),
        "diff": m - ref,
        "ratio": _ratio(m, ref),
        "error": float(errors.loc[arm, w]),
        "r": float(ratios.loc[arm, w]),
    }


def _ratio(value: float, reference: float) -> float:
    """``value / reference`` where both are positive, else NaN (a ratio of a sign change or of zero
    says nothing)."""
    if finite(value) and finite(reference) and value > 0 and reference > 0:
        return value / reference
    return float("nan")


def summary_from_frames(
    frames: Mapping[str, Any], *, reference: Optional[str] = None, metric: Optional[str] = None, rank_by: str = "final"
) -> MultiSummary:
    """The summary of several studies' ``trials_frame`` tables (``{study: frame}``, each study one
    workload): each study's :func:`~flatlab.analysis.compare.table.compare_table` (its own default
    reference, ``metric`` and ``rank_by`` for all), then :func:`summarize`; by default the reference is
    the studies' own where they all record the same one. Each study's
    :attr:`~flatlab.analysis.compare.table.Comparison.warnings` (seeds that missed its training-loss
    target) come first in the notes, prefixed with the study's name.

    Raises:
        ConfigError: fewer than two studies; as :func:`compare_table` for any study (prefixed with
            its name) and as :func:`summarize`.
    """
    if len(frames) < 2:
        raise ConfigError(f"a summary over workloads needs at least two studies; got {len(frames)}")
    comparisons = {}
    for name, df in frames.items():
        try:
            comparisons[name] = compare_table(df, metric=metric, study=name, rank_by=rank_by)
        except ConfigError as exc:
            raise ConfigError(f"study {name}: {exc}") from exc
    references = {c.reference for c in comparisons.values()}
    recorded = references.pop() if len(references) == 1 else None
    summary = summarize(workload_table(comparisons), reference=reference, recorded=recorded)
    warned = tuple(f"{name}: {line}" for name, c in comparisons.items() for line in c.warnings)
    return replace(summary, notes=warned + summary.notes) if warned else summary


def wins(summary: MultiSummary):
    """``rho_a(1)`` of each arm: the share of workloads where it has the lowest test error (ties count
    for each tied arm)."""
    return rho(summary.ratios, 1.0)
