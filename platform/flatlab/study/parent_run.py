"""A launch's MLflow parent run: the experiment of the study, the run every trial run hangs under, and
the tags they all share."""

from __future__ import annotations

import time
from pathlib import Path, PurePosixPath
from typing import Any, Dict, Iterable, List, Optional, Tuple

from mlflow.entities import Param

from flatlab._version import __version__
from flatlab.reports.published_runs import launch_param
from flatlab.study.chain import chained_params
from flatlab.study.launches import Launch
from flatlab.study.loader import local_files
from flatlab.study.options import RunOptions
from flatlab.study.plan import plan
from flatlab.study.spec import Study
from flatlab.tracking import runs
from flatlab.tracking.environment import environment_tags, log_packages
from flatlab.tracking.param_text import flat_params
from flatlab.tracking.ui import TEST_METRICS, default_columns, set_default_view
from flatlab.train import config as train_config


def open_parent_run(
    study: Study,
    opts: RunOptions,
    tracking_uri: str,
    root: Path,
    tags: Dict[str, str],
    resumed: Optional[Launch],
    launch_tags: Dict[str, str],
) -> Tuple[str, str, str]:
    """Experiment and parent run of this launch: ``(experiment_id, parent_run_id, tune_experiment_name)``.

    A new launch gets a new parent run (params: the study's settings, nested ones under dotted names,
    :mod:`flatlab.tracking.param_text`; artifacts: the plan, the study file and the modules it imports
    from beside it (:func:`log_study_files`); ``launch_tags``: e.g. the Optuna studies it grows) and becomes
    the experiment's default view in MLflow's UI (:func:`flatlab.tracking.ui.set_default_view`); ``--resume``
    reopens the ``resumed`` launch's parent run.
    """
    experiment_id = runs.get_or_create_experiment(tracking_uri, study.name, runs.artifact_location(root))
    client = runs.client(tracking_uri)
    if resumed is not None:
        client.update_run(resumed.parent_run_id, status="RUNNING")
        client.set_tag(resumed.parent_run_id, "flatlab.resumed", "true")
        return experiment_id, resumed.parent_run_id, resumed.experiment_name
    exp_name = f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    parent = client.create_run(
        experiment_id,
        run_name=f"{study.name} {time.strftime('%Y-%m-%d %H:%M')}",
        tags={**tags, **launch_tags, runs.TAG_ROLE: "study"},
    )
    p = plan(study)
    params = {
        k: p[k] for k in ("workload", "metric", "mode", "searcher", "scheduler", "max_epochs", "total_trials", "seeds")
    }
    params.update(final_seeds=p["final_seeds"], measures=p["measures"] or "none")
    params.update(chained_params(study))  # <arm>.<field> and <arm>.<field>.source of chained values
    if study.reference_arm is not None:
        params["reference_arm"] = study.reference_arm
    if study.target_metric is not None:
        params["target_metric"] = study.target_metric  # flatlab compare --time-to-target's target
    if study.margins:
        params["margins"] = dict(study.margins)  # margins.<quantity> = m: flatlab compare's equivalence margins
    params.update(launch_param(study.published))  # `flatlab curves STUDY` finds the reference here (JSON)
    params.update({"source": opts.source, "wl": p["workload_params"], "train": p["train"]})
    # readable values: wl.width = 128, measures.neighbourhood_loss.sigma = 0.03, final_seeds = 1, 2, 3
    client.log_batch(parent.info.run_id, params=[Param(k, v) for k, v in flat_params(params).items()])
    # the runs table MLflow's UI opens
    set_default_view(client, experiment_id, study, parent.info.run_id, study_columns(study))
    client.log_dict(parent.info.run_id, p, "plan.json")
    log_packages(client, parent.info.run_id)  # environment/requirements.txt (tracking/environment.py)
    if opts.source and Path(opts.source).is_file():
        log_study_files(client, parent.info.run_id, opts.source)
    return experiment_id, parent.info.run_id, exp_name


def log_study_files(client: Any, run_id: str, source: str) -> List[str]:
    """Log the study file ``source`` and the Python files it imported from its folder or below
    (:func:`flatlab.study.loader.local_files`) under the run's ``study/`` artifacts, at their paths
    relative to the study file's folder: the folder can be downloaded and run again. Returns the
    artifact paths logged."""
    folder = Path(source).resolve().parent
    client.log_artifact(run_id, source, artifact_path="study")
    logged = [f"study/{Path(source).name}"]
    for rel in local_files(source):
        where = PurePosixPath("study", *rel.parent.parts)
        client.log_artifact(run_id, str(folder / rel), artifact_path=str(where))
        logged.append(str(where / rel.name))
    return logged


def common_tags(study: Study, opts: RunOptions) -> Dict[str, str]:
    """The tags of the launch's parent run and of every trial run."""
    return {
        runs.TAG_STUDY: study.name,
        runs.TAG_WORKLOAD: study.workload,
        **runs.provenance_tags(),  # commit, dirty or not, and the digest of the package's source
        runs.TAG_VERSION: __version__,
        **environment_tags(),  # python, torch, CUDA, Ray ... versions (tracking/environment.py)
        **opts.extra_tags,
    }


def study_columns(study: Study, test_metrics: Iterable[str] = TEST_METRICS) -> List[str]:
    """:func:`~flatlab.tracking.ui.default_columns` of ``study``: its metric, measures, target and the
    parameters its arms search (in the order the arms declare them)."""
    searched = [name for arm in study.arms for name in arm.searched()]
    target = any(study.train.get(name) is not None for name in train_config.TARGET_HPARAMS)
    at_target = study.train.get("measure_at_train_loss") is not None
    return default_columns(study.metric, searched, study.measures, test_metrics, target, at_target)
