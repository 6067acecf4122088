"""A study's budget per trial in epochs, optimizer steps, passes or seconds, and its arithmetic per arm.

``Study(budget=Budget(passes=P))`` gives every trial of every arm P passes (gradient evaluations over
mini-batches, as each optimizer declares them: :func:`flatlab.optim.protocol.passes_of`), so an arm
whose steps cost two passes (SAM) trains about half the epochs of one whose steps cost one (SGD): the
comparison at equal compute that the SAM critiques and AlgoPerf ask for. ``Budget(seconds=S)`` gives
each trial S seconds of training (evaluation and measures not counted); ``Budget(steps=N)`` gives every
trial N optimizer steps whatever they cost (equal steps: the IRE paper's language-model budgets, "100k
steps"); ``Budget(epochs=E)`` is the default, ``max_epochs = E``.

How a pass budget is run: before any trial starts, the launch converts it into each arm's epochs
(:func:`arm_budget`: the most steps whose declared passes fit in P, from the arm's optimizer built with
its fixed values and a representative of each searched one, and the workload's steps per epoch), kept
in :attr:`Budget.arm_epochs`. The existing machinery then sees per-arm epochs: each arm's ASHA rungs
(:func:`arm_grace_period`: at the same fraction of every arm's budget, so at about the same passes),
the dry run and the final stage. Each trial's trainer counts its own steps from its own optimizer
(:class:`flatlab.train.trainer.TrialSpec` ``max_passes``), stops at the step that spends the budget
(within one step's passes of it) and spans its LR schedule over those steps. A searched field that
changes the cost of a step (TSAM's ``s``, IRE's ``mask_interval``) still gives each trial its own
steps, but the arm's rungs follow its representative configuration: fix such fields under a pass budget.

A step budget is run by the same machinery, as a pass budget whose every step costs one (:data:`PER_ARM`
units, :meth:`Budget.step_cost`): each arm's epochs are ``ceil(N / steps per epoch)`` (arms differ only by
their batch sizes), its rungs sit at the same fraction of them, and each trial runs exactly N steps
(:class:`flatlab.train.trainer.TrialSpec` ``max_steps``) with its LR schedule, warm-up included, over them.

A seconds budget stops a trial at the first epoch boundary at or past S training seconds; its LR
schedule and ASHA's rungs stay in epochs (``max_epochs``, which also bounds it), as seconds are not
known ahead.

This module is configuration and arithmetic only (no torch, Ray or study imports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional

from flatlab.train.compute import steps_within

UNITS = ("epochs", "steps", "passes", "seconds")
#: the units whose epochs differ per arm and are set at launch (:attr:`Budget.arm_epochs`)
PER_ARM = ("steps", "passes")
MAX_PASSES = 10**12


@dataclass(frozen=True)
class Budget:
    """What each trial may spend: exactly one of ``epochs``, ``steps``, ``passes`` or ``seconds``.

    Attributes:
        epochs: epochs per trial (int >= 1), the same for every arm (``Study.max_epochs``).
        steps: optimizer steps per trial (int >= 1), the same for every arm whatever a step costs.
        passes: passes per trial (int >= 1): gradient evaluations over mini-batches, as each optimizer
            declares them (SAM 2 per step, TSAM 2s, IRE +1 backward per mask refresh).
        seconds: training seconds per trial (> 0), checked at epoch boundaries.
        arm_epochs: arm name -> epochs under a step or pass budget, filled in at launch (:func:`arm_budget`);
            empty in a study file.
    """

    epochs: Optional[int] = None
    steps: Optional[int] = None
    passes: Optional[int] = None
    seconds: Optional[float] = None
    arm_epochs: Mapping[str, int] = field(default_factory=dict)

    @property
    def unit(self) -> str:
        """``'epochs'``, ``'steps'``, ``'passes'`` or ``'seconds'``: the one that is set (``'epochs'`` when none
        is)."""
        for unit in ("steps", "passes", "seconds"):
            if getattr(self, unit) is not None:
                return unit
        return "epochs"

    @property
    def amount(self) -> Optional[float]:
        """The value of :attr:`unit`."""
        return getattr(self, self.unit)

    def step_cost(self, passes: Callable[[int], int]) -> Callable[[int], int]:
        """What step i (0-based) takes from this budget, given ``passes(i)``, the backward passes an arm's
        optimizer declares for it: those passes under a pass budget, 1 under a step budget."""
        return (lambda i: 1) if self.unit == "steps" else passes

    def problems(self) -> List[str]:
        """What is wrong with this budget, one line each naming the field and the allowed values."""
        given = [u for u in UNITS if getattr(self, u) is not None]
        if len(given) != 1:
            return [
                f"budget=Budget({', '.join(f'{u}={getattr(self, u)!r}' for u in given) or ''}): set exactly one of "
                f"{', '.join(UNITS)}, e.g. Budget(passes=100000)"
            ]
        value = getattr(self, given[0])
        if given[0] == "seconds":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
            return [] if ok else [f"budget=Budget(seconds={value!r}); expected a finite number of seconds > 0"]
        if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PASSES):
            return [f"budget=Budget({given[0]}={value!r}); expected an int in [1, {MAX_PASSES}]"]
        return []

    def describe(self) -> str:
        """One line for the dry run and the launch record, e.g. ``'100000 passes per trial'``."""
        return f"{self.amount:g} {self.unit} per trial"


def budget_record(budget: Optional[Budget], max_epochs: int) -> Dict[str, Any]:
    """What the launch record (launch.json ``budget``) says of a study's budget: its ``unit``
    (``epochs``, ``steps``, ``passes`` or ``seconds``), the ``amount`` per trial and, under a step or pass
    budget, each arm's epochs (``arm_epochs``)."""
    if budget is None or budget.unit == "epochs":
        return {"unit": "epochs", "amount": max_epochs}
    out: Dict[str, Any] = {"unit": budget.unit, "amount": budget.amount}
    if budget.arm_epochs:
        out["arm_epochs"] = dict(budget.arm_epochs)
    return out


@dataclass(frozen=True)
class ArmBudget:
    """One arm's share of a pass (or step) budget.

    Attributes:
        steps: the most optimizer steps whose declared passes fit in the budget (a step budget: its steps).
        epochs: epochs those steps take (the last one possibly part-way), ``ceil(steps / steps_per_epoch)``.
        steps_per_epoch: mini-batches per epoch, ``ceil(training rows / batch_size)``.
        first_step_passes: the backward passes of the arm's first step (its cost per step, IRE's
            refresh included).
    """

    steps: int
    epochs: int
    steps_per_epoch: int
    first_step_passes: int


def arm_budget(
    passes: int, cost: Callable[[int], int], rows: int, batch_size: int, step_passes: Optional[int] = None
) -> ArmBudget:
    """An arm's steps and epochs under ``passes`` (:func:`flatlab.train.compute.steps_within`).

    Args:
        passes: the budget per trial (under a step budget, its steps).
        cost: what step i (0-based) of the arm's optimizer takes from the budget (:meth:`Budget.step_cost`).
        rows: training examples per epoch; ``batch_size``: rows per mini-batch.
        step_passes: the backward passes of the arm's first step, if not ``cost(0)`` (a step budget).
    Raises:
        ValueError: the budget does not cover the arm's first step.
    """
    steps = steps_within(passes, cost)
    if steps == 0:
        raise ValueError(f"budget=Budget(passes={passes}) does not cover one step ({cost(0)} passes)")
    per_epoch = math.ceil(rows / batch_size)
    return ArmBudget(steps, math.ceil(steps / per_epoch), per_epoch, cost(0) if step_passes is None else step_passes)


def arm_grace_period(grace_period: int, arm_epochs: int, top_epochs: int) -> int:
    """ASHA's first rung for an arm with ``arm_epochs`` epochs when the study's ``grace_period`` counts
    epochs of its arm with the most (``top_epochs``, the cheapest per step, or the smallest batch under a
    step budget): the same fraction of the arm's budget, so every arm's first rung falls at about the same
    passes (steps); at least 1 and at most
    ``arm_epochs``."""
    return max(1, min(arm_epochs, round(grace_period * arm_epochs / max(1, top_epochs))))
