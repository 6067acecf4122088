"""Third-party usage reporting off in the processes flatlab runs: a local study sends nothing out.

Libraries flatlab runs on report usage over the network by default: Ray's usage statistics
(``RAY_USAGE_STATS_ENABLED``, sent by a Ray instance's head to Ray's collector), MLflow's telemetry
(``MLFLOW_DISABLE_TELEMETRY``, a client ``import mlflow`` starts) and Hugging Face's
(``HF_HUB_DISABLE_TELEMETRY``, sent along with hub calls of ``transformers``/``datasets``). ``import
flatlab`` sets each to off unless the variable is already set, so a user's explicit choice wins. Set
there, before flatlab imports Ray or MLflow, they reach every process of a local launch: the Ray
instance it starts inherits the driver's environment, and each trial imports flatlab again. A cluster
given with ``--address`` keeps its own head's setting for Ray's statistics.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, MutableMapping, Optional

#: each variable and the value that turns its reporting off
OFF: Dict[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}


def disable_reporting(environ: Optional[MutableMapping[str, str]] = None) -> Dict[str, str]:
    """Set each variable of :data:`OFF` in ``environ`` (default ``os.environ``) that is not set yet.

    If MLflow was imported before (its telemetry client already started) and its variable is now off,
    the client is dropped (``mlflow.telemetry.set_telemetry_client`` re-reads the setting).

    Returns:
        The variables this call set (``{}`` when the user had set them all).
    """
    env = os.environ if environ is None else environ
    added = {k: v for k, v in OFF.items() if k not in env}
    env.update(added)
    mlflow_telemetry = sys.modules.get("mlflow.telemetry")
    if environ is None and "MLFLOW_DISABLE_TELEMETRY" in added and mlflow_telemetry is not None:
        mlflow_telemetry.set_telemetry_client()
    return added
