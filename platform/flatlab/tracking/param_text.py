"""MLflow params as values a reader can use: nested settings flattened to dotted names, no Python reprs.

MLflow stores a param as one string. ``str({'model': 'mlp', 'width': 128})`` is neither filterable
(``params.`wl.width` = '128'``) nor readable in the UI's table, so a mapping becomes one param per
entry under a dotted name (``wl.model = mlp``, ``wl.width = 128``; nested mappings nest further:
``measures.neighbourhood_loss.sigma = 0.03``), a list or tuple of plain values a comma-separated
list (``1, 2, 3``), an empty mapping ``(defaults)`` (e.g. a measure that takes its default settings)
and anything else ``str(value)``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

EMPTY = "(defaults)"
VALUE_LIMIT = 6000  # MLflow's limit on a param value's length (characters)


def text(value: Any) -> str:
    """One param value as text: sequences of plain values comma-separated, ``None`` as ``None``, the rest
    ``str(value)``, cut to MLflow's :data:`VALUE_LIMIT`. (Mappings are for :func:`flat_params`.)"""
    if isinstance(value, (list, tuple)) and all(not isinstance(v, (list, tuple, dict)) for v in value):
        out = ", ".join(str(v) for v in value)
    else:
        out = str(value)
    return out[:VALUE_LIMIT]


def flat_params(values: Mapping[str, Any], prefix: str = "") -> Dict[str, str]:
    """``values`` as MLflow params: ``{prefix + key: text}``, mappings flattened to ``<key>.<subkey>``
    (an empty one is :data:`EMPTY`), in ``values``' order.

    >>> flat_params({"model": "mlp", "width": 128}, "wl.")
    {'wl.model': 'mlp', 'wl.width': '128'}
    """
    out: Dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, name + ".") if value else {name: EMPTY})
        else:
            out[name] = text(value)
    return out
