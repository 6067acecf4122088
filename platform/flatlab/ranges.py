"""The values a study's quantities can take, as plain data (no torch): what comparison tables clip the
intervals of means to.

A metric's range follows from its name (:func:`metric_support`: accuracy in [0, 1], a correlation in
[-1, 1], a loss in the workload's loss range); a ``flat/*`` metric's from its measure's declaration
(:attr:`flatlab.sharpness.registry.Measure.support`). :class:`Ranges` holds both for one study; the layer
that knows the workload and the measures builds it (:func:`flatlab.workloads.ranges.ranges_of`) and hands
it to the analysis, which imports neither.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple, Union

Support = Tuple[float, float]
"""``(low, high)``: the values a quantity can take (``math.inf`` for no upper bound)."""

NONNEGATIVE: Support = (0.0, math.inf)
LOSS = "loss"
"""A measure's ``support`` entry for a loss-valued metric: the range of the workload's loss
(:attr:`flatlab.workloads.base.Workload.loss_support`), ``>= 0`` for cross-entropy, unbounded for a toy."""

SWEEPS = {"neighbourhood_loss": ("sigmas", "sigma"), "sam_objective": ("rhos", "rho"), "tilted_objective": ("ts", "t")}
"""``{measure: (its list parameter, the parameter it sweeps)}``: the measures that evaluate a list of values
in one trial (:mod:`flatlab.sharpness.measures`), each value logged as ``flat/<measure>/<param>_<value>``
(:func:`flatlab.sharpness.registry.sweep_key`) and drawn after the study (:mod:`flatlab.analysis.flatness_sweep`)."""

SHARES = ("accuracy", "f1")
"""Metric names (the part after the last ``/``) that are fractions, in [0, 1]."""
CORRELATIONS = ("matthews", "pearson", "spearman")
"""Metric names that are correlation coefficients, in [-1, 1] (GLUE's CoLA and STS-B metrics)."""


def metric_support(metric: str, loss_support: Optional[Support]) -> Optional[Support]:
    """The range of a workload metric, by the name after its last ``/`` (``test/accuracy`` -> ``accuracy``):
    :data:`SHARES` [0, 1]; :data:`CORRELATIONS` [-1, 1]; ``loss`` ``loss_support``; ``perplexity``
    = exp(loss) ``[exp(low), inf)`` (``(0, inf)`` without a loss range); anything else ``None``
    (unknown: unbounded)."""
    leaf = metric.rsplit("/", 1)[-1]
    if leaf in SHARES:
        return (0.0, 1.0)
    if leaf in CORRELATIONS:
        return (-1.0, 1.0)
    if leaf == "loss":
        return loss_support
    if leaf == "perplexity":
        return (math.exp(loss_support[0]), math.inf) if loss_support else (0.0, math.inf)
    return None


def declared_support(
    metric: str, declared: Mapping[str, Union[Support, str]], loss_support: Optional[Support]
) -> Optional[Support]:
    """The range ``declared`` gives ``metric`` (``{metric: (low, high) or LOSS}``, ``<s>`` in a key standing
    for any sweep value: ``flat/neighbourhood_loss/sigma_0.01`` matches ``flat/neighbourhood_loss/sigma_<s>``),
    ``LOSS`` read as ``loss_support``; ``None`` (unbounded) where no key matches."""
    for key, rng in declared.items():
        if re.fullmatch(re.escape(key).replace(re.escape("<s>"), r"[^/_]+"), metric):
            return loss_support if rng == LOSS else rng
    return None


@dataclass(frozen=True)
class Ranges:
    """The ranges of one study's quantities.

    Attributes:
        loss: the workload's loss range (``None``: unbounded, e.g. a toy's loss or an unknown workload).
        measures: every registered measure's declared ranges, ``{flat/* metric: (low, high) or LOSS}``.
    """

    loss: Optional[Support] = None
    measures: Mapping[str, Union[Support, str]] = field(default_factory=dict)

    def of(self, metric: str) -> Optional[Support]:
        """The range of ``metric``: a ``flat/*`` metric by :attr:`measures`, any other by its name
        (:func:`metric_support`); ``None`` where unbounded or unknown."""
        if metric.startswith("flat/"):
            return declared_support(metric, self.measures, self.loss)
        return metric_support(metric, self.loss)


NO_RANGES = Ranges()
"""Nothing known beyond the metric names: losses and ``flat/*`` metrics unbounded."""
