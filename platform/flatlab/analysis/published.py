"""flatlab's runs beside published learning curves (``flatlab curves``).

:func:`compare_curves` sets flatlab's per-epoch mean over seeds, with its t-interval
(:func:`flatlab.analysis.compare.t_estimate`), beside the published runs' mean and range of a curve set
(:mod:`flatlab.analysis.curve_sets`: the file and a study's declaration of it), and says per epoch and
metric whether flatlab's mean lies inside the published range ``[min, max]`` and whether its interval
overlaps that range. Everything here works on plain values and DataFrames;
:mod:`flatlab.reports.published_runs` reads flatlab's side from MLflow.

A published range of a few runs is narrow (two seeds give one ``[min, max]``): a flatlab mean outside
it is a reason to look, not by itself evidence of a difference. Where both sides have at least two
runs the interval overlap says more; :class:`CurveComparison.notes` says how many runs each side has.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from flatlab.analysis.compare import markdown_table, t_estimate
from flatlab.analysis.compare.statistics import clip
from flatlab.analysis.compare.table import quantity_support
from flatlab.analysis.console_table import make_table, print_table
from flatlab.analysis.curve_sets import CurveSet
from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.ranges import NO_RANGES, Ranges

pd = lazy("pandas")

CONFIDENCE = 0.95


@dataclass(frozen=True)
class CurveComparison:
    """flatlab's per-epoch values beside a curve set's, as computed by :func:`compare_curves`.

    Attributes:
        rows: one row per (arm, metric, epoch) that both sides have: ``arm``, ``curve``, ``metric``,
            ``epoch``, flatlab's ``n``, ``mean``, ``std``, ``ci_low``, ``ci_high`` (t-interval of the mean
            over seeds; NaN for n < 2), the published ``pub_n``, ``pub_mean``, ``pub_min``, ``pub_max``,
            ``where`` (``inside``: ``pub_min <= mean <= pub_max``, else ``above``/``below``) and
            ``overlap`` (True/False: the interval meets ``[pub_min, pub_max]``; None for n < 2).
        summary: one row per (arm, metric): ``arm``, ``curve``, ``metric``, ``epochs`` compared,
            ``inside``, ``above``, ``below`` counts, ``overlap`` (epochs whose interval overlaps),
            ``with_interval`` (epochs with an interval), ``outside_epochs`` (text: ``"below at 1, 2"``).
        notes: what the reader should know (few runs, arms without values, ...).
        curves: the :class:`CurveSet` compared with (title, citation, path).
        confidence: of the intervals.
    """

    rows: Any = field(repr=False)
    summary: Any = field(repr=False)
    notes: Tuple[str, ...]
    curves: CurveSet
    confidence: float


ROW_COLUMNS = [
    "arm",
    "curve",
    "metric",
    "epoch",
    "n",
    "mean",
    "std",
    "ci_low",
    "ci_high",
    "pub_n",
    "pub_mean",
    "pub_min",
    "pub_max",
    "where",
    "overlap",
]
SUMMARY_COLUMNS = [
    "arm",
    "curve",
    "metric",
    "epochs",
    "inside",
    "above",
    "below",
    "overlap",
    "with_interval",
    "outside_epochs",
]


def compare_curves(
    curves: CurveSet,
    flatlab,
    arms: Mapping[str, str],
    *,
    metrics: Optional[Sequence[str]] = None,
    epochs: Optional[Sequence[int]] = None,
    confidence: float = CONFIDENCE,
    ranges: Ranges = NO_RANGES,
) -> CurveComparison:
    """flatlab's per-epoch mean and t-interval beside each mapped curve's published runs.

    The interval is intersected with the values the metric can take, as ``flatlab compare`` does
    (:func:`flatlab.analysis.compare.table.quantity_support` with ``ranges``: accuracy in [0, 1], a loss in
    the workload's loss range): the same coverage, no impossible values such as an accuracy of 1.0001.

    Args:
        curves: the published curve set (:func:`flatlab.analysis.curve_sets.load_curves`).
        flatlab: a long DataFrame of flatlab's values, one row per (arm, seed, metric, epoch): columns
            ``arm``, ``seed``, ``metric`` (e.g. ``test/accuracy``), ``epoch`` (epochs trained, the MLflow
            step) and ``value``; the final-seed runs of each arm (:mod:`flatlab.reports.published_runs`).
        arms: arm name -> curve name.
        metrics: the flatlab metrics to compare (default: every metric the curve set maps to).
        epochs: only these epochs (default: every epoch both sides have).
        confidence: of flatlab's t-interval, in (0, 1).
        ranges: the values the metrics can take (:func:`flatlab.workloads.ranges.ranges_of` the study's
            workload); default: losses unbounded.
    Returns:
        A :class:`CurveComparison`.
    Raises:
        ConfigError: an unknown curve or metric (naming the valid ones), missing columns in ``flatlab``,
            ``confidence`` outside (0, 1).
    """
    metrics = _checked_metrics(curves, flatlab, arms, metrics, confidence)
    wanted = None if epochs is None else {int(e) for e in epochs}
    rows: List[Dict[str, Any]] = []
    notes: List[str] = []
    for arm, curve in arms.items():
        mine = flatlab[flatlab["arm"] == arm]
        if mine.empty:
            notes.append(f"arm {arm!r}: no flatlab values (no completed final-seed run recorded these metrics).")
            continue
        pub = curves.frame(curve)
        for metric in metrics:
            ours = mine[mine["metric"] == metric]
            theirs = pub[pub["metric"] == metric]
            common = sorted(set(ours["epoch"].astype(int)) & set(theirs["epoch"].astype(int)))
            if wanted is not None:
                common = [e for e in common if e in wanted]
            if not common:
                notes.append(f"arm {arm!r}, {metric}: no epoch with values on both sides.")
            for e in common:
                row = _epoch_row(ours, theirs, metric, e, confidence, ranges)
                if row is not None:
                    rows.append({"arm": arm, "curve": curve, "metric": metric, **row})
    frame = pd.DataFrame(rows, columns=ROW_COLUMNS)
    summary = _summarise(frame)
    if not frame.empty:
        pub_n, ours_n = int(frame["pub_n"].min()), int(frame["n"].min())
        if pub_n < 3:
            notes.append(
                f"the published range is over as few as {pub_n} run(s) per epoch: a flatlab mean outside it "
                f"is a reason to look, not by itself a difference."
            )
        if ours_n < 2:
            notes.append("some epochs have a single flatlab seed: no interval there (overlap '-').")
    return CurveComparison(frame, summary, tuple(notes), curves, confidence)


def _checked_metrics(curves: CurveSet, flatlab, arms: Mapping[str, str], metrics, confidence: float) -> List[str]:
    """The metrics :func:`compare_curves` compares (default: every one the curve set maps to), once its
    arguments are checked.

    Raises:
        ConfigError: as :func:`compare_curves`.
    """
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ConfigError(f"confidence={confidence!r}; expected a number in (0, 1), e.g. 0.95")
    missing = [c for c in ("arm", "seed", "metric", "epoch", "value") if c not in flatlab.columns]
    if missing:
        raise ConfigError(f"flatlab's values lack the column(s) {', '.join(missing)}")
    compared = curves.compared()
    metrics = list(metrics) if metrics else list(compared)
    unknown = [m for m in metrics if m not in compared]
    if unknown:
        raise ConfigError(
            f"metric(s) {', '.join(unknown)} not in {curves.path}; it maps {', '.join(compared) or 'none'}"
        )
    for arm, curve in arms.items():
        if curve not in curves.curves:
            raise ConfigError(
                f"arm {arm!r} -> curve {curve!r}: not in {curves.path}; curves: {', '.join(curves.curves)}"
            )
    return metrics


def _epoch_row(ours, theirs, metric: str, epoch: int, confidence: float, ranges: Ranges) -> Optional[Dict[str, Any]]:
    """One epoch of one arm and metric: flatlab's t-estimate over seeds (clipped to the metric's support)
    beside the published runs' mean and range; ``None`` where flatlab has only non-finite values (a
    diverged seed: nothing to place)."""
    est = clip(
        t_estimate(ours.loc[ours["epoch"] == epoch, "value"].tolist(), confidence),
        quantity_support(metric, ranges),
    )
    if est.n == 0:
        return None
    p = theirs.loc[theirs["epoch"] == epoch, "value"].astype(float)
    lo, hi = float(p.min()), float(p.max())
    where = "inside" if lo <= est.mean <= hi else "above" if est.mean > hi else "below"
    overlap = None if not math.isfinite(est.low) else bool(est.low <= hi and est.high >= lo)
    return {
        "epoch": epoch,
        "n": est.n,
        "mean": est.mean,
        "std": est.std,
        "ci_low": est.low,
        "ci_high": est.high,
        "pub_n": int(p.size),
        "pub_mean": float(p.mean()),
        "pub_min": lo,
        "pub_max": hi,
        "where": where,
        "overlap": overlap,
    }


def _summarise(frame):
    """The per-(arm, metric) summary of :func:`compare_curves`'s rows."""
    out = []
    for (arm, curve, metric), g in frame.groupby(["arm", "curve", "metric"], sort=False):
        outside = []
        for side in ("below", "above"):
            at = g.loc[g["where"] == side, "epoch"].tolist()
            if at:
                outside.append(f"{side} at {_epoch_list(at)}")
        has = g["overlap"].notna()
        out.append(
            {
                "arm": arm,
                "curve": curve,
                "metric": metric,
                "epochs": len(g),
                "inside": int((g["where"] == "inside").sum()),
                "above": int((g["where"] == "above").sum()),
                "below": int((g["where"] == "below").sum()),
                "overlap": int(g.loc[has, "overlap"].astype(bool).sum()),
                "with_interval": int(has.sum()),
                "outside_epochs": "; ".join(outside),
            }
        )
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def _epoch_list(epochs: Sequence[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    parts: List[str] = []
    start = prev = None
    for e in sorted(int(x) for x in epochs):
        if prev is not None and e == prev + 1:
            prev = e
            continue
        if start is not None:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = e
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------------
# Text


def shown_path(path: Any, cwd: Any = None) -> str:
    """A curve-set file's path as a comparison's text shows it (tables pasted into docs, the launch run's
    ``published/curves.md``): as a researcher finds the file in a checkout, never an absolute path (the
    launch records the file's absolute path, a folder of the machine, or of a checkout since deleted,
    where the study ran).

    The rule, on the path made absolute (``~`` expanded, a relative path joined to ``cwd``, symlinks
    resolved):

    1. under the working directory ``cwd`` (default: the current one): relative to it, e.g.
       ``studies/published/deepobs_fmnist_2c2d.json`` from a checkout's root;
    2. else from the nearest enclosing folder named ``studies`` on: the file's path in the checkout
       that holds the study's ``studies/`` tree, the same ``studies/published/deepobs_fmnist_2c2d.json``;
    3. else the file's name alone.

    Returns:
        A relative POSIX path.
    """
    here = Path(cwd if cwd is not None else os.getcwd()).expanduser().resolve()
    p = (here / Path(str(path)).expanduser()).resolve()  # a relative path: relative to cwd
    if p.is_relative_to(here):
        return p.relative_to(here).as_posix()
    return checkout_path(p)


def checkout_path(path: Any) -> str:
    """Where a curve-set file lies in the checkout that holds it: its path from the nearest enclosing
    folder named ``studies`` on (``studies/published/deepobs_fmnist_2c2d.json``), else its name alone.
    Rules 2 and 3 of :func:`shown_path`; ``flatlab curves`` looks for a recorded file that has gone at this
    path under the working directory (:func:`flatlab.reports.published_runs.reference_curves`).

    Args:
        path: an absolute path (a relative one is taken as it is spelled, not resolved).
    Returns:
        A relative POSIX path.
    """
    p = Path(str(path))
    folders = p.parts[:-1]
    if "studies" in folders:
        nearest = len(folders) - 1 - folders[::-1].index("studies")
        return Path(*p.parts[nearest:]).as_posix()
    return p.name


def _num(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4f}"


def row_cells(comparison: CurveComparison) -> Tuple[List[str], List[List[str]]]:
    """Headers and text cells of the per-epoch rows."""
    pct = f"{comparison.confidence:.0%}"
    head = [
        "arm (curve)",
        "metric",
        "epoch",
        "flatlab mean",
        f"flatlab {pct} CI",
        "n",
        "published mean",
        "published min-max",
        "runs",
        "flatlab mean vs range",
        "CI overlaps",
    ]
    body = []
    for r in comparison.rows.itertuples(index=False):
        ci = "-" if not math.isfinite(r.ci_low) else f"[{_num(r.ci_low)}, {_num(r.ci_high)}]"
        overlap = "-" if r.overlap is None or r.overlap != r.overlap else ("yes" if r.overlap else "NO")
        body.append(
            [
                f"{r.arm} ({r.curve})",
                r.metric,
                str(r.epoch),
                _num(r.mean),
                ci,
                str(r.n),
                _num(r.pub_mean),
                f"{_num(r.pub_min)}-{_num(r.pub_max)}",
                str(r.pub_n),
                r.where if r.where == "inside" else r.where.upper(),
                overlap,
            ]
        )
    return head, body


def summary_lines(comparison: CurveComparison) -> List[str]:
    """One line per (arm, metric): how many epochs fall inside the published range, where not, overlaps."""
    lines = []
    for s in comparison.summary.itertuples(index=False):
        text = f"{s.arm} vs {s.curve}, {s.metric}: inside the published range at {s.inside} of {s.epochs} epochs"
        text += f"; outside: {s.outside_epochs}" if s.outside_epochs else ""
        if s.with_interval:
            text += f"; flatlab's interval overlaps it at {s.overlap} of {s.with_interval}"
        lines.append(text + ".")
    return lines


def to_markdown(comparison: CurveComparison) -> str:
    """The per-epoch table as a pipe table, then the summary, the notes and the citation with the file's
    path as :func:`shown_path` shows it (machine-independent: the text is pasted into docs)."""
    head, body = row_cells(comparison)
    text = [f"### flatlab beside {comparison.curves.title}", "", markdown_table(head, body, left=2), ""]
    text += [f"- {line}" for line in summary_lines(comparison) + list(comparison.notes)]
    text += ["", f"Published: {comparison.curves.citation} ({shown_path(comparison.curves.path)})", ""]
    return "\n".join(text)


def render(comparison: CurveComparison, console: Any) -> None:
    """Print the per-epoch table (no cell split: :mod:`flatlab.analysis.console_table`), the summary, the
    notes and the citation with rich."""
    head, body = row_cells(comparison)
    keys = [(r.arm, r.metric) for r in comparison.rows.itertuples(index=False)]
    starts = [i for i, k in enumerate(keys) if i and k != keys[i - 1]]
    table = make_table(head, body, sections=starts, title=f"flatlab beside {comparison.curves.title}")
    print_table(console, table, "use --format markdown")
    for line in summary_lines(comparison) + list(comparison.notes):
        console.print(line, soft_wrap=True)
    console.print(f"published: {comparison.curves.citation}", soft_wrap=True)
