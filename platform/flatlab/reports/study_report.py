"""The study's summary on its MLflow parent run: best values per arm and the plots a reader looks for first.

After a launch (:func:`flatlab.reports.post_study.post_study`), :func:`log_study_report` logs to the parent run,
from the launch's trials as it is handed them:

* ``report/best_per_arm.json``, a table (``mlflow.log_table``), one row per arm: its best completed trial
  (:func:`flatlab.analysis.selection.best_trial_rows`), its epochs, the study metric, the test metric,
  its flatness measures and its params. The parent run holds no per-arm metrics, so MLflow's charts
  show the trials' curves;
* ``report/learning_curves.png``: the study metric against the epoch, one line per trial, one panel per
  arm (solid: completed, dotted: pruned or stopped, dashed: final-stage re-runs);
* ``report/parallel_coordinate_<arm>.png`` and ``report/param_importances_<arm>.png``: Optuna's
  matplotlib visualisations over the arm's Optuna study (parallel coordinates tidied by
  :func:`flatlab.analysis.plot_axes.tidy_parallel_coordinate`; fANOVA importances with a fixed seed,
  which need >= 2 completed trials and a searched parameter);
* ``report/metric_vs_flatness.png`` (:func:`flatlab.analysis.compare.plot.plot_metric_vs_flatness`) for
  studies without a final stage whose trials measured flatness (with one,
  :func:`flatlab.reports.publish.log_comparison` logs it under ``compare/``);

and it points the experiment's default view in MLflow's UI (:func:`flatlab.tracking.ui.set_default_view`)
at this launch. What cannot be drawn (no completed trial, a grid study without Optuna studies, an arm
that searches nothing) is skipped with its reason in the study's log. Nothing here ever raises: every
trial is already recorded, and a plot must not fail the study.
"""

from __future__ import annotations

import logging
import math
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from flatlab.analysis.compare.plot import plot_metric_vs_flatness
from flatlab.analysis.plot_axes import integer_ticks, plain_figure, plain_numbers, tidy_parallel_coordinate
from flatlab.analysis.report import best_per_arm_table
from flatlab.analysis.results import _test_metric
from flatlab.lazy import lazy
from flatlab.reports.launched import Launched
from flatlab.tracking import runs, ui

matplotlib = lazy("matplotlib")
matplotlib_figure = lazy("matplotlib.figure")
optuna = lazy("optuna")
plt = lazy("matplotlib.pyplot")

logger = logging.getLogger(__name__)

ARTIFACT_DIR = "report"
IMPORTANCE_SEED = 0  # fANOVA's random forest: the same importances on every run of the report


def log_study_report(launched: Launched, trials: Any) -> List[str]:
    """Log the study report of the ended launch ``launched`` (see the module docstring) to its parent run.

    Args:
        launched: the launch (:class:`~flatlab.reports.launched.Launched`: its study, store, parent run,
            output folder, Optuna studies and default MLflow view).
        trials: the launch's trials table (:func:`~flatlab.tracking.trials.trials_frame`; rows of other
            launches are left out).
    Returns:
        The artifact paths and metric names logged.
    """
    study, parent_run_id = launched.study, launched.parent_run_id
    logged: List[str] = []
    skipped: List[str] = []
    try:
        client = runs.client(runs.existing_store(launched.tracking_uri))
    except Exception as exc:  # noqa: BLE001 - a report must never fail the study
        logger.warning("study report: no store for run %s: %s", parent_run_id, exc)
        return logged
    df = trials[trials["launch"] == parent_run_id] if "launch" in trials.columns else trials
    _default_view(client, launched, df)
    try:
        logged += log_best_per_arm(client, parent_run_id, df, study.metric)
    except Exception as exc:  # noqa: BLE001
        logger.warning("study report: best-per-arm table not logged to run %s: %s", parent_run_id, exc, exc_info=True)
    plots = (
        (
            "learning curves",
            lambda tmp: [
                plot_learning_curves(
                    client, df, study.metric, tmp / "learning_curves.png", arms=[a.name for a in study.arms]
                )
            ],
        ),
        ("Optuna plots", lambda tmp: optuna_plots(study, launched.out, launched.optuna_studies, tmp, skipped)),
        ("metric against flatness", lambda tmp: flatness_plot(study, df, tmp, skipped)),
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in plots:
            try:
                for path in make(Path(tmp)):
                    client.log_artifact(parent_run_id, str(path), ARTIFACT_DIR)
                    logged.append(f"{ARTIFACT_DIR}/{Path(path).name}")
            except Exception as exc:  # noqa: BLE001 - warn, keep the other plots
                logger.warning("study report: %s not logged to run %s: %s", name, parent_run_id, exc, exc_info=True)
                skipped.append(f"{name} ({type(exc).__name__}: {exc})")
    for reason in skipped:
        logger.info("study report: skipped %s", reason)
    n_plots = sum(p.endswith(".png") for p in logged)
    line = f"study report: {n_plots} plots on the parent run ({ARTIFACT_DIR}/)" + (
        f"; {len(skipped)} skipped (reasons in {launched.log})" if skipped else ""
    )
    logger.info("%s", line)
    if launched.console is not None:
        launched.console.print(line)
    return logged


def _default_view(client: Any, launched: Launched, df: Any) -> None:
    """Point the experiment's default runs view in MLflow's UI at this launch
    (:func:`flatlab.tracking.ui.set_default_view`), its columns naming the test metric the trials logged."""
    if launched.columns is None:
        return
    try:
        test = _test_metric(df) if not df.empty else None
        columns = launched.columns([test] if test else ui.TEST_METRICS)
        ui.set_default_view(client, launched.experiment_id, launched.study, launched.parent_run_id, columns)
    except Exception as exc:  # noqa: BLE001
        logger.warning("study report: default MLflow view not updated for run %s: %s", launched.parent_run_id, exc)


BEST_TABLE = f"{ARTIFACT_DIR}/best_per_arm.json"


def log_best_per_arm(client: Any, run_id: str, df: Any, metric: str) -> List[str]:
    """Log :func:`best_per_arm_table` to ``run_id`` as the table :data:`BEST_TABLE` (``log_table``: MLflow's
    UI shows it in the run's artifacts as a table), one comparison of the arms instead of one metric per
    arm and value. Returns the artifact paths logged (none when no arm completed a trial)."""
    table = best_per_arm_table(df, metric, trial_name=_run_name)
    if table.empty:
        return []
    client.log_table(run_id, data=table, artifact_file=BEST_TABLE)
    return [BEST_TABLE]


def _run_name(row: Any) -> str:
    """The MLflow run name of a trials-table row (:func:`flatlab.tracking.ui.trial_run_name`)."""
    return ui.trial_run_name(row["arm"], row.get("stage", "search"), row.get("seed", ""), row.get("trial_id", ""))


_STYLE = {"completed": "-", "final": "--"}  # anything else (pruned, diverged, interrupted): dotted


def plot_learning_curves(client: Any, df: Any, metric: str, path: Path, arms: Optional[List[str]] = None) -> Path:
    """Save a PNG: ``metric`` against the epoch (its MLflow history, step = epoch), one line per trial of
    ``df`` (a :func:`~flatlab.tracking.trials.trials_frame` table), one panel per arm (``arms``: their
    order; default: as they appear). Solid: completed search trials; dashed: final-stage trials; dotted:
    pruned, diverged or interrupted ones. Epoch ticks are integers; tick labels carry no offset text
    (:mod:`flatlab.analysis.plot_axes`).

    Raises:
        ValueError: ``df`` has no trial with a recorded value of ``metric``.
    """
    curves: Dict[str, List[Any]] = {}
    for _, row in df.iterrows():
        history = {
            m.step: m.value for m in sorted(client.get_metric_history(row["run_id"], metric), key=lambda m: m.timestamp)
        }
        points = [(s, v) for s, v in sorted(history.items()) if math.isfinite(v)]  # the last value of a re-run epoch
        if points:
            style = "--" if row.get("stage") == "final" else _STYLE.get(row.get("outcome"), ":")
            curves.setdefault(row["arm"], []).append((points, style))
    if not curves:
        raise ValueError(f"no trial recorded {metric!r}: no learning curve to draw")
    order = [a for a in (arms or []) if a in curves] + [a for a in curves if a not in (arms or [])]
    cols = min(3, len(order))
    nrows = math.ceil(len(order) / cols)
    fig = matplotlib_figure.Figure(figsize=(4.2 * cols, 3.4 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, cols, squeeze=False, sharey=True)).ravel()
    for i, (ax, arm) in enumerate(zip(axes, order)):
        for points, style in curves[arm]:
            x, y = zip(*points)
            ax.plot(x, y, style, color=f"C{i % 10}", alpha=0.75, linewidth=1.2, marker="." if len(x) < 3 else None)
        ax.set_title(f"{arm} ({len(curves[arm])} trials)", fontsize="medium")
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        integer_ticks(ax.xaxis)
        plain_numbers(ax)
    for ax in axes[len(order) :]:
        ax.set_visible(False)
    fig.suptitle(f"{metric} per epoch (solid: completed, dotted: stopped early, dashed: final stage)", fontsize="small")
    fig.savefig(path, dpi=110)
    return Path(path)


def optuna_plots(study: Any, out: Path, names: Mapping[str, str], tmp: Path, skipped: List[str]) -> List[Path]:
    """Per arm, Optuna's parallel-coordinate plot and fANOVA importance plot of its Optuna study (``names``:
    arm -> study in ``<out>/optuna.db``, as the launch record names them) as PNGs under ``tmp``. An arm that
    cannot have one gets a reason appended to ``skipped``: no Optuna studies (grid searcher), no searched
    parameter, no completed trial, fewer than 2 for importances or all of one value (the importances are
    undefined)."""
    db = out / "optuna.db"
    if study.searcher == "grid" or not db.exists() or not names:
        skipped.append(f"parallel coordinates and importances: no Optuna studies (searcher={study.searcher!r}, {db})")
        return []
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}", engine_kwargs={"connect_args": {"timeout": 30}})
    paths: List[Path] = []
    for arm in study.arms:
        if not arm.searched():
            skipped.append(f"parallel coordinates and importances of arm {arm.name!r}: it searches no parameter")
            continue
        try:
            paths += _arm_plots(
                optuna.load_study(study_name=names[arm.name], storage=storage), arm.name, study.metric, tmp, skipped
            )
        except Exception as exc:  # noqa: BLE001 - one arm's plot must not cost the others theirs
            logger.warning("study report: Optuna plots of arm %s failed: %s", arm.name, exc, exc_info=True)
            skipped.append(f"parallel coordinates and importances of arm {arm.name!r} ({type(exc).__name__}: {exc})")
    return paths


def _arm_plots(st: Any, arm: str, metric: str, tmp: Path, skipped: List[str]) -> List[Path]:
    """The parallel-coordinate and importance PNGs of one arm's Optuna study ``st`` (see :func:`optuna_plots`)."""
    plots = optuna.visualization.matplotlib
    done = st.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        skipped.append(f"parallel coordinates and importances of arm {arm!r}: no completed trial")
        return []

    paths = [
        _optuna_png(
            lambda: plots.plot_parallel_coordinate(st, target_name=metric),
            tmp / f"parallel_coordinate_{arm}.png",
            f"{arm}: {metric}",
            tidy=tidy_parallel_coordinate,
        )
    ]
    if len(done) < 2:
        skipped.append(f"importances of arm {arm!r}: {len(done)} completed trial (needs >= 2)")
        return paths
    if len({t.value for t in done}) == 1:  # fANOVA divides by the variance of the values
        skipped.append(
            f"importances of arm {arm!r}: its {len(done)} completed trials share one {metric} ({done[0].value:g})"
        )
        return paths
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)
    paths.append(
        _optuna_png(
            lambda: plots.plot_param_importances(st, evaluator=evaluator, target_name=metric),
            tmp / f"param_importances_{arm}.png",
            f"{arm}: importance for {metric}",
        )
    )
    return paths


def _optuna_png(draw: Any, path: Path, title: str, tidy: Any = None) -> Path:
    """Run one of Optuna's matplotlib plots (``draw() -> Axes``), ``tidy(figure, axes)`` it when given,
    title it, save it to ``path`` and close its figure. Optuna draws through pyplot and switches pyplot's
    style to ``ggplot`` for good: the caller's rcParams are restored afterwards, and the figure leaves
    pyplot's registry. Numeric tick labels carry no offset text (:func:`flatlab.analysis.plot_axes.plain_figure`)."""
    with matplotlib.rc_context(), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", UserWarning)  # matplotlib on one trial: "identical low and high ylims"
        ax = draw()
        fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
        try:
            if tidy is not None:
                tidy(fig, ax)
            fig.suptitle(title, fontsize="medium")
            plain_figure(fig)
            fig.savefig(path, dpi=110, bbox_inches="tight")
        finally:
            plt.close(fig)
    return path


def flatness_plot(study: Any, df: Any, tmp: Path, skipped: List[str]) -> List[Path]:
    """``metric_vs_flatness.png`` over ``df``'s completed trials, for studies without a final stage (with
    one, :func:`~flatlab.reports.publish.log_comparison` logs it); skipped (with a reason) where no trial
    recorded a ``flat/*`` measure."""
    if study.final_seeds or (study.searcher == "grid" and len(study.seeds) > 1):
        return []  # the comparison already has it (compare/metric_vs_flatness.png)
    if not any(c.startswith("flat/") and df[c].notna().any() for c in df.columns):
        skipped.append("metric against flatness: no trial recorded a flat/* measure")
        return []
    return [plot_metric_vs_flatness(df, tmp / "metric_vs_flatness.png", all_trials=True)]
