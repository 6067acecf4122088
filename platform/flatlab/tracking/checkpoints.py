"""Checkpoints of earlier trials, fetched from MLflow onto the machine of the trial that reads them.

A workload declares the parameters that name a model checkpoint (``Workload.checkpoint_params``, e.g.
``clip_interpolate``'s ``finetuned``); the workload itself only reads local files. In a study such a
parameter may also hold ``run:<run_id>``, an MLflow run: written by hand, or by the chained-study
resolution at launch (:func:`flatlab.study.chain.resolve_chained`, for ``mlflow:<study>/<arm>?...``
references and ``sp.best_of(..., param=None)``). Before the trial builds its workload,
:func:`local_params` replaces every such value by the path of the run's ``model/model.safetensors``,
downloaded once per machine into ``<cache>/checkpoints/<run_id>/`` (``<cache>``:
:func:`flatlab.cache.cache_root`) with the run's ``trial.json`` beside it, in the run's own artifact
layout: ``<run_id>/model/model.safetensors`` and ``<run_id>/trial.json``. The reference syntax is
:func:`parse_reference`'s; resolving a reference is the launch's job (:mod:`flatlab.study.chain`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, Mapping, Tuple
from urllib.parse import parse_qsl

from flatlab.cache import cache_root
from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.tracking import runs

logged_model = lazy("flatlab.tracking.logged_model")  # it imports torch

MODEL_ARTIFACT = "model/model.safetensors"
TRIAL_ARTIFACT = "trial.json"
RUN_PREFIX = "run:"
REFERENCE_PREFIX = "mlflow:"


def parse_reference(ref: str) -> Tuple[str, str, Dict[str, str]]:
    """``(study, arm, {param: value})`` of a reference ``mlflow:<study>/<arm>[?<param>=<value>&...]``.

    Raises:
        ConfigError: ``ref`` is not of that form (naming it and the form).
    """
    text = ref.strip() if isinstance(ref, str) else ""
    if not text.startswith(REFERENCE_PREFIX):
        raise ConfigError(f"{ref!r} is not a reference; expected mlflow:<study>/<arm>[?param=value&...]")
    body, _, query = text[len(REFERENCE_PREFIX) :].partition("?")
    study, sep, arm = body.partition("/")
    if not sep or not study or not arm or "/" in arm:
        raise ConfigError(f"{ref!r}: expected mlflow:<study>/<arm>[?param=value&...]")
    try:
        # '+' is literal here (1e+20), not a URL-encoded space
        params = dict(parse_qsl(query.replace("+", "%2B"), keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        raise ConfigError(f"{ref!r}: the query must be param=value pairs joined by '&'") from None
    return study, arm, params


def is_reference(value: Any) -> bool:
    """``value`` is written as a reference (``mlflow:...``), well formed or not."""
    return isinstance(value, str) and value.strip().startswith(REFERENCE_PREFIX)


def fetch_run(tracking_uri: str, run_id: str) -> Path:
    """The local path of MLflow run ``run_id``'s final weights (its logged model's safetensors file, or the
    ``model/model.safetensors`` artifact of runs logged before logged models:
    :func:`flatlab.tracking.logged_model.download_weights`), downloaded (with its
    ``trial.json``, when the run has one) into ``<cache>/checkpoints/<run_id>/`` unless already there.
    The model file is moved into place last, so a present model file means a complete download.

    Raises:
        ConfigError: the run has neither a logged model nor ``model/model.safetensors`` (or cannot be read).
    """
    target = cache_root() / "checkpoints" / run_id
    model = target / MODEL_ARTIFACT
    if model.is_file():
        return model
    client = runs.client(tracking_uri)
    target.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target, prefix=".download-"))
    try:
        try:
            local = logged_model.download_weights(client, run_id, str(tmp))
        except Exception as exc:  # MlflowException, OSError ...
            raise ConfigError(
                f"MLflow run {run_id} has no logged model nor artifact {MODEL_ARTIFACT} ({exc}); "
                "was it logged with log_models?"
            ) from None
        try:
            os.replace(client.download_artifacts(run_id, TRIAL_ARTIFACT, str(tmp)), target / TRIAL_ARTIFACT)
        except Exception:  # noqa: BLE001 - trial.json is optional
            pass
        model.parent.mkdir(parents=True, exist_ok=True)
        os.replace(local, model)  # last and atomic
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model


def local_params(params: Mapping[str, Any], names: Iterable[str], tracking_uri: str = "") -> Dict[str, Any]:
    """``params`` (a trial's workload parameters) with every ``run:<run_id>`` value of the checkpoint
    parameters ``names`` replaced by the local file :func:`fetch_run` gives; other values unchanged.

    Args:
        tracking_uri: the MLflow store of the runs; ``''``: ``MLFLOW_TRACKING_URI`` (which ``flatlab run``
            sets on its Ray workers).
    Raises:
        ConfigError: a ``run:`` value without a tracking URI or a run id; an ``mlflow:`` reference (one is
            resolved when its study is launched, never inside a trial); as :func:`fetch_run`.
    """
    out = dict(params)
    for name in names:
        value = out.get(name)
        if not isinstance(value, str):
            continue
        if is_reference(value):
            raise ConfigError(
                f"{name}={value!r}: an mlflow: reference is resolved when its study is launched (flatlab run, "
                f"flatlab.study.chain.resolve_chained); a trial takes run:<run_id> or a checkpoint file"
            )
        if value.startswith(RUN_PREFIX):
            run_id = value[len(RUN_PREFIX) :]
            if not run_id:
                raise ConfigError(f"{name}={value!r}: expected run:<run_id>")
            uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
            if not uri:
                raise ConfigError(
                    f"{name}={value!r}: a run: reference needs a tracking URI: set MLFLOW_TRACKING_URI "
                    f"(flatlab run sets it on its Ray workers)"
                )
            out[name] = str(fetch_run(uri, run_id))
    return out
