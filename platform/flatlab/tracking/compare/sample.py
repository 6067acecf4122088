"""Which trials a paper table is over: the final stage's, else each arm's best configuration with all
its seeds; and the default reference arm."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from flatlab.errors import ConfigError
from flatlab.tracking.compare.statistics import finite


def default_reference(arms: Sequence[str], recorded: Optional[str] = None) -> str:
    """The reference arm when none is asked for: the study's ``reference_arm`` as recorded on the
    launch (``recorded``) if it is one of ``arms``, else the arm named ``sgd`` (the baseline every
    flat-minima paper compares with), else the first arm alphabetically.

    Raises:
        ConfigError: ``arms`` is empty.
    """
    arms = sorted(set(arms))
    if not arms:
        raise ConfigError("no arms to compare: the study has no trials")
    if recorded and recorded not in ("None", "") and recorded in arms:
        return recorded
    return "sgd" if "sgd" in arms else arms[0]


def select_sample(df) -> Tuple[Any, str, List[str]]:
    """The trials a paper table is over, one per (arm, seed).

    The final-stage trials (``stage == "final"``) where the frame has any; otherwise, per arm, the
    best configuration (``param.*`` values; the one with the best mean ``best/<metric>``, else
    ``<metric>``, over its completed trials, by the frame's ``attrs`` metric and mode) with all its
    seeds. Where an (arm, seed) appears twice, the latest started trial is kept (noted).

    Args:
        df: a :func:`flatlab.tracking.results.trials_frame` table.
    Returns:
        ``(sample, source, notes)``: the chosen rows, ``"final"`` or ``"best configuration"``, and notes.
    Raises:
        ConfigError: ``df`` has no trials.
    """
    import pandas as pd

    if df is None or df.empty:
        raise ConfigError("no trials recorded for this study: nothing to compare")
    notes: List[str] = []
    if "stage" in df.columns and (df["stage"] == "final").any():
        sample, source = df[df["stage"] == "final"], "final"
        left = sorted(set(df["arm"]) - set(sample["arm"]))
        if left:
            notes.append(f"no final-stage trials for {', '.join(left)}: not in the table.")
    else:
        metric, mode = df.attrs.get("metric", "val/accuracy"), df.attrs.get("mode", "max")
        key = f"best/{metric}" if has_values(df, f"best/{metric}") else metric
        params = [c for c in df.columns if c.startswith("param.")]
        done = completed(df)
        parts = []
        for _, g in df.groupby("arm", sort=True):
            groups = [sub for _, sub in g.groupby(params, dropna=False, sort=False)] if params else [g]
            scores = []
            for sub in groups:
                vals = pd.to_numeric(sub.loc[done.loc[sub.index], key], errors="coerce") if key in sub else pd.Series(dtype=float)
                vals = vals[vals.map(finite)]
                best = vals.mean() if len(vals) else float("nan")
                scores.append(best if mode == "max" else -best if finite(best) else best)
            scored = [i for i, s in enumerate(scores) if finite(s)]
            pick = max(scored, key=lambda i: scores[i]) if scored else 0  # first-best on ties
            parts.append(groups[pick])
        sample, source = pd.concat(parts), "best configuration"
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


def completed(df):
    """Trials that completed: outcome ``completed`` (or, untagged, MLflow status FINISHED)."""
    outcome = df["outcome"].fillna("") if "outcome" in df else None
    if outcome is None:
        return df["status"] == "FINISHED" if "status" in df else df["arm"].notna()
    untagged = (outcome == "") & (df["status"] == "FINISHED") if "status" in df else outcome == "__never__"
    return (outcome == "completed") | untagged


def has_values(df, column: str) -> bool:
    """Whether ``df`` has a column ``column`` with at least one finite number."""
    import pandas as pd

    return column in df.columns and bool(pd.to_numeric(df[column], errors="coerce").map(finite).any())
