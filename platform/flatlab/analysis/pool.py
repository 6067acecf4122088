"""Tuning curves of a study whose search is a pool of independent trials (``searcher="random"``,
``scheduler="fifo"``): per arm, what a search of n of its trials finds, for n = 1..N.

* the validation metric: the median tuning curve with its simultaneous band (Lourie et al. 2024, by
  ``opda``) and the unbiased expected best of n (Tang et al. 2020);
* the test metric and each flatness measure of the trial a search of n picks by validation (Sivaprasad
  et al., ICML 2020, every subset counted exactly): median and central interval, and the probability
  that the arm's pick beats the reference arm's (:mod:`flatlab.analysis.tuning_curves`).

The pool is every completed search trial of the arm (all tunings; the final stage excluded). The
estimators assume i.i.d. trials: a TPE search (each draw depends on earlier ones) or ASHA (a trial is
stopped depending on others) is refused by :func:`check_independent`, which says what to run instead.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from flatlab.analysis.compare.statistics import CONFIDENCE
from flatlab.analysis.compare.table import higher_is_better, quantity_support
from flatlab.analysis.plot_axes import integer_ticks, plain_numbers
from flatlab.analysis.sample import AT_TARGET_PREFIX, FLAT_PREFIX, Sample
from flatlab.analysis.selection import reference_arm
from flatlab.analysis.tuning_curves import ChosenTrial, TuningCurve, chosen_trial, expected_best, median_tuning_curve
from flatlab.analysis.tuning_curves import win_probability as _win
from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.ranges import NO_RANGES, Ranges

pd = lazy("pandas")
mpl_figure = lazy("matplotlib.figure")

AUXILIARY = ("_stderr", "_clean")
CAPTION = (
    "Validation metric: the median tuning curve (median of the best of n trials) with its {confidence} "
    "simultaneous band (opda) and Tang et al.'s unbiased expected best of n; other quantities: the trial a "
    "search of n picks by validation, its mean, median and the central {confidence} of picks over every subset "
    "of n, and p_beats_{reference}: the probability that the arm's pick beats {reference}'s at that n."
)


@dataclass(frozen=True)
class ArmPool:
    """One arm's pool and its curves.

    Attributes:
        arm: the arm; ``trials``: its completed search trials (the pool, N).
        curve: the validation metric's median tuning curve and band at n = 1..N.
        expected: Tang's expected best validation value at n = 1..N.
        chosen: per quantity, the chosen trial's distribution at n = 1..N.
        wins: per quantity, the probability that this arm's pick beats the reference's at n (NaN for the
            reference arm, and beyond the reference's pool size).
    """

    arm: str
    trials: int
    curve: TuningCurve
    expected: Tuple[float, ...]
    chosen: Dict[str, Tuple[ChosenTrial, ...]]
    wins: Dict[str, Tuple[float, ...]]


@dataclass(frozen=True)
class PoolCurves:
    """A study's tuning curves (:func:`pool_curves`): ``metric``/``mode`` the validation metric,
    ``quantities`` the test metric and the flatness measures, ``reference`` the arm each pick is
    compared with, ``arms`` per arm, ``notes`` what was left out."""

    study: str
    metric: str
    mode: str
    reference: str
    confidence: float
    quantities: Tuple[str, ...]
    higher_is_better: Dict[str, bool]
    arms: Dict[str, ArmPool]
    notes: Tuple[str, ...] = ()


def check_independent(sample: Sample) -> None:
    """Refuse a pool that is not i.i.d. trials.

    Raises:
        ConfigError: the launch's searcher is not ``random`` or its scheduler not ``fifo`` (read from the
            launch), or some search trial was pruned; the message says why and what to run instead.
    """
    info = sample.info
    searcher, scheduler = info.searcher or "unknown", (info.scheduler or "unknown").split(" ")[0]
    search = sample.search().trials
    pruned = int((search["outcome"] == "pruned").sum()) if "outcome" in search.columns else 0
    if searcher == "random" and scheduler == "fifo" and not pruned:
        return
    why = f"searcher={searcher!r}, scheduler={scheduler!r}" + (f", {pruned} pruned trials" if pruned else "")
    raise ConfigError(
        f"study {info.name!r}: tuning curves need a pool of independent trials run to the end ({why}); TPE draws "
        "depend on earlier trials and ASHA stops trials depending on others, so the estimators' i.i.d. assumption "
        "fails. Run a pool with Study(searcher='random', scheduler='fifo'), or compare independent tunings of this "
        "study instead (`flatlab run FILE --tunings 3`, then `flatlab compare STUDY`)"
    )


def pool_curves(
    data: Any,
    *,
    reference: Optional[str] = None,
    measures: Optional[Sequence[str]] = None,
    confidence: float = CONFIDENCE,
    test_metric: Optional[str] = None,
    ranges: Ranges = NO_RANGES,
) -> PoolCurves:
    """The tuning curves of every arm of a pool study (module docstring).

    Args:
        data: a :class:`~flatlab.analysis.sample.Sample` (or ``trials_frame`` table) of a random/FIFO study.
        reference: the arm picks are compared with (default :func:`~flatlab.analysis.selection.reference_arm`).
        measures: the flatness quantities (default every ``flat/*`` recorded, auxiliary ones excluded).
        confidence: of the bands and intervals.
        test_metric: default the sample's (``test/accuracy`` ...).
        ranges: the values the validation metric can take, the tuning curves' support
            (:func:`~flatlab.analysis.compare.table.quantity_support`).
    Raises:
        ConfigError: as :func:`check_independent`; no completed search trial; an unknown reference arm.
    """
    sample = Sample.of(data)
    check_independent(sample)
    pool = sample.search().completed()
    info = pool.info
    if pool.empty:
        raise ConfigError(f"study {info.name!r}: no completed search trial: no tuning curve")
    test = test_metric or pool.test_metric()
    flats = list(measures) if measures else [m for m in pool.measures(FLAT_PREFIX) if not m.endswith(AUXILIARY)]
    quantities = tuple(q for q in [test, *flats] if q)
    arms = pool.arms
    reference = reference or reference_arm(arms, info.reference_arm)
    if reference not in arms:
        raise ConfigError(f"reference arm {reference!r} has no completed trial; arms: {', '.join(arms)}")
    better = {q: higher_is_better(q, info.metric, info.mode) for q in quantities}
    per_arm = {a: _arm_chosen(pool, a, quantities, confidence) for a in arms}
    out, ties = {}, []
    for arm in arms:
        validation, chosen, _ = per_arm[arm]
        wins = {q: _wins(chosen[q], per_arm[reference][1][q], better[q]) for q in quantities}
        if arm == reference:
            wins = {q: tuple(math.nan for _ in chosen[q]) for q in quantities}
        curve, tied = _curve(validation, info, confidence, ranges)
        if tied:
            ties.append(
                f"{arm}: tied {info.metric} values; the band is exact for a continuous metric, approximate here"
            )
        expected = tuple(float(v) for v in expected_best(validation, higher_is_better=info.mode == "max"))
        out[arm] = ArmPool(arm, len(validation), curve, expected, chosen, wins)
    notes = tuple(n for a in arms for n in per_arm[a][2]) + tuple(ties)
    return PoolCurves(info.name, info.metric, info.mode, reference, confidence, quantities, better, out, notes)


def _arm_chosen(pool: Sample, arm: str, quantities: Sequence[str], confidence: float):
    """``(validation values, {quantity: chosen trial per n}, notes)`` of one arm's pool; a trial without a
    finite value of a quantity is left out of that quantity's pool (noted)."""
    rows = pool.trials[pool.trials["arm"] == arm]
    validation = rows[pool.info.metric].astype(float).to_numpy()
    chosen, notes = {}, []
    for q in quantities:
        values = rows[q].astype(float).to_numpy() if q in rows.columns else np.full(len(rows), np.nan)
        keep = np.isfinite(validation) & np.isfinite(values)
        if not keep.all():
            notes.append(f"{arm}: {int((~keep).sum())} of {len(rows)} trials without {q}, left out of its pool")
        v, x = validation[keep], values[keep]
        chosen[q] = tuple(
            chosen_trial(v, x, n, validation_higher_is_better=pool.info.mode == "max", confidence=confidence)
            for n in range(1, v.size + 1)
        )
    return validation[np.isfinite(validation)], chosen, notes


def _wins(mine: Sequence[ChosenTrial], ref: Sequence[ChosenTrial], better: bool) -> Tuple[float, ...]:
    """P(this arm's pick beats the reference's) at each budget n both pools allow (NaN beyond)."""
    return tuple(_win(a, ref[i], higher_is_better=better) if i < len(ref) else math.nan for i, a in enumerate(mine))


def _curve(validation: np.ndarray, info: Any, confidence: float, ranges: Ranges) -> Tuple[TuningCurve, bool]:
    """The validation metric's median tuning curve and band, and whether the pool has tied values (opda
    warns then: its band's coverage is exact for a continuous metric; an accuracy over a finite split ties)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", RuntimeWarning)
        curve = median_tuning_curve(
            validation,
            higher_is_better=info.mode == "max",
            support=_support(info.metric, ranges),
            confidence=confidence,
        )
    tied = any("Duplicates" in str(w.message) for w in seen) or len(set(validation.tolist())) < validation.size
    return curve, tied


def _support(metric: str, ranges: Ranges) -> Tuple[float, float]:
    bounds = quantity_support(metric, ranges)
    return (-math.inf, math.inf) if bounds is None else (float(bounds[0]), float(bounds[1]))


def curves_frame(curves: PoolCurves, quantity: str) -> Any:
    """One quantity's curves as a table (the CSV of ``--tuning-curves``), one row per (arm, n): for the
    validation metric ``median``, ``lower``, ``upper`` (the band) and ``expected_best``; for any other
    quantity the chosen trial's ``mean``, ``median``, ``low``, ``high`` and ``p_beats_<reference>``.

    Raises:
        ConfigError: ``quantity`` is neither the validation metric nor one of the quantities.
    """
    if quantity != curves.metric and quantity not in curves.quantities:
        raise ConfigError(f"no curves of {quantity!r}; quantities: {', '.join((curves.metric, *curves.quantities))}")
    rows: List[Dict[str, Any]] = []
    for arm, a in curves.arms.items():
        if quantity == curves.metric:
            for i, n in enumerate(a.curve.ns):
                rows.append(
                    dict(arm=arm, n=n, median=a.curve.median[i], lower=a.curve.lower[i], upper=a.curve.upper[i])
                )
                rows[-1]["expected_best"] = a.expected[i]
            continue
        for c, win in zip(a.chosen[quantity], a.wins[quantity]):
            rows.append(dict(arm=arm, n=c.n, mean=c.mean, median=c.median, low=c.low, high=c.high))
            rows[-1][f"p_beats_{curves.reference}"] = win
    return pd.DataFrame(rows)


def plot_curves(curves: PoolCurves, quantity: str, path: Path) -> Path:
    """Save a PNG of one quantity's curves against the number of trials n, one line per arm: the median
    curve with its band shaded (validation metric; Tang's expected best dashed), or the chosen trial's
    median with its central interval shaded (any other quantity)."""
    table = curves_frame(curves, quantity)
    fig = mpl_figure.Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    low, high = ("lower", "upper") if quantity == curves.metric else ("low", "high")
    for i, (arm, rows) in enumerate(table.groupby("arm", sort=False)):
        color = f"C{i % 10}"
        finite = rows[np.isfinite(rows[low]) & np.isfinite(rows[high])]
        ax.fill_between(finite["n"], finite[low], finite[high], color=color, alpha=0.15, linewidth=0)
        ax.plot(rows["n"], rows["median"], color=color, label=arm, marker="." if len(rows) < 15 else None)
        if quantity == curves.metric:
            ax.plot(rows["n"], rows["expected_best"], "--", color=color, linewidth=1)
    _limit_y(ax, table, low, high)
    ax.set_xlabel("trials in the search (n)")
    ax.set_ylabel(quantity)
    what = (
        f"median tuning curve, {curves.confidence:.0%} band; dashed: expected best"
        if quantity == curves.metric
        else f"validation-chosen trial: median, {curves.confidence:.0%} of picks"
    )
    flat = " (lower = flatter)" if quantity.startswith((FLAT_PREFIX, AT_TARGET_PREFIX)) else ""
    ax.set_title(f"{curves.study}: {quantity}{flat}\n{what}", fontsize="small")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    integer_ticks(ax.xaxis)
    plain_numbers(ax)
    fig.savefig(path, dpi=110)
    return Path(path)


def _limit_y(ax: Any, table: Any, low: str, high: str) -> None:
    """The y range of the curves and of the band's finite edges inside the data's span: a band edge that
    reaches the metric's bound (where the pool says nothing more, e.g. accuracy 1) leaves the plot at its
    edge instead of flattening every curve."""
    values = table[["median", low, high]].to_numpy(dtype=float)
    span = table["median"].to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    if not finite.size:
        return
    pad = 0.5 * (span.max() - span.min()) + 1e-12
    top = min(finite.max(), span.max() + pad)
    bottom = max(finite.min(), span.min() - pad)
    ax.set_ylim(bottom - 0.05 * (top - bottom), top + 0.05 * (top - bottom))


def write_curves(curves: PoolCurves, directory: Path) -> List[Path]:
    """Write ``tuning_curve_<quantity>.csv`` and ``.png`` for the validation metric and every quantity
    into ``directory`` (made if missing); returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for q in (curves.metric, *curves.quantities):
        stem = "tuning_curve_" + q.replace("/", "_")
        curves_frame(curves, q).to_csv(directory / f"{stem}.csv", index=False)
        out += [directory / f"{stem}.csv", plot_curves(curves, q, directory / f"{stem}.png")]
    return out
