"""Which launch a run finishes or grows, and its MLflow store: the rules checked before anything starts
(:meth:`flatlab.study.runner.StudyLaunch.find`). The record itself, launch.json, is
:class:`~flatlab.study.launches.Launch`; the launch writes it
(:meth:`~flatlab.study.runner.StudyLaunch.write_record`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, Optional

from flatlab.errors import ConfigError
from flatlab.study.launches import Launch, continued_studies, launch_file
from flatlab.study.options import RunOptions
from flatlab.study.spec import Study
from flatlab.tracking import runs

logger = logging.getLogger("flatlab")


def previous_launch(study: Study, opts: RunOptions, root: Path) -> Optional[Launch]:
    """The launch a ``--resume`` finishes or a ``--continue`` grows (``None`` for a new launch), checked
    before anything starts.

    A launch whose driver was killed before Tune saved its experiment is resumed too: its experiment
    starts again, in the same launch (:func:`flatlab.study.tuner.build_tuner`).

    Raises:
        ConfigError: both options; ``--resume`` without a launch; ``--continue`` that cannot grow the
            previous launch's Optuna studies.
    """
    if opts.resume and opts.continue_:
        raise ConfigError(
            "--resume and --continue exclude each other: --resume finishes the latest launch, "
            "--continue starts a new one that adds trials to its Optuna studies"
        )
    if not (opts.resume or opts.continue_):
        return None
    previous = Launch.read(root, study.name)
    where = launch_file(root, study.name)
    if opts.continue_:
        return previous  # what it grows is checked by grown_studies, before anything starts
    if previous is None:
        raise ConfigError(
            f"--resume: no earlier launch of study {study.name!r} under {where.parent} (missing {where.name})"
        )
    return previous


def launch_tracking_uri(opts: RunOptions, previous: Optional[Launch], root: Path) -> str:
    """The MLflow store of this launch: ``--tracking-uri``, else (``--resume``, ``--continue``) the one
    the previous launch recorded, else ``MLFLOW_TRACKING_URI`` or ``<root>/mlflow.db``.

    ``--resume`` with a ``--tracking-uri`` other than the recorded one is the launch's store reached at
    a new address when that store holds the launch's parent run (:func:`flatlab.tracking.runs.holds_run`):
    a tracking server started again on another host over the same backend store, as a SLURM job's head
    node changes between a cancelled job and its resubmission. The launch record then names the new URI.

    Raises:
        ConfigError: ``--resume`` with a ``--tracking-uri`` that is not the launch's store (its trials' runs
            are in the launch's store; finishing them elsewhere would split the launch in two).
    """
    recorded = previous.tracking_uri if previous is not None else ""
    if opts.resume and recorded and opts.tracking_uri and opts.tracking_uri != recorded:
        held = previous.parent_run_id and runs.holds_run(
            opts.tracking_uri, previous.parent_run_id, previous.experiment_id
        )
        if not held:
            raise ConfigError(
                f"--resume: --tracking-uri {opts.tracking_uri} is not the store of the launch it finishes ({recorded}; "
                f"it does not hold the launch's run {previous.parent_run_id or '?'}); leave --tracking-uri out to use "
                "the launch's"
            )
    return opts.tracking_uri or recorded or runs.default_tracking_uri(root)


def grown_studies(study: Study, previous: Optional[Launch], root: Path) -> Dict[str, Any]:
    """For ``--continue``: the launch it grows and, per arm, the Optuna study it adds trials to
    (``continues`` in launch.json), with the prefix of those studies (``optuna_prefix``).

    Raises:
        ConfigError: as :func:`flatlab.study.launches.continued_studies`.
    """
    prefix, names = continued_studies(previous, study, str(launch_file(root, study.name)))
    assert previous is not None  # continued_studies raised otherwise
    return {
        "experiment_name": previous.experiment_name,
        "parent_run_id": previous.parent_run_id,
        "optuna_studies": names,
        "optuna_prefix": prefix,
    }
