"""Early stopping within each arm only: one Tune scheduler per optimizer arm behind one router.

One ``ASHAScheduler`` holds one set of rungs, so every trial it sees is compared with every other: in a
study with several optimizer arms a slow-starting arm (SAM, TSAM, IRE before switch-on) is pruned
against a fast-starting one (AdamW) and loses by construction. ``ALGORITHMS.md`` section 5 (and the
benchmarks it cites) asks that each arm's early stopping be blind to the other arms.

:class:`ArmScheduler` routes each trial, by its config's ``arm``, to that arm's own scheduler (built by
a factory, so any scheduler added later follows the same rule). A trial is therefore only ever compared
with trials of its own arm, and each arm's stopping decisions are exactly those its scheduler would make
on that arm alone, given the same sequence of results.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, FrozenSet, Optional

import numpy as np
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from flatlab.study.spec import Study

ARM_KEY = "arm"


class ArmScheduler(FIFOScheduler):
    """A Tune ``TrialScheduler`` that gives every arm its own scheduler (see module docstring).

    Args:
        arms: the arm names, in study order.
        factory: builds one fresh scheduler for an arm (called once per arm, with the arm's name).
        metric, mode: the study metric; passed to every arm's scheduler.

    Trials are chosen to run in the order Tune created them (the searcher already interleaves arms with
    equal budgets), whatever their arm. A trial whose config has no known ``arm`` raises ``KeyError``.
    """

    def __init__(self, arms, factory: Callable[[str], TrialScheduler], metric: str, mode: str) -> None:
        super().__init__()
        self._metric, self._mode = metric, mode
        self.arms: Dict[str, TrialScheduler] = {}
        for arm in arms:
            sub = factory(arm)
            sub.set_search_properties(metric, mode)
            self.arms[arm] = sub

    def _of(self, trial: Trial) -> TrialScheduler:
        arm = (trial.config or {}).get(ARM_KEY)
        if arm not in self.arms:
            raise KeyError(f"trial {trial.trial_id}: config arm={arm!r} is not one of {', '.join(self.arms)}")
        return self.arms[arm]

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec) -> bool:
        return True  # metric and mode come from the study, set at construction

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        self._of(trial).on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        self._of(trial).on_trial_error(tune_controller, trial)

    def on_trial_result(self, tune_controller, trial: Trial, result: Dict) -> str:
        return self._of(trial).on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial: Trial, result: Dict) -> None:
        self._of(trial).on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        self._of(trial).on_trial_remove(tune_controller, trial)

    def debug_string(self) -> str:
        return "\n".join(f"arm {arm}: {sub.debug_string()}" for arm, sub in self.arms.items())


def build_scheduler(study: Study) -> Optional[TrialScheduler]:
    """The study's scheduler: ``asha`` -> one :class:`~ray.tune.schedulers.ASHAScheduler` per arm behind an
    :class:`ArmScheduler` (rungs at ``grace_period * reduction_factor**k`` epochs, up to ``max_epochs``);
    ``fifo`` -> ``None`` (Tune's FIFO: every trial runs its whole budget)."""
    if study.scheduler != "asha":
        return None

    def asha(_arm: str) -> TrialScheduler:
        return ASHAScheduler(
            time_attr="training_iteration",
            max_t=study.max_epochs,
            grace_period=study.grace_period,
            reduction_factor=study.reduction_factor,
        )

    return ArmScheduler([a.name for a in study.arms], asha, metric=study.metric, mode=study.mode)


def decision_epochs(study: Study) -> FrozenSet[int]:
    """The epochs (1-based reports, Tune's ``training_iteration``) at which :func:`build_scheduler`'s
    scheduler can stop a trial of ``study``: ASHA's rungs ``grace_period * reduction_factor**k`` below
    ``max_epochs`` (Li et al. 2020, "A System for Massively Parallel Hyperparameter Tuning", Algorithm 2;
    the same rungs as Ray's ``ASHAScheduler`` with one bracket), rounded up to whole epochs; empty for
    ``fifo``. A trial's batched reports end at these epochs (:func:`flatlab.study.trainable.make_trainable`),
    so every decision is made on time."""
    if study.scheduler != "asha":
        return frozenset()
    rf = study.reduction_factor
    rungs = int(np.log(study.max_epochs / study.grace_period) / np.log(rf) + 1)  # as Ray's _Bracket counts them
    return frozenset(int(math.ceil(study.grace_period * rf ** k)) for k in range(rungs))
