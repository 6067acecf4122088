"""The :class:`~flatlab.ranges.Ranges` of a study's quantities, from the registries that declare them: the
workload's loss range (:attr:`flatlab.workloads.base.Workload.loss_support`) and every registered
measure's (:attr:`flatlab.sharpness.registry.Measure.support`). Built here, above both registries, and
handed to the analysis (:func:`flatlab.analysis.compare.table.compare_table` and the other comparisons)."""

from __future__ import annotations

from typing import Optional

from flatlab.errors import UnknownNameError
from flatlab.ranges import Ranges
from flatlab.sharpness.registry import declared_ranges
from flatlab.workloads.registry import get_workload


def ranges_of(workload: Optional[str]) -> Ranges:
    """The ranges of a study of the registered ``workload`` (a name; ``None`` or an unregistered name, such
    as an extension's workload not loaded here: its loss unbounded, as it may be negative)."""
    loss = None
    if workload:
        try:
            loss = get_workload(workload).loss_support
        except UnknownNameError:
            loss = None
    return Ranges(loss, declared_ranges())
