"""The comparison at a training-loss target: which seeds reached it, the flatness there, and what a
reader must be told when seeds missed it.

A launch with a training-loss target either measured at the target and trained on
(``measure_at_train_loss``: its trials log ``flat_at_target/*``) or stopped its trials there
(``stop_at_train_loss``: a trial's ``flat/*`` is at the target if it reached it, else after its last
epoch). :func:`at_target_view` gives a ``stop_at_train_loss`` sample its ``flat_at_target/*`` columns,
:func:`target_notes` says what the flatness rows of :func:`~flatlab.analysis.compare.table.compare_table`
hold, and :func:`target_misses` names the arms whose seeds missed the target.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from flatlab.analysis.sample import AT_TARGET_PREFIX, FLAT_PREFIX, TARGET_REACHED, has_values
from flatlab.analysis.selection import completed
from flatlab.lazy import lazy

pd = lazy("pandas")

MEASURE_AT_TARGET = (
    "measure_at_train_loss"  # the frame's attrs key: the launch's trainer target, when it measured and trained on
)
STOP_AT_TARGET = "stop_at_train_loss"  # the frame's attrs key: the launch's trainer target, when trials stopped there


def target_notes(df, sample, flat: Sequence[str]) -> List[str]:
    """The caption lines on what the flatness rows measured where the launch had a training-loss target:
    at the target and at the end (``measure_at_train_loss``), or where ``stop_at_train_loss`` ended the
    trials."""
    measured_at = df.attrs.get(MEASURE_AT_TARGET)
    stopped_at = df.attrs.get(STOP_AT_TARGET)
    if measured_at is not None and any(q.startswith(AT_TARGET_PREFIX) for q in flat):
        return [
            f"flat_at_target/* rows: measured at the first epoch whose mean training loss was <= {measured_at} "
            "(measure_at_train_loss); seeds that missed it are counted in the seeds run and give no value. "
            "flat/* rows: the final models, after the last epoch."
        ]
    if not (flat and stopped_at_target(sample)):  # sample.attrs: df's (select_sample and at_target_view keep them)
        return []
    loss = f"mean training loss <= {stopped_at}" if stopped_at is not None else "the training-loss target"
    if any(q.startswith(AT_TARGET_PREFIX) for q in flat):
        return [
            f"flat_at_target/* rows: the flat/* of the seeds that reached {loss}, where stop_at_train_loss "
            "ended them; seeds that missed it are counted in the seeds run and give no value. flat/* rows: "
            "every completed seed's final model (a seed that missed the target trained to its last epoch)."
        ]
    return [
        f"flat/* rows: measured at {loss} (stop_at_train_loss), where every completed seed "
        "stopped: flatness at a matched training loss."
    ]


def stopped_at_target(sample) -> bool:
    """Whether ``sample``'s trials stopped at a training-loss target (``stop_at_train_loss``): a target
    outcome is recorded and the launch did not measure at the target and train on."""
    return sample.attrs.get(MEASURE_AT_TARGET) is None and has_values(sample, TARGET_REACHED)


def missed_target(sample):
    """Per row of ``sample``: a completed trial that recorded missing its training-loss target."""
    if TARGET_REACHED not in sample.columns:
        return pd.Series(False, index=sample.index)
    return completed(sample) & (pd.to_numeric(sample[TARGET_REACHED], errors="coerce") == 0.0)


def at_target_view(sample):
    """``sample`` with the flatness at the training-loss target as ``flat_at_target/*`` columns, for a
    ``stop_at_train_loss`` launch where a completed trial missed the target.

    A trial that reached the target stopped there and measured that model: its ``flat/<m>`` is its
    ``flat/<m>`` at the target. A trial that missed it trained to ``max_epochs``: its ``flat/<m>`` is
    of that model, at a higher training loss. So, where some trial missed, each ``flat/<m>`` column
    (auxiliary ``_stderr``/``_clean`` included) gets a ``flat_at_target/<m>`` copy with the values of the
    trials that reached the target (NaN elsewhere), and :func:`compare_table` shows both rows: at the
    matched training loss, and every completed seed's final model. Anything else (no target, every trial
    reached it, a ``measure_at_train_loss`` launch that logged its own ``flat_at_target/*``) is
    returned as it is. ``attrs`` are kept."""
    if not (stopped_at_target(sample) and missed_target(sample).any()):
        return sample
    reached = pd.to_numeric(sample[TARGET_REACHED], errors="coerce") == 1.0
    flat = [
        c
        for c in sample.columns
        if c.startswith(FLAT_PREFIX) and AT_TARGET_PREFIX + c[len(FLAT_PREFIX) :] not in sample
    ]
    out = sample.assign(
        **{
            AT_TARGET_PREFIX + c[len(FLAT_PREFIX) :]: pd.to_numeric(sample[c], errors="coerce").where(reached)
            for c in flat
        }
    )
    out.attrs.update(sample.attrs)
    return out


def target_misses(sample, arms: Optional[Sequence[str]] = None) -> List[str]:
    """The line a reader must see when seeds missed the training-loss target: which arms, how many of
    their completed seeds, the target, and what the flatness rows then hold (empty: no seed missed).

    Args:
        sample: the compared trials (:func:`select_sample`), with ``train/target_reached`` and the
            launch's target in ``attrs`` (``measure_at_train_loss`` or ``stop_at_train_loss``).
        arms: in this order (default: alphabetical).
    """
    missed = missed_target(sample)
    if not missed.any():
        return []
    done = completed(sample) & pd.to_numeric(sample[TARGET_REACHED], errors="coerce").notna()
    arms = [a for a in (arms or sorted(sample["arm"].unique())) if missed[sample["arm"] == a].any()]
    counts = ", ".join(
        f"{a} {int(missed[sample['arm'] == a].sum())} of {int(done[sample['arm'] == a].sum())}" for a in arms
    )
    measured_at = sample.attrs.get(MEASURE_AT_TARGET)
    kind, value = (
        (MEASURE_AT_TARGET, measured_at)
        if measured_at is not None
        else (STOP_AT_TARGET, sample.attrs.get(STOP_AT_TARGET))
    )
    target = f"{kind}: mean training loss <= {value}" if value is not None else kind
    return [
        f"Training-loss target missed ({target}): {counts} completed seeds. Those seeds have no flat_at_target/* "
        "value; their flat/* values are of the model after their last epoch, at a higher training loss than the "
        "target."
    ]
