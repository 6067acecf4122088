"""A study's trials as tables (``flatlab results``): ranked, pooled per configuration, each arm's answer,
rendered in the terminal or exported."""

from __future__ import annotations

import datetime
from typing import Any, List, Optional

from flatlab.analysis import selection
from flatlab.analysis.console_table import make_table, print_table
from flatlab.analysis.selection import SEARCH_SEEDS, score_column
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")

# How trials rank in every table: a completed trial before a pruned one, failures last.
OUTCOME_RANK = {"completed": 0, "pruned": 1, "interrupted": 2, "diverged": 3, "error": 4}


def sort_trials(df, metric: str, mode: str):
    """Completed trials first, then pruned, interrupted, and last diverged and errored ones; within each,
    best final ``metric`` first (``best/<metric>`` breaks ties, then the earlier ``start_time`` and the
    ``run_id``, so that the order never depends on the order MLflow returned the runs in). A pruned
    trial never outranks a completed one."""
    rank = df["outcome"].map(OUTCOME_RANK).fillna(len(OUTCOME_RANK))
    ascending = mode == "min"
    keys = df.assign(_rank=rank)
    by = ["_rank"] + [c for c in (metric, f"best/{metric}") if c in df.columns]
    tie_breaks = [c for c in ("start_time", "run_id") if c in df.columns]
    order = keys.sort_values(
        by + tie_breaks,
        ascending=[True] + [ascending] * (len(by) - 1) + [True] * len(tie_breaks),
        na_position="last",
        kind="stable",
    ).index
    return df.loc[order].reset_index(drop=True)


def chosen_configurations(pooled, trials, rank_by: str = "final"):
    """The row of each arm's answer in a :func:`by_config` table (``flatlab results --by-config --best``):
    the final-stage row of its chosen configuration (pooled over the final seeds: the paper-table row),
    else its first final-stage row (the configuration its launch re-ran), else the chosen
    configuration's search row; the chosen configuration is its best
    (:func:`flatlab.analysis.selection.best_configurations` over ``trials``, the :func:`trials_frame`
    table ``pooled`` was made from). Arms best first by the score their configuration was chosen by
    (:func:`flatlab.analysis.selection.rank_arms`: the search trials' mean, not the final stage's);
    an arm with only final-stage rows left (``--filter``) comes last. Arms none of whose search trials
    completed have no row. Each row has the score its configuration was chosen by
    (:func:`flatlab.analysis.selection.score_column` and ``SEARCH_SEEDS``). ``attrs`` are kept, with
    ``best`` set to ``"config"`` and ``rank_by``.
    """
    if pooled.empty:
        return pooled
    mode = trials.attrs.get("mode", "max")
    best = selection.best_configurations(selection.frame_trials(trials, rank_by), mode)
    params = [c for c in pooled.columns if c.startswith("param.")]
    final = pooled["stage"] == selection.STAGE_FINAL if "stage" in pooled.columns else pooled["arm"].isna()
    keep = []
    present = set(pooled["arm"])
    arms = [a for a in selection.rank_arms(best, mode) if a in present]

    def of_chosen(rows, arm: str) -> List[Any]:  # the indices of ``rows`` in the arm's chosen configuration
        return [i for i, row in rows.iterrows() if selection.row_config(row, params) == best[arm].config]

    for arm in arms + [a for a in dict.fromkeys(pooled["arm"]) if a not in best]:
        mine = pooled[pooled["arm"] == arm]
        finals = mine[final.loc[mine.index]]
        if arm not in best:  # only final-stage rows left (--filter)
            keep += list(finals.index[:1])
        else:  # the chosen configuration's final-stage row (--all: launches that chose others have theirs),
            # else the final stage the launch ran, else the chosen configuration's search row
            keep += (of_chosen(finals, arm) or list(finals.index) or of_chosen(mine[~final.loc[mine.index]], arm))[:1]
    out = pooled.loc[keep].reset_index(drop=True)
    configs = [best.get(arm) for arm in out["arm"]]
    out[selection.score_column(trials.attrs.get("metric", "val/accuracy"), rank_by)] = [
        c.mean if c else float("nan") for c in configs
    ]
    out[selection.SEARCH_SEEDS] = pd.array([c.seeds if c else None for c in configs], dtype="Int64")
    out.attrs.update(pooled.attrs)
    out.attrs.update(best="config", rank_by=rank_by)
    return out


def by_config(df, rank_by: str = "final"):
    """One row per configuration, seeds pooled: what a paper table reports (e.g. IRE Table 1, means
    over 3 seeds).

    A configuration is an arm plus its trial params (``param.*``; the seed is not one). For each, from
    the trials that completed (:func:`flatlab.analysis.selection.completed`: not pruned, diverged or
    failed), the mean
    and sample standard deviation (ddof = 1; NaN with one seed) over seeds of: the study metric, its
    best value, the test metric (``test/perplexity``, ``test/accuracy`` or ``test/loss``, the first
    present) and, when present, ``train/speedup``, ``train/steps_to_target``,
    ``train/epochs_to_target`` and every flatness measure ``flat/*``. A target's statistics are over the
    seeds that reached it, so ``reached`` says how many did: ``"k/n"`` of the ``n`` completed seeds
    (a miss is counted, never hidden in the mean). Ordered best first by the mean of ``<metric>`` (the
    rule of :mod:`flatlab.analysis.selection`; ``rank_by="best-epoch"``: of ``best/<metric>``), more
    seeds first among equal means; configurations with no completed trial come last. Search and
    final-stage trials of one configuration are separate rows (``stage``).

    Args:
        df: a :func:`trials_frame` table (its ``attrs`` give the metric and mode).
        rank_by: ``final`` or ``best-epoch`` (:data:`flatlab.analysis.selection.RANKINGS`).
    Returns:
        Columns ``arm``, ``seeds`` (completed trials), ``trials`` (all of them), ``<m> mean`` and
        ``<m> std`` for each metric above, then the ``param.*`` columns.
    """
    if df.empty:
        return df
    metric, mode = df.attrs.get("metric", "val/accuracy"), df.attrs.get("mode", "max")
    rank = f"{selection.value_column(metric, rank_by)} mean"
    test = _test_metric(df)
    targets = [m for m in TARGET_METRICS if _has_values(df, m)]
    flat = sorted(c for c in df.columns if c.startswith("flat/") and _has_values(df, c))
    metrics = [m for m in (metric, f"best/{metric}", test) if m and _has_values(df, m)] + targets + flat
    metrics = list(dict.fromkeys(metrics))  # a --metric that is also a flat/* or target metric: once
    params = [c for c in df.columns if c.startswith("param.")]
    stage = ["stage"] if "stage" in df.columns else []
    keys = ["arm"] + stage + params
    done = selection.completed(df)
    rows = []
    for key, group in df.groupby(keys, dropna=False, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        ok = group[done.loc[group.index]]
        row = {"arm": key[0], **dict(zip(stage, key[1:2])), "seeds": len(ok), "trials": len(group)}
        if targets:
            row["reached"] = f"{_reached(ok)}/{len(ok)}"
        for m in metrics:
            values = pd.to_numeric(ok[m], errors="coerce")
            row[f"{m} mean"] = values.mean() if len(values) else float("nan")
            row[f"{m} std"] = values.std(ddof=1) if len(values) > 1 else float("nan")
        row.update(dict(zip(params, key[1 + len(stage) :])))
        rows.append(row)
    out = pd.DataFrame(rows)
    if rank in out.columns:  # the selection's order: the mean that chooses a configuration, then more seeds
        out = out.sort_values(
            [rank, "seeds"], ascending=[mode == "min", False], na_position="last", kind="stable"
        ).reset_index(drop=True)
    out.attrs.update(df.attrs)
    out.attrs["pooled"] = metrics  # render() shows each as one "mean ± std" column
    return out


TARGET_METRICS = ("train/speedup", "train/steps_to_target", "train/epochs_to_target")


def _reached(ok) -> int:
    """Completed trials that reached their target: ``train/target_reached == 1`` where logged (a
    training-loss target), else a value of ``train/steps_to_target`` (a reference arm's loss)."""
    if "train/target_reached" in ok.columns and ok["train/target_reached"].notna().any():
        return int((pd.to_numeric(ok["train/target_reached"], errors="coerce") == 1).sum())
    column = next((m for m in ("train/steps_to_target", "train/epochs_to_target") if m in ok.columns), None)
    return int(ok[column].notna().sum()) if column else 0


def export(df, path: str, fmt: str) -> None:
    """Write ``df`` as ``csv`` or ``parquet`` (pyarrow). Raises ``ConfigError`` for other formats."""
    if fmt == "csv":
        df.to_csv(path, index=False)
    elif fmt == "parquet":
        df.to_parquet(path, index=False, engine="pyarrow")
    else:
        raise ConfigError(f"--format {fmt!r} is not supported; expected one of table, csv, parquet")


def render(
    df, console: Any, columns: Optional[List[str]] = None, title: str = "", hint: str = "use --format csv"
) -> None:
    """Print ``df`` as a rich table: arm, status, outcome, epochs, the metric (final and best), test
    accuracy, the launch (first :data:`LAUNCH_LABEL` characters of its run id), the start time (local,
    ``YYYY-MM-DD HH:MM:SS``) and the trial's params in one column, one ``name=value`` per line
    (``columns`` overrides the choice). A :func:`by_config` summary shows its seed counts and one
    ``mean ± std`` column per pooled metric.

    No cell line is split or cut (:mod:`flatlab.analysis.console_table`; error messages wrap at spaces): a
    table that cannot fit is printed whole with a line under it naming ``hint`` (the way to get it
    otherwise)."""
    if df.empty:
        console.print("no trials recorded")
        return
    metric = df.attrs.get("metric", "val/accuracy")
    params = [c for c in df.columns if c.startswith("param.")]
    test = _test_metric(df) or "test/accuracy"
    pooled = [] if columns else list(df.attrs.get("pooled", []))
    if pooled:
        cols = [c for c in ("arm", "stage", "seeds", "trials", "reached") if c in df.columns] + _score(df)
    else:
        default = ["arm", "trial_id", "status", "outcome", "epochs", metric, f"best/{metric}", test]
        if _score(df) and (df[SEARCH_SEEDS] > 1).any():  # several seeds: their mean, not this trial's value, ranks
            default[7:7] = _score(df)
        if "stage" in df.columns and (df["stage"] == "final").any():
            default.insert(1, "stage")  # search trials and the final stage's re-runs side by side
        if "tuning" in df.columns and df["tuning"].nunique() > 1:
            default.insert(1, "tuning")  # a study of several independent tunings
        default += [
            c for c in ("train/steps_to_target", "train/speedup") if _has_values(df, c)
        ]  # Study(reference_arm=...)
        default += ["error"] if "error" in df.columns and df["error"].fillna("").astype(bool).any() else []
        default += ["launch", "start_time"]
        cols = [c for c in (columns or default) if c in df.columns]
    rows = []
    for _, row in df.iterrows():
        cells = [_cell(c, row[c]) for c in cols]
        for m in pooled:
            mean, std = _fmt(row[f"{m} mean"]), _fmt(row[f"{m} std"])
            cells.append(mean if std == "-" else f"{mean} ± {std}")
        if not columns:
            cells.append(params_text(row, params, "\n"))
        rows.append(cells)
    head = [*cols, *pooled, *([] if columns else ["params"])]
    prose = [head.index("error")] if "error" in head else []
    captions = ["mean ± sample std over the seeds that completed"] if pooled else []
    captions += [answer_caption(df.attrs)] if df.attrs.get("best") else []
    caption = "\n".join(captions) or None
    print_table(
        console, make_table(head, rows, prose, title=title or None, caption=caption, caption_justify="left"), hint
    )


def _score(df) -> List[str]:
    """The columns of a one-row-per-arm table with the score that chose each arm's configuration
    (:func:`flatlab.analysis.selection.score_column`, ``SEARCH_SEEDS``); none for another table."""
    if not df.attrs.get("best"):
        return []
    score = score_column(df.attrs.get("metric", "val/accuracy"), df.attrs.get("rank_by", "final"))
    return [score, SEARCH_SEEDS] if score in df.columns and SEARCH_SEEDS in df.columns else []


def answer_caption(attrs: Any) -> str:
    """The line under a one-row-per-arm table (``attrs["best"]``: ``"trial"`` from
    :func:`flatlab.analysis.selection.best_trial_rows`, ``"config"`` from
    :func:`chosen_configurations`): which trials the rule chose on, by which metric and direction, the
    order of the rows, and where the final stage's trials are."""
    metric, mode = attrs.get("metric", "val/accuracy"), attrs.get("mode", "max")
    epoch = "best-epoch" if attrs.get("rank_by") == "best-epoch" else "final-epoch"
    trial = attrs.get("best") == "trial"
    rows = "each arm's best trial of its best configuration" if trial else "each arm's best configuration"
    final = (
        "`flatlab results --by-config --best` and `flatlab compare` report them"
        if trial
        else "a final row is the chosen configuration over the final seeds"
    )
    better = "higher" if mode == "max" else "lower"
    return (
        f"{rows}, chosen on completed search trials by the mean {epoch} {metric} over seeds ({better} is "
        f"better); arms best first by that mean. Final-stage trials are not candidates: {final}"
    )


def params_text(row: Any, params: List[str], sep: str) -> str:
    """The params of a trials-table ``row`` as ``name=value`` (columns ``param.<name>``, numbers as
    :func:`_fmt` shortens them), joined by ``sep``; params the trial did not log are left out."""
    return sep.join(f"{c[6:]}={_fmt(row[c], numeric_text=True)}" for c in params if _fmt(row[c]) != "-")


def _test_metric(df) -> Optional[str]:
    """The test metric a table shows: ``test/perplexity`` (language models), else ``test/accuracy``,
    else ``test/loss``, the first with values; ``None`` if there is none."""
    return next((c for c in ("test/perplexity", "test/accuracy", "test/loss") if _has_values(df, c)), None)


def _has_values(df, column: str) -> bool:
    return column in df.columns and bool(df[column].notna().any())


LAUNCH_LABEL = 8  # characters of the launch (parent run) id a table shows, like a short git hash


def _cell(column: str, v: Any) -> str:
    """A table cell of ``column``: the launch id shortened to its first :data:`LAUNCH_LABEL`
    characters, start and end times (ms since the epoch) as local ``YYYY-MM-DD HH:MM:SS``; csv and
    parquet exports keep the raw values."""
    if column == "launch" and isinstance(v, str):
        return v[:LAUNCH_LABEL]
    if column in ("start_time", "end_time") and _fmt(v) != "-":
        return datetime.datetime.fromtimestamp(float(v) / 1000).strftime("%Y-%m-%d %H:%M:%S")
    return _fmt(v)


def _fmt(v: Any, numeric_text: bool = False) -> str:
    """A table cell. ``numeric_text``: strings that read as floats (MLflow stores params as text) are
    shortened like numbers; other text (trial ids such as ``11879e00``) is shown as it is."""
    if isinstance(v, str):
        if not numeric_text:
            return v
        try:
            v = float(v) if any(ch in v for ch in ".e") else v
        except ValueError:
            return v
    if v is None or type(v).__name__ == "NAType":  # pandas.NA: a missing value of a nullable (Int64) column
        return "-"
    if isinstance(v, float):
        if v != v:
            return "-"
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))  # counts (epochs, train/steps_to_target) in full
        return f"{v:.4g}"
    return str(v)
