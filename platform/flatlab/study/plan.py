"""The trial plan of a study (``flatlab run --dry-run``): arms, spaces, budget, resources."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from flatlab.analysis.console_table import make_table, print_table
from flatlab.errors import FlatlabError
from flatlab.study.budget import PER_ARM, ArmBudget, budget_record
from flatlab.study.space import Conditional, Fixed, inner
from flatlab.study.spec import Study
from flatlab.study.trial_spec import arm_budgets, route
from flatlab.study.tunings import tuning_seeds
from flatlab.train.config import loss_target
from flatlab.workloads.registry import build_workload


def plan(study: Study, rows: Optional[int] = None) -> Dict[str, Any]:
    """A JSON-able description of what ``flatlab run`` would launch (nothing is started).

    ``budget`` is the study's (:func:`~flatlab.study.budget.budget_record`); under a pass or step budget
    with ``rows`` (training examples) known, each arm's ``budget`` holds its ``steps``, ``epochs`` and
    ``passes_per_step`` from its optimizer's declared cost (:func:`~flatlab.study.trial_spec.arm_budgets`).

    Raises:
        ConfigError: the pass budget does not cover an arm's first step.
    """
    per_arm = arm_budgets(study, rows) if rows is not None else {}
    arms = _arm_plans(study, per_arm)
    max_epochs = max(b.epochs for b in per_arm.values()) if per_arm else study.max_epochs  # as the launch sets it
    return {
        "study": study.name,
        "workload": study.workload,
        "workload_params": dict(study.workload_params),
        "train": dict(study.train),
        "metric": study.metric,
        "mode": study.mode,
        "searcher": study.searcher,
        "scheduler": study.scheduler
        + (
            f" (grace_period={study.grace_period}, reduction_factor={study.reduction_factor})"
            if study.scheduler == "asha"
            else ""
        ),
        "max_epochs": max_epochs,
        "budget": budget_record(study.budget, study.max_epochs),
        "seeds": list(study.seeds),
        "tunings": study.tunings,
        "total_trials": study.num_total_trials(),
        "max_trial_epochs": study.num_total_trials() * max_epochs,
        "resources_per_trial": (
            study.resources.as_dict()
            if study.resources.workers == 1
            else {"workers": study.resources.workers, "per_worker": study.resources.worker_dict()}
        ),
        "max_concurrent": study.max_concurrent,
        "steps_to_target": (
            f"reference arm {study.reference_arm!r}"
            if study.reference_arm is not None
            else f"target loss {study.target_loss}"
            if study.target_loss is not None
            else None
        ),
        "measures": {k: dict(v) for k, v in study.measures.items()},
        "measure_subset": {
            "split": study.measure_split,
            "extra_splits": list(study.measure_extra_splits),
            "every": study.measure_every,
            "examples": study.measure_examples,
            "seed": study.measure_seed,
        },
        "final_seeds": list(study.final_seeds),
        "published": study.published.as_dict() if study.published is not None else None,
        "reports": {k: dict(v) for k, v in study.reports.items()},
        "arms": arms,
    }


def _arm_plans(study: Study, per_arm: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each arm's part of the plan: trials, searched and fixed values, routes and (under a pass or step
    budget) its epochs."""
    arms: List[Dict[str, Any]] = []
    for arm in study.arms:
        n = (len(study.grid(arm)) if study.searcher == "grid" else study.num_trials) * study.tunings
        arms.append(
            {
                "arm": arm.name,
                "optimizer": arm.optimizer,
                "trials": n,
                "searched": {k: d.describe() for k, d in arm.searched().items()},  # with "if <condition>"
                "conditions": {k: d.condition_text() for k, d in arm.dims.items() if isinstance(d, Conditional)},
                "fixed": arm.constants(),
                "routes": route(study, arm),
                **({"budget": _arm_budget(per_arm[arm.name])} if arm.name in per_arm else {}),
            }
        )
    return arms


def _arm_budget(b: ArmBudget) -> Dict[str, int]:
    """An arm's share of a pass or step budget as the plan shows it."""
    return {"steps": b.steps, "epochs": b.epochs, "passes_per_step": b.first_step_passes}


def tunings_line(study: Study) -> str:
    """The dry run's line on independent tunings: how many, the trials each arm gets in each, and the
    seeds of tuning 2 (:mod:`flatlab.study.tunings`)."""
    per = "its grid" if study.searcher == "grid" else f"{study.num_trials} trials"
    return (
        f"{study.tunings} independent tunings per arm: each arm gets {per} in every tuning, with its own Optuna "
        f"study, ASHA rungs, best configuration and seeds (tuning 2: seeds {list(tuning_seeds(study.seeds, 2))}"
        + (f", final seeds {list(tuning_seeds(study.final_seeds, 2))}" if study.final_seeds else "")
        + ")"
    )


def flatness_when(study: Study) -> str:
    """Which models of a completed trial the study's measures run on, and under which names, as
    ``--dry-run`` prints it: the final model (``flat/<measure>``); with the trainer's
    ``stop_at_train_loss`` that is the model at the target where the trial reached it, else after
    ``max_epochs``; with ``measure_at_train_loss`` also the model at the target
    (``flat_at_target/<measure>``)."""
    target = loss_target(study.train)
    end = f"after epoch {study.max_epochs}"
    if target is None:
        return f"flatness of each completed trial's final model, {end} (flat/<measure>)"
    at = f"the first epoch whose mean training loss is <= {target:g}"
    if study.train.get("measure_at_train_loss") is not None:
        return (
            f"flatness of each completed trial at {at} (flat_at_target/<measure>, if reached) and {end} "
            "(flat/<measure>)"
        )
    return f"flatness of each completed trial's final model (flat/<measure>): at {at} (stop_at_train_loss), else {end}"


def training_rows(study: Study) -> Optional[int]:
    """The training examples of ``study``'s workload, for the dry run of a pass or step budget (its data is
    loaded for that); ``None`` without one or when the data cannot be loaded."""
    if study.budget is None or study.budget.unit not in PER_ARM:
        return None
    try:
        return len(build_workload(study.workload, **dict(study.workload_params)).load_data(study.seed).train)
    except (FlatlabError, OSError):
        return None


def budget_line(study: Study, p: Mapping[str, Any]) -> Optional[str]:
    """The dry run's line on a budget in steps, passes or seconds (``None`` for epochs): each arm's epochs
    and steps under a pass or step budget, from its declared passes per step."""
    budget = p["budget"]
    if budget["unit"] == "epochs":
        return None
    if budget["unit"] == "seconds":
        return (
            f"budget in seconds: {budget['amount']:g} training seconds per trial, ending at the first epoch boundary "
            f"past them (at most {study.max_epochs} epochs, which the LR schedule and ASHA's rungs span)"
        )
    arms = [a for a in p["arms"] if "budget" in a]
    unit = budget["unit"]
    if not arms:
        return f"budget in {unit}: {budget['amount']} per trial (each arm's epochs: the workload's data is missing)"
    each = ", ".join(
        f"{a['arm']} {a['budget']['epochs']} epochs ({a['budget']['steps']} steps x {a['budget']['passes_per_step']} "
        "passes)"
        for a in arms
    )
    return f"budget in {unit}: {budget['amount']} per trial, the LR schedule over each arm's own: {each}"


def render(study: Study, console: Any) -> None:
    """Print :func:`plan` as a rich table to ``console`` (no cell split: :mod:`flatlab.analysis.console_table`);
    a pass or step budget's arms with their epochs (:func:`training_rows` loads the data to count them)."""
    p = plan(study, training_rows(study))
    params = f" {p['workload_params']}" if p["workload_params"] else ""
    console.print(
        f"[bold]{p['study']}[/bold]: workload {p['workload']}{params}, metric {p['metric']} ({p['mode']}), "
        f"searcher {p['searcher']}, scheduler {p['scheduler']}"
    )
    console.print(
        f"budget: {p['total_trials']} trials x up to {p['max_epochs']} epochs (<= {p['max_trial_epochs']} "
        f"trial-epochs), seeds {p['seeds']}, per trial {p['resources_per_trial']}, "
        f"max_concurrent {p['max_concurrent'] or 'as resources allow'}"
    )
    if budget_line(study, p):
        console.print(budget_line(study, p))
    if p["tunings"] > 1:
        console.print(tunings_line(study))
    if p["train"]:
        console.print(f"trainer: {p['train']}")
    if p["measures"]:
        sub = p["measure_subset"]
        console.print(
            f"{flatness_when(study)}: {', '.join(f'{k} {v}' if v else k for k, v in p['measures'].items())}"
            + (
                f" on {sub['examples']} {sub['split']} examples "
                f"(all of them if the split is smaller; seed {sub['seed']})"
                if sub["examples"]
                else f" on all {sub['split']} examples"
            )
            + "".join(f"; again on {x} (flat_{x}/<measure>)" for x in sub["extra_splits"])
            + (f"; and every {sub['every']} epochs (flat_curve/<measure>, step = epoch)" if sub["every"] else "")
        )
    if p["final_seeds"]:
        each = "each arm's best configuration in each tuning" if p["tunings"] > 1 else "each arm's best configuration"
        console.print(f"then {each} (by {p['metric']}) over final seeds {p['final_seeds']}, no early stopping")
    if p["steps_to_target"]:
        console.print(f"after the study: train/steps_to_target against the {p['steps_to_target']}")
    if p["published"]:
        pairs = ", ".join(f"{a} -> {c}" for a, c in p["published"]["arms"].items())
        console.print(f"published reference (`flatlab curves {p['study']}`): {p['published']['path']} ({pairs})")
    if p["reports"]:
        console.print(f"after the study, reports: {', '.join(f'{k} {v}' if v else k for k, v in p['reports'].items())}")
    rows = []
    for arm, a in zip(study.arms, p["arms"]):
        dims = arm.dims
        rows.append(
            (
                a["arm"],
                a["optimizer"],
                str(a["trials"]),
                # a conditional constant reads "k = v if <condition>", a searched field "k ~ dimension [if ...]"
                "\n".join(
                    f"{k} {'=' if isinstance(inner(dims[k]), Fixed) else '~'} {v}" for k, v in a["searched"].items()
                )
                or "-",
                "\n".join(f"{k} = {v!r}" for k, v in a["fixed"].items()) or "-",
            )
        )
    print_table(console, make_table(("arm", "optimizer", "trials", "searched", "fixed"), rows))
