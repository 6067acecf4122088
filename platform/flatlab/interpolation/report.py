"""Figures and summary numbers of an alpha study, rebuilt from its trials in MLflow.

An alpha study runs the ``clip_interpolate`` workload (or any workload whose trials report ``interp/alpha``,
``<split>/loss`` and ``<split>/accuracy``), one trial per (fine-tuned model, alpha[, pruned]). This
module reads the LATEST launch of such a study (:meth:`flatlab.reports.declared.ReportInput.latest`; after
a launch, the post-study pipeline hands it that launch's trials), groups
its FINISHED trials by fine-tuned model (the ``finetuned`` param, else the arm) and by the ``prune``
param, and writes, with :mod:`flatlab.interpolation.plots` (seed paper "In Search of the Successful
Interpolation"; alpha = weight on the FINE-TUNED model, the paper's ``1 - alpha``):

* ``fig1_<split>_vs_alpha.png``: OOD accuracy and loss vs alpha, one line per model (Fig. 1);
* ``fig2_layerwise_interpolation_<i>_<label>.png``: ID and OOD accuracy vs alpha with one layer group
  interpolated at a time (Def. 1.1, Fig. 2), per model (trials with ``layerwise_interpolation``);
* ``fig3_sharpness_vs_alpha.png``: general adaptive average sharpness vs alpha (Fig. 3), +-1 s.e.;
* ``fig4_layerwise_<i>_<label>.png``: layer-wise sharpness, layer x alpha heat map, per model (Fig. 4;
  §3.1's definition, or the interpolated model's layer where the trials measured that);
* ``fig5_pruned_vs_unpruned_<i>_<label>.png``: straggler-pruned vs plain interpolation (Fig. 5,
  Algorithm 1);
* ``sharpness_correlation.md`` / ``.csv``: Kendall's τ between each sharpness measure (``flat/*``) and
  OOD accuracy, pooled, per arm and per model over its alpha grid
  (:func:`flatlab.analysis.generalisation.flatness_correlations` with ``by="param.finetuned"``);
* ``summary.json``: per model and variant the alphas and :meth:`SweepResult.summary` numbers
  (instability Def. 1, barrier, gain Eq. 2, best alpha, failure mode), the straggler layers, and the
  model's τ per measure.

:func:`interpolation_report` logs them under ``report/`` on the launch's parent run; the CLI command
``flatlab interpolation-report STUDY`` calls it.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from flatlab.analysis.generalisation import FlatnessPrediction, flatness_correlations, to_markdown
from flatlab.analysis.sample import Sample
from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.interpolation.sweep import SweepResult
from flatlab.lazy import lazy
from flatlab.reports.declared import ReportInput, StudyReport, register_report
from flatlab.sharpness.results import Estimate
from flatlab.tracking import runs
from flatlab.tracking.checkpoints import RUN_PREFIX, is_reference, parse_reference

plots = lazy("flatlab.interpolation.plots")  # loads matplotlib

_GENERAL = "flat/avg_sharpness"
_LAYERS = {"finetuned": "flat/layer_sharpness/", "interpolated": "flat/layer_sharpness_interpolated/"}
_LAYER_INTERP = "layer_interp/"
_STRAGGLER = "prune/straggler/"
_BY = "param.finetuned"


@dataclass
class ModelCurves:
    """Everything measured along alpha for one fine-tuned model.

    Attributes:
        label: short name for legends (e.g. ``lr=3e-05, augment=randaug``).
        key: the ``finetuned`` reference (or the arm name).
        unpruned, pruned: loss/accuracy sweeps per split (``None`` when that variant was not run).
        sharpness: general sharpness per alpha of the unpruned sweep (empty if not measured).
        layerwise: ``{layer: sharpness per alpha}`` of the unpruned sweep (empty if not measured).
        layer_definition: how ``layerwise`` was measured (``finetuned``: §3.1, or ``interpolated``).
        layer_interpolation: ``{layer: sweep}`` with only that layer interpolated (Fig. 2; empty if not run).
        stragglers: straggler layers reported by the pruned trials.
        kendall_tau: ``{flat/* measure: τ}`` against OOD accuracy over this model's alpha grid.
    """

    label: str
    key: str
    unpruned: Optional[SweepResult] = None
    pruned: Optional[SweepResult] = None
    sharpness: Tuple[Estimate, ...] = ()
    layerwise: Dict[str, Tuple[float, ...]] = field(default_factory=dict)
    layer_definition: str = ""
    layer_interpolation: Dict[str, SweepResult] = field(default_factory=dict)
    stragglers: Tuple[str, ...] = ()
    kendall_tau: Dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Report:
    """What :func:`interpolation_report` produced: the figure paths, ``summary.json`` and the run it
    was logged to (``None`` when not logged)."""

    study: str
    out_dir: Path
    figures: Tuple[Path, ...]
    summary_path: Path
    parent_run_id: Optional[str]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:60] or "model"


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "1.0", "yes")


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _sweep(rows, splits: List[str], prefix: str = "", suffix: str = "") -> SweepResult:
    """Rows of one (model, variant), sorted by alpha; repeated alphas (seeds) are averaged. The columns
    read are ``<prefix><split>/loss<suffix>`` and ``.../accuracy<suffix>``."""
    by_alpha: Dict[float, List[Any]] = {}
    for _, r in rows.iterrows():
        by_alpha.setdefault(round(float(r["_alpha"]), 10), []).append(r)
    alphas = tuple(sorted(by_alpha))
    loss = {s: tuple(_mean(by_alpha[a], f"{prefix}{s}/loss{suffix}") for a in alphas) for s in splits}
    acc = {s: tuple(_mean(by_alpha[a], f"{prefix}{s}/accuracy{suffix}") for a in alphas) for s in splits}
    return SweepResult(alphas, loss, acc)


def _mean(rows: List[Any], column: str) -> float:
    values = [float(r[column]) for r in rows if column in r and _finite(r[column])]
    return sum(values) / len(values) if values else float("nan")


def label_of(ref: str) -> str:
    """A short label for plots: the query of an ``mlflow:`` reference (``lr=3e-05, augment=none``), else
    the arm of that reference, ``run <first 8 characters of its id>`` for ``run:<run_id>``, or a file's name."""
    if is_reference(ref):
        try:
            _, arm, params = parse_reference(ref)
        except ConfigError:
            return ref
        return ", ".join(f"{k}={v}" for k, v in params.items()) or arm
    if ref.startswith(RUN_PREFIX):
        return f"run {ref[len(RUN_PREFIX) :][:8]}"
    return Path(ref).name or ref


def collect_curves(df, split: str = "ood", sources: Optional[Dict[str, str]] = None) -> List[ModelCurves]:
    """Group a :func:`~flatlab.tracking.trials.trials_frame` of an alpha study into per-model curves.

    Args:
        df: one row per trial; needs alpha (the ``interp/alpha`` metric, else the ``alpha`` param) and
            ``<split>/loss``, ``<split>/accuracy``.
        split: the OOD split the figures show (others with loss and accuracy columns are kept too).
        sources: ``finetuned`` value -> the reference it was resolved from at launch (``run:<run_id>`` ->
            ``mlflow:<study>/<arm>?...``, :func:`launch_sources`): labels and order come from the reference.

    Returns:
        One :class:`ModelCurves` per fine-tuned model, sorted by reference.

    Raises:
        ConfigError: no finished trials, or trials without alpha / ``<split>/accuracy``.
    """
    if df.empty or "status" not in df.columns:
        raise ConfigError("the study has no trials to report on")
    df = df[df["status"] == "FINISHED"]
    alpha_col = "interp/alpha" if "interp/alpha" in df.columns else "param.alpha"
    for col in (alpha_col, f"{split}/accuracy", f"{split}/loss"):
        if col not in df.columns:
            raise ConfigError(
                f"the study's trials report no {col!r}; is it an alpha study (workload clip_interpolate)?"
            )
    if df.empty:
        raise ConfigError("the study has no FINISHED trials")
    df = df.assign(_alpha=df[alpha_col].astype(float))
    sources = dict(sources or {})
    splits = sorted(
        {c[: -len("/accuracy")] for c in df.columns if c.endswith("/accuracy") and f"{c[:-9]}/loss" in df.columns}
    )
    splits = [s for s in splits if s not in ("train", "test", "best")]
    df = df.assign(_key=df["param.finetuned"] if "param.finetuned" in df.columns else df["arm"])
    df = df.assign(_pruned=df["param.prune"].map(_truthy) if "param.prune" in df.columns else False)
    out: List[ModelCurves] = []
    for key in sorted(set(df["_key"]), key=lambda k: sources.get(str(k), str(k))):
        rows = df[df["_key"] == key].sort_values("_alpha", kind="stable")
        label = label_of(sources.get(str(key), str(key))) if "param.finetuned" in df.columns else str(key)
        curves = ModelCurves(label=label, key=str(key))
        plain, pruned = rows[~rows["_pruned"]], rows[rows["_pruned"]]
        if len(plain):
            _read_unpruned(curves, plain, splits)
        if len(pruned):
            curves.pruned = _sweep(pruned, splits)
            found = [
                c[len(_STRAGGLER) :]
                for c in pruned.columns
                if c.startswith(_STRAGGLER) and pruned[c].map(_finite).any()
            ]
            curves.stragglers = tuple(found)
        out.append(curves)
    return out


def _read_unpruned(curves: ModelCurves, plain, splits: List[str]) -> None:
    """The unpruned trials' sweep, sharpness (general and layer-wise) and layer-wise interpolation into
    ``curves`` (``plain``: one model's unpruned rows sorted by alpha)."""
    curves.unpruned = _sweep(plain, splits)
    if _GENERAL in plain.columns and plain[_GENERAL].map(_finite).all():
        se = plain[f"{_GENERAL}_stderr"] if f"{_GENERAL}_stderr" in plain.columns else None
        curves.sharpness = tuple(
            Estimate(float(v), float(se.iloc[i]) if se is not None and _finite(se.iloc[i]) else 0.0, 0, ())
            for i, v in enumerate(plain[_GENERAL])
        )
    for definition, prefix in _LAYERS.items():
        for col in (c for c in plain.columns if c.startswith(prefix)):
            if plain[col].map(_finite).all():
                curves.layerwise[col[len(prefix) :]] = tuple(float(v) for v in plain[col])
                curves.layer_definition = definition
    marker = f"{_LAYER_INTERP}{splits[0]}/accuracy/" if splits else None
    for col in (c for c in plain.columns if marker and c.startswith(marker)):
        if plain[col].map(_finite).all():
            group = col[len(marker) :]
            curves.layer_interpolation[group] = _sweep(plain, splits, prefix=_LAYER_INTERP, suffix=f"/{group}")


def sharpness_correlation(df, split: str = "ood") -> Optional[FlatnessPrediction]:
    """Kendall's τ between every sharpness measure (``flat/*``) of the alpha study's trials ``df`` and
    ``<split>/accuracy``: pooled, per arm and per fine-tuned model over its alpha grid
    (:func:`~flatlab.analysis.generalisation.flatness_correlations`, ``by="param.finetuned"``); ``None``
    when no trial measured sharpness."""
    sample = Sample.of(df)
    if not sample.completed().measures():
        return None
    by = _BY if _BY in sample.trials.columns else None
    return flatness_correlations(sample, target=f"{split}/accuracy", by=by)


def attach_correlation(curves: List[ModelCurves], prediction: FlatnessPrediction, split: str = "ood") -> None:
    """Each model's τ per measure (its ``param.finetuned=<key>`` scope against ``<split>/accuracy``) into
    its :attr:`ModelCurves.kendall_tau`."""
    for c in curves:
        c.kendall_tau = {
            r.measure: r.correlation.tau
            for r in prediction.rows
            if r.scope == f"{_BY}={c.key}" and r.target == f"{split}/accuracy"
        }


def _safe_summary(sweep: Optional[SweepResult]) -> Optional[Dict[str, Any]]:
    if sweep is None:
        return None
    out: Dict[str, Any] = {"alphas": list(sweep.alphas), "loss": dict(sweep.loss), "accuracy": dict(sweep.accuracy)}
    try:
        out["summary"] = sweep.summary()
    except ConfigError as exc:  # e.g. a grid without alpha 0 or 1
        out["summary_error"] = str(exc)
    return out


def write_report(
    curves: List[ModelCurves],
    out_dir: Path,
    split: str = "ood",
    correlation: Optional[FlatnessPrediction] = None,
) -> Tuple[List[Path], Path]:
    """Write the figures (module docstring) and ``summary.json`` for ``curves`` into ``out_dir``, and with
    ``correlation`` (:func:`sharpness_correlation`) its table as ``sharpness_correlation.md`` / ``.csv``.

    Returns:
        ``(figure paths, summary path)``. Figures whose data were not measured are skipped.

    Raises:
        ConfigError: no model has an unpruned sweep.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plain = [c for c in curves if c.unpruned is not None]
    if not plain:
        raise ConfigError("no fine-tuned model has unpruned interpolation trials; nothing to plot")
    figures = [
        plots.plot_sweeps({c.label: c.unpruned for c in plain}, out_dir / f"fig1_{split}_vs_alpha.png", split=split)
    ]
    with_sharpness = [c for c in plain if c.sharpness]
    grids = {c.unpruned.alphas for c in with_sharpness}
    if len(grids) == 1:
        figures.append(
            plots.plot_sharpness_vs_alpha(
                next(iter(grids)),
                {c.label: c.sharpness for c in with_sharpness},
                out_dir / "fig3_sharpness_vs_alpha.png",
            )
        )
    else:  # different alpha grids: one figure per model
        for i, c in enumerate(with_sharpness):
            figures.append(
                plots.plot_sharpness_vs_alpha(
                    c.unpruned.alphas,
                    {c.label: c.sharpness},
                    out_dir / f"fig3_sharpness_vs_alpha_{i}_{_slug(c.label)}.png",
                )
            )
    figures += _per_model_figures(curves, out_dir, split)
    summary_path = _write_summary(curves, out_dir, split)
    if correlation is not None:
        correlation.frame().to_csv(out_dir / "sharpness_correlation.csv", index=False)
        (out_dir / "sharpness_correlation.md").write_text(to_markdown(correlation))
    return figures, summary_path


def _per_model_figures(curves: List[ModelCurves], out_dir: Path, split: str) -> List[Path]:
    """Figs. 2, 4 and 5 of every model that has their data."""
    titles = {"finetuned": "layer-wise sharpness (§3.1: fine-tuned layer perturbed, then interpolated)"}
    figures: List[Path] = []
    for i, c in enumerate(curves):
        if c.unpruned is not None and c.layer_interpolation:
            splits = [s for s in ("val", split) if s in c.unpruned.accuracy]
            figures.append(
                plots.plot_layerwise_interpolation(
                    c.unpruned,
                    c.layer_interpolation,
                    out_dir / f"fig2_layerwise_interpolation_{i}_{_slug(c.label)}.png",
                    splits=splits,
                )
            )
        if c.unpruned is not None and c.layerwise:
            figures.append(
                plots.plot_layerwise_heatmap(
                    c.unpruned.alphas,
                    c.layerwise,
                    out_dir / f"fig4_layerwise_{i}_{_slug(c.label)}.png",
                    title=titles.get(c.layer_definition, "layer-wise sharpness (the interpolated model's layer)"),
                )
            )
        if c.unpruned is not None and c.pruned is not None:
            figures.append(
                plots.plot_pruned_vs_unpruned(
                    c.unpruned, c.pruned, out_dir / f"fig5_pruned_vs_unpruned_{i}_{_slug(c.label)}.png", split=split
                )
            )
    return figures


def _write_summary(curves: List[ModelCurves], out_dir: Path, split: str) -> Path:
    summary = {
        "split": split,
        "alpha": "weight on the fine-tuned model (WiSE-FT); the seed paper's alpha is 1 - alpha",
        "models": [
            {
                "label": c.label,
                "finetuned": c.key,
                "unpruned": _safe_summary(c.unpruned),
                "pruned": _safe_summary(c.pruned),
                "sharpness_general": [e.value for e in c.sharpness],
                "layer_sharpness": c.layer_definition or None,
                "layer_interpolation": {g: _safe_summary(s) for g, s in c.layer_interpolation.items()},
                "stragglers": list(c.stragglers),
                "kendall_tau": {m: (t if math.isfinite(t) else None) for m, t in c.kendall_tau.items()},
            }
            for c in curves
        ],
    }
    summary_path = out_dir / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, default=float))
    return summary_path


def interpolation_report(
    tracking_uri: str,
    study: str,
    *,
    out_dir: Optional[Path] = None,
    split: str = "ood",
    log: bool = True,
    launch: Optional[ReportInput] = None,
) -> Report:
    """Build the figures and ``summary.json`` of alpha study ``study`` from one launch's trials and, with
    ``log``, upload them under ``report/`` to that launch's parent run.

    Args:
        tracking_uri: the MLflow store the study ran against.
        out_dir: where the files are written (default: ``launch.out_dir``, else a new temporary folder).
        split: the OOD split of Fig. 1 and Fig. 5 (``ood`` = the first OOD set).
        launch: the launch and its trials, as the post-study pipeline hands them to a declared report
            (its parent run's params name the fine-tuned models' references; the report is logged
            there); ``None``: the latest launch, read here (:meth:`ReportInput.latest`).

    Raises:
        ConfigError: unknown study, no launch, no finished alpha trials (see :func:`collect_curves`).
    """
    if out_dir is None and launch is not None:
        out_dir = launch.out_dir
    launch = launch or ReportInput.latest(tracking_uri, study, Path(out_dir or "."))  # "." replaced below
    client = runs.client(tracking_uri)
    df = launch.trials
    curves = collect_curves(df, split=split, sources=launch_sources(client.get_run(launch.parent_run_id).data.params))
    correlation = sharpness_correlation(df, split)
    if correlation is not None:
        attach_correlation(curves, correlation, split)
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix=f"flatlab-report-{study}-"))
    figures, summary_path = write_report(curves, out, split=split, correlation=correlation)
    parent_id = None
    if log:
        parent_id = launch.parent_run_id
        client.log_artifacts(parent_id, str(out), artifact_path="report")
        client.set_tag(parent_id, "flatlab.report", "report/")
    return Report(study, out, tuple(figures), summary_path, parent_id)


def launch_sources(params: Dict[str, str]) -> Dict[str, str]:
    """Resolved value -> its reference, from a launch run's params of chained values
    (:func:`flatlab.study.chain.chained_params`: ``<name>`` beside ``<name>.source``)."""
    suffix = ".source"
    return {
        params[k[: -len(suffix)]]: v for k, v in params.items() if k.endswith(suffix) and k[: -len(suffix)] in params
    }


def _interpolation(report: ReportInput, params: Mapping[str, Any]) -> List[str]:
    """The registered ``interpolation`` report: :func:`interpolation_report` over the launch it is handed."""
    rep = interpolation_report(report.tracking_uri, report.study, split=params["split"], launch=report)
    return [
        f"report: {len(rep.figures)} figures and {rep.summary_path.name} in {rep.out_dir}, logged under report/ on run "
        f"{rep.parent_run_id}"
    ]


register_report(
    StudyReport(
        "interpolation",
        "an alpha study's figures (seed paper Figs. 1 to 5), Kendall's tau of sharpness against OOD accuracy "
        "and summary.json",
        _interpolation,
        hparams=(HParam("split", "ood", str, doc="the OOD split of Figs. 1 and 5"),),
    )
)
