"""The Python API for notebooks and scripts: :func:`run` a study and read its :func:`results` as a
pandas DataFrame, with the options of ``flatlab run`` and ``flatlab results``.

Both are exported from :mod:`flatlab` and imported on first use, so ``import flatlab`` stays light.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable, List, Optional, Union

from flatlab import cluster
from flatlab.analysis import query
from flatlab.errors import ConfigError, did_you_mean
from flatlab.lazy import lazy
from flatlab.study import options as study_options
from flatlab.study.spec import Study
from flatlab.tracking import runs
from flatlab.tracking import trials as tracking_trials

pd = lazy("pandas")
study_run_file = lazy("flatlab.study.run_file")


def run(
    study: Union[Study, str, os.PathLike],
    *,
    studies: Union[None, str, Iterable[str]] = None,
    scale: Optional[str] = None,
    trials: Optional[int] = None,
    epochs: Optional[int] = None,
    final_seeds: Optional[int] = None,
    tunings: Optional[int] = None,
    checkpoint_every: Optional[int] = None,
    root: Union[None, str, os.PathLike] = None,
    console: Any = None,
    **options: Any,
):
    """Run a study on Ray Tune (Optuna searcher, ASHA, MLflow tracking), as ``flatlab run`` does: the
    same preparation (:func:`flatlab.study.prepare.prepare`), so ``flatlab.run(path, resume=True)``
    resumes exactly as ``flatlab run path --resume``, at the scale, budget and checkpoint cadence the
    launch recorded.

    Args:
        study: a :class:`~flatlab.Study`, or the path of a study file (relative to the working
            directory).
        studies: with a file, run only these of its studies (``--study``).
        scale: with a file that defines ``SCALES``, the scale (``--scale``).
        trials, epochs, final_seeds, tunings: the budget overrides of ``--trials``, ``--epochs``,
            ``--final-seeds``, ``--tunings``.
        checkpoint_every: epochs between trial checkpoints (``--checkpoint-every``).
        root: the output root (``--root``; default env ``FLATLAB_ROOT``, else ``./flatlab-runs``).
        console: a ``rich`` console for the end-of-study lines (progress lines are printed either way).
        **options: any other field of :class:`flatlab.study.runner.RunOptions`: ``address``,
            ``tracking_uri``, ``storage``, ``resume``, ``continue_``, ``num_cpus`` ...

    Returns:
        For a :class:`Study`, its :class:`~flatlab.study.runner.StudyOutcome`; for a file, a list of
        them, one per study run, in the file's order (it stops after an interrupted one).

    Raises:
        ConfigError: an invalid study or file, ``studies`` that the file does not define, an option
            that ``RunOptions`` does not have (naming the valid ones), or any error ``flatlab run`` reports
            (a resume option that differs from the launch's, ``resume`` with ``continue_`` ...).
    """
    valid = [
        f.name for f in dataclasses.fields(study_options.RunOptions) if f.name not in ("root", "source", "overrides")
    ]
    unknown = [k for k in options if k not in valid]
    if unknown:
        names = [
            "studies",
            "scale",
            "trials",
            "epochs",
            "final_seeds",
            "tunings",
            "checkpoint_every",
            "root",
            "console",
            *valid,
        ]
        raise ConfigError(
            f"flatlab.run(): unknown option {', '.join(map(repr, unknown))}{did_you_mean(unknown[0], names)}; "
            f"valid options: {', '.join(names)}"
        )
    root_path = Path(root) if root is not None else Path(os.environ.get("FLATLAB_ROOT", "flatlab-runs"))
    given = {
        "trials": trials,
        "epochs": epochs,
        "final_seeds": final_seeds,
        "tunings": tunings,
        "scale": scale,
        "checkpoint_every": checkpoint_every,
    }
    only = [studies] if isinstance(studies, str) else list(studies or [])

    def check(_studies: List[Study]) -> bool:
        if options.get("address"):  # an unreachable head fails within seconds, as with the CLI
            cluster.check_address(options["address"])
        return True

    opts = study_options.RunOptions(
        root=root_path, source="" if isinstance(study, Study) else os.fspath(study), **options
    )
    outcomes = study_run_file.run_file(study, given, opts, only=only, console=console, check=check)
    return outcomes[0] if isinstance(study, Study) else outcomes


def results(
    name: str,
    *,
    root: Union[None, str, os.PathLike] = None,
    tracking_uri: Optional[str] = None,
    all_launches: bool = False,
    tuning: Optional[int] = None,
    arms: Union[None, str, Iterable[str]] = None,
    metric: Optional[str] = None,
    mode: Optional[str] = None,
    filter: Optional[str] = None,  # noqa: A002 - the CLI's name
    best: bool = False,
    by_config: bool = False,
    sort: Union[None, str, Iterable[str]] = None,
    columns: Union[None, str, Iterable[str]] = None,
    rank_by: str = "final",
):
    """A study's trials from MLflow as a pandas DataFrame: the table of ``flatlab results``.

    One row per trial of the latest launch (``all_launches``: of every launch), best first (completed
    trials before pruned ones, failures last), with raw values: ``launch`` is the full parent run id,
    ``start_time``/``end_time`` are timezone-aware UTC timestamps (``datetime64[ns, UTC]``; ``NaT``
    where MLflow has none, e.g. ``end_time`` of a running trial), params are ``param.<name>`` (integers
    as pandas' nullable ``Int64``). The filters are those of the CLI, applied in its order (tuning, arms,
    metric, filter, by_config, best, sort, columns; see :mod:`flatlab.analysis.query`), to this
    table, so ``filter`` and ``sort`` see the timestamps too:

    Args:
        name: the study name (its MLflow experiment).
        root: the output root whose ``mlflow.db`` to read (default env ``FLATLAB_ROOT``, else
            ``./flatlab-runs``); ignored when ``tracking_uri`` (or env ``MLFLOW_TRACKING_URI``) is set.
        tuning: only this independent tuning's trials (``--tuning``).
        arms: only these arms (``--arm``).
        metric, mode: rank by this metric (``--metric``, ``--mode``).
        filter: a pandas query over the trials (``--filter``), e.g.
            ``"outcome == 'completed' and `param.lr` < 0.1"`` (backticks around names with '/' or '.');
            times compare with a UTC time: ``"start_time > '2026-12-01 08:00+00:00'"``.
        best, by_config: ``--best``, ``--by-config``: each arm's best trial or configuration by the rules of
            :mod:`flatlab.analysis.selection` (arms none of whose trials completed have no row).
        rank_by: ``--rank-by``: ``final`` (each trial's final-epoch value, the rule) or ``best-epoch``.
        sort: ``"col"`` / ``"-col"`` or a list of them (``--sort``).
        columns: a list or comma list of the columns to keep (``--columns``).

    Raises:
        ConfigError: an unknown study or store, and every filter error of ``flatlab results``.
    """
    base = Path(root) if root is not None else Path(os.environ.get("FLATLAB_ROOT", "flatlab-runs"))
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or runs.default_tracking_uri(base.resolve())
    df = _with_timestamps(tracking_trials.trials_frame(uri, name, all_launches=all_launches))
    return query.select(
        df,
        tuning=tuning,
        arms=arms,
        metric=metric,
        mode=mode,
        filter=filter,
        best=best,
        by_config=by_config,
        sort=sort,
        columns=columns,
        rank_by=rank_by,
    )


def _with_timestamps(df):
    """``df`` with its ``start_time``/``end_time`` (MLflow's ms since the epoch, NaN where missing) as
    ``datetime64[ns, UTC]`` (``NaT`` where missing). Only the Python API converts: the CLI's table,
    csv/parquet exports and ``--filter``/``--sort`` keep MLflow's ms."""
    for col in ("start_time", "end_time"):
        if col in df.columns:
            ms = pd.to_numeric(df[col], errors="coerce")
            df[col] = pd.to_datetime(ms, unit="ms", utc=True).dt.as_unit("ns")
    return df


__all__: List[str] = ["run", "results"]
