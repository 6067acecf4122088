"""How a study reads in MLflow's web UI (MLflow 3): run names, links into the training view, and the
experiment's default runs view.

Run names (:func:`trial_run_name`): ``<arm> · <trial id>`` for a search trial, ``<arm> · final · seed <s>``
for a final-stage re-run; the launch's parent run is ``<study> <date time>``.

Links (:func:`runs_url`, :func:`run_url`): MLflow 3's UI keeps a "GenAI / Model training" switch in the
browser that wins over the experiment's ``mlflow.experimentKind`` tag, so every link flatlab prints
carries ``workflowType=machine_learning`` (the training view) and ``viewStateShareKey`` (the default view).

Default view (:func:`default_view`, :func:`set_default_view`): the UI opens a saved view of an
experiment's runs page for ``?viewStateShareKey=<key>``, read from the experiment tag
``mlflow.sharedViewState.<key>`` (MLflow's ``useSharedExperimentViewState``). flatlab writes the view
:data:`VIEW_KEY` at each launch, and again after it: the trials best first by the study metric, with the
columns a researcher reads first (:func:`default_columns`) and charts that start with the study metric's
curves (:func:`chart_sections`). The UI shows numbers unrounded, and a browser that saved a view of its
own for the experiment keeps it when opened without the link.

Statuses (:data:`OUTCOME_STATUS`): a trial's MLflow status says whether it ran as planned, its
``flatlab.outcome`` tag says how it ended. A pruned trial (stopped by its scheduler at a rung) is a
result, not a failure: FINISHED, ``flatlab.outcome=pruned``. Only errors and divergence are FAILED (red
in the UI); a trial cut short by an interrupted launch is KILLED (``--resume`` finishes it).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence
from urllib.parse import urlencode

from flatlab.tracking.runs import AT_TARGET_PREFIX

#: ``flatlab.outcome`` -> the MLflow run status it ends with.
OUTCOME_STATUS = {
    "completed": "FINISHED",
    "pruned": "FINISHED",
    "diverged": "FAILED",
    "error": "FAILED",
    "interrupted": "KILLED",
}

SEP = " · "
VIEW_KEY = "flatlab"  # the shared view flatlab writes: experiment tag mlflow.sharedViewState.flatlab
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
VIEW_TAG = VIEW_TAG_PREFIX + VIEW_KEY
WORKFLOW = {"workflowType": "machine_learning"}  # MLflow 3's training view (not the GenAI overview)
TEST_METRICS = ("test/accuracy", "test/perplexity", "test/loss")  # as flatlab.analysis.results shows them
TARGET_EPOCHS = "train/epochs_to_target"


def trial_run_name(arm: str, stage: str, seed: Any, trial_id: str, tuning: Optional[int] = None) -> str:
    """The MLflow run name of a trial: ``<arm> · <trial id>`` for a search trial (several trials of an arm
    share a seed), ``<arm> · final · seed <seed>`` for a final-stage re-run (one per arm and seed); in a
    study of several tunings the tuning follows the arm (``sam · t2 · a1b2c3d4``)."""
    head = [arm] if tuning is None else [arm, f"t{tuning}"]
    if stage == "final":
        return SEP.join([*head, "final", f"seed {seed}"])
    return SEP.join([*head, trial_id])


def model_name(arm: str, stage: str, seed: Any, trial_id: str) -> str:
    """The name of a trial's MLflow logged model: :func:`trial_run_name` in the characters MLflow allows
    there (no ``/ : . % " '``): ``sam-a1b2c3d4``, ``sam-final-seed3``."""
    name = f"{arm}-final-seed{seed}" if stage == "final" else f"{arm}-{trial_id}"
    return "".join("_" if c in "/:.%\"' " else c for c in name)


def ui_base(tracking_uri: str) -> Optional[str]:
    """The web address of the MLflow UI for ``tracking_uri``: the server itself for ``http(s)://``
    stores, ``None`` for files (SQLite, ``file:``), which need ``mlflow server`` (:func:`serve_hint`)."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return None


def runs_url(base: str, experiment_id: str) -> str:
    """The experiment's runs page in the training view, opening flatlab's default view."""
    query = urlencode({**WORKFLOW, "viewStateShareKey": VIEW_KEY})
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def run_url(base: str, experiment_id: str, run_id: str, tab: str = "") -> str:
    """A run's page (``tab``: ``model-metrics``, ``artifacts`` ...) in the training view."""
    path = f"/#/experiments/{experiment_id}/runs/{run_id}" + (f"/{tab}" if tab else "")
    return f"{base.rstrip('/')}{path}?{urlencode(WORKFLOW)}"


def models_url(base: str, experiment_id: str) -> str:
    """The experiment's logged models page in the training view."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/models?{urlencode(WORKFLOW)}"


def serve_hint(tracking_uri: str) -> str:
    """The command that serves a file store's UI on this machine only (127.0.0.1), with
    :func:`mlflow_command`'s absolute path: it works in a shell where flatlab's environment is not active."""
    return f"{mlflow_command()} server --backend-store-uri {tracking_uri} --host 127.0.0.1 --port 5000"


def mlflow_command() -> str:
    """The MLflow CLI of the running Python as a shell word: the ``mlflow`` script beside the interpreter
    (a virtual environment's ``bin/``) when there is one, else ``<python> -m mlflow``."""
    script = Path(sys.executable).parent / "mlflow"
    return shlex.quote(str(script)) if script.is_file() else f"{shlex.quote(sys.executable)} -m mlflow"


def where_to_look(tracking_uri: str, experiment_id: str) -> str:
    """One line that says where a study's runs are in MLflow's UI: the runs page's link for a tracking
    server; for a file store, the command that serves it on 127.0.0.1 and the link it then answers."""
    base = ui_base(tracking_uri)
    if base is not None:
        return f"MLflow: {runs_url(base, experiment_id)}"
    return f"MLflow UI: `{serve_hint(tracking_uri)}`, then {runs_url('http://127.0.0.1:5000', experiment_id)}"


def column(kind: str, name: str) -> str:
    """The MLflow UI's id of a runs-table column: ``metrics.`val/accuracy```, ``params.`lr```."""
    return f"{kind}.`{name}`"


def default_columns(
    metric: str,
    searched: Iterable[str],
    measures: Iterable[str] = (),
    test_metrics: Iterable[str] = TEST_METRICS,
    target: bool = False,
    at_target: bool = False,
) -> List[str]:
    """The runs table's default columns (see the module docstring), as UI column ids, in the order they
    are shown after the run name: the study metric, the test metrics, the epochs run, the outcome, the
    searched parameters, then the logged model, the flatness measures and the epochs to the target.

    Args:
        metric: the study metric.
        searched: the searched parameters (params of the trial runs), in order.
        measures: the study's flatness measures (metrics ``flat/<measure>``).
        test_metrics: the test metrics to show (a column without values stays hidden).
        target: the study has a training-loss target (metric ``train/epochs_to_target``).
        at_target: the measures also run at that target (``flat_at_target/<measure>``, after ``flat/<measure>``).
    """
    measures = list(measures)
    first = [column("metrics", m) for m in dict.fromkeys([metric, *test_metrics, "epoch"])]
    flat = [f"flat/{m}" for m in measures] + ([f"{AT_TARGET_PREFIX}{m}" for m in measures] if at_target else [])
    later = [column("metrics", m) for m in flat + ([TARGET_EPOCHS] if target else [])]
    return (
        first
        + [column("tags", "flatlab.outcome")]
        + [column("params", p) for p in dict.fromkeys(searched)]
        + [column("attributes", "Models")]
        + [c for c in later if c not in first]
    )


MODEL_METRICS, SYSTEM_METRICS = "Model metrics", "System metrics"  # MLflow's sections of unprefixed metrics


def chart_sections(metric: str) -> List[str]:
    """The experiment's chart sections (a metric's section is its name up to the last ``/``), in the order
    a researcher reads them: the study metric's (``val``), the training curves per epoch (``train``), the
    final model's test metrics and flatness (``test``, ``flat``: bars, one per run), the smoothed loss
    per optimizer step (``train_step``), the running best (``best/val``) and times; MLflow's own sections
    last (sections flatlab does not know of are added after them)."""
    head = metric.rsplit("/", 1)[0] if "/" in metric else MODEL_METRICS
    names = [head, "train", "test", "flat", "train_step", f"best/{head}", "time", MODEL_METRICS, SYSTEM_METRICS]
    return list(dict.fromkeys(names))


def _line_chart(metric: str, section: str) -> Dict[str, Any]:
    """A line chart of ``metric`` against the step (MLflow's serialised ``RunsChartsLineCardConfig``)."""
    return {
        "uuid": f"flatlab-chart-{metric}",
        "type": "LINE",
        "metricKey": metric,
        "metricSectionId": section,
        "runsCountToCompare": 20,
        "deleted": False,
        "isGenerated": True,
        "lineSmoothness": 0,
        "xAxisKey": "step",
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "selectedXAxisMetricKey": "",
        "useGlobalXaxisKey": True,
        "useGlobalLineSmoothing": True,
        "range": {},
    }


GROUP_BY_ARM = {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": "flatlab.arm"}]}
"""MLflow's "Group by" of the runs table and charts (``RunsGroupByConfig``): runs grouped by their arm tag, so a
chart draws one line per arm, the mean over its runs with the min-max band, instead of a line per run."""


def default_view(columns: List[str], metric: str, mode: str, parent_run_id: str) -> Dict[str, Any]:
    """The shared view state of flatlab's default runs view (MLflow's ``ExperimentPageSearchFacetsState``
    and ``ExperimentPageUIState`` fields, a JSON object: ``searchFilter``, ``orderByKey``, ``orderByAsc``,
    ``selectedColumns``, ``runsExpanded`` ...; column ids ``<attributes|metrics|params|tags>.`<name>```):
    ``columns`` shown in that order after the run name, best
    ``metric`` first (``mode``; MLflow lists runs flat when they are sorted by a metric, the launch runs,
    which have none, last), the launch ``parent_run_id`` expanded when they are nested (sorted by time),
    the first 20 runs drawn in the charts, whose sections come in :func:`chart_sections`' order with the
    study metric's curves first, against the step (the epoch, for per-epoch metrics), and the runs grouped
    by arm (:data:`GROUP_BY_ARM`)."""
    sections = [
        {
            "uuid": f"flatlab-section-{name}",
            "name": name,
            "display": True,
            "isReordered": False,
            "deleted": False,
            "isGenerated": True,
        }
        for name in chart_sections(metric)
    ]
    ids = {s["name"]: s["uuid"] for s in sections}
    head = metric.rsplit("/", 1)[0] if "/" in metric else MODEL_METRICS
    charts = [_line_chart(metric, ids[head]), _line_chart(f"best/{metric}", ids[f"best/{head}"])]
    return {
        "searchFilter": "",
        "orderByKey": column("metrics", metric),
        "orderByAsc": mode == "min",
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "datasetsFilter": [],
        "modelVersionFilter": "All Runs",
        "selectedColumns": columns,
        "columnOrder": [column("attributes", "Run Name"), *columns],
        "columnWidths": {},
        "runsExpanded": {parent_run_id: True},
        "runsPinned": [],
        "runsHidden": [],
        "runsVisibilityMap": {},
        "runsHiddenMode": "FIRST_20_RUNS",
        "compareRunCharts": charts,
        "compareRunSections": sections,
        "isAccordionReordered": True,  # MLflow keeps these sections in this order (new ones go last)
        "viewMaximized": False,
        "runListHidden": False,
        "groupBy": GROUP_BY_ARM,
        "groupsExpanded": {},
        "useGroupedValuesInCharts": True,
        "hideEmptyCharts": True,
        "autoRefreshEnabled": True,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def set_default_view(
    client: Any, experiment_id: str, study: Any, parent_run_id: str, columns: Sequence[str]
) -> Dict[str, Any]:
    """Write flatlab's default view of ``study``'s runs (launch ``parent_run_id``) to the experiment tag
    :data:`VIEW_TAG`; returns the view. ``columns``: the view's columns (:func:`default_columns`, e.g.
    :func:`flatlab.study.parent_run.study_columns` of the study)."""
    view = default_view(list(columns), study.metric, study.mode, parent_run_id)
    client.set_experiment_tag(experiment_id, VIEW_TAG, json.dumps(view, separators=(",", ":")))
    return view
