"""A flatlab logged model loaded back: the network its workload builds, with the trial's weights.

MLflow loads a flatlab model (:mod:`flatlab.tracking.logged_model` writes it) by importing this module,
the ``python_function`` flavour's ``loader_module``, and calling :func:`_load_pyfunc`::

    import mlflow
    model = mlflow.pyfunc.load_model(f"models:/{model_id}")
    logits = model.predict(x)            # x: numpy (N, ...) inputs of the workload -> numpy (N, classes)
    net = model.get_raw_model()          # the torch.nn.Module itself

:func:`load_torch_model` gives the network without MLflow's wrapper. Both rebuild the network from
``model.json`` (workload name and parameters) through the workload registry and load the safetensors
state dict: nothing in the model folder is executed or unpickled. Rebuilding needs the workloads, so
this module sits above them and above tracking.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch
from safetensors.torch import load_file

from flatlab.lazy import lazy
from flatlab.tracking.logged_model import DATA_DIR, DESCRIPTION, WEIGHTS
from flatlab.workloads.registry import build_workload

mlflow_artifacts = lazy("mlflow.artifacts")


def load_torch_model(model_uri: str, tracking_uri: Optional[str] = None) -> torch.nn.Module:
    """The ``torch.nn.Module`` of a flatlab logged model (``models:/<model_id>`` or a local model folder),
    rebuilt by its workload and loaded from safetensors, in eval mode, on the CPU.

    Raises:
        ValueError: the folder is not a flatlab model (no ``data/flatlab/model.json``).
    """
    local = Path(mlflow_artifacts.download_artifacts(artifact_uri=model_uri, tracking_uri=tracking_uri))
    return _build(local / DATA_DIR)


def _build(data: Path) -> torch.nn.Module:
    if not (data / DESCRIPTION).is_file():
        raise ValueError(f"not a flatlab model: {data} holds no {DESCRIPTION}")
    info = json.loads((data / DESCRIPTION).read_text())
    model = build_workload(info["workload"], **info.get("workload_params", {})).build_model()
    model.load_state_dict(load_file(str(data / WEIGHTS)))
    return model.eval()


class PyfuncModel:
    """What ``mlflow.pyfunc.load_model`` wraps for a flatlab model: ``predict`` runs the network."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def get_raw_model(self) -> torch.nn.Module:
        """The ``torch.nn.Module`` (``PyFuncModel.get_raw_model()``)."""
        return self.module

    def predict(self, model_input: Any, params: Optional[Dict[str, Any]] = None) -> Any:
        """The network's outputs (numpy) for ``model_input``: a numpy array, a tensor or a pandas
        DataFrame of the workload's inputs, ``(N, ...)``; floating inputs are cast to the network's
        dtype. No gradients, eval mode."""
        if hasattr(model_input, "to_numpy"):
            model_input = model_input.to_numpy()
        x = torch.as_tensor(np.asarray(model_input) if not isinstance(model_input, torch.Tensor) else model_input)
        first = next(self.module.parameters(), None)
        if x.is_floating_point() and first is not None:
            x = x.to(first.dtype)
        with torch.no_grad():
            out = self.module(x)
        return out.detach().cpu().numpy()


def _load_pyfunc(data_path: str) -> PyfuncModel:
    """MLflow's entry point for the ``python_function`` flavour (``loader_module``): ``data_path`` is the
    model's ``data`` folder."""
    return PyfuncModel(_build(Path(data_path)))
