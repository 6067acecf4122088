"""Published learning curves as data: the curve-set file (:func:`load_curves`, its format) and a
study's declaration of one (:class:`Published`).

A paper or benchmark that publishes per-epoch curves (DeepOBS's baselines, a paper's appendix tables)
becomes a *curve-set file*: plain JSON, read without executing anything. A study declares the file and
which of its arms reproduces which curve (``Study(published=Published(path, arms={arm: curve}))``);
:mod:`flatlab.analysis.published` sets flatlab's runs beside it. This module reads files only, so a
study's configuration can name a reference without loading the comparison.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")

FORMAT = "flatlab-published-curves"
VERSION = 1
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
    """A validated curve-set file (the format: :func:`load_curves`)."""

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
