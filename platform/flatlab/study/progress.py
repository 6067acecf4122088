"""Concise terminal progress for a running study: trials done / running / pending and the best so far.

"Best so far" is the study's one answer (:mod:`flatlab.analysis.selection`) over the search trials that
have completed: the best configuration's score (its final-epoch value of the study metric, the mean
over its seeds where it has several), never a pruned trial's, a running trial's or an epoch before the
last, and never a final-stage re-run's.

Trials that ended before a ``--resume`` count as done (their outcome is read from the restored trials).
A trial whose worker died (or that raised) is reported on one line: ``failed ... will resume`` when Tune
retries it from its last checkpoint, ``failed`` with the error's first line when it will not (a later
``--resume`` retries it; the line says so); Ray's own
multi-line message goes to the log (:func:`flatlab.study.ray_compat.route_ray_errors_to_log`).
While trials wait and none runs (a cluster without the GPU they reserve, which an autoscaler may add),
the status line says what they wait for; a trial that falls back to CPU (``Resources(cpu_fallback=True)``)
gets a warning line.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.tune import Callback
from rich.console import Console

from flatlab.analysis.sample import TUNING_KEY
from flatlab.analysis.selection import best_configurations, best_trial, rank_arms, search_trial, trial_outcome
from flatlab.study.placement import waiting_for
from flatlab.tracking.placement_tags import PLACEMENT_KEY, placement_tags
from flatlab.tracking.trial_errors import one_line, read_trial_error


class ProgressPrinter(Callback):
    """Prints one line when a trial ends, and a status line at most every ``every_s`` seconds.

    Args:
        total: trials the study will launch; metric, mode: the study metric.
        every_s: seconds between status lines.

    Pickled (Tune keeps callbacks in its experiment state) as its configuration only; a state pickled by
    an older flatlab that still holds ``max_epochs`` unpickles (the key is dropped).
    """

    _STATE = ("total", "metric", "mode", "every_s")

    def __init__(self, total: int, metric: str, mode: str, every_s: float = 15.0) -> None:
        self.total = total
        self.metric = metric
        self.mode = mode
        self.every_s = every_s
        self._init()

    def __getstate__(self) -> Dict[str, Any]:
        return {k: self.__dict__[k] for k in self._STATE}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.every_s = 15.0
        self.__dict__.update({k: v for k, v in state.items() if k in self._STATE})  # drops an old max_epochs
        self._init()

    def _init(self) -> None:
        self.console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
        self._running: set = set()
        self._done: Dict[str, str] = {}
        self._seen = 0  # trials already looked at for ones that ended before a resume
        self._trials: Dict[str, Any] = {}  # trial id -> its selection.Trial (search trials that ended)
        self._last_print = 0.0
        self._last_status = 0.0
        self._t0 = time.monotonic()
        self._placed: Dict[str, str] = {}  # trial id -> the placement last seen (a CPU fallback is warned once)
        # on a resume: trial id -> the trial id whose MLflow run it took over (LaunchRecords.took_over)
        self.took_over: Optional[Callable[[str], Optional[str]]] = None

    def _ended(self, trial: Any, error: bool) -> None:
        t = search_trial(trial.config or {}, getattr(trial, "last_result", {}) or {}, error, self.metric)
        if t is not None:
            self._trials[trial.trial_id] = t

    def best(self) -> str:
        """The best configuration so far, as the status line shows it: ``"0.9582 (sgd_ire 3364efad)"``
        (``", mean of 3 seeds"`` added when it has several), or ``"-"`` before any search trial completed."""
        best = best_configurations(self._trials.values(), self.mode)
        if not best:
            return "-"
        top = best[rank_arms(best, self.mode)[0]]
        seeds = f", mean of {top.seeds} seeds" if top.seeds > 1 else ""
        trial_id = next(k for k, t in self._trials.items() if t is best_trial(top))
        return f"{top.mean:.4f} ({_label(best_trial(top).ref or {})} {self._recorded_id(trial_id)}{seeds})"

    def _recorded_id(self, trial_id: str) -> str:
        """The id MLflow knows the trial by: on a resume, that of the run it took over, else its own."""
        return (self.took_over(trial_id) if self.took_over is not None else None) or trial_id

    def status(self) -> str:
        pending = max(0, self.total - len(self._done) - len(self._running))
        best = self.best()
        return (
            f"[{time.monotonic() - self._t0:6.0f}s] trials: {len(self._done)} done / {len(self._running)} running / "
            f"{pending} pending | best {self.metric} {best}"
        )

    def on_step_begin(self, iteration: int, trials: List, **info: Any) -> None:
        if len(trials) == self._seen:
            return
        self._seen = len(trials)

        for trial in trials:  # a restored experiment: trials that ended before the resume are done
            if trial.trial_id in self._done or trial.status not in ("TERMINATED", "ERROR"):
                continue
            last = getattr(trial, "last_result", {}) or {}
            self._done[trial.trial_id] = trial_outcome(last, trial.status == "ERROR", self.metric)
            self._ended(trial, trial.status == "ERROR")

    def on_step_end(self, iteration: int, trials: List, **info: Any) -> None:
        # nothing reports while every trial waits (e.g. for a GPU an autoscaler may add): say so
        if time.monotonic() - self._last_print > self.every_s:
            pending = [t for t in trials if t.status == "PENDING"]
            idle = not self._running and time.monotonic() - self._t0 > self.every_s  # past start-up, nothing runs
            reason = _waiting_for(pending[0]) if pending and idle else ""
            self._print(self.status() + (f" | {len(pending)} pending wait for {reason}" if reason else ""))

    def on_trial_start(self, iteration: int, trials: List, trial: Any, **info: Any) -> None:
        self._done.pop(trial.trial_id, None)  # an errored trial restarted by a resume runs again
        self._trials.pop(trial.trial_id, None)
        self._running.add(trial.trial_id)

    def on_trial_result(self, iteration: int, trials: List, trial: Any, result: Dict, **info: Any) -> None:
        placed = result.get(PLACEMENT_KEY)
        if placed is not None and placed != self._placed.get(trial.trial_id):
            self._placed[trial.trial_id] = placed
            fallback = placement_tags(placed).get("flatlab.cpu_fallback")
            if fallback:
                self._print(f"[yellow]warning:[/yellow] trial {trial.trial_id}: {fallback}")
        if time.monotonic() - self._last_print > self.every_s:
            self._print(self.status())

    def _end(self, trial: Any, outcome: str, note: str = "") -> None:
        self._running.discard(trial.trial_id)
        self._done[trial.trial_id] = outcome
        last = getattr(trial, "last_result", {}) or {}
        v = last.get(self.metric)
        shown = f"{v:.4f}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"
        recorded = self._recorded_id(trial.trial_id)
        if recorded != trial.trial_id:  # it took over a killed driver's run
            note += f" (in MLflow: trial {recorded})"
        self._print(
            f"  {outcome:9s} {_label(trial.config or {}):>10s} {trial.trial_id} "
            f" epochs {last.get('epoch', 0):>3}  {self.metric} {shown}{note}"
        )
        if time.monotonic() - self._last_status > 5.0 or not self._running:
            self._print(self.status())
            self._last_status = time.monotonic()

    def on_trial_complete(self, iteration: int, trials: List, trial: Any, **info: Any) -> None:
        outcome = trial_outcome(getattr(trial, "last_result", {}) or {}, False, self.metric)
        self._ended(trial, False)
        self._end(trial, "done" if outcome == "completed" else outcome)

    def on_trial_error(self, iteration: int, trials: List, trial: Any, **info: Any) -> None:
        self._ended(trial, True)
        self._end(trial, "failed", _error_line(trial) + " (--resume retries it)")

    def on_trial_recover(self, iteration: int, trials: List, trial: Any, **info: Any) -> None:
        # Tune retries the trial (FailureConfig.max_failures): it stays running
        last = getattr(trial, "last_result", {}) or {}
        self._print(
            f"  {'failed':9s} {_label(trial.config or {}):>10s} {trial.trial_id}  epochs {last.get('epoch', 0):>3}"
            f"  will resume from its last checkpoint{_error_line(trial)}"
        )

    def _print(self, line: str) -> None:
        self._last_print = time.monotonic()
        self.console.print(line)


def _label(config: Dict[str, Any]) -> str:
    """A trial's arm as the progress lines show it: ``sam``, or ``sam t2`` in a study of several tunings."""
    arm = str(config.get("arm", ""))
    return f"{arm} t{config[TUNING_KEY]}" if TUNING_KEY in config else arm


def _waiting_for(trial: Any) -> str:
    """What pending ``trial`` waits for on the cluster (``""`` if it fits or the cluster cannot be asked)."""
    try:
        request = trial.placement_group_factory.required_resources
        return waiting_for(request, ray.available_resources(), ray.cluster_resources())
    except Exception:  # noqa: BLE001 - the progress line must not fail the study
        return ""


def _error_line(trial: Any) -> str:
    """``": <first line of the trial's error>"`` (e.g. a killed worker's), or ``""`` when there is none."""
    try:
        text = read_trial_error(trial)
    except Exception:  # noqa: BLE001 - the progress line must not fail the study
        return ""
    return f": {one_line(text)[:100]}" if text else ""
