"""Which trials a paper table is over: the final stage's, else each arm's best configuration with all
its seeds (the rule of :mod:`flatlab.analysis.selection`)."""

from __future__ import annotations

from typing import Any, List, Tuple

from flatlab.analysis import selection
from flatlab.errors import ConfigError


def select_sample(df, rank_by: str = "final") -> Tuple[Any, str, List[str]]:
    """The trials a paper table is over, one per (arm, seed).

    The final-stage trials (``stage == "final"``) where the frame has any; otherwise each arm's best
    configuration (:func:`flatlab.analysis.selection.best_configuration_rows`: the best mean over its
    seeds of the final validation value, by the frame's ``attrs`` metric and mode) with all its seeds,
    failed ones included. An arm none of whose search trials completed has no best configuration and
    is left out (noted). Where an (arm, seed) appears twice, the latest started trial is kept (noted).

    Args:
        df: a :func:`flatlab.tracking.trials.trials_frame` table.
        rank_by: ``final`` (the rule) or ``best-epoch`` (:data:`flatlab.analysis.selection.RANKINGS`);
            no effect on a final stage's trials.
    Returns:
        ``(sample, source, notes)``: the chosen rows, ``"final"`` or ``"best configuration"``, and notes.
    Raises:
        ConfigError: ``df`` has no trials; an unknown ``rank_by``.
    """
    if df is None or df.empty:
        raise ConfigError("no trials recorded for this study: nothing to compare")
    notes: List[str] = []
    if "stage" in df.columns and (df["stage"] == selection.STAGE_FINAL).any():
        sample, source = df[df["stage"] == selection.STAGE_FINAL], "final"
        left = sorted(set(df["arm"]) - set(sample["arm"]))
        if left:
            notes.append(f"no final-stage trials for {', '.join(left)}: not in the table.")
    else:
        sample, source = selection.best_configuration_rows(df, rank_by), "best configuration"
        left = sorted(set(df["arm"]) - set(sample["arm"]))
        if left:
            notes.append(f"no completed trial for {', '.join(left)}: no best configuration, not in the table.")
        if sample.empty:
            raise ConfigError("no trial of this study completed: nothing to compare")
    if "start_time" in sample.columns:
        sample = sample.sort_values("start_time", kind="stable", na_position="first")
    dup = sample.duplicated(["arm", "seed"], keep="last")
    if dup.any():
        pairs = ", ".join(f"{a} seed {s}" for a, s in sample.loc[dup, ["arm", "seed"]].itertuples(index=False))
        notes.append(f"repeated trials ({pairs}): the latest started of each is used.")
        sample = sample[~dup]
    sample = sample.sort_values(["arm", "seed"], kind="stable").reset_index(drop=True)
    sample.attrs.update(df.attrs)
    return sample, source, notes
