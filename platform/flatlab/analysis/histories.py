"""Per-epoch histories of a study's final trials, the table the compute-based analyses read.

One row per (run, epoch) in long form: ``run_id``, ``arm``, ``tuning``, ``seed``, ``epoch`` (MLflow's
step), the cumulative compute at the end of that epoch, :data:`PASSES` (``compute/passes``, gradient
evaluations over mini-batches) and :data:`SECONDS` (``compute/train_s``, wall-clock seconds spent in the
training steps, without evaluation or the flatness measures), and one column per metric logged that
epoch (``val/accuracy``, ``test/accuracy`` with ``test_every_epoch``, ``flat_curve/<m>`` every k epochs
with ``measure_every``; NaN where not logged that epoch).
:func:`flatlab.tracking.histories.read_histories` reads it from MLflow; tests build it by hand.

The unit of replication follows :mod:`flatlab.analysis.claims`: the tuning where the study has several
(:func:`units`), else each seed of its one tuning (the seeds are then the units, as in a single
tuning's table).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Tuple

from flatlab.errors import ConfigError

PASSES, SECONDS = "compute/passes", "compute/train_s"
"""The cumulative cost columns: gradient evaluations (passes) and training seconds."""
UNITS = {"passes": PASSES, "seconds": SECONDS}
"""A cost unit's name -> its column."""
KEYS = ("run_id", "arm", "tuning", "seed", "epoch")
"""The columns that say which run and epoch a row is."""


def check(frame: Any, columns: Tuple[str, ...] = ()) -> Any:
    """``frame`` sorted by run and epoch, after checking it has :data:`KEYS` and ``columns``.

    Raises:
        ConfigError: a missing column (named), or no rows.
    """
    missing = [c for c in (*KEYS, *columns) if c not in frame.columns]
    if missing:
        raise ConfigError(
            f"the histories lack the column(s) {', '.join(missing)}; they need {', '.join((*KEYS, *columns))} "
            "(flatlab.tracking.histories.read_histories builds them from MLflow)"
        )
    if frame.empty:
        raise ConfigError("no per-epoch history of a completed final trial: nothing to compare")
    return frame.sort_values(["run_id", "epoch"]).reset_index(drop=True)


def unit_column(unit: str) -> str:
    """The column of a cost unit (``passes`` or ``seconds``).

    Raises:
        ConfigError: any other unit.
    """
    if unit not in UNITS:
        raise ConfigError(f"cost unit {unit!r} is not supported; expected one of {', '.join(UNITS)}")
    return UNITS[unit]


def runs(frame: Any) -> List[Tuple[Tuple[Any, ...], Any]]:
    """``[((run_id, arm, tuning, seed), that run's rows by epoch), ...]``."""
    return [(key, rows) for key, rows in frame.groupby(["run_id", "arm", "tuning", "seed"], sort=True)]


def last_finite(values: Any) -> float:
    """The last finite number of a sequence (NaN where none)."""
    for v in reversed(list(values)):
        if v is not None and isinstance(v, (int, float)) and math.isfinite(v):
            return float(v)
    return math.nan


def groups(table: Any) -> List[Any]:
    """The units of replication of a per-run table (columns ``tuning``, ``seed``): its tunings where it has
    several, else one unit per seed. Returns ``[(label, rows), ...]`` in order."""
    tunings = sorted(set(int(t) for t in table["tuning"]))
    if len(tunings) > 1:
        return [(f"t{k}", table[table["tuning"] == k]) for k in tunings]
    return [(f"s{s}", table[table["seed"] == s]) for s in sorted(set(table["seed"]))]


def higher_is_better(quantity: str, metric: str, mode: str) -> bool:
    """The direction of a quantity: the study metric's by ``mode``; accuracy up; losses, perplexity and
    flatness (``flat*/``) down; anything else up."""
    if quantity == metric:
        return mode != "min"
    q = quantity.lower()
    if q.startswith("flat") or "loss" in q or "perplexity" in q:
        return False
    return True


def per_seed_differences(table: Any, quantity: str, reference: str) -> Dict[str, List[List[float]]]:
    """arm -> per unit (:func:`groups`), the differences arm − reference of ``quantity`` over the seeds
    both ran in that tuning (finite values only); the reference arm is left out."""
    out: Dict[str, List[List[float]]] = {}
    arms = [a for a in sorted(set(table["arm"])) if a != reference]
    for _label, rows in groups(table):
        ref = _by_seed(rows[rows["arm"] == reference], quantity)
        for a in arms:
            mine = _by_seed(rows[rows["arm"] == a], quantity)
            out.setdefault(a, []).append([mine[s] - ref[s] for s in mine if s in ref])
    return out


def _by_seed(rows: Any, quantity: str) -> Dict[Any, float]:
    return {
        s: float(v) for s, v in zip(rows["seed"], rows[quantity]) if isinstance(v, (int, float)) and math.isfinite(v)
    }
