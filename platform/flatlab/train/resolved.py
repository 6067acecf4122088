"""The resolved configuration of a trial: every value its optimizer, trainer and workload run with.

A :class:`~flatlab.train.trainer.TrialSpec` holds only what a study set (its searched and fixed values);
the registries' declarations fill in the rest. The trainer builds its recipe with
:func:`resolve_trainer`, and :func:`resolve_spec` gives the same values without building anything, for
MLflow params and ``trial.json``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping

from flatlab.errors import ConfigError
from flatlab.hparams import resolve
from flatlab.optim.registry import get_optimizer
from flatlab.train.config import TRAINER_HPARAMS, recipe_problems
from flatlab.workloads.registry import get_workload


def resolve_trainer(train_defaults: Any, given: Mapping[str, Any]) -> Dict[str, Any]:
    """``TRAINER_HPARAMS`` with the workload's recipe (``train_defaults``, a
    :class:`~flatlab.workloads.base.TrainDefaults`) over the declared defaults and ``given`` over both.

    Raises:
        ConfigError: an unknown trainer parameter, a value outside its allowed range, or values that
            break a rule together (:func:`~flatlab.train.config.recipe_problems`).
    """
    defaults = dataclasses.asdict(train_defaults)
    if given.get("warmup_steps") is not None:  # a warm-up in steps replaces the workload's in epochs
        defaults["warmup_epochs"] = 0.0
    hp = resolve(TRAINER_HPARAMS, {**defaults, **dict(given)}, "trainer")
    problems = recipe_problems(hp)
    if problems:
        raise ConfigError("\n".join(f"trainer: {p}" for p in problems))
    return hp


def resolve_spec(spec: Any) -> Dict[str, Dict[str, Any]]:
    """Every value ``spec`` (a :class:`~flatlab.train.trainer.TrialSpec`) trains with:
    ``{"optimizer": {...}, "trainer": {...}, "workload": {...}}``, defaults filled in from the optimizer
    registry's and the workload's declarations. ``trainer`` also holds ``epochs`` (the run's length,
    which the LR schedule spans).

    Raises:
        ConfigError: a value outside its allowed range; UnknownNameError: an unregistered name.
    """
    workload = get_workload(spec.workload)
    optimizer = get_optimizer(spec.optimizer).resolve(dict(spec.optimizer_params))
    trainer = {**resolve_trainer(workload.train_defaults, spec.trainer_params), "epochs": spec.epochs}
    params = resolve(workload.hparams, dict(spec.workload_params), f"workload {spec.workload!r}")
    return {"optimizer": optimizer, "trainer": trainer, "workload": params}
