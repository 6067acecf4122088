"""A trial's final model written as an MLflow logged model, stored as safetensors (no pickle).

A trial that trains logs its final model as an MLflow 3 logged model (``models:/<model_id>``) of its run:
MLflow's Models column and Logged models page list it, the best one can be registered
(``mlflow.register_model("models:/<model_id>", name)``) and any of them loads through MLflow's own API
(``mlflow.pyfunc.load_model``; :mod:`flatlab.models`).

The model folder holds ``data/flatlab/model.safetensors`` (the state dict: tensors only) and ``model.json``
(the workload name and parameters that rebuild the network, :data:`FLAVOR`'s description). Its
``python_function`` flavour names :data:`LOADER_MODULE` as its ``loader_module``: MLflow imports flatlab's
installed code by that name, which rebuilds the network from ``model.json`` and loads the safetensors
file. Nothing in the folder is executed or unpickled (a ``PythonModel`` would be pickled with
cloudpickle, and a models-from-code file would be executed). This module writes and finds models; it
knows no workload (the loader, which builds the workload's network, sits above the workloads).

The logged model carries the run's params, its ``flatlab.*`` identity tags, and the final metrics of
the trial (linked to the model, at the steps and timestamp the driver logs them with: the same metric
rows, stored once).
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import logging
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
from safetensors.torch import save_file

from flatlab._version import __version__
from flatlab.lazy import lazy

mlflow_artifacts = lazy("mlflow.artifacts")
mlflow_entities = lazy("mlflow.entities")
mlflow_models = lazy("mlflow.models")
mlflow_pyfunc = lazy("mlflow.pyfunc")

logger = logging.getLogger(__name__)

FLAVOR = "flatlab"
DATA_DIR = "data/flatlab"  # in the model folder (MLflow copies the data folder "flatlab" under "data/")
WEIGHTS = "model.safetensors"
DESCRIPTION = "model.json"
MODEL_TYPE = "flatlab"
#: The module MLflow imports to load a flatlab model (its ``_load_pyfunc``): :mod:`flatlab.models`.
LOADER_MODULE = "flatlab.models"
LEGACY_ARTIFACT = "model/model.safetensors"  # where runs logged before logged models kept the weights
_IDENTITY_TAGS = (
    "flatlab.study",
    "flatlab.arm",
    "flatlab.optimizer",
    "flatlab.stage",
    "flatlab.seed",
    "flatlab.trial_id",
    "flatlab.workload",
)


def describe(spec: Any) -> Dict[str, Any]:
    """``model.json`` of a :class:`~flatlab.train.config.TrialSpec`: what rebuilds its network."""
    return {"workload": spec.workload, "workload_params": dict(spec.workload_params), "flatlab_version": __version__}


def requirements() -> List[str]:
    """The pip requirements of a logged model (installed versions; no inference run)."""
    out = []
    for dist in ("flatlab", "torch", "safetensors", "mlflow"):
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            out.append(dist)
    return out


def save(path: Path, model: torch.nn.Module, spec: Any) -> Any:
    """Write ``model`` (its state dict) and ``spec``'s description as an MLflow model folder at ``path``
    (which must not exist); returns the :class:`mlflow.models.Model` written there (without ids)."""
    return _save(Path(path), model, spec, None)


def _save(path: Path, model: torch.nn.Module, spec: Any, mlflow_model: Any) -> Any:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / Path(DATA_DIR).name
        data.mkdir()
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(data / WEIGHTS))
        info = describe(spec)
        (data / DESCRIPTION).write_text(json.dumps(info, indent=2, default=str))
        mlflow_model = mlflow_model or mlflow_models.Model()
        mlflow_model.add_flavor(
            FLAVOR,
            weights=f"{DATA_DIR}/{WEIGHTS}",
            description=f"{DATA_DIR}/{DESCRIPTION}",
            workload=info["workload"],
            flatlab_version=info["flatlab_version"],
        )
        mlflow_pyfunc.save_model(
            str(path),
            loader_module=LOADER_MODULE,
            data_path=str(data),
            mlflow_model=mlflow_model,
            pip_requirements=requirements(),
        )
    return mlflow_model


def log_trial_model(client: Any, run_id: str, name: str, model: torch.nn.Module, spec: Any, *, step: int = 0) -> str:
    """Log ``model`` as an MLflow logged model of run ``run_id`` (its output at ``step``) named ``name``;
    returns its id. The model gets the run's params and ``flatlab.*`` identity tags. Its metrics are the
    trial's final report, which only the driver logs, linked to this id
    (:data:`flatlab.tracking.runs.MODEL_ID_KEY`, :class:`flatlab.tracking.callback.MLflowTrialLogger`).

    Raises:
        MlflowException: MLflow refused a call (the logged model, if created, is marked FAILED).
    """
    run = client.get_run(run_id)
    tags = {k: v for k, v in run.data.tags.items() if k in _IDENTITY_TAGS}
    logged = client.create_logged_model(
        run.info.experiment_id,
        name=name,
        source_run_id=run_id,
        params=dict(run.data.params),
        tags=tags,
        model_type=MODEL_TYPE,
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            mlflow_model = mlflow_models.Model(
                artifact_path=logged.artifact_location,
                model_uuid=logged.model_id,
                run_id=run_id,
                model_id=logged.model_id,
            )
            _save(Path(tmp) / "model", model, spec, mlflow_model)
            client.log_model_artifacts(logged.model_id, str(Path(tmp) / "model"))
        client.log_outputs(run_id, [mlflow_entities.LoggedModelOutput(logged.model_id, step=step)])
    except BaseException:
        client.finalize_logged_model(logged.model_id, mlflow_entities.LoggedModelStatus.FAILED)
        raise
    client.finalize_logged_model(logged.model_id, mlflow_entities.LoggedModelStatus.READY)
    return logged.model_id


def run_model_id(client: Any, run_id: str) -> Optional[str]:
    """The id of the latest READY flatlab logged model whose source is run ``run_id`` (``None``: none)."""
    run = client.get_run(run_id)
    found = client.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{run_id}' AND model_type = '{MODEL_TYPE}'",
        order_by=[{"field_name": "creation_timestamp", "ascending": False}],
    )
    ready = [m for m in found if m.status == mlflow_entities.LoggedModelStatus.READY]
    return ready[0].model_id if ready else None


def download_weights(client: Any, run_id: str, dst: str) -> str:
    """Download the final weights of trial run ``run_id`` into folder ``dst``: its logged model's
    ``data/flatlab/model.safetensors``, or, for runs logged before logged models, its ``model/model.safetensors``
    artifact. Returns the local file.

    Raises:
        MlflowException, OSError: the run has neither (MLflow's error for the legacy artifact).
    """
    model_id = run_model_id(client, run_id)
    if model_id is None:
        return client.download_artifacts(run_id, LEGACY_ARTIFACT, dst)
    location = client.get_logged_model(model_id).artifact_location.rstrip("/")
    return mlflow_artifacts.download_artifacts(
        artifact_uri=f"{location}/{DATA_DIR}/{WEIGHTS}", dst_path=dst, tracking_uri=client.tracking_uri
    )
