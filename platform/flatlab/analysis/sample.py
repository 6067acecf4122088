"""A study's trials as every analysis reads them: one typed sample, built once from the store.

:class:`Sample` pairs what the launch recorded about the study (:class:`StudyInfo`: metric, mode,
reference arm, workload, training-loss target) with one row per trial in a fixed schema: ``arm``,
``tuning`` (1..S, :data:`TUNING_KEY`), ``stage`` (``search`` or ``final``), ``seed``, ``outcome``,
``completed`` (derived once, :func:`is_completed`), the trial's final metrics by name and its params
as ``param.<name>``. The comparisons read it as arm → tuning → configuration → seed.

:func:`flatlab.tracking.trials.read_sample` builds one from MLflow; :meth:`Sample.of` from a
``trials_frame`` table (its ``attrs`` give the :class:`StudyInfo`), which is how tests and users with
a DataFrame of their own reach every analysis. Nothing here reads or writes a store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional

from flatlab.lazy import lazy

pd = lazy("pandas")

FLAT_PREFIX = "flat/"
"""Metric prefix of a flatness measure of the final model (``flat/fisher_trace``)."""
AT_TARGET_PREFIX = "flat_at_target/"
"""Metric prefix of a flatness measure taken at the training-loss target (``measure_at_train_loss``)."""
EPOCHS_TO_TARGET = "train/epochs_to_target"
STEPS_TO_TARGET = "train/steps_to_target"
TARGET_REACHED = "train/target_reached"  # 1.0 reached, 0.0 missed (a training-loss target)
TARGETS = (EPOCHS_TO_TARGET, STEPS_TO_TARGET)
"""A trial's epochs and steps to the training-loss target (a quantity of the comparison tables)."""
STAGE_KEY, STAGE_SEARCH, STAGE_FINAL = "stage", "search", "final"
"""A trial config's stage key and its values: a search (tuning) trial, or a final-stage re-run."""
TUNING_KEY = "tuning"
"""A trial config's key of its independent tuning, 1..S (``Study(tunings=S)``); 1 where absent."""
TRIAL_KEYS = ("arm", "seed", STAGE_KEY, TUNING_KEY)
"""Trial config keys that say which trial it is, not which configuration: never hyperparameters."""
TEST_METRICS = ("test/perplexity", "test/accuracy", "test/loss")
"""The test metric a table shows, the first with values (language models report perplexity)."""


def is_completed(outcome: Any, status: Any = None) -> bool:
    """Whether a recorded trial completed: its outcome (the MLflow tag ``flatlab.outcome``) is
    ``completed``; a run without the tag counts when its MLflow status is ``FINISHED``."""
    text = "" if outcome is None or outcome != outcome else str(outcome)  # NaN: no tag
    return text == "completed" or (text == "" and status == "FINISHED")


@dataclass(frozen=True)
class StudyInfo:
    """What the launch recorded about its study, as the analysis needs it.

    Attributes:
        name: the study's name (titles).
        metric, mode: the study metric and its direction (``max``/``min``): what selection ranks by.
        reference_arm: the study's ``reference_arm`` as recorded (text), or ``None``.
        workload: the workload's registered name (the range of its loss), or ``None``.
        measure_at_train_loss, stop_at_train_loss: the trainer's training-loss target as recorded
            (text), or ``None``.
        searcher, scheduler: the launch's (``random``, ``fifo`` ...; the scheduler's text may carry its
            settings), or ``None`` where not recorded.
        margins: the study's equivalence margins, quantity -> m (``Study.margins``; empty: the defaults).
        target_metric: the study's target of ``metric`` for time to target (``Study.target_metric``), or ``None``.
        study_file: the study file the launch ran (as ``flatlab run`` was given it), or ``None`` where not recorded.
    """

    name: str = ""
    metric: str = "val/accuracy"
    mode: str = "max"
    reference_arm: Optional[str] = None
    workload: Optional[str] = None
    measure_at_train_loss: Optional[str] = None
    stop_at_train_loss: Optional[str] = None
    searcher: Optional[str] = None
    scheduler: Optional[str] = None
    margins: Mapping[str, float] = field(default_factory=dict)
    target_metric: Optional[float] = None
    study_file: Optional[str] = None

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> StudyInfo:
        """The info a ``trials_frame`` table carries in its ``attrs`` (missing keys: the defaults)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in attrs.items() if k in known and v is not None}
        values.setdefault("name", attrs.get("study", ""))
        return cls(**values)

    def attrs(self) -> Dict[str, Any]:
        """As a ``trials_frame`` table's ``attrs``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}


@dataclass(frozen=True, eq=False)
class Sample:
    """One study's trials, typed once (see the module docstring).

    Attributes:
        info: the study's :class:`StudyInfo`.
        trials: one row per trial in the module's schema; its ``attrs`` are ``info.attrs()``.
    """

    info: StudyInfo
    trials: Any = field(repr=False)

    @classmethod
    def of(cls, data: Any, info: Optional[StudyInfo] = None) -> Sample:
        """``data`` as a sample: a :class:`Sample` as it is; a ``trials_frame`` table (``attrs`` give the
        info unless ``info`` does) with ``tuning`` 1, ``stage`` ``search`` and ``completed`` (from
        ``outcome``/``status``) filled in where it has none. An empty table gives an empty sample."""
        if isinstance(data, Sample):
            return data
        df = data.copy() if data is not None else pd.DataFrame()
        info = info or StudyInfo.from_attrs(getattr(data, "attrs", {}) or {})
        if TUNING_KEY not in df.columns:
            df[TUNING_KEY] = 1
        df[TUNING_KEY] = pd.to_numeric(df[TUNING_KEY], errors="coerce").fillna(1).astype(int)
        if STAGE_KEY not in df.columns:
            df[STAGE_KEY] = STAGE_SEARCH
        if "completed" not in df.columns:
            outcome = df["outcome"] if "outcome" in df.columns else [None] * len(df)
            status = df["status"] if "status" in df.columns else [None] * len(df)
            plain = "outcome" not in df.columns and "status" not in df.columns  # a hand-made table: all count
            df["completed"] = [plain or is_completed(o, s) for o, s in zip(outcome, status)]
        df.attrs = {**getattr(data, "attrs", {}), **info.attrs()}
        return cls(info, df)

    def _subset(self, mask: Any) -> Sample:
        out = self.trials[mask]
        out.attrs = dict(self.trials.attrs)
        return Sample(self.info, out)

    @property
    def empty(self) -> bool:
        """Whether there is no trial."""
        return self.trials.empty

    @property
    def arms(self) -> List[str]:
        """The arms with a trial, sorted."""
        return sorted(set(self.trials["arm"])) if not self.empty else []

    @property
    def tunings(self) -> List[int]:
        """The tunings with a trial, sorted (``[1]`` for a single-tuning study)."""
        return sorted(set(int(t) for t in self.trials[TUNING_KEY])) if not self.empty else []

    def search(self) -> Sample:
        """The search (tuning) trials."""
        return self._subset(self.trials[STAGE_KEY] != STAGE_FINAL)

    def final(self) -> Sample:
        """The final stage's re-runs."""
        return self._subset(self.trials[STAGE_KEY] == STAGE_FINAL)

    def tuning(self, k: int) -> Sample:
        """The trials of tuning ``k``."""
        return self._subset(self.trials[TUNING_KEY] == int(k))

    def completed(self) -> Sample:
        """The trials that completed (:func:`is_completed`)."""
        return self._subset(self.trials["completed"].astype(bool))

    def has_values(self, column: str) -> bool:
        """Whether some trial has a finite value of ``column``."""
        return has_values(self.trials, column)

    def test_metric(self) -> Optional[str]:
        """The first of :data:`TEST_METRICS` with values, or ``None``."""
        return next((c for c in TEST_METRICS if self.has_values(c)), None)

    def measures(self, prefix: str = FLAT_PREFIX) -> List[str]:
        """The ``flat/*`` (or ``prefix``) columns with values, sorted."""
        return sorted(c for c in self.trials.columns if c.startswith(prefix) and self.has_values(c))

    def params(self) -> List[str]:
        """The ``param.<name>`` columns."""
        return [c for c in self.trials.columns if c.startswith("param.")]


def has_values(df: Any, column: str) -> bool:
    """Whether the table ``df`` has a column ``column`` with at least one finite number."""
    if column not in df.columns:
        return False
    values = pd.to_numeric(df[column], errors="coerce")
    return bool(values.map(lambda v: isinstance(v, (int, float)) and math.isfinite(v)).any())
