"""TSAM paper, Table 2: every trained model on every objective, one table per split.

§5.2 of "Reweighting Local Minima with Tilted SAM" takes the models trained by ERM, SAM and TSAM and
evaluates each on the ERM objective ``L(theta)``, the SAM objective ``max_{||eps|| <= rho} L(theta + eps)``
and the tilted objective ``L^t(theta)``, on the training set and on the test set: two 3x3 tables, rows
the trained models (arms), columns the objectives. The measures ``erm_objective``, ``sam_objective`` and
``tilted_objective`` (:mod:`flatlab.sharpness.objectives`) log them as ``flat/<measure>`` on the study's
``measure_split`` and ``flat_<split>/<measure>`` on each of its ``measure_extra_splits``.

:func:`objective_tables` builds the tables from a trials frame (:func:`flatlab.tracking.trials.trials_frame`):
each cell the mean over the completed trials of an arm (the final-stage trials where the study has them,
every completed trial otherwise: a grid's seeds) with its standard deviation and count;
:func:`format_objective_table` writes one as text. Lower is better in every cell (losses).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from flatlab.analysis.sample import STAGE_FINAL

#: column label -> measure, in the paper's order
OBJECTIVES: Mapping[str, str] = {"ERM": "erm_objective", "SAM": "sam_objective", "TSAM": "tilted_objective"}


@dataclass(frozen=True)
class ObjectiveTable:
    """One split's table.

    Attributes:
        split: the split's name (``train``, ``test`` ...).
        prefix: the metric prefix its cells were read from (``flat`` or ``flat_test``).
        arms: the rows, in the order the arms first appear in the frame.
        objectives: the column labels (``ERM``, ``SAM``, ``TSAM``).
        cells: ``{(arm, objective): (mean, std, n)}`` (std ``nan`` for one trial; a cell without values is absent).
    """

    split: str
    prefix: str
    arms: Tuple[str, ...]
    objectives: Tuple[str, ...]
    cells: Mapping[Tuple[str, str], Tuple[float, float, int]]


def objective_tables(
    df: Any, splits: Sequence[Tuple[str, str]], objectives: Mapping[str, str] = OBJECTIVES
) -> List[ObjectiveTable]:
    """The tables of ``df``'s completed trials, one per ``(split name, metric prefix)`` of ``splits`` that
    has a value (e.g. ``[("train", "flat"), ("test", "flat_test")]``).

    Args:
        df: a trials frame (columns ``arm``, ``outcome``, ``stage`` and the metrics).
        splits: the splits to tabulate, each as (name shown, metric prefix).
        objectives: column label -> measure name.
    """
    done = df[df["outcome"] == "completed"] if len(df) else df
    if len(done) and "stage" in done.columns and (done["stage"] == STAGE_FINAL).any():
        done = done[done["stage"] == STAGE_FINAL]
    arms = tuple(dict.fromkeys(done["arm"])) if len(done) else ()
    tables = []
    for split, prefix in splits:
        cells: Dict[Tuple[str, str], Tuple[float, float, int]] = {}
        for label, measure in objectives.items():
            column = f"{prefix}/{measure}"
            if column not in done.columns:
                continue
            for arm in arms:
                values = done.loc[done["arm"] == arm, column].dropna().astype(float)
                if len(values):
                    cells[(arm, label)] = (float(values.mean()), float(values.std(ddof=1)), int(len(values)))
        if cells:
            tables.append(ObjectiveTable(split, prefix, arms, tuple(objectives), cells))
    return tables


def format_objective_table(table: ObjectiveTable) -> List[str]:
    """``table`` as Markdown lines: a caption, then one row per trained model, cells ``mean ± std (n)``."""
    lines = [
        f"{table.split} split: rows = trained model (arm), columns = objective evaluated "
        f"({table.prefix}/<measure>; mean ± std over trials (n); lower is better)",
        "",
        "| trained by | " + " | ".join(table.objectives) + " |",
        "|---|" + "---|" * len(table.objectives),
    ]
    for arm in table.arms:
        row = []
        for label in table.objectives:
            cell = table.cells.get((arm, label))
            if cell is None:
                row.append("-")
            else:
                mean, std, n = cell
                row.append(f"{mean:.4g}" + (f" ± {std:.2g}" if n > 1 else "") + f" ({n})")
        lines.append(f"| {arm} | " + " | ".join(row) + " |")
    return lines


__all__ = ["OBJECTIVES", "ObjectiveTable", "format_objective_table", "objective_tables"]
