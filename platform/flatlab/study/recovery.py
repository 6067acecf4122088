"""Resuming a launch whose driver was killed (SIGKILL, a lost head node): its records made exact again.

Tune saves its experiment (trials and searcher state) from time to time; MLflow and Optuna are written
as trials go. A driver killed between two saves leaves them ahead of the saved experiment:

* trials that finished after the save: Tune restores them as unfinished and would train them again,
  ending their MLflow runs a second time and adding Optuna trials;
* trials started after the save (orphans): Tune restores nothing of them, the searcher suggests
  them anew, and their MLflow runs and Optuna trials would stay RUNNING for ever beside the new ones.

:class:`LaunchRecords` reads the launch's trial runs from MLflow once when the resume starts, and
answers for every trial Tune adds (:meth:`LaunchRecords.on_add`, from
:class:`~flatlab.study.schedulers.ArmScheduler`): a trial whose run already ended with an outcome
(completed, pruned, diverged) is not run again (its recorded result stands and its run is left as it
was); a new trial with the same configuration as an orphan's run takes that run over
(:meth:`LaunchRecords.claimed`, for :class:`~flatlab.tracking.callback.MLflowTrialLogger`, which skips
the epochs already logged). The searcher reuses the orphans' Optuna trials
(:class:`~flatlab.study.searchers.ArmSearcher`). Orphan runs that no trial took over end KILLED
(:meth:`LaunchRecords.end_unclaimed`).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Set

from flatlab.analysis.selection import COMPLETED_KEY, DIVERGED_KEY
from flatlab.tracking import runs

logger = logging.getLogger(__name__)

#: Outcomes of a trial that ended by itself (``flatlab.outcome``); ``error`` and ``interrupted`` run again.
ENDED = ("completed", "pruned", "diverged")


class LaunchRecords:
    """The trial runs of the launch ``parent_run_id`` as MLflow held them when the resume started."""

    def __init__(self, tracking_uri: str, experiment_id: str, parent_run_id: str) -> None:
        self.tracking_uri = tracking_uri
        client = runs.client(tracking_uri)
        found = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{runs.PARENT}` = '{parent_run_id}' and tags.`{runs.TAG_ROLE}` = 'trial'",
            max_results=50000,
        )
        self._runs: Dict[str, Any] = {r.data.tags.get(runs.TAG_TRIAL, ""): r for r in found}
        self._added: Set[str] = set()  # trial ids Tune added in this process
        self._claimed: Dict[str, Any] = {}  # trial id -> the orphan run it took over
        self._taken: Set[str] = set()  # run ids of orphans taken over

    def on_add(self, trial_id: str, config: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        """Tune adds trial ``trial_id`` with ``config``: its recorded last result if its run (its own, or
        an orphan's with the same configuration, which it takes over) already ended with an outcome;
        ``None`` when the trial is to run."""
        self._added.add(trial_id)
        run = self._runs.get(trial_id) or self._claimed.get(trial_id)
        if run is None:
            run = self._orphan_like(config)
            if run is not None:
                self._claimed[trial_id] = run
                self._taken.add(run.info.run_id)
                logger.info(
                    "resume: trial %s takes over the run %s of trial %s (started after Tune's last save)",
                    trial_id,
                    run.info.run_id,
                    run.data.tags.get(runs.TAG_TRIAL),
                )
        if run is None or run.info.status == "RUNNING" or run.data.tags.get(runs.TAG_OUTCOME) not in ENDED:
            return None
        return recorded_result(run)

    def claimed(self, trial_id: str) -> Optional[str]:
        """The run id of the orphan run ``trial_id`` took over, if any."""
        run = self._claimed.get(trial_id)
        return run.info.run_id if run is not None else None

    def took_over(self, trial_id: str) -> Optional[str]:
        """The trial id whose orphan run ``trial_id`` took over (the id MLflow and ``flatlab results``
        show for it), if any."""
        run = self._claimed.get(trial_id)
        return run.data.tags.get(runs.TAG_TRIAL) if run is not None else None

    def _orphan_like(self, config: Mapping[str, Any]) -> Optional[Any]:
        """An untaken run of a trial Tune never added whose configuration, stage and tuning are ``config``'s: by
        its :data:`~flatlab.tracking.runs.TAG_CONFIG` digest, set as the run was created (so also a run
        whose driver was killed before it logged the params), else (runs made before the tag) by its params."""
        want = runs.trial_params(dict(config))
        digest = runs.config_digest(dict(config))
        stage = str(config.get(runs.STAGE_KEY, runs.STAGE_SEARCH))
        tuning = str(config.get(runs.TUNING_KEY, 1))
        for trial_id, run in self._runs.items():
            if trial_id in self._added or run.info.run_id in self._taken:
                continue
            tags = run.data.tags
            if tags.get(runs.TAG_STAGE, runs.STAGE_SEARCH) != stage or tags.get(runs.TAG_TUNING, "1") != tuning:
                continue
            tagged = run.data.tags.get(runs.TAG_CONFIG)
            params = run.data.params
            if tagged == digest if tagged is not None else all(params.get(k) == v for k, v in want.items()):
                return run
        return None

    def end_unclaimed(self) -> List[str]:
        """End KILLED (``flatlab.outcome=interrupted``) the runs still RUNNING of trials Tune never added
        and no trial took over; returns their run ids."""
        client = runs.client(self.tracking_uri)
        ended = []
        for trial_id, run in self._runs.items():
            if trial_id in self._added or run.info.run_id in self._taken:
                continue
            if client.get_run(run.info.run_id).info.status == "RUNNING":
                client.set_tag(run.info.run_id, runs.TAG_OUTCOME, "interrupted")
                client.set_terminated(run.info.run_id, status="KILLED")
                ended.append(run.info.run_id)
        return ended


def recorded_result(run: Any) -> Dict[str, Any]:
    """A Tune result rebuilt from a finished trial run: its last metric values, its epoch as
    ``training_iteration``, and the completion or divergence flag its outcome implies
    (:func:`flatlab.study.searchers.trial_outcome` gives the run's outcome back)."""
    result: Dict[str, Any] = dict(run.data.metrics)
    outcome = run.data.tags.get(runs.TAG_OUTCOME)
    if "epoch" in result:
        result["epoch"] = int(result["epoch"])
        result["training_iteration"] = result["epoch"]
    if outcome == "completed":
        result[COMPLETED_KEY] = 1
    elif outcome == "diverged":
        result[DIVERGED_KEY] = 1
    return result
