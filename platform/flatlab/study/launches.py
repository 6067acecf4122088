"""The launch record ``<root>/<study>/launch.json``: what ``--resume`` reuses and what ``--continue`` grows.

A launch records, besides its Tune experiment and MLflow parent run (written by
:func:`flatlab.study.runner.run_study`):

* ``overrides``: the budget options it ran with (``trials``, ``epochs``, ``final_seeds``, ``scale``;
  ``None`` where the study file's value was used). ``--resume`` reuses them (:func:`resume_budget`), so a
  launch started with ``--trials 4 --epochs 15`` resumes at that budget, not at the file's.
* ``checkpoint_every``: the checkpoint cadence its trials ran with (``--checkpoint-every`` or the study
  file's; ``null``: the default, by time). A ``--resume`` without ``--checkpoint-every`` keeps it
  (:func:`resume_checkpoint_every`); one with it changes the cadence from then on (not a budget: it
  changes what a restart loses, not what the study measures).
* ``optuna_prefix`` and ``optuna_studies``: the Optuna study of each arm (``<prefix>.<arm>`` in
  ``<root>/<study>/optuna.db``). ``--continue`` starts a new launch whose arms add trials to the previous
  launch's Optuna studies (:func:`continued_studies`), so TPE builds on every trial it has seen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from flatlab.errors import ConfigError

BUDGET_KEYS = ("trials", "epochs", "final_seeds", "scale")
"""The ``flatlab run`` options a launch records and ``--resume`` reuses."""

_FLAGS = {"trials": "--trials", "epochs": "--epochs", "final_seeds": "--final-seeds", "scale": "--scale"}


def launch_file(root: Path, study: str) -> Path:
    """``<root>/<study>/launch.json``."""
    return Path(root) / study / "launch.json"


def read_launch(root: Path, study: str) -> Optional[Dict[str, Any]]:
    """The latest launch record of ``study`` under ``root``; ``None`` if there is none.

    Raises:
        ConfigError: the file exists but is not a JSON object.
    """
    path = launch_file(root, study)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable launch record: {exc}") from exc
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: not a launch record (a JSON object expected)")
    return record


def resume_budget(recorded: Optional[Dict[str, Any]], given: Dict[str, Any], where: str = "") -> Dict[str, Any]:
    """The budget options of a ``--resume``: the launch's recorded ``overrides``, which an explicit
    option may repeat but not change.

    Args:
        recorded: the launch record (``None``, or one without ``overrides`` written before they were
            recorded: ``given`` is used as it is).
        given: the options of this command (``None`` where not given), keys :data:`BUDGET_KEYS`.
        where: the study's name, for the message.

    Raises:
        ConfigError: an option given with a value other than the launch's, naming both.
    """
    kept = (recorded or {}).get("overrides")
    if not isinstance(kept, dict):
        return {k: given.get(k) for k in BUDGET_KEYS}
    out: Dict[str, Any] = {}
    for key in BUDGET_KEYS:
        before, now = kept.get(key), given.get(key)
        if now is not None and now != before:
            shown = "the study file's value" if before is None else f"{_FLAGS[key]} {before}"
            raise ConfigError(
                f"--resume{f' of study {where!r}' if where else ''}: {_FLAGS[key]} {now} differs from the launch being "
                f"resumed, which ran with {shown}; a resume keeps the launch's budget (leave {_FLAGS[key]} out, or "
                "start a new launch without --resume)"
            )
        out[key] = before
    return out


def file_scales(path: str) -> Tuple[str, ...]:
    """The scales a study file defines (``SCALES``, the default first; ``()`` for a file without)."""
    from flatlab.study.loader import _scales, load_module

    return _scales(path, load_module(path))


def resume_scale(path: str, root: Path) -> Optional[str]:
    """The scale a ``--resume`` without ``--scale`` loads ``path`` at: the one whose latest launch (of any
    of the file's studies at that scale) is the newest; ``None`` (the default) if none ran or the file
    has no scales.

    Raises:
        ConfigError: the study file cannot be loaded at one of its scales.
    """
    from flatlab.study.loader import load_studies

    scales = file_scales(path)
    best: Tuple[float, Optional[str]] = (-1.0, None)
    for scale in scales:
        for study in load_studies(path, scale=scale):
            record = read_launch(root, study.name)
            if record is None:
                continue
            ran = (record.get("overrides") or {}).get("scale") or scales[0]
            mtime = launch_file(root, study.name).stat().st_mtime
            if ran == scale and mtime > best[0]:
                best = (mtime, scale)
    return best[1]


def launch_budgets(path: str, studies: List[Any], given: Dict[str, Any], root: Path, resume: bool) -> Dict[str, Dict[str, Any]]:
    """Study name -> the budget options its launch runs with (and records): ``given`` for a new launch
    (``scale`` made explicit: the file's default when not given), the recorded ones for ``--resume``
    (:func:`resume_budget`).

    Raises:
        ConfigError: a ``--resume`` option that differs from the launch's.
    """
    scales = file_scales(path)
    effective = dict(given, scale=given.get("scale") or (scales[0] if scales else None))
    if not resume:
        return {s.name: dict(effective) for s in studies}
    # given["scale"] is the explicit --scale only: without it, the file was loaded at resume_scale's
    return {s.name: resume_budget(read_launch(root, s.name), given, s.name) for s in studies}


def resume_checkpoint_every(recorded: Optional[Dict[str, Any]], study_value: Optional[int], where: str = "") -> Optional[int]:
    """The ``checkpoint_every`` of a ``--resume`` without ``--checkpoint-every``: the one its launch
    recorded, so a launch started with ``--checkpoint-every 2`` goes on checkpointing every 2 epochs;
    ``study_value`` (the study file's) for a record without one (written before it was recorded).

    Raises:
        ConfigError: the recorded value is neither ``null`` nor a positive int (an edited record), naming
            the study and the value.
    """
    if not recorded or "checkpoint_every" not in recorded:
        return study_value
    value = recorded["checkpoint_every"]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"--resume{f' of study {where!r}' if where else ''}: its launch record has "
                          f"checkpoint_every={value!r}; expected null or an int >= 1 (pass --checkpoint-every N)")
    return value


def continued_studies(previous: Optional[Dict[str, Any]], study: Any, where: str) -> Tuple[str, Dict[str, str]]:
    """For ``--continue``: the previous launch's Optuna study prefix and, per arm, the Optuna study this
    launch adds trials to (``<prefix>.<arm>``; an arm new in this launch starts its study there).

    Args:
        previous: the previous launch record of ``study`` (``None``: there is none).
        study: the validated :class:`~flatlab.study.spec.Study`.
        where: the launch record's path, for messages.

    Raises:
        ConfigError: no previous launch; a ``grid`` study (no Optuna study to grow); an arm whose searched
            space differs from the Optuna distributions its study has seen (naming the arm and the
            parameters).
    """
    from flatlab.study.searchers import optuna_study_name

    if study.searcher == "grid":
        raise ConfigError(f"--continue: study {study.name!r} uses searcher='grid', which has no Optuna study to add trials to")
    if previous is None:
        raise ConfigError(f"--continue: study {study.name!r} has no previous launch to continue (missing {where})")
    prefix = previous.get("optuna_prefix") or previous.get("experiment_name")
    if not prefix:
        raise ConfigError(f"--continue: {where} does not name the previous launch's Optuna studies")
    storage = previous.get("optuna_storage")
    names = {arm.name: optuna_study_name(prefix, arm.name) for arm in study.arms}
    if storage:
        for arm in study.arms:
            seen = _seen_distributions(storage, names[arm.name])
            if seen is None:
                continue  # a new arm (or one without searched parameters so far): its study starts now
            now = {k: d.to_optuna() for k, d in arm.searched().items()}
            diff = space_difference(seen, now)
            if diff:
                raise ConfigError(
                    f"--continue: arm {arm.name!r} of study {study.name!r} searches a different space than the Optuna "
                    f"study {names[arm.name]!r} it would continue ({diff}); start a new launch without --continue, or "
                    "give the changed arm a new name"
                )
    return prefix, names


def space_difference(seen: Dict[str, Any], now: Dict[str, Any]) -> str:
    """How two spaces (parameter -> Optuna distribution) differ, as one phrase; ``""`` when they agree."""
    parts = []
    for k in sorted(set(seen) | set(now)):
        if k not in now:
            parts.append(f"{k}: searched before, not now")
        elif k not in seen:
            parts.append(f"{k}: searched now, not before")
        elif seen[k] != now[k]:
            parts.append(f"{k}: {seen[k]!r} before, {now[k]!r} now")
    return "; ".join(parts)


def _seen_distributions(storage: str, name: str) -> Optional[Dict[str, Any]]:
    """Union of the distributions of the trials of Optuna study ``name``; ``None`` if it has no trial."""
    import optuna

    from flatlab.study.searchers import _storage

    try:
        st = optuna.load_study(study_name=name, storage=_storage(storage))
    except KeyError:
        return None
    seen: Dict[str, Any] = {}
    for trial in st.get_trials(deepcopy=False):
        seen.update(trial.distributions)
    return seen or None

