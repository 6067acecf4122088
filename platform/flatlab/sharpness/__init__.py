"""Sharpness and curvature measures over a fixed evaluation subset.

Public surface (everything takes ``model, data`` first; ``params`` restricts a measure to one group):

* grouping: :class:`GroupRule`, :class:`Grouping`, :func:`group_parameters`, :func:`get_grouping`,
  :func:`select_group`, :data:`GROUPINGS` (``clip``, ``vit``, ``modules``);
* data: :class:`EvalSubset`, :func:`as_subset`;
* average-case adaptive sharpness (Andriushchenko et al. 2023; seed "In Search of the Successful
  Interpolation", App. A): :func:`average_sharpness`, :func:`average_sharpness_batched`,
  :func:`layerwise_sharpness`;
* worst-case adaptive sharpness: :func:`worst_case_sharpness`;
* curvature: :func:`hessian_trace` (Hutchinson 1989), :func:`top_hessian_eigenvalue`,
  :func:`hessian_vector_product`, :func:`fisher_trace` (IRE's measure);
* TSAM's flatness measure: :func:`neighbourhood_loss`;
* the measures registry (:mod:`flatlab.sharpness.registry`: :class:`Measure`, :func:`get_measure`,
  :func:`list_measures`; each measure registers itself beside its estimator) and what trials and studies
  run (:mod:`flatlab.sharpness.measures`): :func:`resolve_measures`, :func:`compute_measures`,
  :func:`measure_subset`.

Equations, units, defaults and metric keys: ``docs/algorithms/flatness.md``.
"""

from flatlab.sharpness.average import average_sharpness, layerwise_sharpness, neighbourhood_loss
from flatlab.sharpness.batched import average_sharpness_batched
from flatlab.sharpness.data import EvalSubset, as_subset
from flatlab.sharpness.fisher import fisher_trace
from flatlab.sharpness.grouping import (
    GROUPINGS,
    Grouping,
    GroupRule,
    clip_grouping,
    get_grouping,
    group_parameters,
    keys_of,
    module_grouping,
    select_group,
    vit_grouping,
)
from flatlab.sharpness.hessian import hessian_trace, hessian_vector_product, top_hessian_eigenvalue
from flatlab.sharpness.measures import (
    MEASURES,
    Measure,
    compute_measures,
    get_measure,
    list_measures,
    measure_subset,
    register_measure,
    resolve_measures,
)
from flatlab.sharpness.results import (
    EigenEstimate,
    Estimate,
    NeighbourhoodLoss,
    SharpnessEstimate,
    WorstCaseSharpness,
)
from flatlab.sharpness.worst_case import worst_case_sharpness

__all__ = [
    "GROUPINGS",
    "MEASURES",
    "EigenEstimate",
    "Estimate",
    "EvalSubset",
    "GroupRule",
    "Grouping",
    "Measure",
    "NeighbourhoodLoss",
    "SharpnessEstimate",
    "WorstCaseSharpness",
    "as_subset",
    "average_sharpness",
    "average_sharpness_batched",
    "clip_grouping",
    "compute_measures",
    "fisher_trace",
    "get_grouping",
    "get_measure",
    "group_parameters",
    "hessian_trace",
    "hessian_vector_product",
    "keys_of",
    "layerwise_sharpness",
    "list_measures",
    "measure_subset",
    "module_grouping",
    "neighbourhood_loss",
    "register_measure",
    "resolve_measures",
    "select_group",
    "top_hessian_eigenvalue",
    "vit_grouping",
    "worst_case_sharpness",
]
