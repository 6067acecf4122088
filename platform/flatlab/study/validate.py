"""Validation of a :class:`~flatlab.study.spec.Study`: every problem found, in one error.

:func:`validate` checks a study against the registries (workload, optimizers, measures, reports), the
trainer's parameters and its own bounds before anything starts or is written. Each check below returns
its problems as lines naming the study file, the arm and the field with the allowed values; nothing
stops at the first one, so a study file with three mistakes reports three lines at once. An arm's
optimizer is also built once on a dummy parameter (:func:`_probe_optimizer`), so a combination it
refuses as a whole fails here rather than in every trial.
"""

from __future__ import annotations

import math
import re
from typing import Any, List, Mapping, Optional, Tuple

import torch

from flatlab.analysis.curve_sets import Published
from flatlab.errors import ConfigError, UnknownNameError, did_you_mean
from flatlab.hparams import resolve
from flatlab.interpolation import report as _interpolation_report  # noqa: F401 (registers the interpolation report)
from flatlab.optim.registry import get_optimizer
from flatlab.reports.declared import resolve_reports
from flatlab.sharpness.measures import resolve_measures
from flatlab.study.budget import PER_ARM, Budget
from flatlab.study.space import BestOf, Fixed, condition_problems, grid_points, inner, is_searched, representatives
from flatlab.study.spec import MODES, SCHEDULERS, SEARCHERS, Arm, Resources, Study
from flatlab.study.trial_spec import declared, route
from flatlab.study.tunings import overlapping_seeds
from flatlab.train.config import TARGET_HPARAMS, TRAINER_HPARAMS, recipe_problems
from flatlab.workloads.registry import get_workload

# The searchers seed arm i's Optuna sampler with seed * SAMPLER_SEED_STRIDE + i (study/searchers.py), and
# numpy's RandomState inside the samplers needs that in [0, 2**32): this bounds the study seed.
SAMPLER_SEED_STRIDE = 1000
SEED_LIMIT = 2**32  # trial seeds and derived sampler seeds lie in [0, SEED_LIMIT)
MAX_COUNT = 10**6  # upper bound of trial, epoch and rung counts (a typo's 10**9 would run forever)
MAX_RESOURCE = 2**16  # upper bound of per-trial CPUs / GPUs
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def validate(study: Study, source: str = "") -> Study:
    """Check the whole study; raises ONE :class:`ConfigError` listing every problem found.

    Each message names the study file (``source``), the arm and the field, with the allowed values.
    Nothing is started or written. Returns ``study`` for chaining.
    """
    where = f"{source}: study {study.name!r}" if source else f"study {study.name!r}"
    errors: List[str] = []
    if not (isinstance(study.name, str) and bool(_NAME.match(study.name or ""))):
        errors.append(f"{where}: name={study.name!r}: use letters, digits, '_', '.', '-'")
    workload_cls, found = _workload_problems(study, where)
    errors += found
    try:
        resolve(TRAINER_HPARAMS, study.train, f"{where}: field 'train'")
    except ConfigError as exc:
        errors.extend(str(exc).splitlines())
    errors += _target_problems(study, where)
    errors += [f"{where}: {m}" for m in _scalar_problems(study) + _choice_problems(study) + _arm_name_problems(study)]
    errors += _measure_problems(study, where)
    if study.published is not None and not isinstance(study.published, Published):
        errors.append(f"{where}: published={study.published!r}; expected None or Published(path, arms={{arm: curve}})")
    elif study.published is not None:
        errors.extend(f"{where}: {m}" for m in study.published.problems([a.name for a in study.arms]))
    errors += _report_problems(study, where)
    errors += _margin_problems(study, where)
    errors += [f"{where}: {m}" for m in _budget_problems(study)]
    for arm in study.arms:
        errors += _arm_problems(study, arm, where, workload_cls is not None)
    if errors:
        raise ConfigError("invalid study:\n  " + "\n  ".join(errors))
    return study


def _workload_problems(study: Study, where: str) -> Tuple[Optional[Any], List[str]]:
    """``(workload class or None, problems)``: the workload is registered, its parameters resolve, and the
    study metric is one it reports every epoch."""
    try:
        workload_cls = get_workload(study.workload)
    except UnknownNameError as exc:
        return None, [f"{where}: field 'workload': {exc}"]
    errors: List[str] = []
    try:
        resolve(workload_cls.hparams, study.workload_params, f"{where}: workload_params")
    except ConfigError as exc:
        errors.extend(str(exc).splitlines())
    per_epoch = [m for m in workload_cls.metrics if not m.startswith("test/")]
    if study.metric in workload_cls.metrics and study.metric not in per_epoch:
        errors.append(
            f"{where}: metric={study.metric!r} is reported only after the last epoch (the test split is kept out "
            f"of model selection); the searcher and scheduler need one reported every epoch: {', '.join(per_epoch)}"
        )
    elif study.metric not in workload_cls.metrics:
        errors.append(
            f"{where}: metric={study.metric!r} is not reported by workload {study.workload!r}; it reports: "
            f"{', '.join(per_epoch)}"
        )
    return workload_cls, errors


def _choice_problems(study: Study) -> List[str]:
    """``mode``, ``searcher`` and ``scheduler`` are among the allowed names; ``grace_period`` is a count
    (within ``max_epochs`` for ASHA, whose first rung must lie within the budget; FIFO ignores it)."""
    out: List[str] = []
    if study.mode not in MODES:
        out.append(f"mode={study.mode!r}; expected one of {', '.join(MODES)}")
    if study.searcher not in SEARCHERS:
        out.append(f"searcher={study.searcher!r}; expected one of {', '.join(SEARCHERS)}")
    if study.scheduler not in SCHEDULERS:
        out.append(f"scheduler={study.scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
    grace = study.grace_period
    if study.scheduler == "asha":
        top = study.max_epochs if _is_int(study.max_epochs) else 1
        if not (_is_int(grace) and 1 <= grace <= top):
            out.append(
                f"grace_period={grace!r}; expected an int in [1, max_epochs={study.max_epochs!r}] (scheduler='asha')"
            )
    elif not (_is_int(grace) and 1 <= grace <= MAX_COUNT):
        out.append(f"grace_period={grace!r}; expected an int in [1, {MAX_COUNT}]")
    return out


def _arm_name_problems(study: Study) -> List[str]:
    """At least one arm; arm names unique and usable as MLflow run, Optuna study and Tune trial names;
    ``reference_arm`` one of them; ``target_loss`` a finite positive loss; not both a reference and a target;
    ``target_metric`` a finite number."""
    out: List[str] = []
    if len(study.arms) == 0:
        out.append("arms is empty; give at least one Arm(optimizer=..., space={...})")
    names = [a.name for a in study.arms]
    if len(set(map(repr, names))) != len(names):
        out.append(f"arm names must be unique, got {names}")
    out += [f"arm name {n!r}: use letters, digits, '_', '.', '-'" for n in names if not _is_name(n)]
    if not (study.reference_arm is None or study.reference_arm in names):
        out.append(
            f"reference_arm={study.reference_arm!r}; expected None or one of the arm names: "
            f"{', '.join(map(repr, names))}"
        )
    target = study.target_loss
    if not (target is None or (_is_number(target) and target > 0)):
        out.append(f"target_loss={target!r}; expected None or a finite float > 0 (the training loss to reach)")
    if study.reference_arm is not None and target is not None:
        out.append(
            f"reference_arm={study.reference_arm!r} and target_loss={target!r} are both set; set at most one of them"
        )
    if not (study.target_metric is None or _is_number(study.target_metric)):
        out.append(
            f"target_metric={study.target_metric!r}; expected None or a finite number (the value of "
            f"{study.metric} to reach, in its units)"
        )
    return out


def _target_problems(study: Study, where: str) -> List[str]:
    """Problems with the training-loss target (the trainer's ``stop_at_train_loss`` or
    ``measure_at_train_loss``): both set (:func:`~flatlab.train.config.recipe_problems`); either in an
    arm's space (a target is study-wide: flatness is compared at one training loss for every arm, and
    ``flatlab compare`` reads it from the launch); ``measure_at_train_loss`` without ``measures``."""
    if not isinstance(study.train, Mapping):
        return []  # reported by the trainer parameters' resolve
    errors = [f"{where}: field 'train': {m}" for m in recipe_problems(study.train)]
    for arm in study.arms:
        for key in TARGET_HPARAMS:
            if isinstance(arm.space, Mapping) and key in arm.space:
                errors.append(
                    f"{where}, arm {arm.name!r}: field {key!r} is study-wide (every arm is measured at the same "
                    f"training loss): set it in Study(train={{{key!r}: ...}}), not in an arm's space"
                )
    measure_at = study.train.get("measure_at_train_loss")
    if measure_at is not None and isinstance(study.measures, Mapping) and not study.measures:
        errors.append(
            f"{where}: field 'train': measure_at_train_loss={measure_at!r} runs the study's measures at the target, "
            f"but measures is empty; set measures={{...}} (`flatlab measures` lists them), or use "
            f"stop_at_train_loss to only stop there"
        )
    return errors


def _measure_problems(study: Study, where: str) -> List[str]:
    """Problems with ``measures``, their subset and ``final_seeds`` (each naming the field)."""
    errors: List[str] = []
    if not isinstance(study.measures, Mapping):
        errors.append(
            f"{where}: measures={study.measures!r}; expected a dict of measure name -> parameters, "
            f"e.g. measures={{'fisher_trace': {{}}}} (see `flatlab measures`)"
        )
    else:
        try:
            resolve_measures(study.measures, f"{where}: measures")
        except ConfigError as exc:
            errors.extend(str(exc).splitlines())
    if not (_is_int(study.measure_examples) and 0 <= study.measure_examples <= 10**7):
        errors.append(
            f"{where}: measure_examples={study.measure_examples!r}; expected an int in [0, 10**7] (0 = the whole split)"
        )
    if not (_is_int(study.measure_seed) and 0 <= study.measure_seed < 2**32):
        errors.append(f"{where}: measure_seed={study.measure_seed!r}; expected an int in [0, 2**32)")
    splits = ("train", "val")
    if study.measure_split not in splits:
        errors.append(f"{where}: measure_split={study.measure_split!r}; expected one of {', '.join(map(repr, splits))}")
    errors += _measure_more_problems(study, where)
    fs = study.final_seeds
    if not (isinstance(fs, tuple) and all(_is_int(x) and 0 <= x < 2**32 for x in fs)):
        errors.append(
            f"{where}: final_seeds={fs!r}; expected a tuple of ints in [0, 2**32), e.g. final_seeds=(1, 2, 3)"
        )
    elif len(set(fs)) != len(fs):
        errors.append(f"{where}: final_seeds={fs!r} repeats a seed")
    elif fs and study.searcher == "grid":
        errors.append(
            f"{where}: final_seeds={fs!r} with searcher='grid': a grid already runs every point with every "
            f"seed in seeds=...; put the seeds there and leave final_seeds empty"
        )
    return errors


def _measure_more_problems(study: Study, where: str) -> List[str]:
    """Problems with ``measure_extra_splits`` (a tuple of distinct splits other than ``measure_split``) and
    ``measure_every`` (``None`` or an int >= 1), and either of them set without ``measures``."""
    errors: List[str] = []
    extra, every, allowed = study.measure_extra_splits, study.measure_every, ("train", "val", "test")
    if not (isinstance(extra, tuple) and all(x in allowed for x in extra)):
        errors.append(
            f"{where}: measure_extra_splits={extra!r}; expected a tuple of splits from "
            f"{', '.join(map(repr, allowed))}, e.g. ('test',)"
        )
    elif len(set(extra)) != len(extra) or study.measure_split in extra:
        errors.append(
            f"{where}: measure_extra_splits={extra!r} repeats a split or names measure_split={study.measure_split!r}"
        )
    if every is not None and not (_is_int(every) and every >= 1):
        errors.append(f"{where}: measure_every={every!r}; expected None or an int >= 1 (epochs between measurements)")
    if (extra or every is not None) and isinstance(study.measures, Mapping) and not study.measures:
        errors.append(
            f"{where}: measure_extra_splits or measure_every is set but measures is empty; set measures={{...}} "
            f"(`flatlab measures` lists them)"
        )
    return errors


def _budget_problems(study: Study) -> List[str]:
    """``budget`` is ``None`` or a valid :class:`~flatlab.study.budget.Budget`; under a pass or step budget no
    arm searches ``batch_size`` (an arm's steps per epoch, so its epochs and ASHA rungs, must be known before
    its trials start)."""
    budget = study.budget
    if budget is None:
        return []
    if not isinstance(budget, Budget):
        return [
            f"budget={budget!r} ({type(budget).__name__}); expected None or Budget(epochs=...), Budget(steps=...), "
            "Budget(passes=...) or Budget(seconds=...)"
        ]
    out = budget.problems()
    if budget.unit in PER_ARM:
        for arm in study.arms:
            if isinstance(arm.space, Mapping) and is_searched(arm.dims.get("batch_size", Fixed(None))):
                out.append(
                    f"arm {arm.name!r}: field 'batch_size' is searched under budget=Budget({budget.unit}=...); fix it "
                    f"per arm (an arm's epochs under a {budget.unit} budget need its steps per epoch)"
                )
    return out


def _report_problems(study: Study, where: str) -> List[str]:
    """Problems with ``reports`` (:func:`flatlab.reports.declared.resolve_reports`), one per line."""
    try:
        resolve_reports(study.reports, f"{where}: reports")
    except ConfigError as exc:
        return str(exc).splitlines()
    return []


def _arm_problems(study: Study, arm: Arm, where: str, workload_ok: bool) -> List[str]:
    """Problems of one arm: its optimizer is registered; each field of its space is declared by the
    optimizer, the trainer or the workload, is not a data field, and has a dimension within the
    declaration; its conditions hold; a grid enumerates; the optimizer accepts a representative setting."""
    aw = f"{where}, arm {arm.name!r}"
    if not isinstance(arm.optimizer, str):
        return [
            f"{aw}: field 'optimizer'={arm.optimizer!r}; expected a registered optimizer name "
            "(`flatlab optimizers` lists them)"
        ]
    try:
        get_optimizer(arm.optimizer)
    except UnknownNameError as exc:
        # the fields cannot be checked against an unknown optimizer, but each dimension's own
        # problems (a log range with low <= 0, an empty choice ...) are still reported now
        own = [f"{aw}, field {key!r}: {msg}" for key, dim in arm.dims.items() if (msg := dim.problem())]
        return [f"{aw}: field 'optimizer': {exc}"] + own
    if not workload_ok:
        return []
    routes = route(study, arm)
    errors = _field_problems(study, arm, aw, routes)
    errors.extend(f"{aw}, field {key!r}: {msg}" for key, msg in condition_problems(arm.dims))
    if study.searcher == "grid" and not errors:
        try:
            grid_points(arm.dims, aw)
        except ConfigError as exc:
            errors.append(str(exc))
    if not errors:
        errors += _probe_optimizer(arm, aw, routes)
    return errors


def _field_problems(study: Study, arm: Arm, aw: str, routes: Mapping[str, str]) -> List[str]:
    """Each field of ``arm``'s space: not reserved, declared somewhere, not one of the workload's data
    fields (the data is loaded once per study), and a dimension its declaration accepts."""
    errors: List[str] = []
    accepted = declared(study, arm)
    data_fields = get_workload(study.workload).data_hparams
    for key, dim in arm.dims.items():
        if key in ("arm", "seed"):
            errors.append(f"{aw}: field {key!r} is reserved; set trial seeds with Study(seeds=...)")
            continue
        hp = accepted.get(key)
        if hp is None:
            errors.append(
                f"{aw}: field {key!r}{did_you_mean(key, accepted)} is not accepted by optimizer {arm.optimizer!r}, "
                f"the trainer or workload {study.workload!r}; accepted: {', '.join(sorted(accepted))}"
            )
            continue
        if routes[key] == "workload" and key in data_fields:
            errors.append(
                f"{aw}: field {key!r} changes workload {study.workload!r}'s data, which is loaded once per study; "
                f"set it in Study(workload_params=...) (one study per value)"
            )
            continue
        try:
            dim.check(hp, f"{aw}, field {key!r}")
        except ConfigError as exc:
            errors.append(str(exc))
    return errors


def _probe_optimizer(arm: Arm, where: str, routes: Mapping[str, str]) -> List[str]:
    """Build ``arm``'s optimizer once, on a one-element dummy parameter, with its fixed values and a
    representative value of every searched dimension (:meth:`Dim.representative`). A combination the
    optimizer rejects as a whole (``nesterov=True`` with ``momentum=0``) is then reported now, naming
    the arm, instead of failing every trial."""
    for config in representatives(arm.dims):  # one per branch of the conditional fields
        values = {
            k: v
            for k, v in config.items()  # a chained value (best_of) is known only at launch
            if routes.get(k) == "optimizer" and not isinstance(inner(arm.dims.get(k)), BestOf)
        }
        try:
            get_optimizer(arm.optimizer).create([torch.zeros(1, requires_grad=True)], **values)
        except (ConfigError, ValueError) as exc:
            return [f"{where}: optimizer {arm.optimizer!r} rejects these settings: {exc}"]
    return []


def _scalar_problems(study: Study) -> List[str]:
    """The problems of ``study``'s counts, seeds and resources (each message names its field and the
    allowed range). Bounds: counts <= :data:`MAX_COUNT`; trial seeds in [0, 2**32); the study seed such
    that every sampler seed ``seed * 1000 + arm index`` (study/searchers.py) stays below 2**32."""
    out: List[str] = []
    for name, low, nullable in (
        ("num_trials", 1, False),
        ("tunings", 1, False),
        ("max_epochs", 1, False),
        ("reduction_factor", 2, False),
        ("max_concurrent", 1, True),
        ("checkpoint_every", 1, True),
    ):
        value = getattr(study, name)
        if not (nullable and value is None) and not (_is_int(value) and low <= value <= MAX_COUNT):
            out.append(f"{name}={value!r}; expected {'None or ' if nullable else ''}an int in [{low}, {MAX_COUNT}]")
    out += _seed_problems(study)
    res = study.resources
    if not isinstance(res, Resources):
        out.append(
            f"resources={res!r} ({type(res).__name__}); expected Resources(cpu=..., gpu=...), "
            "e.g. Resources(cpu=2, gpu=0.5)"
        )
    else:
        out += _resource_problems(res)
    return out


def _seed_problems(study: Study) -> List[str]:
    """Trial seeds distinct and in [0, 2**32), apart between tunings; the study seed small enough that
    every arm's sampler seed stays below 2**32."""
    out: List[str] = []
    seeds = study.seeds
    if not (isinstance(seeds, tuple) and seeds and all(_is_int(s) and 0 <= s < SEED_LIMIT for s in seeds)):
        out.append(f"seeds={seeds!r}; expected a non-empty tuple of ints in [0, 2**32), e.g. seeds=(0, 1, 2)")
    elif len(set(seeds)) != len(seeds):
        out.append(f"seeds={seeds!r} repeats a seed (the same trials would run twice)")
    elif _is_int(study.tunings) and 1 < study.tunings <= MAX_COUNT:
        finals = study.final_seeds if isinstance(study.final_seeds, tuple) else ()
        shared = overlapping_seeds(set(seeds) | {s for s in finals if _is_int(s)}, study.tunings)
        if shared:
            out.append(
                f"tunings={study.tunings} with seeds={seeds!r} and final_seeds={finals!r}: tuning k shifts every "
                f"seed by (k - 1) * 1000000, so tunings would share seeds {shared[:5]}; keep seeds below 1000000"
            )
    n_arms = len(study.arms) if isinstance(study.arms, tuple) else 1
    max_seed = (SEED_LIMIT - max(n_arms, 1)) // SAMPLER_SEED_STRIDE
    if not (_is_int(study.seed) and 0 <= study.seed <= max_seed):
        out.append(
            f"seed={study.seed!r}; expected an int in [0, {max_seed}] (arm i's sampler is seeded with "
            f"seed * {SAMPLER_SEED_STRIDE} + i, which must stay below 2**32)"
        )
    return out


def _resource_problems(res: Resources) -> List[str]:
    """CPUs and GPUs per worker within bounds (a GPU fraction only up to 1), the flags booleans, and
    whole GPUs per worker when a trial has several workers."""
    out: List[str] = []
    cpu_ok = _is_number(res.cpu) and 0 < res.cpu <= MAX_RESOURCE
    gpu_ok = _is_number(res.gpu) and 0 <= res.gpu <= MAX_RESOURCE and (res.gpu <= 1 or float(res.gpu).is_integer())
    if not (cpu_ok and gpu_ok):
        out.append(
            f"resources=Resources(cpu={res.cpu!r}, gpu={res.gpu!r}); expected cpu in (0, {MAX_RESOURCE}] and gpu in "
            f"[0, {MAX_RESOURCE}], a fraction only up to 1 (Ray shares a GPU, it does not split several)"
        )
    if not isinstance(getattr(res, "cpu_fallback", False), bool):
        out.append(f"resources=Resources(cpu_fallback={res.cpu_fallback!r}); expected True or False")
    if not isinstance(getattr(res, "flush_denormal", True), bool):
        out.append(
            f"resources=Resources(flush_denormal={res.flush_denormal!r}); expected True (subnormal floats "
            "read and written as 0 on the trial's CPU threads) or False (IEEE subnormals kept)"
        )
    workers = getattr(res, "workers", 1)
    if not (_is_int(workers) and 1 <= workers <= MAX_RESOURCE):
        out.append(
            f"resources=Resources(workers={workers!r}); expected an int in [1, {MAX_RESOURCE}] "
            "(data-parallel workers per trial)"
        )
    elif workers > 1 and gpu_ok and not float(res.gpu).is_integer():
        out.append(
            f"resources=Resources(workers={workers}, gpu={res.gpu!r}); with workers > 1 each worker (DDP rank) needs "
            f"whole GPUs: expected gpu = 0 (CPU, gloo) or an integer >= 1"
        )
    return out


def _is_name(x: Any) -> bool:
    return isinstance(x, str) and bool(_NAME.match(x))


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _margin_problems(study: Study, where: str) -> List[str]:
    """``margins`` maps quantity names (text) to positive finite numbers."""
    margins = study.margins
    if not isinstance(margins, Mapping):
        return [f"{where}: margins={margins!r}; expected a dict of quantity -> margin, e.g. {{'test/accuracy': 0.005}}"]
    bad = []
    for q, m in margins.items():
        ok = isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m) and m > 0
        if not isinstance(q, str) or not q or not ok:
            bad.append(f"{where}: margins[{q!r}]={m!r}; expected a quantity name mapped to a positive number")
    return bad
