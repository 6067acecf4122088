"""The software a launch ran with: version tags on every run and the installed packages as an artifact.

Tags (on the parent run and every trial run): ``flatlab.env.python``, ``flatlab.env.platform``,
``flatlab.env.torch``, ``flatlab.env.cuda`` (``torch.version.cuda``: the CUDA torch was built with, ``none``
for a CPU build), ``flatlab.env.ray``, ``flatlab.env.optuna``, ``flatlab.env.mlflow``. The parent run's
``environment/requirements.txt`` lists every installed distribution as ``name==version`` (what
``pip freeze`` prints for them, read with :mod:`importlib.metadata`). Values are the driver's; trials on
other machines of a cluster run whatever those have installed.
"""

from __future__ import annotations

import importlib.metadata as metadata
import platform
from typing import Any, Dict

from flatlab.lazy import lazy

torch = lazy("torch")

TAG_PREFIX = "flatlab.env."
PACKAGES_ARTIFACT = "environment/requirements.txt"
_VERSIONED = ("torch", "ray", "optuna", "mlflow")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment_tags() -> Dict[str, str]:
    """``flatlab.env.<name>`` -> version string for python, platform, torch, CUDA, Ray, Optuna and MLflow."""
    tags = {"python": platform.python_version(), "platform": platform.platform()}
    tags.update({name: _version(name) for name in _VERSIONED})
    try:
        tags["cuda"] = torch.version.cuda or "none"
    except ImportError:
        tags["cuda"] = "none"
    return {TAG_PREFIX + k: v for k, v in tags.items()}


def installed_packages() -> str:
    """Every installed distribution as ``name==version``, one per line, sorted by lower-cased name (the
    first found of a name that is installed twice, as Python would import it)."""
    seen: Dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={dist.version}"
    return "\n".join(seen[k] for k in sorted(seen)) + "\n"


def log_packages(client: Any, run_id: str) -> None:
    """Log :func:`installed_packages` as ``environment/requirements.txt`` of ``run_id``."""
    client.log_text(run_id, installed_packages(), PACKAGES_ARTIFACT)
