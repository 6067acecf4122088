"""Finding a fine-tuned checkpoint: a local file, an MLflow run id, or a trial of an earlier study.

Reference strings (the ``finetuned`` parameter of ``clip_interpolate``):

* ``mlflow:<study>/<arm>[?<param>=<value>&...]``: the one FINISHED trial of arm ``<arm>`` in the
  latest FINISHED launch of study ``<study>`` (the rule of chained studies,
  :func:`flatlab.study.chain.finished_launch`) whose logged params equal the given ones (numbers
  compared as numbers: ``lr=1e-5`` matches a logged ``1e-05``), e.g.
  ``mlflow:rft_clip_finetune/adamw?lr=3e-05&augment=randaug``;
* ``run:<run_id>``: that MLflow run. A study file gets the BEST fine-tuned model of a study this way
  with ``"finetuned": sp.best_of("rft_clip_finetune", arm="adamw")`` (a chained value, resolved at
  launch to ``run:<run_id>``);
* anything else: a local checkpoint file (safetensors or torch state dict).

MLflow references download the run's final weights (its logged model's safetensors file, or the
``model/model.safetensors`` artifact of runs logged before logged models:
:func:`flatlab.tracking.logged_model.download_weights`) and ``trial.json``, when present, into
``<cache>/checkpoints/<run_id>/`` once per machine; ``<cache>`` is ``$FLATLAB_CACHE`` or
``~/.cache/flatlab``. The tracking URI is the workload's ``tracking_uri`` parameter or
``MLFLOW_TRACKING_URI`` (which ``flatlab run`` sets on every Ray worker).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import parse_qsl

from flatlab.errors import ConfigError

MODEL_ARTIFACT = "model/model.safetensors"
TRIAL_ARTIFACT = "trial.json"


@dataclass(frozen=True)
class Checkpoint:
    """A resolved reference: local ``path``, the MLflow ``run_id`` (``None`` for files) and the trial's
    ``trial.json`` content (``{}`` when unavailable)."""

    path: Path
    run_id: Optional[str] = None
    trial: Dict[str, Any] = field(default_factory=dict)


def cache_root() -> Path:
    """``$FLATLAB_CACHE`` or ``$XDG_CACHE_HOME/flatlab`` or ``~/.cache/flatlab``, as an absolute path."""
    env = os.environ.get("FLATLAB_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    return (Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flatlab").resolve()


def parse_reference(ref: str) -> Tuple[str, Any]:
    """``("mlflow", (study, arm, {param: value}))``, ``("run", run_id)`` or ``("file", path)``.

    Raises:
        ConfigError: an empty reference or a malformed ``mlflow:`` reference.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError(
            "finetuned is empty; give mlflow:<study>/<arm>[?param=value&...], run:<run_id> or a checkpoint path"
        )
    ref = ref.strip()
    if ref.startswith("mlflow:"):
        body, _, query = ref[len("mlflow:") :].partition("?")
        study, sep, arm = body.partition("/")
        if not sep or not study or not arm or "/" in arm:
            raise ConfigError(f"finetuned={ref!r}: expected mlflow:<study>/<arm>[?param=value&...]")
        try:
            # '+' is literal here (1e+20), not a URL-encoded space
            params = dict(parse_qsl(query.replace("+", "%2B"), keep_blank_values=True, strict_parsing=bool(query)))
        except ValueError:
            raise ConfigError(f"finetuned={ref!r}: the query must be param=value pairs joined by '&'") from None
        return "mlflow", (study, arm, params)
    if ref.startswith("run:"):
        run_id = ref[len("run:") :]
        if not run_id:
            raise ConfigError(f"finetuned={ref!r}: expected run:<run_id>")
        return "run", run_id
    return "file", os.path.expanduser(ref)


def label_of(ref: str) -> str:
    """A short label for plots: the query of an ``mlflow:`` reference (``lr=3e-05, augment=none``), else
    the arm, run id or file name."""
    try:
        kind, value = parse_reference(ref)
    except ConfigError:
        return ref
    if kind == "mlflow":
        study, arm, params = value
        return ", ".join(f"{k}={v}" for k, v in params.items()) or arm
    if kind == "run":
        return f"run {value[:8]}"
    return Path(value).name


def same_value(logged: str, wanted: str) -> bool:
    """``logged`` (an MLflow param string) equals ``wanted``: as numbers when both parse, else as text."""
    try:
        a, b = float(logged), float(wanted)
    except (TypeError, ValueError):
        return str(logged) == str(wanted)
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def _tracking_uri(tracking_uri: str) -> str:
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        raise ConfigError(
            "an mlflow:/run: reference needs a tracking URI: set the workload's tracking_uri or MLFLOW_TRACKING_URI "
            "(flatlab run sets it on its Ray workers)"
        )
    return uri


def find_trial_run(tracking_uri: str, study: str, arm: str, params: Dict[str, str]) -> Any:
    """The one FINISHED trial run of ``arm`` in the latest finished launch of ``study`` whose params match
    ``params``.

    Raises:
        ConfigError: unknown study, no finished launch, no match (the arm's finished trials are listed
            with their params) or several matches (add a distinguishing param, e.g. ``seed``).
    """
    from flatlab.study.chain import finished_launch
    from flatlab.tracking import runs

    parent = finished_launch(tracking_uri, study)
    client = runs.client(tracking_uri)
    candidates = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`{runs.PARENT}` = '{parent.info.run_id}' and tags.`{runs.TAG_ARM}` = '{arm}'",
        max_results=50000,
    )
    finished = [r for r in candidates if r.info.status == "FINISHED"]
    matches = [r for r in finished if all(k in r.data.params and same_value(r.data.params[k], v) for k, v in params.items())]
    wanted = "&".join(f"{k}={v}" for k, v in params.items()) or "(no params)"
    if not matches:
        shown = "; ".join(
            ", ".join(f"{k}={v}" for k, v in sorted(r.data.params.items()) if k != "arm" and not runs.is_resolved_param(k)) for r in finished[:8]
        )
        raise ConfigError(
            f"no FINISHED trial of study {study!r}, arm {arm!r} (latest finished launch) has {wanted}; "
            f"finished trials of that arm: {shown or '(none)'}"
        )
    if len(matches) > 1:
        raise ConfigError(
            f"{len(matches)} trials of study {study!r}, arm {arm!r} match {wanted}; add a param that tells them "
            "apart (e.g. seed=0)"
        )
    return matches[0]


def _download(tracking_uri: str, run_id: str) -> Tuple[Path, Dict[str, Any]]:
    from flatlab.tracking import runs
    from flatlab.tracking.logged_model import download_weights

    target = cache_root() / "checkpoints" / run_id
    model = target / MODEL_ARTIFACT
    trial_file = target / TRIAL_ARTIFACT
    client = runs.client(tracking_uri)
    if not model.is_file():
        target.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target, prefix=".download-"))
        try:
            try:
                local = download_weights(client, run_id, str(tmp))
            except Exception as exc:  # MlflowException, OSError ...
                raise ConfigError(f"MLflow run {run_id} has no logged model nor artifact {MODEL_ARTIFACT} ({exc}); "
                                  "was it logged with log_models?") from None
            try:
                os.replace(client.download_artifacts(run_id, TRIAL_ARTIFACT, str(tmp)), trial_file)
            except Exception:  # trial.json is optional
                pass
            model.parent.mkdir(parents=True, exist_ok=True)
            os.replace(local, model)  # last and atomic: a present model file means the download is complete
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    trial: Dict[str, Any] = {}
    if trial_file.is_file():
        try:
            trial = json.loads(trial_file.read_text())
        except json.JSONDecodeError:
            trial = {}
    return model, trial


def resolve_checkpoint(ref: str, tracking_uri: str = "") -> Checkpoint:
    """Resolve ``ref`` (module docstring) to a local file, downloading MLflow artifacts when needed.

    Raises:
        ConfigError: a malformed reference, no tracking URI for an MLflow reference, no matching run,
            a run without a logged model or ``model/model.safetensors``, a missing file.
    """
    kind, value = parse_reference(ref)
    if kind == "file":
        path = Path(value)
        if not path.is_file():
            raise ConfigError(f"finetuned={ref!r} is not a file (nor an mlflow:/run: reference)")
        return Checkpoint(path)
    uri = _tracking_uri(tracking_uri)
    if kind == "run":
        run_id = value
    else:
        study, arm, params = value
        run_id = find_trial_run(uri, study, arm, params).info.run_id
    path, trial = _download(uri, run_id)
    return Checkpoint(path, run_id, trial)


def differing_params(theirs: Dict[str, Any], ours: Dict[str, Any], keys: List[str]) -> List[str]:
    """``"key: fine-tuned=<a>, here=<b>"`` for every key in ``keys`` whose value differs between the
    fine-tuned trial's resolved workload params ``theirs`` and ``ours``."""
    return [f"{k}: fine-tuned={theirs.get(k)!r}, here={ours.get(k)!r}" for k in keys if theirs.get(k) != ours.get(k)]
