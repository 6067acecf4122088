"""One Tune searcher for all arms of a study, with an equal budget per arm, that tells Optuna what happened.

:class:`ArmSearcher` hands out trials arm by arm (the arm with the fewest trials goes next), so a
single ``Tuner`` serves every optimizer arm and no worker idles at an arm's tail. For ``optuna`` and
``random`` it drives one seeded Optuna study per arm (``<launch>.<arm>``, in SQLite beside the study's
outputs) through ask/tell, define-by-run: a ``space.when`` field is suggested only when its condition
holds, so an inactive field is absent from the config, MLflow's params and the trainer's spec. For
``grid`` it enumerates the arm's active grid points x seeds.

Optuna is told the truth about each trial (Ray's ``OptunaSearch`` stores a scheduler-stopped trial as
COMPLETE with its partial value, so Optuna's best trial could be a pruned one):

* every epoch's value of the study metric is an intermediate value (step = epoch), written with the
  trial's outcome in one storage write per trial;
* a trial that ran its budget (or stopped at its training-loss target) is COMPLETE with its final
  value; one stopped by the scheduler is PRUNED; one that raised or diverged is FAIL;
* each Optuna trial carries ``tune_trial_id``, ``arm``, ``seed``, ``launch`` and, once it ends,
  ``mlflow_run_id`` (:attr:`ArmSearcher.run_id_of`); the Optuna study's metric name is the study's;
* after a driver was killed, a resume first takes over the trials asked for after Tune's last save, and
  a trial Optuna already holds as COMPLETE or PRUNED keeps that record (:mod:`flatlab.study.recovery`).

Its state (``save``/``restore``, read by ``--resume``) is JSON: counters and trial-number maps. The
searches themselves live in the Optuna storage, so nothing read back can execute code.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from typing import Any, Callable, Dict, List, Optional

import optuna
from ray.tune.search import Searcher

from flatlab.analysis.sample import TUNING_KEY
from flatlab.analysis.selection import trial_outcome
from flatlab.errors import ConfigError
from flatlab.study.space import Dim, inner, is_searched, sample
from flatlab.study.spec import Study
from flatlab.study.tunings import lanes, split_lane, tuning_seed, with_tuning

logger = logging.getLogger(__name__)

LAUNCH_ATTR = "launch"
"""User attribute of each Optuna trial: the Tune experiment (launch) that asked for it."""


def _sampler(kind: str, seed: int):
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def optuna_study_name(launch: str, arm: str) -> str:
    """Name of ``arm``'s Optuna study in a launch (``<launch>.<arm>``; ``arm`` a lane of
    :mod:`flatlab.study.tunings`, ``<arm>@<k>`` for tuning k >= 2)."""
    return f"{launch}.{arm}"


class ArmSearcher(Searcher):
    """Tune searcher over the arms of ``study`` (see module docstring).

    Args:
        study: a validated study.
        optuna_storage: Optuna storage URL (e.g. ``sqlite:///.../optuna.db``); ``None`` keeps it in memory.
        launch: launch name; each arm's Optuna study is named ``<launch>.<arm>`` (a new launch starts
            fresh searches, ``--resume`` continues them).
    """

    def __init__(
        self, study: Study, optuna_storage: Optional[str] = None, launch: str = "", experiment: str = ""
    ) -> None:
        super().__init__(metric=study.metric, mode=study.mode)
        self._experiment = experiment  # the Tune experiment (launch) this searcher asks for: a user attr of its trials
        self._orphans: Dict[str, List[Any]] = {}  # arm -> its launch's Optuna trials no Tune trial holds
        # the search's lanes: one per arm and tuning (flatlab.study.tunings), each with its own budget and study
        self._arms: List[str] = lanes([a.name for a in study.arms], study.tunings)
        self._arm_index = {a.name: i for i, a in enumerate(study.arms)}
        self._tunings = study.tunings
        self._seeds = list(study.seeds)
        self._count: Dict[str, int] = {a: 0 for a in self._arms}
        self._trial_arm: Dict[str, str] = {}
        self._points: Dict[str, List[Dict[str, Any]]] = {}
        self._storage_url = optuna_storage
        self._launch = launch or study.name
        # tune trial id -> [optuna storage trial id, optuna trial number, last reported step]
        self._optuna: Dict[str, List[int]] = {}
        # tune trial id -> [[epoch, value], ...]: intermediate values not yet written (with the outcome)
        self._pending: Dict[str, List[List[float]]] = {}
        self._spaces: Dict[str, Dict[str, Dim]] = {}
        self._studies: Dict[str, Any] = {}
        self._study_seed = study.seed
        self._kind = study.searcher
        self.run_id_of: Optional[Callable[[str], Optional[str]]] = None  # Tune trial id -> MLflow run id
        if study.searcher == "grid":
            self._points = {
                name: study.grid(study.arm(split_lane(name)[0]), split_lane(name)[1]) for name in self._arms
            }
            self._budget = {a: len(p) for a, p in self._points.items()}
            return
        self._budget = {name: study.num_trials for name in self._arms}
        for name in self._arms:
            self._spaces[name] = study.arm(split_lane(name)[0]).dims
        self._open_studies()

    def _open_studies(self) -> None:
        storage = _storage(self._storage_url)
        for arm in self._arms:
            if not any(is_searched(inner(d)) for d in self._spaces.get(arm, {}).values()):
                continue  # nothing searched: the arm's trials are its (conditional) constants
            name, tuning = split_lane(arm)
            seed = tuning_seed(self._study_seed * 1000 + self._arm_index.get(name, 0), tuning)
            st = optuna.create_study(
                study_name=optuna_study_name(self._launch, arm),
                storage=storage,
                sampler=_sampler(self._kind, seed),
                direction="maximize" if self.mode == "max" else "minimize",
                load_if_exists=True,
            )
            seen = len(st.get_trials(deepcopy=False))
            if seen:  # --resume or --continue: a sampler seeded as before would re-draw the same random points
                st.sampler = _sampler(self._kind, (seed + seen) % 2**32)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                st.set_metric_names([self.metric])
            self._studies[arm] = st
        self._find_orphans()

    def _find_orphans(self) -> None:
        """The trials this launch asked Optuna for that no Tune trial of the (restored) experiment holds:
        asked after Tune's last save, before the driver was killed. The next suggestions of their arm
        take them over, in order, instead of asking for new ones, so each arm keeps ``num_trials``. A trial
        still RUNNING without the launch attribute is one too: the driver was killed between ``ask()`` and
        the writes of its attributes (only a killed driver leaves a trial RUNNING)."""
        self._orphans = {}
        if not self._experiment:
            return
        held = {record[0] for record in self._optuna.values()}
        for arm, st in self._studies.items():
            mine = [
                t
                for t in st.get_trials(deepcopy=False)
                if t._trial_id not in held
                and (
                    t.user_attrs.get(LAUNCH_ATTR) == self._experiment
                    or (LAUNCH_ATTR not in t.user_attrs and t.state == optuna.trial.TrialState.RUNNING)
                )
            ]
            self._orphans[arm] = sorted(mine, key=lambda t: t.number)

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
            name, tuning = split_lane(arm)
            seed = tuning_seed(self._seeds[i % len(self._seeds)], tuning)
            config = with_tuning({"arm": name, "seed": seed}, tuning, self._tunings)
            st = self._studies.get(arm)
            trial = None
            if st is not None and self._orphans.get(arm):  # asked before the driver was killed: take it over
                frozen = self._orphans[arm].pop(0)
                trial = optuna.trial.Trial(st, frozen._trial_id)  # its params come back as they were drawn
                config["seed"] = frozen.user_attrs.get("seed", config["seed"])
                if not frozen.state.is_finished():
                    trial.set_user_attr("tune_trial_id", trial_id)
                    # the driver may have died before it wrote these after ask()
                    attrs = (
                        ("arm", name),
                        (TUNING_KEY, tuning),
                        ("seed", config["seed"]),
                        (LAUNCH_ATTR, self._experiment),
                    )
                    for key, value in attrs:
                        if key not in frozen.user_attrs:
                            trial.set_user_attr(key, value)
                self._optuna[trial_id] = [frozen._trial_id, frozen.number, max([-1, *frozen.intermediate_values])]
            elif st is not None:
                trial = st.ask()
                trial.set_user_attr("tune_trial_id", trial_id)
                trial.set_user_attr("arm", name)
                trial.set_user_attr(TUNING_KEY, tuning)
                trial.set_user_attr("seed", config["seed"])
                if self._experiment:
                    trial.set_user_attr(LAUNCH_ATTR, self._experiment)
                self._optuna[trial_id] = [trial._trial_id, trial.number, -1]
            # parents before children; only the active fields are suggested (the trial's own sampler seeds them)
            config.update(sample(self._spaces[arm], lambda name, dim: dim.suggest(trial, name)))
        self._count[arm] += 1
        self._trial_arm[trial_id] = arm
        return config

    def _trial(self, trial_id: str):
        arm = self._trial_arm.get(trial_id, "")
        if arm not in self._studies or trial_id not in self._optuna:
            return None, None
        st = self._studies[arm]
        return st, optuna.trial.Trial(st, self._optuna[trial_id][0])

    def on_trial_result(self, trial_id: str, result: Dict) -> None:
        """Keep the epoch's metric as an intermediate value; it is written to Optuna with the trial's
        outcome (one storage write per trial, not one per epoch on Tune's event loop)."""
        st, _ = self._trial(trial_id)
        value = result.get(self.metric)
        if st is None or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        step = int(result.get("epoch", result.get("training_iteration", 0)))
        record = self._optuna[trial_id]
        if step <= record[2]:
            return  # re-run after a resume from an earlier checkpoint: the step is already recorded
        self._pending.setdefault(trial_id, []).append([step, float(value)])
        record[2] = step

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        st, trial = self._trial(trial_id)
        if st is None:
            return
        if result:  # Tune hands the result that ended the trial (its last epoch, or the one ASHA stopped at) only here
            self.on_trial_result(trial_id, result)
        outcome = trial_outcome(result, error, self.metric)
        state = {"completed": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED}.get(
            outcome, optuna.trial.TrialState.FAIL
        )
        value = float(result[self.metric]) if outcome == "completed" else None
        pending = self._pending.pop(trial_id, [])
        try:
            run_id = self.run_id_of(trial_id) if self.run_id_of is not None else None
            frozen = st.trials[self._optuna[trial_id][1]]
            if frozen.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
                # told before the driver was killed (Tune's save predates it): the record stands
                if run_id and "mlflow_run_id" not in frozen.user_attrs:
                    logger.info("Optuna trial %d: finished before, its MLflow run is %s", frozen.number, run_id)
                return
            if frozen.state.is_finished():
                # a trial told before (it errored) that Tune resumed and that ended again: this attempt is
                # a new Optuna trial with the same params, so the first attempt's record stays as it was
                attrs = {
                    **frozen.user_attrs,
                    "retry_of": frozen.number,
                    **({"mlflow_run_id": run_id} if run_id else {}),
                }
                st.add_trial(
                    optuna.trial.create_trial(
                        state=state,
                        value=value,
                        params=frozen.params,
                        distributions=frozen.distributions,
                        user_attrs=attrs,
                        intermediate_values={int(k): v for k, v in pending},
                    )
                )
                return
            for step, v in pending:
                trial.report(v, int(step))
            if run_id:
                trial.set_user_attr("mlflow_run_id", run_id)
            st.tell(self._optuna[trial_id][1], value, state=state)
        except Exception:  # noqa: BLE001 - the Optuna record must not fail the study
            logger.exception("could not tell Optuna the outcome of trial %s", trial_id)

    # ---- state: JSON only ---------------------------------------------------------------------
    _STATE = (
        "_arms",
        "_arm_index",
        "_tunings",
        "_seeds",
        "_count",
        "_trial_arm",
        "_points",
        "_storage_url",
        "_launch",
        "_optuna",
        "_budget",
        "_study_seed",
        "_kind",
        "_pending",
        "_experiment",
    )

    def save(self, checkpoint_path: str) -> None:
        _write_state(checkpoint_path, "flatlab.ArmSearcher/1", {k: getattr(self, k) for k in self._STATE})

    def restore(self, checkpoint_path: str) -> None:
        """Read what :meth:`save` wrote (JSON); the searches continue from the Optuna storage.

        Raises:
            ConfigError: the file is not this searcher's JSON state (e.g. an old pickle).
        """
        state = _read_state(checkpoint_path, "flatlab.ArmSearcher/1")
        state.setdefault("_pending", {})
        state.setdefault("_experiment", "")  # saved before searchers knew their launch: no orphans taken over
        state.setdefault("_arm_index", {a: i for i, a in enumerate(state["_arms"])})  # saved before tunings
        state.setdefault("_tunings", 1)
        for k in self._STATE:
            setattr(self, k, state[k])
        if self._kind != "grid" and not self._studies:
            self._open_studies()
        self._find_orphans()  # against the restored trial map
        self._sync_reported_steps()

    def _sync_reported_steps(self) -> None:
        """After a restore: the last step each trial reported, from the Optuna storage (the saved state may
        predate later reports), so a trial re-running epochs from an earlier checkpoint reports none twice."""
        trials: Dict[str, Dict[int, Any]] = {}
        for trial_id, record in self._optuna.items():
            arm = self._trial_arm.get(trial_id, "")
            if arm not in self._studies:
                continue
            if arm not in trials:
                trials[arm] = {t.number: t for t in self._studies[arm].get_trials(deepcopy=False)}
            frozen = trials[arm].get(record[1])
            if frozen is not None:
                record[2] = max([record[2], *frozen.intermediate_values])

    def __getstate__(self) -> Dict[str, Any]:
        # Tune pickles the searcher into its own experiment state: keep configuration, not live handles
        return {k: v for k, v in self.__dict__.items() if k not in ("_studies", "run_id_of", "_orphans")}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state.setdefault("_experiment", "")
        state.setdefault("_arm_index", {a: i for i, a in enumerate(state["_arms"])})
        state.setdefault("_tunings", 1)
        self.__dict__.update(state)
        self._studies, self.run_id_of, self._orphans = {}, None, {}
        if self._kind != "grid":
            self._open_studies()


class FixedSearcher(Searcher):
    """Hands out a fixed list of trial configs in order, then finishes (the final-seeds stage)."""

    def __init__(self, configs: List[Dict[str, Any]], metric: str, mode: str) -> None:
        super().__init__(metric=metric, mode=mode)
        self._configs = [dict(c) for c in configs]
        self._next = 0

    def set_search_properties(self, metric: Optional[str], mode: Optional[str], config: Dict, **spec: Any) -> bool:
        return True

    def suggest(self, trial_id: str) -> Optional[Dict[str, Any]]:
        if self._next >= len(self._configs):
            return Searcher.FINISHED
        self._next += 1
        return dict(self._configs[self._next - 1])

    def on_trial_complete(self, trial_id: str, result: Optional[Dict] = None, error: bool = False) -> None:
        pass

    def save(self, checkpoint_path: str) -> None:
        _write_state(checkpoint_path, "flatlab.FixedSearcher/1", {"configs": self._configs, "next": self._next})

    def restore(self, checkpoint_path: str) -> None:
        """Raises ConfigError: the file is not this searcher's JSON state."""
        state = _read_state(checkpoint_path, "flatlab.FixedSearcher/1")
        self._configs, self._next = state["configs"], state["next"]


def _write_state(path: str, fmt: str, state: Dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump({**state, "_format": fmt}, f)


def _read_state(path: str, fmt: str) -> Dict[str, Any]:
    """The JSON state :func:`_write_state` wrote in format ``fmt``; nothing read can execute code.

    Raises:
        ConfigError: the file is not JSON (e.g. an old pickle: refused, never unpickled) or not ``fmt``.
    """
    try:
        with open(path) as f:
            state = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a flatlab searcher state (JSON expected; refusing to unpickle): {exc}") from exc
    if not isinstance(state, dict) or state.get("_format") != fmt:
        raise ConfigError(f"{path}: not a flatlab searcher state (format {fmt} expected)")
    return state


def _storage(url: Optional[str]):
    if url is None:
        return None
    return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
