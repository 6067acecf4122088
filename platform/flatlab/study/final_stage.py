"""The final stage of a launch: after the search, each arm's best configuration (per tuning) re-run once
per final seed, with no early stopping, as trials tagged ``flatlab.stage=final``."""

from __future__ import annotations

import logging
from typing import Any, Dict, List

from flatlab.analysis import selection
from flatlab.study.options import RunOptions
from flatlab.study.ray_compat import can_resume
from flatlab.study.searchers import FixedSearcher
from flatlab.study.spec import Study
from flatlab.study.tuner import Started, experiment_path, make_scheduler, new_tuner, restore_tuner
from flatlab.study.tunings import tuning_seeds, with_tuning
from flatlab.tracking import runs

logger = logging.getLogger("flatlab")


def final_configs(study: Study, grid: Any) -> List[Dict[str, Any]]:
    """The final stage's trial configs: for each arm and tuning, its best configuration
    (:func:`flatlab.analysis.selection.best_configurations` over that tuning's completed search trials:
    the best mean over seeds of the study metric's final value) once per seed of ``study.final_seeds``
    (tuning k's seeds, :func:`flatlab.study.tunings.tuning_seed`), with ``stage = final``. An arm with no
    completed trial in a tuning gets none there (logged).

    Args:
        grid: the search's Tune results (``ResultGrid``: each result's ``config``, last ``metrics`` and
            ``error``).
    """
    results = [(r.config or {}, r.metrics or {}, r.error is not None) for r in grid]
    configs: List[Dict[str, Any]] = []
    for tuning in range(1, study.tunings + 1):
        trials = [
            selection.search_trial(config, metrics, error, study.metric)
            for config, metrics, error in results
            if int(config.get(runs.TUNING_KEY, 1)) == tuning
        ]
        best = selection.best_configurations([t for t in trials if t is not None], study.mode)
        for arm in study.arms:
            if arm.name not in best:
                logger.warning("final stage: arm %s has no completed search trial in tuning %d", arm.name, tuning)
                continue
            chosen = {k: v for k, v in selection.best_trial(best[arm.name]).ref.items() if k != "seed"}
            seeds = tuning_seeds(study.final_seeds, tuning)
            configs += [
                with_tuning({**chosen, "seed": seed, runs.STAGE_KEY: runs.STAGE_FINAL}, tuning, study.tunings)
                for seed in seeds
            ]
    return configs


def final_stage_tuner(study: Study, opts: RunOptions, started: Started, grid: Any) -> Any:
    """The final stage's Tuner: each arm's best configuration over the final seeds (:func:`final_configs`),
    or, for a ``--resume`` that stopped in it after Tune saved it, the final stage's experiment restored."""
    name = f"{started.launch.experiment_name}-final"
    path = experiment_path(started.storage_path, name)
    started.launch.write(final_experiment_path=path)
    if opts.resume and can_resume(path):
        return restore_tuner(path, started.trainable, started.callbacks, started.records)
    configs = final_configs(study, grid)
    logger.info("final stage: %d trials (%s)", len(configs), ", ".join(sorted({c["arm"] for c in configs})))
    return new_tuner(
        study,
        started.trainable,
        FixedSearcher(configs, study.metric, study.mode),
        make_scheduler(study, started.records, fifo=True),
        name,
        started.storage_path,
        started.callbacks,
        len(configs),
    )
