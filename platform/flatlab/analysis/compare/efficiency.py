"""HPO efficiency: the share of a paper grid's compute that an Optuna + ASHA search of the same arm
needed to reach the grid's best validation metric (``flatlab compare --against``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from flatlab.analysis.compare.columns import number
from flatlab.analysis.compare.statistics import finite
from flatlab.analysis.sample import has_values
from flatlab.analysis.selection import completed
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")


def hpo_efficiency(
    grid_df, search_df, *, metric: str, mode: str, tolerance: float, arm: Optional[str] = None
) -> Dict[str, Any]:
    """The fraction of a paper grid's compute an Optuna + ASHA search of the same arm needed to reach
    the grid's best validation metric.

    Compute is trial-epochs (column ``epochs``). The grid's best is the best ``best/<metric>``
    (else ``<metric>``) of its completed trials, a single trial's value (stricter than the best
    configuration's mean over seeds). The search's trials are taken in start order (``start_time``)
    and their epochs summed up to and including the first completed trial whose value is within
    ``tolerance`` of the grid's best (``>= best − tolerance`` for ``mode="max"``, ``<= best + tolerance``
    for ``"min"``); pruned, diverged and errored trials add their epochs but never count as reaching
    it. Final-stage trials (``stage == "final"``) are left out of both.

    Args:
        grid_df, search_df: ``trials_frame`` tables of the grid study and the search study.
        metric: the validation metric (e.g. ``val/accuracy``).
        mode: ``max`` or ``min``.
        tolerance: absolute, in the metric's units, >= 0.
        arm: only this arm's trials of both (default all trials).
    Returns:
        ``{"metric", "mode", "tolerance", "grid_best", "target", "grid_trials", "grid_epochs",
        "search_trials", "search_total_epochs", "reached", "trials_used", "search_epochs",
        "fraction", "run_id", "trial_id"}``; when the search never reaches the target, ``reached`` is
        False and ``trials_used``, ``search_epochs``, ``fraction``, ``run_id``, ``trial_id`` are None.
    Raises:
        ConfigError: ``mode`` not max/min, a negative or non-finite ``tolerance``, a frame without
            the ``epochs``/metric/``start_time`` columns, or a grid without a completed trial.
    """
    if mode not in ("max", "min"):
        raise ConfigError(f"mode={mode!r}; expected 'max' or 'min'")
    if not finite(tolerance) or tolerance < 0:
        raise ConfigError(f"tolerance={tolerance!r}; expected a finite number >= 0 in {metric}'s units")
    grid, gkey = _search_trials(grid_df, "grid", metric, arm)
    search, skey = _search_trials(search_df, "search", metric, arm)
    gvals = pd.to_numeric(grid.loc[completed(grid), gkey], errors="coerce")
    gvals = gvals[gvals.map(finite)]
    if gvals.empty:
        raise ConfigError(f"the grid study has no completed trial with {gkey}: no best to reach")
    best = float(gvals.max() if mode == "max" else gvals.min())
    target = best - tolerance if mode == "max" else best + tolerance
    if "start_time" not in search.columns or search["start_time"].isna().any():
        raise ConfigError("the search study's trials need start_time (trials_frame records it) to be taken in order")
    search = search.sort_values("start_time", kind="stable")
    epochs = pd.to_numeric(search["epochs"], errors="coerce").fillna(0)
    svals = pd.to_numeric(search[skey], errors="coerce")
    hits = completed(search) & svals.map(finite) & ((svals >= target) if mode == "max" else (svals <= target))
    grid_epochs = int(pd.to_numeric(grid["epochs"], errors="coerce").fillna(0).sum())
    out: Dict[str, Any] = {
        "metric": metric,
        "mode": mode,
        "tolerance": float(tolerance),
        "grid_best": best,
        "target": target,
        "grid_trials": int(len(grid)),
        "grid_epochs": grid_epochs,
        "search_trials": int(len(search)),
        "search_total_epochs": int(epochs.sum()),
        "reached": bool(hits.any()),
        "trials_used": None,
        "search_epochs": None,
        "fraction": None,
        "run_id": None,
        "trial_id": None,
    }
    if hits.any():
        pos = int(hits.to_numpy().argmax())  # first hit in start order
        used = int(epochs.iloc[: pos + 1].sum())
        first = search.iloc[pos]
        out.update(
            trials_used=pos + 1,
            search_epochs=used,
            fraction=used / grid_epochs if grid_epochs else None,
            run_id=first.get("run_id"),
            trial_id=first.get("trial_id"),
        )
    return out


def efficiency_cells(results: Mapping[str, Mapping[str, Any]]) -> Tuple[List[str], List[List[str]]]:
    """Headers and text cells of :func:`hpo_efficiency` results per arm (``{arm: result}``)."""
    head = [
        "arm",
        "grid best",
        "target",
        "grid trial-epochs",
        "search trial-epochs to target",
        "trials used",
        "fraction of grid compute",
    ]
    body = []
    for a, r in results.items():
        reached = r["reached"]
        body.append(
            [
                a,
                number(r["grid_best"]),
                number(r["target"]),
                str(r["grid_epochs"]),
                f"{r['search_epochs']}" if reached else f"not reached ({r['search_total_epochs']} spent)",
                f"{r['trials_used']}/{r['search_trials']}" if reached else f"-/{r['search_trials']}",
                number(r["fraction"]) if reached and r["fraction"] is not None else "-",
            ]
        )
    return head, body


def _search_trials(df, name: str, metric: str, arm: Optional[str]) -> Tuple[Any, str]:
    """``(trials, value column)`` of study ``name`` for :func:`hpo_efficiency`: ``arm``'s trials (all where
    ``None``) without the final stage, and ``best/<metric>`` where recorded, else ``<metric>``.

    Raises:
        ConfigError: no trials, ``arm`` not in the study, or no ``epochs`` or value column.
    """
    if df is None or df.empty:
        raise ConfigError(f"the {name} study has no trials")
    if arm is not None:
        if arm not in set(df["arm"]):
            raise ConfigError(f"arm {arm!r} is not in the {name} study; arms: {', '.join(sorted(set(df['arm'])))}")
        df = df[df["arm"] == arm]
    if "stage" in df.columns:
        df = df[df["stage"] != "final"]
    key = f"best/{metric}" if has_values(df, f"best/{metric}") else metric
    missing = [c for c in ("epochs", key) if c not in df.columns]
    if missing:
        raise ConfigError(f"the {name} study's trials have no {', '.join(missing)} column")
    return df, key
