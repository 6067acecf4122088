"""Where a workload's data come from: a Hugging Face hub name, a local path, or ``"synthetic"``.

Every data-backed workload has a ``data_path`` parameter:

* ``None`` (default): the hub dataset (``datasets.load_dataset(hub_name, config)``); works offline too
  when the HF cache already holds it (``HF_DATASETS_OFFLINE=1``).
* a local path: a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (read with
  ``datasets.load_from_disk``), or anything else ``datasets.load_dataset`` accepts (a folder of data
  files, a local copy of the hub repository).
* ``"synthetic"``: a small dataset generated deterministically in the workload's schema (tests and the
  ``smoke`` scale of the study files; no file is read).

When neither the path nor the hub is reachable, :func:`load_hf` raises :class:`DataUnavailable`, which
names the parameter and says how to provide the data offline. ``datasets`` is imported lazily.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Tuple

from flatlab.errors import ConfigError
from flatlab.lazy import lazy

datasets = lazy("datasets")  # optional: the vision, nlp and clip extras install it

SYNTHETIC = "synthetic"


class DataUnavailable(ConfigError):
    """A workload's data could be read neither from ``data_path`` nor from the hub."""


def describe_error(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, at most ``limit`` characters of message (for wrapped errors)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


def is_synthetic(data_path: Optional[str]) -> bool:
    """Whether ``data_path`` selects the generated dataset."""
    return data_path == SYNTHETIC


def _offline_hint(workload: str, hub_name: str, config: Optional[str], param: str) -> str:
    cfg = f", {config!r}" if config else ""
    return (
        f"To run offline, on a machine with network access run "
        f"`datasets.load_dataset({hub_name!r}{cfg}).save_to_disk(DIR)`, copy DIR here and pass "
        f"workload_params={{{param!r}: DIR}}; or pre-fill the Hugging Face cache and set HF_DATASETS_OFFLINE=1; "
        f"or use {param}={SYNTHETIC!r} for a small generated dataset in workload {workload!r}'s schema."
    )


def load_hf(
    workload: str,
    hub_name: str,
    config: Optional[str] = None,
    data_path: Optional[str] = None,
    param: str = "data_path",
    hint: Optional[str] = None,
) -> Any:
    """A ``datasets.DatasetDict`` (or ``Dataset``) from ``data_path`` if given, else from the hub.

    Args:
        workload: the workload's registry name (for messages).
        hub_name, config: ``datasets.load_dataset`` arguments used when ``data_path`` is ``None``.
        data_path: a ``save_to_disk`` folder or any path ``load_dataset`` accepts.
        param: the workload parameter that holds ``data_path`` (for messages).
        hint: what the message says after the reason (default: how to provide the data offline).
    Raises:
        DataUnavailable: the path does not exist or cannot be read, or the hub cannot be reached;
            the message names ``param`` and explains how to provide the data offline.
    """
    load_dataset, load_from_disk = datasets.load_dataset, datasets.load_from_disk  # imported here, not in a try
    hint = hint or _offline_hint(workload, hub_name, config, param)
    if data_path is not None:
        p = Path(os.path.expanduser(data_path))
        if not p.exists():
            raise DataUnavailable(f"workload {workload!r}: {param}={data_path!r} does not exist. {hint}")
        is_saved = (p / "dataset_dict.json").exists() or (p / "state.json").exists()
        try:
            if is_saved:
                return load_from_disk(str(p))
            return load_dataset(str(p), config) if config else load_dataset(str(p))
        except Exception as exc:  # noqa: BLE001 - any reader failure becomes one clear message
            raise DataUnavailable(
                f"workload {workload!r}: could not read {param}={data_path!r} ({describe_error(exc)}). {hint}"
            ) from exc
    try:
        return load_dataset(hub_name, config)
    except Exception as exc:  # noqa: BLE001 - network / cache errors come in many types
        raise DataUnavailable(
            f"workload {workload!r}: {param} is not set and the hub dataset {hub_name!r}"
            f"{f' ({config})' if config else ''} could not be loaded ({describe_error(exc)}). {hint}"
        ) from exc


def get_split(dsets: Any, names: Tuple[str, ...]) -> Any:
    """The first split of ``dsets`` named in ``names`` (``None`` if there is none).

    A bare ``Dataset`` (not a dict) counts as the ``train`` split.
    """
    if isinstance(dsets, datasets.Dataset):
        return dsets if "train" in names else None
    for n in names:
        if n in dsets:
            return dsets[n]
    return None


def require_split(dsets: Any, names: Tuple[str, ...], workload: str, data_path: Optional[str]) -> Any:
    """Like :func:`get_split`, but raises ``DataUnavailable`` listing the splits found."""
    got = get_split(dsets, names)
    if got is None:
        have = list(dsets.keys()) if hasattr(dsets, "keys") else ["(a single Dataset)"]
        raise DataUnavailable(
            f"workload {workload!r}: data at {data_path or 'the hub'} has no split named {' or '.join(names)}; "
            f"found: {', '.join(have)}"
        )
    return got


def require_columns(ds: Any, candidates: Tuple[str, ...], what: str, workload: str) -> str:
    """The first of ``candidates`` that is a column of ``ds``; raises ``DataUnavailable`` otherwise."""
    for c in candidates:
        if c in ds.column_names:
            return c
    raise DataUnavailable(
        f"workload {workload!r}: no {what} column; expected one of {', '.join(candidates)}, "
        f"found {', '.join(ds.column_names)}"
    )
