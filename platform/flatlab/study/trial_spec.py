"""From a study and one trial's config to what the trial runs: where each field goes and its
:class:`~flatlab.train.trainer.TrialSpec`.

A trial config is ``{"arm", "seed", field: value ...}`` (the searcher's suggestion, or a final-stage
config). Each field of an arm's space is declared by the arm's optimizer, the trainer or the workload
(:func:`declared`); :func:`route` says which, :func:`trial_spec` sorts the values accordingly, and
:func:`resolved_config` fills in every default, as the trial's MLflow run records it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Mapping

import torch

from flatlab.analysis.sample import TRIAL_KEYS
from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.optim.protocol import Progress, passes_of
from flatlab.optim.registry import get_optimizer
from flatlab.study.budget import PER_ARM, ArmBudget, Budget, arm_budget
from flatlab.study.space import SOURCE_SUFFIX, BestOf, inner, representatives
from flatlab.study.spec import Arm, Study
from flatlab.train.config import TRAINER_HPARAMS, warmup_steps_of
from flatlab.train.resolved import resolve_spec
from flatlab.train.trainer import TrialSpec
from flatlab.workloads.registry import get_workload


def route(study: Study, arm: Arm) -> Dict[str, str]:
    """field -> ``optimizer`` | ``trainer`` | ``workload``: where each space field of ``arm`` goes
    (``unknown`` for a field none of them declares; :func:`flatlab.study.validate.validate` refuses it)."""
    opt = {h.name for h in get_optimizer(arm.optimizer).hparams}
    trn = {h.name for h in TRAINER_HPARAMS}
    wl = {h.name for h in get_workload(study.workload).hparams}
    out = {}
    for k in arm.dims:
        out[k] = "optimizer" if k in opt else "trainer" if k in trn else "workload" if k in wl else "unknown"
    return out


def declared(study: Study, arm: Arm) -> Dict[str, HParam]:
    """Every field ``arm`` may set, with its declaration (optimizer, trainer and workload fields)."""
    out: Dict[str, HParam] = {h.name: h for h in get_workload(study.workload).hparams}
    out.update({h.name: h for h in TRAINER_HPARAMS})
    out.update({h.name: h for h in get_optimizer(arm.optimizer).hparams})
    return out


def trial_spec(study: Study, config: Mapping[str, Any], device: str = "cpu") -> TrialSpec:
    """The :class:`TrialSpec` of one trial config (``{"arm", "seed", field: value ...}``) of ``study``.

    Raises:
        UnknownNameError: ``config["arm"]`` is not an arm of ``study``.
    """
    arm = study.arm(config["arm"])
    routes = route(study, arm)
    opt: Dict[str, Any] = {}
    trn: Dict[str, Any] = dict(study.train)
    wl: Dict[str, Any] = dict(study.workload_params)
    for k, v in config.items():
        if k in TRIAL_KEYS or k.endswith(SOURCE_SUFFIX):  # <field>.source: a chained value's origin
            continue
        {"optimizer": opt, "trainer": trn, "workload": wl}.get(routes.get(k, ""), opt)[k] = v
    budget = study.budget if study.budget is not None else Budget()
    return TrialSpec(
        workload=study.workload,
        optimizer=arm.optimizer,
        epochs=study.epochs_of(arm.name),
        seed=int(config["seed"]),
        workload_params=wl,
        optimizer_params=opt,
        trainer_params=trn,
        device=device,
        max_passes=budget.passes,
        max_steps=budget.steps,
        max_seconds=budget.seconds,
    )


def arm_budgets(study: Study, rows: int) -> Dict[str, ArmBudget]:
    """Each arm's steps and epochs under ``study``'s pass or step budget (:func:`flatlab.study.budget.arm_budget`,
    a step costing :meth:`~flatlab.study.budget.Budget.step_cost`), with ``rows`` training examples: the
    arm's optimizer built on a dummy parameter with its fixed values and a representative of each searched
    one, its batch size resolved as its trials' (workload default, ``Study.train``, the arm's fixed value).
    Empty without a pass or step budget.

    Raises:
        ConfigError: the budget does not cover an arm's first step.
    """
    if study.budget is None or study.budget.unit not in PER_ARM:
        return {}
    out: Dict[str, ArmBudget] = {}
    for arm in study.arms:
        typical = representatives(arm.dims)[0]  # a chained value (best_of) is resolved by the launch, not here
        fixed = {k: v for k, v in typical.items() if not isinstance(inner(arm.dims.get(k)), BestOf)}
        config = {"arm": arm.name, "seed": 0, **fixed}
        spec = trial_spec(study, config)
        recipe = resolve_spec(spec)["trainer"]
        batch = int(recipe["batch_size"])
        opt = get_optimizer(arm.optimizer).create([torch.zeros(1, requires_grad=True)], **dict(spec.optimizer_params))
        per_epoch = math.ceil(rows / batch)
        hook = getattr(opt, "on_progress", None)
        if hook is not None:  # IRE's switch-on by epoch or warm-up: known from here
            hook(Progress(0, 0, per_epoch * study.max_epochs, per_epoch, warmup_steps_of(recipe, per_epoch)))
        passes = lambda i, opt=opt: passes_of(opt, i)[1]  # noqa: E731
        try:
            out[arm.name] = arm_budget(
                int(study.budget.amount), study.budget.step_cost(passes), rows, batch, step_passes=passes(0)
            )
        except ValueError as exc:
            raise ConfigError(f"study {study.name!r}, arm {arm.name!r}: {exc}") from exc
    return out


def with_arm_epochs(study: Study, rows: int) -> Study:
    """``study`` with each arm's epochs under its pass or step budget set (:attr:`Budget.arm_epochs`, from
    :func:`arm_budgets`) and ``max_epochs`` the largest of them; ``study`` itself without one.
    The launch calls it once the data is loaded (``rows``: training examples), before any trial.

    Raises:
        ConfigError: as :func:`arm_budgets`.
    """
    budgets = arm_budgets(study, rows)
    if not budgets:
        return study
    epochs = {name: b.epochs for name, b in budgets.items()}
    budget = dataclasses.replace(study.budget, arm_epochs=epochs)
    return dataclasses.replace(study, budget=budget, max_epochs=max(epochs.values()))


def resolved_config(study: Study, config: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Every value one trial (``config``: ``{"arm", "seed", field: value ...}``) runs with, defaults
    filled in from the declarations: ``{"optimizer": {...}, "trainer": {...}, "workload": {...}}``
    (``trainer`` includes ``epochs``; see :func:`flatlab.train.resolved.resolve_spec`).

    Raises:
        ConfigError: a value outside its allowed range; UnknownNameError: an unknown arm.
    """
    return resolve_spec(trial_spec(study, config))
