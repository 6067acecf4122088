"""Reports a study asks for after a launch: work that needs all of its trials, chosen by the study
(``Study(reports={name: {param: value}})``), never by its workload.

Each report is handed a :class:`ReportInput` (the launch's store, study, parent run and trials, read once
by the post-study pipeline) and its parameters. Registered reports (:data:`REPORTS`; each writes into
``<root>/<study>/report`` and logs to the launch's parent run in MLflow):

* ``toy_figure`` (the papers' toy losses: IRE Fig. 1, TSAM Fig. 1): :func:`toy_figure`, the end point
  (parameter ``end``, a metric) and the flatness (``flatness``, a metric) of every completed trial
  against the searched ``kappa`` or ``t``, one dot per seed and the mean per value; logged under
  ``toy/``. Both parameters are required.
* ``objectives`` (TSAM paper, Table 2): :func:`objectives_report`, each trained model (arm) on the ERM,
  SAM and tilted objectives (the measures ``erm_objective``, ``sam_objective``, ``tilted_objective``),
  one table per split (``split``: the study's ``measure_split``; ``extra``: its ``measure_extra_splits``,
  comma-separated); printed, written to ``objectives.md`` and logged under ``objectives/``.
* ``curves_by`` (TSAM paper, Figs. 3 and 7): :func:`curves_by_report`, per-epoch metrics (``metrics``,
  comma-separated; default ``test/accuracy``, which needs the trainer's ``test_every_epoch``) of ``arm``
  (default ``tsam``), one curve per value of its parameter ``by`` (default ``t``) at that value's best
  configuration, the mean over its seeds (:mod:`flatlab.analysis.param_curves`); written to
  ``curves_<by>_<metric>.png`` and ``.json`` and logged under ``curves/``.
* ``interpolation`` (seed paper "In Search of the Successful Interpolation", Figs. 1 to 5, and Kendall's
  tau of sharpness against OOD accuracy), registered by :mod:`flatlab.interpolation.report` (the layer
  above, which the study layer loads):
  :func:`flatlab.interpolation.report.interpolation_report` over an alpha study's trials, logged under
  ``report/`` with ``summary.json``; ``split``: the OOD split of Figs. 1 and 5 (default ``ood``).
  ``flatlab interpolation-report STUDY`` rebuilds it on demand, reading the latest launch's trials itself.

:func:`resolve_reports` validates a study's declaration (study validation calls it, so a typo fails
before any trial starts); :func:`run_reports` runs them after a launch whose trials all ended (the last
step of :func:`flatlab.reports.post_study.post_study`, handed its sample). A report that fails is
reported in the terminal and the log, never raised: every trial is already recorded in MLflow.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Tuple

from flatlab.analysis import objectives, param_curves
from flatlab.analysis.sample import Sample
from flatlab.errors import ConfigError, did_you_mean
from flatlab.hparams import HParam, resolve
from flatlab.lazy import lazy
from flatlab.registry import Registry
from flatlab.tracking import runs
from flatlab.tracking.trials import parent_runs, read_sample

matplotlib = lazy("matplotlib")
plt = lazy("matplotlib.pyplot")

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class ReportInput:
    """What a declared report is handed: one launch of a study, its trials read once.

    Attributes:
        tracking_uri: the MLflow store the study ran against.
        study: the study's name.
        out_dir: where the report writes its files.
        parent_run_id: the launch's parent run, where the report logs its artifacts.
        trials: the launch's trials, one row per trial (:attr:`flatlab.analysis.sample.Sample.trials`:
            a ``trials_frame`` table with ``completed``, ``tuning`` and ``stage``).
    """

    tracking_uri: str
    study: str
    out_dir: Path
    parent_run_id: str
    trials: Any = field(repr=False)

    @classmethod
    def latest(cls, tracking_uri: str, study: str, out_dir: Path) -> ReportInput:
        """``study``'s latest launch in ``tracking_uri``, its trials read once (for a report run on demand).

        Raises:
            ConfigError: unknown study, no launch recorded (:func:`flatlab.tracking.trials.read_sample`).
        """
        parents = parent_runs(tracking_uri, study)
        if not parents:
            raise ConfigError(f"study {study!r} has no launches recorded in {tracking_uri}")
        return cls(tracking_uri, study, Path(out_dir), parents[0].info.run_id, read_sample(tracking_uri, study).trials)


Run = Callable[[ReportInput, Mapping[str, Any]], List[str]]
"""``run(report input, params) -> lines for the terminal`` (params resolved)."""


@dataclass(frozen=True)
class StudyReport:
    """One registered report: its ``hparams`` (``required``: those a study must give) and ``run``."""

    name: str
    doc: str
    run: Run
    hparams: Tuple[HParam, ...] = ()
    required: Tuple[str, ...] = ()


REPORTS: Registry[StudyReport] = Registry("report")


def register_report(report: StudyReport) -> StudyReport:
    """Add ``report`` to :data:`REPORTS`; raises ``ValueError`` if its name is taken."""
    return REPORTS.register(report.name, report)


def resolve_reports(spec: Mapping[str, Mapping[str, Any]], where: str) -> Dict[str, Dict[str, Any]]:
    """Validate a study's ``reports`` declaration and fill in the defaults.

    Args:
        spec: ``{report name: {param: value}}``; ``{}`` as the value takes every default.
        where: what declared it, e.g. ``"study 'toy_ire_fig1', reports"``; starts every message.
    Returns:
        ``{report name: {param: value}}`` with every declared parameter.
    Raises:
        ConfigError: ``spec`` or a value is not a mapping; an unknown report (listing the valid ones), an
            unknown parameter, a value outside its range, a required parameter not given; all in one
            error, one per line.
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"{where}: reports must be a mapping {{report name: {{param: value}}}}, e.g. "
            f"{{'interpolation': {{}}}}; got {type(spec).__name__} {spec!r}"
        )
    valid = REPORTS.names()
    problems: List[str] = []
    out: Dict[str, Dict[str, Any]] = {}
    for name, given in spec.items():
        if not isinstance(name, str) or name not in valid:
            problems.append(
                f"{where}: unknown report {name!r}{did_you_mean(name, valid)}; valid reports: {', '.join(valid)}"
            )
            continue
        report = REPORTS.get(name)
        try:
            out[name] = resolve(report.hparams, given, f"{where}: {name}")
        except ConfigError as exc:
            problems.extend(str(exc).splitlines())
            continue
        missing = [p for p in report.required if p not in given]
        if missing:
            problems.append(
                f"{where}: {name} needs {', '.join(missing)} "
                f"({'; '.join(h.doc for h in report.hparams if h.name in missing)})"
            )
    if problems:
        raise ConfigError("\n".join(problems))
    return out


def run_reports(
    study: Any, tracking_uri: str, out_dir: Path, parent_run_id: str, sample: Sample, console: Any = None
) -> List[str]:
    """Run the reports ``study`` declares on one of its launches, each handed the same
    :class:`ReportInput`; print and log their lines. A report that raises is reported (a warning
    naming it) and the others still run.

    Args:
        study: a :class:`~flatlab.study.spec.Study` (its ``name`` and ``reports``).
        tracking_uri, parent_run_id: the launch's MLflow store and parent run.
        out_dir: where the reports write their files.
        sample: the launch's trials (:func:`flatlab.tracking.trials.read_sample`).
        console: a rich console for the lines (``None``: the log only).

    Returns:
        The lines of the reports that ran.
    """
    lines: List[str] = []
    try:
        declared = resolve_reports(study.reports, f"study {study.name!r}: reports")
    except ConfigError as exc:  # a study that skipped validation: say so, never fail after its trials
        logger.warning("%s", exc)
        if console is not None:
            console.print(f"[yellow]warning:[/yellow] no reports run: {exc}")
        return lines
    report = ReportInput(tracking_uri, study.name, Path(out_dir), parent_run_id, sample.trials)
    for name, params in declared.items():
        try:
            got = REPORTS.get(name).run(report, params)
        except Exception as exc:  # noqa: BLE001 - the study's results stand
            logger.exception("report %s of study %s failed", name, study.name)
            if console is not None:
                console.print(f"[yellow]warning:[/yellow] report {name!r} of study {study.name!r} failed: {exc}")
            continue
        for line in got:
            logger.info("%s", line)
            if console is not None:
                console.print(line)
        lines += got
    return lines


def toy_figure(report: ReportInput, end_metric: str, flat_metric: str) -> List[str]:
    """End point (``end_metric``) and flatness (``flat_metric``) of every completed trial of the launch
    against the searched kappa or t (the trial param of that name; the first of ``kappa``, ``t``, ``rho``
    it has), one dot per seed and the mean per value; written to ``report.out_dir`` (``toy_figure.png``,
    ``toy_summary.json``: per value, the seeds' end points and flatness) and logged under ``toy/`` on the
    launch run.

    Returns:
        One line for the terminal.
    """
    matplotlib.use("Agg")
    study, out_dir, df = report.study, report.out_dir, report.trials
    done = df[df["outcome"] == "completed"] if not df.empty else df
    x = next((c for c in ("param.kappa", "param.t", "param.rho") if c in done.columns), None)
    if done.empty or x is None or end_metric not in done.columns:
        return [f"toy figure: no completed trial with kappa or t in study {study!r}"]
    summary: Dict[str, Dict[str, List[float]]] = {}
    for value, group in done.groupby(x):
        summary[str(value)] = {
            "end": [float(v) for v in group[end_metric]],
            "flatness": [float(v) for v in group[flat_metric]],
        }
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, metric in zip(axes, (end_metric, flat_metric)):
        ax.scatter(done[x], done[metric], s=14, alpha=0.6, label="seeds")
        means = done.groupby(x)[metric].mean()
        ax.plot(means.index, means.values, "o-", color="black", label="mean")
        ax.set_xlabel(x.removeprefix("param."))
        ax.set_ylabel(metric)
        ax.legend(fontsize=8)
    fig.suptitle(study)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    png, js = out_dir / "toy_figure.png", out_dir / "toy_summary.json"
    fig.savefig(png, dpi=120)
    plt.close(fig)
    js.write_text(
        json.dumps(
            {
                "x": x.removeprefix("param."),
                "end_metric": end_metric,
                "flatness_metric": flat_metric,
                "values": summary,
            },
            indent=2,
        )
    )
    parent = report.parent_run_id
    client = runs.client(report.tracking_uri)
    for f in (png, js):
        client.log_artifact(parent, str(f), artifact_path="toy")
    return [f"toy figure: {png.name} and {js.name} in {out_dir}, logged under toy/ on run {parent}"]


def objectives_report(report: ReportInput, split: str, extra: str) -> List[str]:
    """TSAM paper, Table 2: the tables of :func:`flatlab.analysis.objectives.objective_tables` over the completed
    trials of the launch, one for ``split`` (the study's ``measure_split``, metrics ``flat/*``) and one per
    comma-separated name of ``extra`` (``flat_<name>/*``); written to ``report.out_dir/objectives.md`` and
    logged under ``objectives/`` on the launch run.

    Returns:
        The tables' lines, for the terminal (a line saying why when no trial has the measures).
    """
    study, out_dir = report.study, report.out_dir
    splits = [(split, "flat"), *((x, f"flat_{x}") for x in extra.split(",") if x)]
    tables = objectives.objective_tables(report.trials, splits)
    if not tables:
        return [f"objectives table: no completed trial of {study!r} has erm/sam/tilted_objective"]
    lines: List[str] = []
    for table in tables:
        lines += [*objectives.format_objective_table(table), ""]
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "objectives.md"
    md.write_text("\n".join([f"# {study}: objectives of each trained model (TSAM paper, Table 2)", "", *lines]))
    parent = report.parent_run_id
    runs.client(report.tracking_uri).log_artifact(parent, str(md), artifact_path="objectives")
    return [*lines, f"objectives table: {md}, logged under objectives/ on run {parent}"]


def curves_by_report(report: ReportInput, metrics: str, arm: str, by: str) -> List[str]:
    """TSAM paper, Figs. 3 and 7: :mod:`flatlab.analysis.param_curves` over the launch's trials, each curve
    the mean over seeds of a metric's MLflow history (step = epoch), one figure per comma-separated name of
    ``metrics``; written to ``report.out_dir`` (``curves_<by>_<metric>.png`` and ``.json``, the metric's ``/``
    as ``_``) and logged under ``curves/`` on the launch run.

    Returns:
        Per metric, one line per value (its best configuration's score and last point), then where the files
        are; a line saying why for a metric no trial recorded.

    Raises:
        ConfigError: no trial of ``arm``, or ``by`` not among its parameters.
    """
    df = report.trials
    best = param_curves.best_per_value(df, arm, by)
    what = (report.study, arm, by, report.parent_run_id)
    lines: List[str] = []
    for metric in [m.strip() for m in metrics.split(",") if m.strip()]:
        lines += _curves_of(report.tracking_uri, df, best, metric, what, report.out_dir)
    return lines


def _curves_of(tracking_uri: str, df: Any, best: List[Any], metric: str, what: Tuple[str, ...], out_dir: Path):
    """The figure, JSON and lines of one metric of :func:`curves_by_report` (``what``: study, arm, by, parent)."""
    study, arm, by, parent = what
    client = runs.client(tracking_uri)
    curves = []
    for c in best:
        histories = [
            {m.step: m.value for m in sorted(client.get_metric_history(df.loc[r, "run_id"], metric), key=_time)}
            for r in c.runs
        ]
        curves.append(replace(c, points=param_curves.mean_curve(histories)))
    if not any(c.points for c in curves):
        return [f"curves by {by}: no trial of {arm!r} in {study!r} recorded {metric!r} per epoch"]
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"curves_{by}_{metric.replace('/', '_')}"
    png, js = out_dir / f"{stem}.png", out_dir / f"{stem}.json"
    param_curves.plot_value_curves(
        curves, by, metric, f"{study}: {arm}, {metric} per epoch, best configuration per {by}", png
    )
    js.write_text(json.dumps(param_curves.curves_summary(curves, by, metric), indent=2))
    for f in (png, js):
        client.log_artifact(parent, str(f), artifact_path="curves")
    lines = [
        f"{by} = {c.value}: {df.attrs.get('metric')} {c.score:.4g} over {len(c.runs)} seed(s); "
        + (f"{metric} {c.points[-1][1]:.4g} at epoch {c.points[-1][0]}" if c.points else f"no {metric} recorded")
        for c in curves
    ]
    return [*lines, f"curves by {by}: {png.name} and {js.name} in {out_dir}, logged under curves/ on run {parent}"]


def _time(m: Any) -> Any:
    return m.timestamp


register_report(
    StudyReport(
        "objectives",
        "each trained model on the ERM, SAM and tilted objectives, one table per split (TSAM paper, Table 2)",
        lambda report, p: objectives_report(report, p["split"], p["extra"]),
        hparams=(
            HParam("split", "train", str, doc="the study's measure_split (its flat/* metrics)"),
            HParam("extra", "test", str, doc="comma-separated extra splits (flat_<split>/* metrics), '' for none"),
        ),
    )
)
register_report(
    StudyReport(
        "curves_by",
        "an arm's per-epoch metric, one curve per value of a parameter at its best configuration (TSAM Fig. 3)",
        lambda report, p: curves_by_report(report, p["metrics"], p["arm"], p["by"]),
        hparams=(
            HParam(
                "metrics",
                "test/accuracy",
                str,
                doc="comma-separated per-epoch metrics, a figure each (test/*: needs test_every_epoch)",
            ),
            HParam("arm", "tsam", str, doc="the arm whose trials are split"),
            HParam("by", "t", str, doc="the parameter, one curve per value"),
        ),
    )
)
register_report(
    StudyReport(
        "toy_figure",
        "end point and flatness of every completed trial against the searched kappa or t (the papers' toy losses)",
        lambda report, p: toy_figure(report, p["end"], p["flatness"]),
        hparams=(
            HParam("end", "", str, doc="the end-point metric, e.g. val/abs_u"),
            HParam("flatness", "", str, doc="the flatness metric, e.g. val/trace_hessian"),
        ),
        required=("end", "flatness"),
    )
)
