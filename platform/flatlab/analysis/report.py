"""The one-row-per-arm summary of a launch (``report/best_per_arm.json`` on its parent run)."""

from __future__ import annotations

import math
from typing import Any, Callable

from flatlab.analysis.results import _test_metric, params_text
from flatlab.analysis.selection import SEARCH_SEEDS, best_trial_rows, score_column
from flatlab.lazy import lazy

pd = lazy("pandas")

_AUXILIARY = ("_stderr", "_clean")  # flat/<measure>_stderr, _clean: details of a measure, left out of the table


def _trial_label(row: Any) -> str:
    """A trial's label where the caller gives no run name: ``<arm> <trial id>``."""
    return f"{row['arm']} {row.get('trial_id', '')}".strip()


def best_per_arm_table(df: Any, metric: str, trial_name: Callable[[Any], str] = _trial_label) -> Any:
    """One row per arm: the best trial of its best configuration
    (:func:`flatlab.analysis.selection.best_trial_rows`; ``df``: a
    :func:`~flatlab.tracking.trials.trials_frame` table, best first): ``arm``, ``trial``
    (``trial_name(row)``: the run's name in the store), ``epochs``, ``metric``, the test metric, each flatness
    measure ``flat/*``, the score the
    rule chose the arm's configuration by (``search <metric> mean`` over ``search seeds``, the
    configuration's completed search trials; rows are in its order, best first, as ``flatlab results
    --best`` shows them), the trial's ``params`` (``name=value`` of its logged params, one per line) and
    ``run_id``. Numbers are rounded to 4 significant digits (the runs hold the exact values). Arms
    without a completed trial get no row."""
    if df.empty or "outcome" not in df.columns:
        return pd.DataFrame()
    best = best_trial_rows(df)
    test = _test_metric(df)
    # the column best_trial_rows wrote its score to (named from the frame's metric, as it names it)
    score = score_column(best.attrs.get("metric", "val/accuracy"), best.attrs.get("rank_by", "final"))
    flat = sorted(c for c in df.columns if c.startswith("flat/") and not c.endswith(_AUXILIARY) and df[c].notna().any())
    params = [c for c in df.columns if c.startswith("param.")]
    rows = []
    for _, row in best.iterrows():
        out = {
            "arm": row["arm"],
            "trial": trial_name(row),
            "epochs": int(row["epochs"]),
        }
        for name in [metric] + ([test] if test else []) + flat:
            value = row.get(name)
            out[name] = float(f"{value:.4g}") if isinstance(value, (int, float)) and math.isfinite(value) else None
        for name in (score, SEARCH_SEEDS):  # what the rule chose the configuration (and ordered the arms) by
            value = row.get(name)
            out[name] = (int(value) if name == SEARCH_SEEDS else float(f"{value:.4g}")) if pd.notna(value) else None
        out["params"] = params_text(row, params, "\n")
        out["run_id"] = row["run_id"]
        rows.append(out)
    return pd.DataFrame(rows)
