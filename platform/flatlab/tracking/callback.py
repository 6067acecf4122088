"""Driver-side MLflow logging for Tune trials, batched and off the Tune event loop.

Ray's ``MLflowLoggerCallback`` logs every result synchronously, on the thread that drives Tune. This
callback only enqueues there; one background thread creates runs, sends metrics with
``MlflowClient.log_batch`` (all pending results of a run in one call), and ends runs. Statuses
(:data:`flatlab.tracking.ui.OUTCOME_STATUS`): FINISHED for completed trials and for trials the scheduler
stopped (``flatlab.outcome=pruned``: a result, not a failure), FAILED for errors and divergence
(``flatlab.outcome=diverged``); runs are named by :func:`flatlab.tracking.ui.trial_run_name`.

Each epoch's metrics carry the time that epoch ended (the report's ``epoch_end_time``), not the time
they reached the driver; per-epoch metrics have step = epoch, the final model's summary values
(``test/*``, ``flat/*`` ...: :data:`flatlab.tracking.runs.SUMMARY_KEY`) step 0. A failed trial's
exception and traceback go to its ``error.txt`` artifact and ``Type: message`` to its ``flatlab.error``
tag, which a restart removes. Where each (re)start of a trial ran (the reports'
:data:`~flatlab.tracking.placement_tags.PLACEMENT_KEY`) becomes ``flatlab.<field>`` tags. :meth:`close`
marks anything still open KILLED. The callback pickles without its thread (Tune stores it in the
experiment state for resume).

No epoch is logged twice: a trial resumed from a checkpoint older than its last report re-runs epochs
that are already in MLflow; the callback remembers each run's last logged step (seeded from MLflow's
``epoch`` history when it reopens a run) and skips steps up to it. ``best/<metric>`` continues from the
run's logged best. A resume after the driver was killed hands a trial the run of the same trial started
after Tune's last save (:attr:`MLflowTrialLogger.claimed`), so no run is left RUNNING.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from mlflow.entities import Metric, Param, RunTag
from ray.tune import Callback

from flatlab.analysis.selection import trial_outcome
from flatlab.tracking import runs, ui
from flatlab.tracking.placement_tags import PLACEMENT_KEY, placement_tags
from flatlab.tracking.trial_errors import one_line, read_trial_error

logger = logging.getLogger(__name__)

_FLUSH_S = 0.5


class MLflowTrialLogger(Callback):
    """Logs each Tune trial as a child MLflow run of ``parent_run_id``.

    Args:
        tracking_uri, experiment_id, parent_run_id: where to log.
        tags: tags set on every child run (study, workload, git commit, version).
        arm_optimizer: arm name -> optimizer name (tagged on each child run).
        metric, mode: the study metric; ``best/<metric>`` is logged alongside it.
        study: the :class:`~flatlab.study.spec.Study`; with ``resolve``, each child run's params hold the
            trial's resolved configuration too (:func:`flatlab.tracking.runs.trial_params`).
        log: the study's driver log file (kept absolute); the runs a failed launch ends name it.
        resolve: ``(study, config) -> resolved configuration``
            (:func:`flatlab.study.trial_spec.resolved_config`), passed in so that tracking needs nothing
            of the study package; not pickled: the launch that restores the callback passes its own.

    A trial's outcome comes from its last report (:func:`flatlab.analysis.selection.trial_outcome`).
    Pickled (Tune keeps callbacks in its experiment state) as its configuration only; a state pickled by
    an older flatlab that still holds ``max_epochs`` unpickles (the key is dropped).
    """

    _STATE = (
        "tracking_uri",
        "experiment_id",
        "parent_run_id",
        "tags",
        "arm_optimizer",
        "metric",
        "mode",
        "study",
        "log",
    )

    def __init__(
        self,
        tracking_uri: str,
        experiment_id: str,
        parent_run_id: str,
        tags: Dict[str, str],
        arm_optimizer: Dict[str, str],
        metric: str,
        mode: str,
        study: Any = None,
        log: Optional[Path] = None,
        resolve: Optional[Callable[[Any, Dict[str, Any]], Dict[str, Dict[str, Any]]]] = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id
        self.parent_run_id = parent_run_id
        self.tags = dict(tags)
        self.arm_optimizer = dict(arm_optimizer)
        self.metric = metric
        self.mode = mode
        self.study = study
        self.log = None if log is None else str(Path(log).resolve())
        self.resolve = resolve
        self._init_runtime()
        #: A resume's :meth:`flatlab.study.recovery.LaunchRecords.claimed`: trial id -> the run of a trial
        #: started before the driver was killed that it takes over (not pickled).
        self.claimed: Optional[Callable[[str], Optional[str]]] = None

    # ---- pickling: configuration only ----------------------------------------------------------
    def __getstate__(self) -> Dict[str, Any]:
        return {k: self.__dict__[k] for k in self._STATE}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.study = self.log = self.resolve = None  # state pickled before the callback held its study, its log
        self.__dict__.update({k: v for k, v in state.items() if k in self._STATE})  # drops an old max_epochs
        self.claimed = None
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._queue: "queue.Queue[Tuple[str, str, Any]]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._run_ids: Dict[str, str] = {}
        self._open: set = set()
        self._best: Dict[str, float] = {}  # trial id -> best metric value logged (background thread)
        self._logged_step: Dict[str, int] = {}  # trial id -> last step sent to MLflow (background thread)
        self._last: Dict[str, Dict] = {}
        self._placed: Dict[str, str] = {}  # trial id -> the placement its run is tagged with
        self.errors: List[str] = []

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._worker, name="flatlab-mlflow", daemon=True)
            self._thread.start()

    # ---- Tune callback hooks (cheap: enqueue only) --------------------------------------------
    def setup(self, **info: Any) -> None:
        self._ensure_thread()

    def on_trial_start(self, iteration: int, trials: List, trial: Any, **info: Any) -> None:
        self._ensure_thread()
        self._queue.put(("start", trial.trial_id, dict(trial.config)))

    def on_trial_restore(self, iteration: int, trials: List, trial: Any, **info: Any) -> None:
        self.on_trial_start(iteration, trials, trial)

    def on_trial_recover(self, iteration: int, trials: List, trial: Any, **info: Any) -> None:
        self.on_trial_start(iteration, trials, trial)

    def on_trial_result(self, iteration: int, trials: List, trial: Any, result: Dict, **info: Any) -> None:
        # a diverged trial reports an infinite metric to Tune; MLflow would store it as +-1.8e308
        metrics = {k: v for k, v in runs.numeric_metrics(result).items() if math.isfinite(v)}
        self._last[trial.trial_id] = result
        step = int(result.get("epoch", result.get("training_iteration", 0)))
        ended = result.get(runs.EPOCH_END_KEY)  # seconds since 1970 (the worker's clock); older reports lack it
        timestamp = int(1000 * ended) if isinstance(ended, (int, float)) and math.isfinite(ended) else None
        model_id = result.get(runs.MODEL_ID_KEY)  # the final report: its metrics belong to the trial's model too
        self._queue.put(
            (
                "metrics",
                trial.trial_id,
                (metrics, step, timestamp, runs.summary_keys(result), model_id if isinstance(model_id, str) else None),
            )
        )
        placed = result.get(PLACEMENT_KEY)
        if placed is not None and placed != self._placed.get(trial.trial_id):  # a (re)start's device, node ...
            self._placed[trial.trial_id] = placed
            self._queue.put(("tags", trial.trial_id, placement_tags(placed)))

    def on_trial_complete(self, iteration: int, trials: List, trial: Any, **info: Any) -> None:
        last = self._last.get(trial.trial_id) or getattr(trial, "last_result", {}) or {}
        outcome = trial_outcome(last, False, self.metric)
        status = ui.OUTCOME_STATUS.get(outcome, "FAILED")
        self._queue.put(("end", trial.trial_id, (status, outcome, None)))

    def on_trial_error(self, iteration: int, trials: List, trial: Any, **info: Any) -> None:
        # Read Tune's error file now, on the driver: it lives in Ray's temporary session folder.
        self._queue.put(("end", trial.trial_id, ("FAILED", "error", read_trial_error(trial))))

    def on_experiment_end(self, trials: List, **info: Any) -> None:
        self.flush()

    # ---- driver API -----------------------------------------------------------------------------
    def run_id_of(self, trial_id: str, timeout: float = 10.0) -> Optional[str]:
        """The MLflow run id of a Tune trial (waits up to ``timeout`` s for its queued creation)."""
        if trial_id not in self._run_ids:
            self.flush(timeout)
        return self._run_ids.get(trial_id)

    def flush(self, timeout: float = 120.0) -> None:
        """Block until everything enqueued so far is written (or ``timeout`` seconds pass)."""
        if self._thread is None:
            return
        done = threading.Event()
        self._queue.put(("flush", "", done))
        done.wait(timeout)

    def close(self, interrupted: bool = False, failed: bool = False) -> None:
        """Flush, then end every child run still open: KILLED (``flatlab.outcome=interrupted``) when the
        launch was interrupted, FAILED (``flatlab.outcome=error``, ``flatlab.error`` naming the study's
        log file) when Tune itself raised."""
        self.flush()
        status, outcome = ("FAILED", "error") if failed else ("KILLED", "interrupted")
        log = self.log if self.log is not None else "the driver's log"
        for trial_id in list(self._open):
            self._queue.put(("end", trial_id, (status, outcome, f"the launch failed; see {log}" if failed else None)))
        self.flush()
        self._queue.put(("stop", "", None))
        if self._thread is not None:
            self._thread.join(timeout=30)

    # ---- background thread --------------------------------------------------------------------
    def _worker(self) -> None:
        client = runs.client(self.tracking_uri)
        pending: Dict[str, List] = {}
        last_flush = time.monotonic()
        while True:
            try:
                kind, trial_id, payload = self._queue.get(timeout=_FLUSH_S)
            except queue.Empty:
                kind, trial_id, payload = "tick", "", None
            try:
                if kind == "metrics":
                    pending.setdefault(trial_id, []).append(payload)
                if kind in ("start", "end", "flush", "stop", "tags") or (
                    pending and time.monotonic() - last_flush > _FLUSH_S
                ):
                    self._send_metrics(client, pending)
                    last_flush = time.monotonic()
                if kind == "start":
                    self._start_run(client, trial_id, payload)
                elif kind == "end":
                    self._end_run(client, trial_id, *payload)
                elif kind == "tags" and trial_id in self._run_ids:
                    client.log_batch(self._run_ids[trial_id], tags=[RunTag(k, v) for k, v in payload.items()])
                elif kind == "flush":
                    payload.set()
                elif kind == "stop":
                    return
            except Exception as exc:  # never kill the study for a tracking hiccup; report at the end
                logger.exception("MLflow logging failed (%s for trial %s)", kind, trial_id)
                self.errors.append(f"{kind} {trial_id}: {exc}")
                if kind == "flush":
                    payload.set()

    def _start_run(self, client: Any, trial_id: str, config: Dict[str, Any]) -> None:
        run_id = self._run_ids.get(trial_id) or runs.find_trial_run(
            self.tracking_uri, self.experiment_id, trial_id, self.parent_run_id
        )
        claimed = self.claimed(trial_id) if run_id is None and self.claimed is not None else None
        if claimed is not None:  # a resume: the run of the same trial, started before the driver was killed
            client.set_tag(claimed, runs.TAG_TRIAL, trial_id)  # the trial's worker finds its run by this tag
            run_id = claimed
        arm = str(config.get("arm", ""))
        if run_id is None:
            tags = {
                **self.tags,
                runs.PARENT: self.parent_run_id,
                runs.TAG_ROLE: "trial",
                runs.TAG_TRIAL: trial_id,
                runs.TAG_ARM: arm,
                runs.TAG_OPT: self.arm_optimizer.get(arm, arm),
                runs.TAG_SEED: str(config.get("seed", "")),
                runs.TAG_STAGE: str(config.get(runs.STAGE_KEY, runs.STAGE_SEARCH)),
                runs.TAG_TUNING: str(config.get(runs.TUNING_KEY, 1)),
                runs.TAG_CONFIG: runs.config_digest(config),  # recognisable before its params are logged
            }
            tuning = int(tags[runs.TAG_TUNING]) if getattr(self.study, "tunings", 1) > 1 else None
            name = ui.trial_run_name(arm, tags[runs.TAG_STAGE], tags[runs.TAG_SEED], trial_id, tuning)
            run = client.create_run(self.experiment_id, tags=tags, run_name=name)
            run_id = run.info.run_id
            client.log_batch(run_id, params=[Param(k, v) for k, v in self._params(config).items()])
        else:
            client.update_run(run_id, status="RUNNING")
            data = client.get_run(run_id).data
            self._seed_logged(client, trial_id, run_id, data.metrics)
            if runs.TAG_ERROR in data.tags:  # restarted after an error: not failed now
                client.delete_tag(run_id, runs.TAG_ERROR)
            # a driver killed between creating the run and logging its params left them out
            missing = {k: v for k, v in self._params(config).items() if k not in data.params}
            if missing:
                client.log_batch(run_id, params=[Param(k, v) for k, v in missing.items()])
        self._run_ids[trial_id] = run_id
        self._open.add(trial_id)

    def _params(self, config: Dict[str, Any]) -> Dict[str, str]:
        """The child run's params: ``config`` as given, and its resolved configuration where it can be
        resolved (a failure is logged: the trial itself reports the bad value)."""
        resolved = None
        if self.study is not None and self.resolve is not None:
            try:
                resolved = self.resolve(self.study, config)
            except Exception:  # noqa: BLE001 - the trial fails with the real error; keep its run
                logger.warning("could not resolve the configuration of %s", config, exc_info=True)
        return runs.trial_params(config, resolved)

    def _send_metrics(self, client: Any, pending: Dict[str, List]) -> None:
        now = int(time.time() * 1000)
        for trial_id in list(pending):
            run_id = self._run_ids.get(trial_id)
            if run_id is None:
                continue  # its start is still queued behind; sent on a later flush
            batch = []
            for metrics, step, timestamp, summary, model_id in pending.pop(trial_id):
                if step <= self._logged_step.get(trial_id, -1):
                    continue  # re-run from an earlier checkpoint: this epoch is logged already
                self._logged_step[trial_id] = step
                value = metrics.get(self.metric)
                if value is not None:
                    best = self._best.get(trial_id)
                    if best is None or (value > best if self.mode == "max" else value < best):
                        self._best[trial_id] = best = value
                    metrics = {**metrics, f"best/{self.metric}": best}
                # the final model's summary values (test/*, flat/* ...) at step 0: a bar per run in MLflow's charts
                batch += [
                    Metric(k, v, timestamp or now, runs.metric_step(k, step, summary), model_id=model_id)
                    for k, v in metrics.items()
                ]
            runs.log_metrics(client, run_id, batch)

    def _seed_logged(self, client: Any, trial_id: str, run_id: str, metrics: Dict[str, float]) -> None:
        """For a run reopened after a restart: its last logged step (from MLflow's ``epoch`` history) and
        best value (from its latest ``metrics``)."""
        steps = [m.step for m in client.get_metric_history(run_id, "epoch")]
        if steps:
            self._logged_step[trial_id] = max(self._logged_step.get(trial_id, -1), max(steps))
        best = metrics.get(f"best/{self.metric}")
        if best is not None and trial_id not in self._best:
            self._best[trial_id] = float(best)

    def _end_run(self, client: Any, trial_id: str, status: str, outcome: str, error: Optional[str]) -> None:
        run_id = self._run_ids.get(trial_id)
        if run_id is None or trial_id not in self._open:
            return
        client.set_tag(run_id, runs.TAG_OUTCOME, outcome)
        if outcome == "pruned":
            client.set_tag(run_id, "pruned", "true")
        if error:  # one line as a tag (shown by ``flatlab results``), the full text as an artifact
            client.set_tag(run_id, runs.TAG_ERROR, one_line(error))
            try:
                client.log_text(run_id, error + "\n", "error.txt")
            except Exception as exc:  # the run must still end FAILED
                logger.warning("could not log error.txt for trial %s: %s", trial_id, exc)
                self.errors.append(f"error.txt {trial_id}: {exc}")
        client.set_terminated(run_id, status=status)
        self._open.discard(trial_id)
