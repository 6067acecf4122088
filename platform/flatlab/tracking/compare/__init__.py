"""The paper table of a study (``flatlab compare``), one module per job:

* :mod:`~flatlab.tracking.compare.statistics`: the t-interval of a mean over seeds, the paired
  per-seed test with its effect size, and Holm's adjustment over a family of tests
  (:func:`t_estimate`, :func:`paired_difference`, :func:`cohen_dz`, :func:`holm`, :func:`paired_power`);
* :mod:`~flatlab.tracking.compare.sample`: which trials the table is over (:func:`select_sample`, by
  the rules of :mod:`flatlab.tracking.selection`, which also names the default reference arm);
* :mod:`~flatlab.tracking.compare.table`: the comparison table itself (:func:`compare_table`,
  :class:`Comparison`);
* :mod:`~flatlab.tracking.compare.text`: its markdown, LaTeX, CSV and rich renderings;
* :mod:`~flatlab.tracking.compare.plot`: the test metric against flatness (:func:`plot_metric_vs_flatness`);
* :mod:`~flatlab.tracking.compare.publish`: the table and plot as artifacts of a launch's MLflow run
  (:func:`log_comparison`);
* :mod:`~flatlab.tracking.compare.efficiency`: HPO efficiency, a search's share of a grid's compute
  (:func:`hpo_efficiency`).

The names below are the package's public surface (``from flatlab.tracking import compare as cmp``).
"""

from flatlab.tracking.compare.efficiency import efficiency_cells, hpo_efficiency
from flatlab.tracking.compare.plot import plot_metric_vs_flatness
from flatlab.tracking.compare.publish import log_comparison
from flatlab.tracking.compare.sample import select_sample
from flatlab.tracking.compare.statistics import (
    CONFIDENCE, Estimate, Paired, cohen_dz, holm, paired_difference, paired_power, t_estimate,
)
from flatlab.tracking.compare.table import (
    EPOCHS_TO_TARGET, FEW_SEEDS, FLAT_PREFIX, STEPS_TO_TARGET, TARGET_REACHED, TARGETS, Comparison, Row, compare_table,
    higher_is_better, seed_values,
)
from flatlab.tracking.compare.text import (
    FORMATS, SIGNIFICANCE, caption, cells, format_comparison, headers, latex_escape, latex_table, markdown_table,
    multiplicity, render, to_csv, to_latex, to_markdown,
)

__all__ = [
    "CONFIDENCE", "EPOCHS_TO_TARGET", "FEW_SEEDS", "FLAT_PREFIX", "FORMATS", "SIGNIFICANCE", "STEPS_TO_TARGET",
    "TARGETS", "TARGET_REACHED", "Comparison", "Estimate", "Paired", "Row", "caption", "cells", "cohen_dz",
    "compare_table", "efficiency_cells", "format_comparison", "headers", "higher_is_better", "holm", "hpo_efficiency",
    "latex_escape", "latex_table", "log_comparison", "markdown_table", "multiplicity", "paired_difference",
    "paired_power", "plot_metric_vs_flatness", "render", "seed_values", "select_sample", "t_estimate", "to_csv",
    "to_latex", "to_markdown",
]
