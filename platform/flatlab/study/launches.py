"""The launch record ``<root>/<study>/launch.json`` (:class:`Launch`): what ``--resume`` reuses and what
``--continue`` grows. This module owns the file: its fields, reading and writing it, and the resume rules.

A launch records its Tune experiment and MLflow parent run, its status (``running``, ``finished``,
``killed``, ``failed``) and:

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

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.study.tunings import study_lanes

# Optuna and Ray Tune (the searchers): `flatlab run` reads launch.json without them
optuna = lazy("optuna")
searchers = lazy("flatlab.study.searchers")

BUDGET_KEYS = ("trials", "epochs", "final_seeds", "tunings", "scale")
"""The ``flatlab run`` options a launch records and ``--resume`` reuses."""

_FLAGS = {
    "trials": "--trials",
    "epochs": "--epochs",
    "final_seeds": "--final-seeds",
    "tunings": "--tunings",
    "scale": "--scale",
}

STATUSES = ("running", "finished", "killed", "failed")


LOG_NAME = "flatlab.log"


def log_file(out: Path) -> Path:
    """The driver log of the study whose outputs are in ``out`` (``<root>/<study>``): Ray's, Tune's,
    Optuna's and MLflow's lines and flatlab's own, such as why a report plot was skipped."""
    return Path(out) / "logs" / LOG_NAME


def launch_file(root: Path, study: str) -> Path:
    """``<root>/<study>/launch.json``."""
    return Path(root) / study / "launch.json"


@dataclass
class Launch:
    """One launch of a study, as ``<root>/<study>/launch.json`` records it.

    Attributes:
        path: the record's file (not written into it).
        experiment_name: the Tune experiment (``<study>-<YYYYmmdd-HHMMSS>``).
        experiment_path: its folder (or URI) under the Tune storage.
        parent_run_id, experiment_id, tracking_uri: the MLflow launch run, its experiment and store.
        status: one of :data:`STATUSES`.
        num_errors: trials that ended in an error.
        overrides: the budget options (:data:`BUDGET_KEYS`) the launch runs with.
        checkpoint_every: the trials' checkpoint cadence (``None``: by time).
        optuna_storage, optuna_prefix, optuna_studies: the arms' Optuna studies (``{}`` for a grid).
        continues: for a ``--continue`` launch, the launch whose Optuna studies it grows
            (``experiment_name``, ``parent_run_id``, ``optuna_studies``).
        final_experiment_path: the final stage's Tune experiment, once it started.
        budget: the unit and amount of each trial's budget (:func:`flatlab.study.budget.budget_record`:
            ``{"unit": "passes", "amount": 100000, "arm_epochs": {...}}``); ``{}`` in older records.
    """

    path: Path
    experiment_name: str = ""
    experiment_path: str = ""
    parent_run_id: str = ""
    experiment_id: str = ""
    tracking_uri: str = ""
    status: str = "running"
    num_errors: int = 0
    overrides: Optional[Dict[str, Any]] = None
    checkpoint_every: Optional[int] = None
    optuna_storage: str = ""
    optuna_prefix: str = ""
    optuna_studies: Dict[str, str] = field(default_factory=dict)
    continues: Dict[str, Any] = field(default_factory=dict)
    final_experiment_path: Optional[str] = None
    budget: Dict[str, Any] = field(default_factory=dict)
    recorded: Tuple[str, ...] = field(default=(), repr=False, compare=False)  # the keys the file had

    @classmethod
    def read(cls, root: Path, study: str) -> Optional["Launch"]:
        """The latest launch record of ``study`` under ``root``; ``None`` if there is none. A record
        written by an older flatlab reads with defaults for what it lacks; unknown keys are ignored.

        Raises:
            ConfigError: the file exists but is not a JSON object.
        """
        path = launch_file(root, study)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a readable launch record: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a launch record (a JSON object expected)")
        names = {f.name for f in dataclasses.fields(cls)} - {"path", "recorded"}
        return cls(path=path, recorded=tuple(data), **{k: v for k, v in data.items() if k in names})

    def write(self, **changes: Any) -> "Launch":
        """Apply ``changes`` (field values) and write the record, whole, to :attr:`path`."""
        for key, value in changes.items():
            setattr(self, key, value)
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("path", "recorded")}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data, indent=2, default=str))
        self.recorded = tuple(data)
        return self

    @property
    def done(self) -> bool:
        """The launch finished and none of its trials errored: a ``--resume`` has nothing to run."""
        return self.status == "finished" and self.num_errors == 0


def resume_budget(recorded: Optional[Launch], given: Dict[str, Any], where: str = "") -> Dict[str, Any]:
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
    kept = recorded.overrides if recorded is not None else None
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


def resume_checkpoint_every(recorded: Optional[Launch], study_value: Optional[int], where: str = "") -> Optional[int]:
    """The ``checkpoint_every`` of a ``--resume`` without ``--checkpoint-every``: the one its launch
    recorded, so a launch started with ``--checkpoint-every 2`` goes on checkpointing every 2 epochs;
    ``study_value`` (the study file's) for a record without one (written before it was recorded).

    Raises:
        ConfigError: the recorded value is neither ``null`` nor a positive int (an edited record), naming
            the study and the value.
    """
    if recorded is None or "checkpoint_every" not in recorded.recorded:
        return study_value
    value = recorded.checkpoint_every
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(
            f"--resume{f' of study {where!r}' if where else ''}: its launch record has "
            f"checkpoint_every={value!r}; expected null or an int >= 1 (pass --checkpoint-every N)"
        )
    return value


def continued_studies(previous: Optional[Launch], study: Any, where: str) -> Tuple[str, Dict[str, str]]:
    """For ``--continue``: the previous launch's Optuna study prefix and, per arm and tuning (its lane,
    :mod:`flatlab.study.tunings`), the Optuna study this launch adds trials to (``<prefix>.<arm>``,
    ``<prefix>.<arm>@<k>``; an arm or tuning new in this launch starts its study there).

    Args:
        previous: the previous launch record of ``study`` (``None``: there is none).
        study: the validated :class:`~flatlab.study.spec.Study`.
        where: the launch record's path, for messages.

    Raises:
        ConfigError: no previous launch; a ``grid`` study (no Optuna study to grow); an arm whose searched
            space differs from the Optuna distributions its study has seen (naming the arm and the
            parameters).
    """
    if study.searcher == "grid":
        raise ConfigError(
            f"--continue: study {study.name!r} uses searcher='grid', which has no Optuna study to add trials to"
        )
    if previous is None:
        raise ConfigError(f"--continue: study {study.name!r} has no previous launch to continue (missing {where})")
    prefix = previous.optuna_prefix or previous.experiment_name
    if not prefix:
        raise ConfigError(f"--continue: {where} does not name the previous launch's Optuna studies")
    storage = previous.optuna_storage
    names = {lane: searchers.optuna_study_name(prefix, lane) for lane in study_lanes(study)}
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
    try:
        st = optuna.load_study(study_name=name, storage=searchers._storage(storage))
    except KeyError:
        return None
    seen: Dict[str, Any] = {}
    for trial in st.get_trials(deepcopy=False):
        seen.update(trial.distributions)
    return seen or None
