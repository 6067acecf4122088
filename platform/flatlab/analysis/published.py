"""Published learning curves as data, and flatlab's runs beside them (``flatlab curves``).

A paper or benchmark that publishes per-epoch curves (DeepOBS's baselines, a paper's appendix tables)
becomes a *curve-set file*: plain JSON, read without executing anything (its format: :func:`load_curves`).
A study declares the file and which of its arms reproduces which curve
(``Study(published=Published(path, arms={arm: curve}))``); :func:`compare_curves` then sets flatlab's per-epoch
mean over seeds, with its t-interval
(:func:`flatlab.analysis.compare.t_estimate`), beside the published runs' mean and range, and says per
epoch and metric whether flatlab's mean lies inside the published range ``[min, max]`` and whether its
interval overlaps that range. Everything here works on plain values and DataFrames;
:mod:`flatlab.tracking.published_runs` reads flatlab's side from MLflow.

A published range of a few runs is narrow (two seeds give one ``[min, max]``): a flatlab mean outside
it is a reason to look, not by itself evidence of a difference. Where both sides have at least two
runs the interval overlap says more; :class:`CurveComparison.notes` says how many runs each side has.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from flatlab.analysis.compare import markdown_table, t_estimate
from flatlab.analysis.compare.statistics import clip
from flatlab.analysis.compare.table import quantity_support
from flatlab.analysis.console_table import make_table, print_table
from flatlab.errors import ConfigError

FORMAT = "flatlab-published-curves"
VERSION = 1
CONFIDENCE = 0.95
_REQUIRED_TEXT = ("title", "citation", "source")


# ---------------------------------------------------------------------------------------------------
# The study's declaration


@dataclass(frozen=True)
class Published:
    """A study's published reference: the curve-set file and which arm reproduces which curve.

    Attributes:
        path: the curve-set JSON file; a relative path is relative to the study file (the study loader
            resolves it; a study built in Python without a file: relative to the working directory).
        arms: arm name -> curve name in the file (arms not named here are not compared).
    """

    path: str
    arms: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.arms, Mapping):
            object.__setattr__(self, "arms", dict(self.arms))

    def relative_to(self, folder: Path) -> "Published":
        """This declaration with a relative ``path`` made absolute against ``folder``."""
        if not isinstance(self.path, str) or not self.path:  # reported by problems()
            return self
        p = Path(self.path).expanduser()
        return self if p.is_absolute() else Published(str((folder / p).resolve()), self.arms)

    def problems(self, arm_names: Sequence[str]) -> List[str]:
        """What is wrong with this declaration for a study with ``arm_names``: a file that is missing or
        breaks the format (:func:`load_curves`), an arm or curve that does not exist. Each message names
        the field; empty when all is well."""
        if not isinstance(self.path, str) or not self.path:
            return [f"published.path={self.path!r}; expected the path of a curve-set JSON file"]
        if not isinstance(self.arms, Mapping) or not self.arms:
            return [
                f"published.arms={self.arms!r}; expected a dict of arm "
                "name -> curve name, e.g. {'sgd': 'fmnist_2c2d/sgd'}"
            ]
        try:
            curves = load_curves(self.path)
        except ConfigError as exc:
            return [f"published.path: {line.strip()}" for line in str(exc).splitlines()]
        out = []
        for arm, curve in self.arms.items():
            if arm not in arm_names:
                out.append(f"published.arms: {arm!r} is not an arm of the study; arms: {', '.join(arm_names)}")
            if curve not in curves.curves:
                out.append(
                    f"published.arms[{arm!r}]={curve!r} is not a curve "
                    f"of {self.path}; curves: {', '.join(curves.curves)}"
                )
        return out

    def as_dict(self) -> Dict[str, Any]:
        """``{"path": ..., "arms": {...}}`` (JSON-able; the launch run records it)."""
        return {"path": self.path, "arms": dict(self.arms)}


# ---------------------------------------------------------------------------------------------------
# The curve-set file


@dataclass(frozen=True)
class PublishedRun:
    """One published run: its ``seed``, where it was read (``path``, ``commit``; may be empty) and its
    per-epoch ``values`` (list name -> tuple of floats, NaN where the list holds null)."""

    seed: Any
    values: Mapping[str, Tuple[float, ...]]
    path: str = ""
    commit: str = ""


@dataclass(frozen=True)
class Curve:
    """One published curve (an optimizer at one setting): its runs and free-form ``meta`` (settings ...)."""

    name: str
    runs: Tuple[PublishedRun, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CurveSet:
    """A validated curve-set file (see the module docstring for the format)."""

    path: str
    title: str
    citation: str
    source: str
    first_epoch: int
    metrics: Mapping[str, Optional[str]]
    curves: Mapping[str, Curve]
    notes: Tuple[str, ...] = ()

    def compared(self) -> Dict[str, str]:
        """flatlab metric -> list name, for the lists that are compared (mapped to a flatlab metric)."""
        return {m: name for name, m in self.metrics.items() if m}

    def frame(self, curve: str):
        """The runs of ``curve`` as a long DataFrame: ``seed``, ``epoch``, ``metric`` (the flatlab metric
        each compared list maps to), ``value`` (finite values only).

        Raises:
            ConfigError: an unknown curve (listing the valid ones).
        """
        # pandas on first use: importing this module stays light
        import pandas as pd

        if curve not in self.curves:
            raise ConfigError(f"{self.path}: no curve {curve!r}; curves: {', '.join(self.curves)}")
        rows = []
        for run in self.curves[curve].runs:
            for metric, name in self.compared().items():
                for i, v in enumerate(run.values.get(name, ())):
                    if math.isfinite(v):
                        rows.append({"seed": run.seed, "epoch": self.first_epoch + i, "metric": metric, "value": v})
        return pd.DataFrame(rows, columns=["seed", "epoch", "metric", "value"])


def load_curves(path: str) -> CurveSet:
    """Read and validate a curve-set file (JSON only; nothing in it is executed).

    The curve-set format (version 1)::

        {
          "format": "flatlab-published-curves",      # required, exactly this
          "version": 1,                               # required
          "title": "...",                             # required: what the curves are
          "citation": "...",                          # required: the paper or benchmark to cite
          "source": "...",                            # required: where the numbers were read
          "first_epoch": 0,                           # epoch of each list's entry 0 (0: before training)
          "metrics": {"test_accuracies": "test/accuracy",   # list name -> flatlab metric it is compared with,
                      "train_losses": null},                #   or null: kept, never compared
          "notes": ["..."],                           # optional: what differs from flatlab's setting
          "curves": {
            "<curve name>": {
              "settings": {...},                      # optional, free-form (learning rate, batch size ...)
              "runs": [                               # one entry per published run (seed)
                {"seed": 45, "path": "...", "commit": "...",   # seed required; path/commit: where it was read
                 "values": {"test_accuracies": [0.163, 0.834, ...]}}   # per-epoch lists (numbers or null)
              ],
              ...                                     # any other key: kept as metadata
            }
          }
        }

    Epochs: entry ``i`` of a list is the value after ``first_epoch + i`` epochs of training. flatlab logs
    the metrics of epoch ``e`` (``e`` epochs trained, 1-based) at MLflow step ``e``, so with
    ``first_epoch = 0`` list entry ``e`` is compared with step ``e`` (entry 0, the untrained network, has no
    flatlab counterpart). Constant-learning-rate curves can be compared at every epoch; a run shorter than
    the published one is compared over the epochs it has.

    Raises:
        ConfigError: the file is missing or not JSON, or breaks the format; ONE error listing every
            problem, each naming the file and the field (e.g. ``curves['sgd'].runs[1].values.test_losses[3]``).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: no such curve-set file")
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a JSON file ({exc})") from None
    errors = _format_problems(doc)
    if errors:
        raise ConfigError(f"{path}: not a valid curve-set file:\n  " + "\n  ".join(errors))
    curves = {}
    for name, c in doc["curves"].items():
        runs = tuple(
            PublishedRun(
                seed=r["seed"],
                path=str(r.get("path", "")),
                commit=str(r.get("commit", "")),
                values={k: tuple(math.nan if v is None else float(v) for v in vals) for k, vals in r["values"].items()},
            )
            for r in c["runs"]
        )
        curves[name] = Curve(name, runs, {k: v for k, v in c.items() if k != "runs"})
    return CurveSet(
        path=str(path),
        title=doc["title"],
        citation=doc["citation"],
        source=doc["source"],
        first_epoch=int(doc.get("first_epoch", 0)),
        metrics=dict(doc["metrics"]),
        curves=curves,
        notes=tuple(doc.get("notes", ())),
    )


def _format_problems(doc: Any) -> List[str]:
    """Every way ``doc`` (parsed JSON) breaks the curve-set format, each naming its field."""
    if not isinstance(doc, dict):
        return [f"the top level is a {type(doc).__name__}; expected an object with format, version, curves ..."]
    errors: List[str] = []
    if doc.get("format") != FORMAT:
        errors.append(f"format={doc.get('format')!r}; expected {FORMAT!r}")
    if doc.get("version") != VERSION:
        errors.append(f"version={doc.get('version')!r}; expected {VERSION}")
    for key in _REQUIRED_TEXT:
        if not (isinstance(doc.get(key), str) and doc[key].strip()):
            errors.append(f"{key}={doc.get(key)!r}; expected a non-empty string")
    first = doc.get("first_epoch", 0)
    if not (isinstance(first, int) and not isinstance(first, bool) and first >= 0):
        errors.append(
            f"first_epoch={first!r}; expected an int >= 0 (the epoch of each list's entry 0; 0 = before training)"
        )
    notes = doc.get("notes", [])
    if not (isinstance(notes, list) and all(isinstance(n, str) for n in notes)):
        errors.append("notes: expected a list of strings")
    metrics = doc.get("metrics")
    if not (
        isinstance(metrics, dict)
        and metrics
        and all(isinstance(k, str) and (v is None or (isinstance(v, str) and v)) for k, v in metrics.items())
    ):
        errors.append(
            f"metrics={metrics!r}; expected an object of list name -> flatlab metric (e.g. "
            f'\'test/accuracy\') or null, e.g. {{"test_accuracies": "test/accuracy"}}'
        )
        metrics = {}
    elif not any(metrics.values()):
        errors.append("metrics: no list is mapped to a flatlab metric; nothing could be compared")
    curves = doc.get("curves")
    if not (isinstance(curves, dict) and curves):
        errors.append(f"curves={_short(curves)}; expected a non-empty object of curve name -> {{runs: [...]}}")
        return errors
    for name, curve in curves.items():
        errors.extend(_curve_problems(f"curves[{name!r}]", curve, metrics))
    return errors


def _curve_problems(where: str, curve: Any, metrics: Mapping[str, Any]) -> List[str]:
    if not isinstance(curve, dict):
        return [f"{where}: expected an object with runs, got {_short(curve)}"]
    runs = curve.get("runs")
    if not (isinstance(runs, list) and runs):
        return [f"{where}.runs={_short(runs)}; expected a non-empty list of runs"]
    errors: List[str] = []
    seeds = []
    for i, run in enumerate(runs):
        w = f"{where}.runs[{i}]"
        if not isinstance(run, dict):
            errors.append(f"{w}: expected an object with seed and values, got {_short(run)}")
            continue
        if "seed" not in run or not isinstance(run["seed"], (int, str)) or isinstance(run["seed"], bool):
            errors.append(f"{w}.seed={_short(run.get('seed'))}; expected an int (or a string label)")
        else:
            seeds.append(run["seed"])
        for key in ("path", "commit"):
            if key in run and not isinstance(run[key], str):
                errors.append(f"{w}.{key}={_short(run[key])}; expected a string")
        values = run.get("values")
        if not (isinstance(values, dict) and values):
            errors.append(f"{w}.values={_short(values)}; expected an object of list name -> per-epoch list")
            continue
        for name, vals in values.items():
            if name not in metrics:
                errors.append(f"{w}.values.{name}: not declared in metrics (declared: {', '.join(metrics) or 'none'})")
            elif not isinstance(vals, list):
                errors.append(
                    f"{w}.values.{name}={_short(vals)}; expected a list of numbers (null for a missing epoch)"
                )
            else:
                bad = [
                    j
                    for j, v in enumerate(vals)
                    if not (v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)))
                ]
                if bad:
                    errors.append(
                        f"{w}.values.{name}[{bad[0]}]={_short(vals[bad[0]])}; expected a number or null"
                        + (f" ({len(bad)} such entries)" if len(bad) > 1 else "")
                    )
    if len(set(map(repr, seeds))) != len(seeds):
        errors.append(f"{where}.runs: seeds {seeds} repeat a seed")
    return errors


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------------------------------
# The comparison


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
    workload: Optional[str] = None,
) -> CurveComparison:
    """flatlab's per-epoch mean and t-interval beside each mapped curve's published runs.

    The interval is intersected with the values the metric can take, as ``flatlab compare`` does
    (:func:`flatlab.analysis.compare.table.quantity_support`: accuracy in [0, 1], a loss in ``workload``'s
    loss range): the same coverage, no impossible values such as an accuracy of 1.0001.

    Args:
        curves: the published curve set (:func:`load_curves`).
        flatlab: a long DataFrame of flatlab's values, one row per (arm, seed, metric, epoch): columns
            ``arm``, ``seed``, ``metric`` (e.g. ``test/accuracy``), ``epoch`` (epochs trained, the MLflow
            step) and ``value``; the final-seed runs of each arm (:mod:`flatlab.tracking.published_runs`).
        arms: arm name -> curve name.
        metrics: the flatlab metrics to compare (default: every metric the curve set maps to).
        epochs: only these epochs (default: every epoch both sides have).
        confidence: of flatlab's t-interval, in (0, 1).
        workload: the study's registered workload name (its loss range); ``None``: losses unbounded.
    Returns:
        A :class:`CurveComparison`.
    Raises:
        ConfigError: an unknown curve or metric (naming the valid ones), missing columns in ``flatlab``,
            ``confidence`` outside (0, 1).
    """
    # pandas on first use: importing this module stays light
    import pandas as pd

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
                row = _epoch_row(ours, theirs, metric, e, confidence, workload)
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


def _epoch_row(
    ours, theirs, metric: str, epoch: int, confidence: float, workload: Optional[str]
) -> Optional[Dict[str, Any]]:
    """One epoch of one arm and metric: flatlab's t-estimate over seeds (clipped to the metric's support)
    beside the published runs' mean and range; ``None`` where flatlab has only non-finite values (a
    diverged seed: nothing to place)."""
    est = clip(
        t_estimate(ours.loc[ours["epoch"] == epoch, "value"].tolist(), confidence),
        quantity_support(metric, workload),
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
    # pandas on first use: importing this module stays light
    import pandas as pd

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
    path under the working directory (:func:`flatlab.tracking.published_runs.reference_curves`).

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
