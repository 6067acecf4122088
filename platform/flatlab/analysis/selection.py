"""The answer a study gives, defined once: which trials completed, each arm's best configuration, the
best trial and the reference arm. Every command and stage that picks a winner asks this module:
``flatlab compare``, ``flatlab results --best``, the final stage, ``sp.best_of`` and the
steps-to-target reference.

* **Completed** (:func:`trial_outcome`): a trial that reached its own end (``max_epochs``, or the
  study's training-loss target) with a finite value of the study metric. Pruned, diverged, errored and
  interrupted trials are not completed; their values never choose anything.
* **Best configuration of an arm** (:func:`rank_configurations`): the arm's completed *search* trials
  grouped by configuration (params, seed excluded: :func:`config_key`), each scored by the **mean over
  its seeds of the final-epoch validation value of the study metric**. The final model is the one whose
  test metric is reported, so it is chosen by that model's validation value; choosing by the best
  epoch's would pick on a checkpoint never evaluated (selection bias). Ties: more completed seeds, then
  the smaller configuration, so the answer does not depend on the order trials are listed in.
* **Best trial of an arm** (:func:`best_trial`): the best configuration's completed trial with the best
  final value (ties: the smaller seed); for a seed, :func:`trial_for_seed`.
* **Order of arms** (:func:`rank_arms`): best first by the score their best configuration won with.
* **Reference arm** (:func:`reference_arm`): the study's ``reference_arm`` where it is among the
  compared arms, else ``sgd`` (the baseline every flat-minima paper compares with), else the first arm
  alphabetically.

The only other ranking is explicit: ``rank_by="best-epoch"`` scores each trial by ``best/<metric>``.
Nothing here imports Ray, MLflow or the study package: callers turn their Tune results, MLflow runs or
``trials_frame`` tables into :class:`Trial` records (the ``*_rows`` helpers do it for tables).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from flatlab.analysis.sample import STAGE_FINAL, STAGE_KEY, TRIAL_KEYS, is_completed
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")

COMPLETED_KEY = "completed"
"""Set to 1 in a trial's last report when it ran its whole budget or reached its training-loss target."""
DIVERGED_KEY = "diverged"
"""Set to 1 in the report of a trial whose loss became non-finite."""

RANKINGS = ("final", "best-epoch")
"""How a trial is scored: its final epoch's value of the study metric (the rule), or its best epoch's
(``best/<metric>``, an explicit option)."""


Key = Tuple[Tuple[str, Tuple[int, Any]], ...]


def trial_outcome(result: Optional[Mapping[str, Any]], error: bool, metric: str) -> str:
    """How a trial ended, from its last result: ``completed``, ``pruned`` (stopped by the scheduler),
    ``diverged`` or ``error``. One rule for Optuna's states, MLflow's outcome tags and every selection.

    Args:
        result: the trial's last report (``COMPLETED_KEY``/``DIVERGED_KEY`` set by the trainable).
        error: the trial raised.
        metric: the study metric; a completed trial must have a finite value of it.
    """
    if error:
        return "error"
    result = result or {}
    if result.get(DIVERGED_KEY):
        return "diverged"
    if result.get(COMPLETED_KEY):
        value = result.get(metric)
        return "completed" if isinstance(value, (int, float)) and math.isfinite(value) else "diverged"
    return "pruned"


def completed(df):
    """:func:`is_completed` for each row of a ``trials_frame`` table (a boolean Series)."""
    if "completed" in df.columns:  # a Sample's table: derived once when it was built
        return df["completed"].astype(bool)
    if "outcome" not in df.columns and "status" not in df.columns:
        return pd.Series(True, index=df.index)
    outcome = df["outcome"] if "outcome" in df.columns else pd.Series(None, index=df.index, dtype=object)
    status = df["status"] if "status" in df.columns else pd.Series(None, index=df.index, dtype=object)
    return pd.Series([is_completed(o, s) for o, s in zip(outcome, status)], index=df.index, dtype=bool)


def value_column(metric: str, rank_by: str = "final") -> str:
    """The column a trial is scored by: ``metric`` (its final value) or ``best/<metric>``.

    Raises:
        ConfigError: ``rank_by`` not one of :data:`RANKINGS`.
    """
    if rank_by not in RANKINGS:
        raise ConfigError(f"rank_by={rank_by!r} is not supported; expected one of {', '.join(RANKINGS)}")
    return metric if rank_by == "final" else f"best/{metric}"


SEARCH_SEEDS = "search seeds"
"""The column of a one-row-per-arm table with its best configuration's completed search trials."""


def score_column(metric: str, rank_by: str = "final") -> str:
    """The column of a one-row-per-arm table with the score its arm's best configuration was chosen
    by: ``search <metric> mean`` (``search best/<metric> mean`` with ``rank_by="best-epoch"``).

    Raises:
        ConfigError: as :func:`value_column`.
    """
    return f"search {value_column(metric, rank_by)} mean"


# ---------------------------------------------------------------------------------------------------
# Configurations


def canonical(value: Any) -> Optional[Tuple[int, Any]]:
    """A param value as it compares across sources: a number (Tune's ``0.1``, MLflow's ``"0.1"``, a
    table's ``0.1``) as ``(0, float)``, anything else as ``(1, str)``; ``None`` for a missing value
    (NaN or pandas' NA: the param is not set for this trial)."""
    if value is None:
        return (1, "None")
    if type(value).__name__ == "NAType" or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, bool):
        return (1, str(value))
    try:
        number = float(value)
    except (TypeError, ValueError):
        return (1, str(value))
    return (1, str(value)) if math.isnan(number) else (0, number)


def config_key(params: Mapping[str, Any]) -> Key:
    """A configuration's identity: its params by name (seed, arm and stage excluded by the caller),
    values made comparable by :func:`canonical`, missing ones left out."""
    out = []
    for name in sorted(params):
        value = canonical(params[name])
        if value is not None:
            out.append((name, value))
    return tuple(out)


def row_config(row: Mapping[str, Any], params: Sequence[str]) -> Key:
    """:func:`config_key` of one row of a ``trials_frame`` table: its ``params`` columns (``param.<name>``)
    by name, the prefix dropped."""
    return config_key({c[len("param.") :]: row[c] for c in params})


@dataclass(frozen=True)
class Trial:
    """One trial, as selection sees it.

    Attributes:
        arm: the arm's name.
        config: :func:`config_key` of its params (seed excluded).
        seed: its seed.
        value: its score (final value of the study metric, or the best epoch's with
            ``rank_by="best-epoch"``) when it completed with a finite one; else ``None``.
        ref: the caller's handle (a table's row label, a run id, a Tune result).
    """

    arm: str
    config: Key
    seed: Any
    value: Optional[float]
    ref: Any = None


@dataclass(frozen=True)
class Configuration:
    """One configuration of an arm with a score.

    Attributes:
        arm, config: as in :class:`Trial`.
        mean: the mean of its completed trials' values.
        trials: its completed trials, best value first (ties: the smaller seed).
    """

    arm: str
    config: Key
    mean: float
    trials: Tuple[Trial, ...]

    @property
    def seeds(self) -> int:
        """How many completed trials the mean is over."""
        return len(self.trials)


def _sign(mode: str) -> float:
    if mode not in ("max", "min"):
        raise ConfigError(f"mode={mode!r}; expected 'max' or 'min'")
    return 1.0 if mode == "max" else -1.0


def rank_configurations(trials: Iterable[Trial], mode: str) -> Dict[str, List[Configuration]]:
    """Per arm, its configurations with a completed trial, best first (the module's rule: mean value,
    then more seeds, then the smaller configuration: params compared by name, numbers as numbers, text
    as text). Final-stage re-runs are not candidates; an Optuna search (one trial per configuration) is
    the special case of one seed. Trials without a value take no part; an arm none of whose trials
    completed is absent.

    Raises:
        ConfigError: ``mode`` not ``max``/``min``.
    """
    sign = _sign(mode)
    groups: Dict[Tuple[str, Key], List[Trial]] = {}
    for t in trials:
        if t.value is not None and math.isfinite(t.value):
            groups.setdefault((t.arm, t.config), []).append(t)
    ranked: Dict[str, List[Configuration]] = {}
    for (arm, config), members in groups.items():
        members = sorted(members, key=lambda t: (-sign * t.value, _seed_order(t.seed)))
        mean = math.fsum(t.value for t in members) / len(members)
        ranked.setdefault(arm, []).append(Configuration(arm, config, mean, tuple(members)))
    for arm in ranked:
        ranked[arm].sort(key=lambda c: (-sign * c.mean, -c.seeds, c.config))
    return {arm: ranked[arm] for arm in sorted(ranked)}


def best_configurations(trials: Iterable[Trial], mode: str) -> Dict[str, Configuration]:
    """Each arm's best configuration (:func:`rank_configurations`' first); arms with no completed trial
    are absent."""
    return {arm: ranked[0] for arm, ranked in rank_configurations(trials, mode).items()}


def rank_arms(best: Mapping[str, Configuration], mode: str) -> List[str]:
    """The arms of ``best`` (:func:`best_configurations`), best first by the score their best
    configuration won with: its mean (by ``mode``), then more seeds, then its best trial's value, then
    the arm's name, so the order never depends on the order trials are listed in. The order every
    one-row-per-arm table (``flatlab results --best``, the end of ``flatlab run``) shows.

    Raises:
        ConfigError: ``mode`` not ``max``/``min``.
    """
    sign = _sign(mode)
    return sorted(
        best, key=lambda arm: (-sign * best[arm].mean, -best[arm].seeds, -sign * best_trial(best[arm]).value, arm)
    )


def best_trial(configuration: Configuration) -> Trial:
    """The best trial of a configuration (and, of an arm's best configuration, of the arm): its
    completed trial with the best value, ties to the smaller seed."""
    return configuration.trials[0]


def search_trial(
    config: Mapping[str, Any], result: Optional[Mapping[str, Any]], error: bool, metric: str
) -> Optional[Trial]:
    """A running study's trial as a :class:`Trial` (its Tune ``config`` and last ``result``): valued by
    its final result's ``metric`` when it completed (:func:`trial_outcome`), else ``None``-valued; and
    ``None`` for a final-stage re-run, which is never a candidate. ``ref`` is the config.

    Args:
        config: the trial's config (``arm``, ``seed``, ``stage`` and its hyperparameters).
        result: its last report, or ``None`` before any.
        error: the trial raised.
        metric: the study metric.
    """
    if config.get(STAGE_KEY) == STAGE_FINAL:
        return None
    done = trial_outcome(result, error, metric) == "completed"
    params = {k: v for k, v in config.items() if k not in TRIAL_KEYS}
    return Trial(
        str(config.get("arm")),
        config_key(params),
        config.get("seed"),
        float(result[metric]) if done and result is not None else None,
        ref=config,
    )


def trial_for_seed(ranked: Sequence[Configuration], seed: Any) -> Optional[Trial]:
    """The trial with ``seed`` of the best-ranked configuration in ``ranked`` that has one (its best such
    trial where a seed ran twice); ``None`` if no configuration completed that seed."""
    wanted = _seed_order(seed)
    for configuration in ranked:
        for t in configuration.trials:
            if _seed_order(t.seed) == wanted:
                return t
    return None


def _seed_order(seed: Any) -> Tuple[int, Any]:
    return canonical(seed) or (2, "")


def reference_arm(arms: Iterable[str], chosen: Optional[str] = None) -> str:
    """The arm every other arm is compared with, when none is asked for: ``chosen`` (the study's
    ``reference_arm``, as the launch recorded it) if it is one of ``arms``, else ``sgd``, else the first
    of ``arms`` alphabetically.

    Raises:
        ConfigError: ``arms`` is empty.
    """
    names = sorted(set(arms))
    if not names:
        raise ConfigError("no arms to compare: the study has no trials")
    if chosen and chosen not in ("None", "") and chosen in names:
        return chosen
    return "sgd" if "sgd" in names else names[0]


# ---------------------------------------------------------------------------------------------------
# trials_frame tables


def frame_trials(df, rank_by: str = "final") -> List[Trial]:
    """The search trials of a ``trials_frame`` table (``stage`` other than ``final``) as :class:`Trial`
    records: config from the ``param.*`` columns, score from the ``attrs`` metric (``value_column``),
    ``ref`` the row's label.

    Raises:
        ConfigError: an unknown ``rank_by``; ``best-epoch`` for a table without ``best/<metric>`` values.
    """
    metric = df.attrs.get("metric", "val/accuracy")
    column = value_column(metric, rank_by)
    if df.empty:
        return []
    if rank_by != "final" and (column not in df.columns or not df[column].notna().any()):
        raise ConfigError(f"--rank-by {rank_by}: these trials recorded no {column} to rank by")
    rows = df[df["stage"] != STAGE_FINAL] if "stage" in df.columns else df
    params = [c for c in rows.columns if c.startswith("param.")]
    done = completed(rows)
    values = (
        pd.to_numeric(rows[column], errors="coerce")
        if column in rows.columns
        else pd.Series(float("nan"), index=rows.index)
    )
    out = []
    for label, row in rows.iterrows():
        value = float(values.loc[label]) if done.loc[label] and math.isfinite(float(values.loc[label])) else None
        out.append(Trial(str(row["arm"]), row_config(row, params), row.get("seed"), value, label))
    return out


def best_configuration_rows(df, rank_by: str = "final"):
    """The rows of each arm's best configuration in a ``trials_frame`` table: all its search trials,
    completed or not (a paper table counts every seed run). Arms without a completed trial have none.
    ``attrs`` are kept."""
    trials = frame_trials(df, rank_by)
    best = best_configurations(trials, df.attrs.get("mode", "max"))
    keep = [t.ref for t in trials if t.arm in best and t.config == best[t.arm].config]
    out = df.loc[keep]
    out.attrs.update(df.attrs)
    return out


def best_trial_rows(df, rank_by: str = "final"):
    """One row per arm of a ``trials_frame`` table: its :func:`best_trial`, arms best first
    (:func:`rank_arms`), with the score the rule chose its configuration by: :data:`SEARCH_SEEDS` (the
    configuration's completed search trials) and :func:`score_column` (their mean). Arms without a
    completed search trial have none. ``attrs`` are kept, with ``best`` set to ``"trial"`` and
    ``rank_by``."""
    mode = df.attrs.get("mode", "max")
    best = best_configurations(frame_trials(df, rank_by), mode)
    arms = rank_arms(best, mode)
    out = df.loc[[best_trial(best[a]).ref for a in arms]].reset_index(drop=True)
    out[score_column(df.attrs.get("metric", "val/accuracy"), rank_by)] = [best[a].mean for a in arms]
    out[SEARCH_SEEDS] = [best[a].seeds for a in arms]
    out.attrs.update(df.attrs)
    out.attrs.update(best="trial", rank_by=rank_by)
    return out
