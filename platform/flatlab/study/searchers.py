"""One Tune searcher for all arms of a study, with an equal budget per arm.

:class:`ArmSearcher` hands out trials arm by arm (the arm with the fewest trials goes next), so a
single ``Tuner`` serves every optimizer arm and no worker idles at an arm's tail. For ``optuna`` and
``random`` it delegates to one ``OptunaSearch`` per arm (its own Optuna study, seeded, stored in
SQLite beside the study's outputs); for ``grid`` it enumerates the arm's grid x seeds in order.
Its state is pickled by Tune (``save``/``restore``), so ``--resume`` continues the same searches.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any, Dict, List, Optional

from ray.tune.search import Searcher

from flatlab.study.spec import Study

logger = logging.getLogger(__name__)


def _sampler(kind: str, seed: int):
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


class ArmSearcher(Searcher):
    """Tune searcher over the arms of ``study`` (see module docstring).

    Args:
        study: a validated study.
        optuna_storage: Optuna storage URL (e.g. ``sqlite:///.../optuna.db``); ``None`` keeps it in memory.
        launch: launch name; each arm's Optuna study is named ``<launch>.<arm>`` (a new launch starts
            fresh searches, ``--resume`` continues them).
    """

    def __init__(self, study: Study, optuna_storage: Optional[str] = None, launch: str = "") -> None:
        super().__init__(metric=study.metric, mode=study.mode)
        self._arms: List[str] = [a.name for a in study.arms]
        self._seeds = list(study.seeds)
        self._count: Dict[str, int] = {a: 0 for a in self._arms}
        self._trial_arm: Dict[str, str] = {}
        self._points: Dict[str, List[Dict[str, Any]]] = {}
        self._constants: Dict[str, Dict[str, Any]] = {}
        self._sub: Dict[str, Any] = {}
        if study.searcher == "grid":
            self._points = {a.name: study.grid(a) for a in study.arms}
            self._budget = {a: len(p) for a, p in self._points.items()}
            return
        from ray.tune.search.optuna import OptunaSearch

        self._budget = {a.name: study.num_trials for a in study.arms}
        for i, arm in enumerate(study.arms):
            self._constants[arm.name] = arm.constants()
            searched = arm.searched()
            if searched:
                self._sub[arm.name] = OptunaSearch(
                    space={k: d.to_optuna() for k, d in searched.items()},
                    metric=study.metric,
                    mode=study.mode,
                    sampler=_sampler(study.searcher, study.seed * 1000 + i),
                    study_name=f"{launch or study.name}.{arm.name}",
                    storage=_storage(optuna_storage),
                )

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: Dict, **spec: Any) -> bool:
        return True  # metric and mode come from the study

    def total_trials(self) -> int:
        return sum(self._budget.values())

    def suggest(self, trial_id: str) -> Optional[Dict[str, Any]]:
        open_arms = [a for a in self._arms if self._count[a] < self._budget[a]]
        if not open_arms:
            return Searcher.FINISHED
        arm = min(open_arms, key=lambda a: self._count[a])
        i = self._count[arm]
        if self._points:
            config = dict(self._points[arm][i])
        else:
            config = {"arm": arm, "seed": self._seeds[i % len(self._seeds)], **self._constants[arm]}
            sub = self._sub.get(arm)
            if sub is not None:
                params = sub.suggest(trial_id)
                if params is None:
                    return None
                config.update(params)
        self._count[arm] += 1
        self._trial_arm[trial_id] = arm
        return config

    def on_trial_result(self, trial_id: str, result: Dict) -> None:
        sub = self._sub.get(self._trial_arm.get(trial_id, ""))
        if sub is not None and self.metric in result:
            sub.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        sub = self._sub.get(self._trial_arm.get(trial_id, ""))
        if sub is not None:
            sub.on_trial_complete(trial_id, result=result, error=error)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))


def _storage(url: Optional[str]):
    if url is None:
        return None
    import optuna

    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
