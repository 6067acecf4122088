"""The paper table of a study (``flatlab compare``): each arm over seeds, and paired against a reference arm.

Over the trials :func:`~flatlab.analysis.compare.select.select_sample` chooses. For each arm and each
quantity (the test metric, every ``flat/<measure>`` and ``flat_at_target/<measure>``, epochs or steps to a
target): the :func:`~flatlab.analysis.compare.statistics.t_estimate` over seeds and, against the reference
arm, the :func:`~flatlab.analysis.compare.statistics.paired_difference` (with its effect size d_z).

Many arms make many tests. Each quantity is one family: its tests are the non-reference arms' paired
tests against the reference, and their p-values are Holm-adjusted within it
(:func:`~flatlab.analysis.compare.statistics.holm`), controlling the family-wise error rate of each
quantity at ``alpha = 1 − confidence``. Quantities are not adjusted against each other (each answers
its own question: the test metric, each flatness measure, the speed to a target).

The interval of an arm's mean is clipped to the values the quantity can take (:func:`quantity_support`:
an accuracy in [0, 1], a loss or a Fisher trace >= 0; a Hutchinson Hessian trace unbounded): the true
mean lies there too, so the coverage stays and only impossible values go. Paired differences, of either
sign, are not clipped; means, standard deviations and tests are unchanged.

Only completed trials give values; seeds that diverged, errored, were pruned or interrupted are counted
as run ("values / run") and named in the notes. At a training-loss target (``measure_at_train_loss`` or
``stop_at_train_loss``, in the frame's ``attrs``) the ``flat_at_target/*`` rows are at the target (a seed
that missed it gives no value; :func:`at_target_view`) and the ``flat/*`` rows the final models'; every
arm with a seed that missed the target is named in :attr:`Comparison.warnings` (:func:`target_misses`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from flatlab.analysis.compare.at_target import at_target_view, target_misses, target_notes
from flatlab.analysis.compare.columns import frame_fields
from flatlab.analysis.compare.select import select_sample
from flatlab.analysis.compare.statistics import (
    CONFIDENCE,
    Estimate,
    Paired,
    clip,
    finite,
    holm,
    paired_difference,
    t_estimate,
)
from flatlab.analysis.results import _test_metric
from flatlab.analysis.sample import (
    AT_TARGET_PREFIX,
    EPOCHS_TO_TARGET,
    FLAT_PREFIX,
    TARGET_REACHED,
    TARGETS,
    has_values,
)
from flatlab.analysis.selection import completed, reference_arm, value_column
from flatlab.errors import ConfigError
from flatlab.lazy import lazy
from flatlab.ranges import NO_RANGES, Ranges

pd = lazy("pandas")

AUXILIARY = ("_stderr", "_clean")  # flat/<measure>_stderr, _clean: shown only when asked for by name
_HIGHER_BETTER = ("accuracy", "acc", "top1", "top5", "f1", "auc", "bleu")
_LOWER_BETTER = ("loss", "perplexity", "error", "nll")
FEW_SEEDS = 5
"""Paired tests over fewer seeds than this get a caption note: n seeds give a t-test n − 1 degrees of
freedom and little power (a non-significant p is then weak evidence of no difference)."""


@dataclass(frozen=True)
class Row:
    """One arm, one quantity: ``summary`` over its seeds, ``runs`` seeds run (counting failures and
    misses), ``diff`` against the reference (``None`` for the reference arm itself) and ``p_holm``,
    ``diff.p`` Holm-adjusted over the quantity's family of tests (NaN where there is no test);
    ``values`` and ``reference_values``, ``{seed: value}``, the arm's and the reference's seeds with a
    value, from which a registered column computes its statistic (:mod:`flatlab.analysis.compare.columns`)."""

    quantity: str
    arm: str
    runs: int
    summary: Estimate
    diff: Optional[Paired]
    p_holm: float = float("nan")
    clipped: bool = False
    """Whether ``summary``'s t-interval reached outside the quantity's range and was clipped to it."""
    values: Mapping[Any, float] = field(default_factory=dict, compare=False, repr=False)
    reference_values: Mapping[Any, float] = field(default_factory=dict, compare=False, repr=False)

    @property
    def tested(self) -> bool:
        """Whether the row has a paired test (a non-reference arm with a finite p-value)."""
        return self.diff is not None and finite(self.diff.p)


class RowTable:
    """What a table of rows, one per quantity and arm, answers (``rows``, ``quantities`` and ``confidence``
    are the dataclass's): its arms in order, its significance level and the row of an arm."""

    @property
    def arms(self) -> List[str]:
        """Arms in table order (the reference first)."""
        return list(dict.fromkeys(r.arm for r in self.rows))

    @property
    def alpha(self) -> float:
        """The significance level of the Holm-adjusted tests, ``1 − confidence`` (0.05 for 95 %)."""
        return round(1.0 - self.confidence, 12)

    def row(self, quantity: str, arm: str) -> Any:
        """The row of ``arm`` for ``quantity``.

        Raises:
            ConfigError: no such quantity or arm in the table (the message lists the valid ones).
        """
        for r in self.rows:
            if r.quantity == quantity and r.arm == arm:
                return r
        raise ConfigError(
            f"no row for quantity {quantity!r} and arm {arm!r}; quantities: {', '.join(self.quantities)}; "
            f"arms: {', '.join(self.arms)}"
        )


@dataclass(frozen=True)
class Comparison(RowTable):
    """A study's paper table, as computed by :func:`compare_table`.

    Attributes:
        metric: the test metric (e.g. ``test/accuracy``).
        reference: the arm every other arm is paired against.
        confidence: of every interval (e.g. 0.95).
        source: ``final`` (final-stage trials) or ``best configuration`` (no final stage).
        quantities: the table's quantities in order (metric, ``flat/*``, ``flat_at_target/*``, then targets).
        higher_is_better: per quantity, the direction that counts as better.
        rows: one :class:`Row` per quantity and arm, quantity-major, reference arm first.
        seeds: the per-seed sample, one row per (arm, seed): ``arm``, ``seed``, ``outcome``,
            ``run_id`` and one column per quantity (NaN where the seed gave no value).
        notes: what the table leaves out and why (failed seeds, missed targets, duplicates).
        study: the study's name, for titles.
        rank_by: how the best configuration was chosen where there is no final stage (``final``: the
            mean final validation value over seeds; ``best-epoch``: the best epoch's, asked for).
        warnings: what a reader must see before the numbers (shown above the table): the arms with
            seeds that missed the training-loss target (:func:`target_misses`).
        support: per quantity, the ``(low, high)`` its arms' intervals are clipped to (:func:`quantity_support`;
            ``None``: unbounded).
        study_file: the study file the launch ran, where it recorded one (the caption's ``flatlab run`` line).
    """

    metric: str
    reference: str
    confidence: float
    source: str
    quantities: Tuple[str, ...]
    higher_is_better: Mapping[str, bool]
    rows: Tuple[Row, ...]
    seeds: Any = field(repr=False)
    notes: Tuple[str, ...] = ()
    study: str = ""
    rank_by: str = "final"
    warnings: Tuple[str, ...] = ()
    support: Mapping[str, Optional[Tuple[float, float]]] = field(default_factory=dict)
    study_file: Optional[str] = None

    def family(self, quantity: str) -> List[Row]:
        """The rows of ``quantity``'s family of tests: its non-reference arms with a paired test."""
        return [r for r in self.rows if r.quantity == quantity and r.tested]

    def significant(self, row: Row) -> Optional[bool]:
        """Whether ``row``'s Holm-adjusted p is below :attr:`alpha`; ``None`` where it has no test."""
        return bool(row.p_holm < self.alpha) if row.tested else None

    def frame(self):
        """The table as numbers, one row per (quantity, arm): ``quantity``, ``arm``, ``higher_is_better``,
        then each registered column's numbers (:mod:`flatlab.analysis.compare.columns`): ``runs``, ``n``,
        ``mean``, ``std``, ``ci_low``, ``ci_high`` and, against the reference, ``diff_n``, ``diff_mean``,
        ``diff_std``, ``diff_low``, ``diff_high``, ``d_z`` (Cohen's d_z), ``p`` (paired t-test),
        ``p_holm`` (Holm-adjusted within the quantity), ``tests`` (the size of that family),
        ``significant`` (``p_holm < alpha``; empty without a test), ``arm_better``, ``ref_better``,
        ``ties`` (NaN for the reference arm)."""
        return pd.DataFrame(
            [
                {"quantity": r.quantity, "arm": r.arm, "higher_is_better": self.higher_is_better[r.quantity]}
                | frame_fields(self, r)
                for r in self.rows
            ]
        )


def higher_is_better(quantity: str, study_metric: str = "", study_mode: str = "max") -> bool:
    """Whether a larger value of ``quantity`` is better: ``flat/*`` (lower = flatter) and epochs or
    steps to target are lower-is-better; accuracy-like names higher; loss, perplexity and error
    lower; a test metric named like the study metric (``test/x`` for ``val/x``) follows the study's
    mode; anything else counts as higher-is-better."""
    if quantity.startswith((FLAT_PREFIX, AT_TARGET_PREFIX)) or quantity in TARGETS:
        return False
    leaf = quantity.rsplit("/", 1)[-1].lower()
    if any(w in leaf for w in _HIGHER_BETTER):
        return True
    if any(w in leaf for w in _LOWER_BETTER):
        return False
    if study_metric and leaf == study_metric.rsplit("/", 1)[-1].lower():
        return study_mode == "max"
    return True


def quantity_support(quantity: str, ranges: Ranges = NO_RANGES) -> Optional[Tuple[float, float]]:
    """The values ``quantity`` can take, ``(low, high)``, or ``None`` (unbounded, also when unsure).

    ``flat_at_target/<m>`` as ``flat/<m>``; the epochs and steps to a target: ``None``; anything else as
    ``ranges`` gives it (:meth:`flatlab.ranges.Ranges.of`: a ``flat/*`` metric as its measure declares it,
    any other metric by its name: accuracy [0, 1], a loss in the workload's loss range). ``ranges`` comes
    from the layer that knows the workload (:func:`flatlab.workloads.ranges.ranges_of`); by default only
    the metric names are known (losses and ``flat/*`` unbounded).
    """
    if quantity.startswith(AT_TARGET_PREFIX):
        quantity = FLAT_PREFIX + quantity[len(AT_TARGET_PREFIX) :]
    return None if quantity in TARGETS else ranges.of(quantity)


def compare_table(
    df,
    *,
    metric: Optional[str] = None,
    reference: Optional[str] = None,
    measures: Optional[Sequence[str]] = None,
    confidence: float = CONFIDENCE,
    study: str = "",
    rank_by: str = "final",
    ranges: Ranges = NO_RANGES,
) -> Comparison:
    """The paper table of a study's trials (see the module docstring for the statistics).

    Args:
        df: a :func:`flatlab.tracking.trials.trials_frame` table (``attrs`` metric and mode).
        metric: the test metric (default ``test/perplexity``, ``test/accuracy`` or ``test/loss``, the
            first recorded).
        reference: the arm every other arm is paired against (default
            :func:`flatlab.analysis.selection.reference_arm` of the compared arms and the study's
            ``reference_arm``, which ``trials_frame`` reads from the launch into ``attrs``).
        measures: the ``flat/*`` measures to include (``fisher_trace`` or ``flat/fisher_trace``, each with
            its ``flat_at_target/*`` where recorded; or ``flat_at_target/fisher_trace`` alone; default every
            one recorded in the sample except the auxiliary ``*_stderr`` and ``*_clean``).
        confidence: of the t-intervals, in (0, 1).
        study: the study's name, for titles.
        rank_by: how a grid study's best configuration is chosen (:func:`select_sample`): ``final``
            (the rule) or ``best-epoch`` (an explicit alternative).
        ranges: the values the quantities can take, which the arms' intervals are clipped to
            (:func:`quantity_support`; :func:`flatlab.workloads.ranges.ranges_of` the study's workload).
    Returns:
        A :class:`Comparison`; quantities: the metric, the measures (``flat/*``, then ``flat_at_target/*``),
        then ``train/epochs_to_target``
        and/or ``train/steps_to_target`` where the launch has a target.
    Raises:
        ConfigError: no trials; unknown metric, reference arm or measure (listing the valid ones);
            ``confidence`` outside (0, 1); ``rank_by`` not one of ``selection.RANKINGS`` (also where a
            final stage makes it unused).
    """
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ConfigError(f"confidence={confidence!r}; expected a number in (0, 1), e.g. 0.95")
    value_column("", rank_by)  # checked here: a study with a final stage never ranks, and would not see it
    sample, source, notes = select_sample(df, rank_by)
    if "tuning" in sample.columns and sample["tuning"].nunique() > 1:
        notes.append(
            f"pooled over {sample['tuning'].nunique()} independent tunings, seeds paired within each: these intervals "
            "leave the tuning's variance out; `flatlab compare STUDY` compares over the tunings"
        )
    sample = at_target_view(sample)
    metric = metric or _test_metric(df) or "test/accuracy"
    if not has_values(sample, metric):
        valid = sorted(
            c for c in sample.columns if "/" in c and not c.startswith(("param.", "best/")) and has_values(sample, c)
        )
        raise ConfigError(
            f"metric {metric!r} has no values in the compared trials; metrics there: {', '.join(valid) or '(none)'}"
        )
    arms = sorted(sample["arm"].unique())
    if reference is None:
        reference = reference_arm(arms, df.attrs.get("reference_arm"))
    if reference not in arms:
        raise ConfigError(f"reference arm {reference!r} is not in the compared trials; arms: {', '.join(arms)}")
    flat = _flat_quantities(sample, measures)
    targets = [
        q
        for q in TARGETS
        if q in df.columns and (has_values(df, q) or (q == EPOCHS_TO_TARGET and has_values(df, TARGET_REACHED)))
    ]
    quantities = (metric, *flat, *targets)
    mode = df.attrs.get("mode", "max")
    better = {q: higher_is_better(q, df.attrs.get("metric", ""), mode) for q in quantities}
    support = {q: quantity_support(q, ranges) for q in quantities}
    seeds = seed_values(sample, quantities)
    ordered = [reference] + [a for a in arms if a != reference]
    notes += _seed_notes(seeds, completed(sample), ordered, targets)
    notes += target_notes(df, sample, flat)
    rows = _rows(seeds, quantities, ordered, better, support, confidence)
    return Comparison(
        metric,
        reference,
        float(confidence),
        source,
        quantities,
        better,
        tuple(rows),
        seeds.reset_index(drop=True),
        tuple(notes),
        study,
        rank_by,
        tuple(target_misses(sample, ordered)),
        support,
        df.attrs.get("study_file"),
    )


def _flat_quantities(sample, measures: Optional[Sequence[str]]) -> List[str]:
    """The flatness rows: every ``flat/*`` then ``flat_at_target/*`` measure recorded in ``sample`` (their
    Monte-Carlo errors and clean losses left out), or those of ``measures``, each ``flat/<m>`` with its
    ``flat_at_target/<m>`` where recorded.

    Raises:
        ConfigError: a measure of ``measures`` not recorded (listing those that are).
    """
    recorded = [
        c
        for prefix in (FLAT_PREFIX, AT_TARGET_PREFIX)
        for c in sorted(sample.columns)
        if c.startswith(prefix) and has_values(sample, c)
    ]
    if measures is None:  # by default the measures' values, not their Monte-Carlo errors or clean losses
        return [c for c in recorded if not c.endswith(AUXILIARY)]
    wanted = [m if m.startswith((FLAT_PREFIX, AT_TARGET_PREFIX)) else FLAT_PREFIX + m for m in measures]
    unknown = [m for m in wanted if m not in recorded]
    if unknown:
        raise ConfigError(
            f"measures {', '.join(unknown)} not recorded in the compared trials; "
            f"measures there: {', '.join(recorded) or '(none)'}"
        )
    also = [AT_TARGET_PREFIX + m[len(FLAT_PREFIX) :] for m in wanted if m.startswith(FLAT_PREFIX)]
    return list(dict.fromkeys([*wanted, *(c for c in also if c in recorded)]))


def _seed_notes(seeds, done, ordered: Sequence[str], targets: Sequence[str]) -> List[str]:
    """Per arm (``ordered``), the seeds that did not complete and the completed ones that missed a
    training-loss target (``targets``): counted in the seeds run, without values."""
    notes: List[str] = []
    for arm in ordered:
        mine = seeds[seeds["arm"] == arm]
        failed = mine[~done.loc[mine.index]]
        if len(failed):
            what = ", ".join(
                f"seed {s} {o or 'unfinished'}" for s, o in failed[["seed", "outcome"]].itertuples(index=False)
            )
            notes.append(
                f"{arm}: {what}; counted in the seeds run, no values from {'it' if len(failed) == 1 else 'them'}."
            )
        for q in targets:
            missed = mine[done.loc[mine.index] & mine[q].isna()]
            if len(missed):
                which = ", ".join(map(str, missed["seed"]))
                notes.append(
                    f"{arm}: seed{'s' if len(missed) > 1 else ''} {which} completed without reaching the target ({q})."
                )
    return notes


def _rows(seeds, quantities, ordered: Sequence[str], better, support, confidence: float) -> List[Row]:
    """One :class:`Row` per quantity and arm (``ordered``: the reference first): the t-estimate over seeds,
    clipped to the quantity's support, and the paired difference against the reference with its
    Holm-adjusted p-value (the family: the quantity's arms)."""
    reference = ordered[0]
    rows: List[Row] = []
    for q in quantities:
        ref = _by_seed(seeds, reference, q)
        block = []
        for arm in ordered:
            mine = _by_seed(seeds, arm, q)
            diff = (
                None
                if arm == reference
                else paired_difference(mine, ref, higher_is_better=better[q], confidence=confidence)
            )
            runs = int((seeds["arm"] == arm).sum())
            raw = t_estimate(list(mine.values()), confidence)
            summary = clip(raw, support[q])
            block.append(
                Row(q, arm, runs, summary, diff, clipped=summary is not raw, values=mine, reference_values=ref)
            )
        adjusted = holm([r.diff.p if r.diff is not None else float("nan") for r in block])  # the quantity's family
        rows += [replace(r, p_holm=p) for r, p in zip(block, adjusted)]
    return rows


def seed_values(sample, quantities: Sequence[str]):
    """Per (arm, seed) row of ``sample``: ``arm``, ``seed``, ``outcome``, ``run_id`` and each quantity's
    value, NaN unless the trial completed with a finite value (and, for ``train/epochs_to_target`` and
    every ``flat_at_target/*``, ``train/target_reached == 1`` where recorded: flatness at the target is
    compared at the matched training loss, so a seed that never reached it gives no value there). Every
    ``flat/*`` is the final model's: a value for every completed seed (:func:`at_target_view` gives a
    ``stop_at_train_loss`` launch its at-target columns)."""
    done = completed(sample)
    seeds = sample[[c for c in ("arm", "seed", "outcome", "run_id") if c in sample.columns]].copy()
    for q in quantities:
        values = (
            pd.to_numeric(sample[q], errors="coerce") if q in sample else pd.Series(float("nan"), index=sample.index)
        )
        keep = done & values.map(finite)
        at_target = q == EPOCHS_TO_TARGET or q.startswith(AT_TARGET_PREFIX)
        if at_target and has_values(sample, TARGET_REACHED):
            keep &= pd.to_numeric(sample[TARGET_REACHED], errors="coerce") == 1.0
        seeds[q] = values.where(keep)
    return seeds


def _by_seed(seeds, arm: str, quantity: str) -> Dict[Any, float]:
    mine = seeds[(seeds["arm"] == arm) & seeds[quantity].notna()]
    return dict(zip(mine["seed"], mine[quantity].astype(float)))
