"""Early stopping within each arm only: one Tune scheduler per optimizer arm behind one router.

One ``ASHAScheduler`` holds one set of rungs, so every trial it sees is compared with every other: in a
study with several optimizer arms a slow-starting arm (SAM, TSAM, IRE before switch-on) is pruned
against a fast-starting one (AdamW) and loses by construction. Each arm is therefore tuned blind to the
others, its early stopping included (``docs/comparing.md``, "The answer a study gives").

:class:`ArmScheduler` routes each trial, by its config's ``arm`` and ``tuning`` (its lane,
:mod:`flatlab.study.tunings`), to that lane's own scheduler (built by a factory, so any scheduler added
later follows the same rule). A trial is therefore only ever compared with trials of its own arm and
tuning, and each lane's stopping decisions are exactly those its scheduler would make on that lane alone,
given the same sequence of results.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, FrozenSet, List, Optional

from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from flatlab.study.ray_compat import asha_rung_count
from flatlab.study.spec import Study
from flatlab.study.tunings import lane_of, split_lane, study_lanes


class ArmScheduler(FIFOScheduler):
    """A Tune ``TrialScheduler`` that gives every arm its own scheduler (see module docstring).

    Args:
        arms: the lanes (arm names, ``<arm>@<k>`` for tuning k >= 2), in study order.
        factory: builds one fresh scheduler for a lane (called once per lane, with its name).
        metric, mode: the study metric; passed to every arm's scheduler.

    Trials are chosen to run in the order Tune created them (the searcher already interleaves arms with
    equal budgets), whatever their arm. A trial whose config has no known ``arm`` raises ``KeyError``.

    A resumed launch sets :attr:`recorded` (:meth:`flatlab.study.recovery.LaunchRecords.on_add`): a trial
    Tune adds whose run already ended (it finished after Tune's last save, before the driver was
    killed) gets that recorded result (with its config, as Tune's own results have it) and is stopped
    before it starts, never trained again; a trial Tune restored as TERMINATED keeps the result Tune saved.
    """

    def __init__(self, arms, factory: Callable[[str], TrialScheduler], metric: str, mode: str) -> None:
        super().__init__()
        self._metric, self._mode = metric, mode
        self.arms: Dict[str, TrialScheduler] = {}
        for arm in arms:
            sub = factory(arm)
            sub.set_search_properties(metric, mode)
            self.arms[arm] = sub
        self.recorded: Optional[Callable[[str, Dict], Optional[Dict]]] = None  # trial id, config -> result
        self._ended: List[Trial] = []

    def __getstate__(self) -> Dict:
        # Tune pickles the scheduler with its experiment: not the resume's live hooks
        return {k: v for k, v in self.__dict__.items() if k not in ("recorded", "_ended")}

    def __setstate__(self, state: Dict) -> None:
        self.__dict__.update(state)
        self.recorded, self._ended = None, []

    def _of(self, trial: Trial) -> TrialScheduler:
        arm = lane_of(trial.config or {})
        if arm not in self.arms:
            raise KeyError(f"trial {trial.trial_id}: config arm={arm!r} is not one of {', '.join(self.arms)}")
        return self.arms[arm]

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], **spec) -> bool:
        return True  # metric and mode come from the study, set at construction

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        self._of(trial).on_trial_add(tune_controller, trial)
        config = dict(trial.config or {})
        result = self.recorded(trial.trial_id, config) if self.recorded is not None else None
        if result is not None and trial.status != Trial.TERMINATED:  # ended before the kill, after Tune's save
            # Tune's result carries the config (``Result.config``: what the final stage picks from)
            trial.update_last_result({**result, "config": config})
            self._ended.append(trial)  # stopped at the next scheduling step

    def choose_trial_to_run(self, tune_controller) -> Optional[Trial]:
        while self._ended:  # before Tune starts actors for pending trials
            trial = self._ended.pop()
            if trial.status == Trial.PENDING:
                trial.init_local_path()  # a trial never started has no folder yet; Tune's results need one
                tune_controller.stop_trial(trial)
        return super().choose_trial_to_run(tune_controller)

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


def build_scheduler(study: Study, fifo: bool = False) -> ArmScheduler:
    """The study's scheduler, an :class:`ArmScheduler`: ``asha`` -> one
    :class:`~ray.tune.schedulers.ASHAScheduler` per arm (rungs at ``grace_period * reduction_factor**k``
    epochs, up to ``max_epochs``; under a pass budget each arm's own,
    :meth:`~flatlab.study.spec.Study.epochs_of` and :meth:`~flatlab.study.spec.Study.grace_of`); ``fifo``
    (or ``fifo=True``, the final stage) -> Tune's FIFO per arm: every trial runs its whole budget."""
    if study.scheduler != "asha" or fifo:
        return ArmScheduler(study_lanes(study), lambda _arm: FIFOScheduler(), metric=study.metric, mode=study.mode)

    def asha(lane: str) -> TrialScheduler:
        arm = split_lane(lane)[0]
        return ASHAScheduler(
            time_attr="training_iteration",
            max_t=study.epochs_of(arm),
            grace_period=study.grace_of(arm),
            reduction_factor=study.reduction_factor,
        )

    return ArmScheduler(study_lanes(study), asha, metric=study.metric, mode=study.mode)


def decision_epochs(study: Study) -> FrozenSet[int]:
    """The epochs (1-based reports, Tune's ``training_iteration``) at which :func:`build_scheduler`'s
    scheduler can stop a trial of ``study``: ASHA's rungs ``grace_period * reduction_factor**k`` below
    ``max_epochs`` (Li et al. 2020, "A System for Massively Parallel Hyperparameter Tuning", Algorithm 2;
    the same rungs as Ray's ``ASHAScheduler`` with one bracket), rounded up to whole epochs; empty for
    ``fifo``. A trial's batched reports end at these epochs (:func:`flatlab.study.trainable.make_trainable`),
    so every decision is made on time. Under a pass budget, the rungs of every arm together."""
    if study.scheduler != "asha":
        return frozenset()

    rf = study.reduction_factor
    out = set()
    for arm in {a.name for a in study.arms}:
        grace = study.grace_of(arm)
        rungs = asha_rung_count(study.epochs_of(arm), grace, rf)
        out.update(int(math.ceil(grace * rf**k)) for k in range(rungs))
    return frozenset(out)
