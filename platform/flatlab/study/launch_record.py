"""Which launch a run finishes or grows, and its record in launch.json (:class:`~flatlab.study.launches.Launch`)
from the moment it has a parent run: written ``running`` before Tune starts, ended ``failed`` or ``killed``
when it fails before that."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, Optional

from flatlab.errors import ConfigError
from flatlab.study.budget import budget_record
from flatlab.study.launches import Launch, continued_studies, launch_file
from flatlab.study.options import RunOptions
from flatlab.study.searchers import optuna_study_name
from flatlab.study.spec import Study
from flatlab.study.tuner import experiment_path
from flatlab.study.tunings import study_lanes
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


def record_launch(
    study: Study,
    opts: RunOptions,
    resumed: Optional[Launch],
    grown: Optional[Dict[str, Any]],
    root: Path,
    storage_path: str,
    tracking_uri: str,
    experiment_id: str,
    parent_run_id: str,
    exp_name: str,
) -> Launch:
    """launch.json of this launch, written ``running``. A resume keeps what the launch recorded (its
    budget, Optuna studies, what it continues, its final stage), with this run's checkpoint cadence."""
    out = root / study.name
    if resumed is not None:
        launch, prefix = resumed, resumed.optuna_prefix or exp_name
        overrides = resumed.overrides if resumed.overrides is not None else dict(opts.overrides)
    else:
        launch = Launch(
            path=launch_file(root, study.name),
            experiment_name=exp_name,
            experiment_path=experiment_path(storage_path, exp_name),
            parent_run_id=parent_run_id,
        )
        prefix, overrides = (grown or {}).get("optuna_prefix") or exp_name, dict(opts.overrides)
        if grown:
            launch.continues = {k: grown[k] for k in ("experiment_name", "parent_run_id", "optuna_studies")}
    return launch.write(
        tracking_uri=tracking_uri,
        experiment_id=experiment_id,
        status="running",
        overrides=overrides,
        checkpoint_every=study.checkpoint_every,  # --resume keeps it (launches.resume_checkpoint_every)
        budget=budget_record(study.budget, study.max_epochs),  # which unit: epochs, passes or seconds
        optuna_storage=f"sqlite:///{out / 'optuna.db'}",
        optuna_prefix=prefix,
        optuna_studies={lane: optuna_study_name(prefix, lane) for lane in study_lanes(study)}
        if study.searcher != "grid"
        else {},
    )


def end_unstarted(
    launch: Optional[Launch], opened: Any, exc: BaseException, out: Path, storage_path: str, tracking_uri: str
) -> None:
    """End a launch that failed before Tune started (``exc``): its parent run FAILED (KILLED on Ctrl-C)
    and launch.json ``failed`` (``killed``), never RUNNING/``running``. Nothing to end where MLflow itself
    failed (no parent run). Never raises: ``exc`` is what the caller sees."""
    try:
        experiment_id, parent_run_id, exp_name = opened.result()
    except BaseException:  # noqa: BLE001 - MLflow itself failed: no parent run was opened
        return
    status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
    logger.error("launch failed before Tune started: %s: %s", type(exc).__name__, exc, exc_info=exc)
    try:
        runs.client(tracking_uri).set_terminated(parent_run_id, status=status)
        if launch is None:
            launch = Launch(
                path=out / "launch.json",
                experiment_name=exp_name,
                experiment_path=experiment_path(storage_path, exp_name),
                parent_run_id=parent_run_id,
                experiment_id=experiment_id,
                tracking_uri=tracking_uri,
            )
        launch.write(status=status.lower())
    except Exception:  # noqa: BLE001 - report the original error, not this one
        logger.exception("could not record the failed launch in MLflow / %s", out / "launch.json")
