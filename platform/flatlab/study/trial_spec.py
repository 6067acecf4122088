"""From a study and one trial's config to what the trial runs: where each field goes and its
:class:`~flatlab.train.trainer.TrialSpec`.

A trial config is ``{"arm", "seed", field: value ...}`` (the searcher's suggestion, or a final-stage
config). Each field of an arm's space is declared by the arm's optimizer, the trainer or the workload
(:func:`declared`); :func:`route` says which, :func:`trial_spec` sorts the values accordingly, and
:func:`resolved_config` fills in every default, as the trial's MLflow run records it.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

from flatlab.analysis.sample import TRIAL_KEYS
from flatlab.hparams import HParam
from flatlab.optim.registry import get_optimizer
from flatlab.study.space import SOURCE_SUFFIX
from flatlab.study.spec import Arm, Study
from flatlab.train.config import TRAINER_HPARAMS
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
    return TrialSpec(
        workload=study.workload,
        optimizer=arm.optimizer,
        epochs=study.max_epochs,
        seed=int(config["seed"]),
        workload_params=wl,
        optimizer_params=opt,
        trainer_params=trn,
        device=device,
    )


def resolved_config(study: Study, config: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Every value one trial (``config``: ``{"arm", "seed", field: value ...}``) runs with, defaults
    filled in from the declarations: ``{"optimizer": {...}, "trainer": {...}, "workload": {...}}``
    (``trainer`` includes ``epochs``; see :func:`flatlab.train.resolved.resolve_spec`).

    Raises:
        ConfigError: a value outside its allowed range; UnknownNameError: an unknown arm.
    """
    return resolve_spec(trial_spec(study, config))
