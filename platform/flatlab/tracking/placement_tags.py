"""Where a trial ran, as tags of its MLflow run: the trial reports its placement under :data:`PLACEMENT_KEY`
(a JSON object as a string, :func:`encode`) and the driver's MLflow callback tags each field as
``flatlab.<field>`` (:func:`placement_tags`)."""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping

#: The report key that carries a trial's placement (a JSON object as a string; Tune keeps strings as they are).
PLACEMENT_KEY = "flatlab/placement"

TAG_PREFIX = "flatlab."
#: The placement fields, tagged ``flatlab.<field>`` on the trial's run.
FIELDS = (
    "device",
    "gpu_name",
    "world_size",
    "workers",
    "resources",
    "node",
    "gpu_ids",
    "start_epoch",
    "cpu_fallback",
    "cpu_denormals",
)


def encode(record: Mapping[str, str]) -> str:
    """``record`` as the :data:`PLACEMENT_KEY` value of a report."""
    return json.dumps(dict(record), sort_keys=True)


def placement_tags(value: Any) -> Dict[str, str]:
    """The run tags (``flatlab.<field>``) of a report's :data:`PLACEMENT_KEY` value (``{}`` for anything
    that is not such a JSON object)."""
    try:
        record = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return {}
    if not isinstance(record, dict):
        return {}
    return {f"{TAG_PREFIX}{k}": str(v)[:5000] for k, v in record.items() if k in FIELDS}
