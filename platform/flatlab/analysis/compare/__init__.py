"""The paper table of a study (``flatlab compare``), one module per job:

* :mod:`~flatlab.analysis.compare.statistics`: the t-interval of a mean over seeds, the paired
  per-seed test with its effect size, and Holm's adjustment over a family of tests
  (:func:`t_estimate`, :func:`paired_difference`, :func:`cohen_dz`, :func:`holm`, :func:`paired_power`);
* :mod:`~flatlab.analysis.compare.select`: which trials the table is over (:func:`select_sample`, by
  the rules of :mod:`flatlab.analysis.selection`, which also names the default reference arm);
* :mod:`~flatlab.analysis.compare.table`: the comparison table itself (:func:`compare_table`,
  :class:`Comparison`);
* :mod:`~flatlab.analysis.compare.columns`: its columns, each statistic one registered :class:`Column`
  (:func:`register_column`, :data:`COLUMNS`);
* :mod:`~flatlab.analysis.compare.text`: its markdown, LaTeX, CSV and rich renderings, over those columns;
* :mod:`~flatlab.analysis.compare.plot`: the test metric against flatness (:func:`plot_metric_vs_flatness`);
* :mod:`~flatlab.analysis.compare.efficiency`: HPO efficiency, a search's share of a grid's compute
  (:func:`hpo_efficiency`);
* :mod:`~flatlab.analysis.compare.multi`: one summary over several studies that share arms, each a
  workload (:func:`summarize` over a plain :func:`workload_table`; :func:`summary_from_frames`), with
  its text outputs in :mod:`~flatlab.analysis.compare.multi_text`;
* :mod:`~flatlab.analysis.compare.profiles`: performance profiles of the arms over the workloads
  (:func:`performance_ratios`, :func:`rho`, :func:`plot_profiles`).

Logging the table and plot to a launch's MLflow run is :func:`flatlab.reports.publish.log_comparison`.
The names below are the package's public surface (``from flatlab.analysis import compare as cmp``).
"""

from flatlab.analysis.compare.columns import COLUMNS, SIGNIFICANCE, Column, register_column
from flatlab.analysis.compare.efficiency import efficiency_cells, hpo_efficiency
from flatlab.analysis.compare.multi import MultiSummary, summarize, summary_from_frames, workload_table
from flatlab.analysis.compare.plot import plot_metric_vs_flatness
from flatlab.analysis.compare.profiles import (
    error_from_metric,
    error_matrix,
    performance_ratios,
    plot_profiles,
    profile,
    rho,
)
from flatlab.analysis.compare.select import select_sample
from flatlab.analysis.compare.statistics import (
    CONFIDENCE,
    Estimate,
    Paired,
    cohen_dz,
    holm,
    paired_difference,
    paired_power,
    t_estimate,
)
from flatlab.analysis.compare.table import (
    FEW_SEEDS,
    Comparison,
    Row,
    compare_table,
    higher_is_better,
    seed_values,
)
from flatlab.analysis.compare.text import (
    FORMATS,
    caption,
    cells,
    format_comparison,
    headers,
    latex_escape,
    latex_table,
    markdown_table,
    multiplicity,
    render,
    to_csv,
    to_latex,
    to_markdown,
)
from flatlab.analysis.sample import EPOCHS_TO_TARGET, FLAT_PREFIX, STEPS_TO_TARGET, TARGET_REACHED, TARGETS

__all__ = [
    "COLUMNS",
    "CONFIDENCE",
    "EPOCHS_TO_TARGET",
    "FEW_SEEDS",
    "FLAT_PREFIX",
    "FORMATS",
    "SIGNIFICANCE",
    "STEPS_TO_TARGET",
    "TARGETS",
    "TARGET_REACHED",
    "Column",
    "Comparison",
    "Estimate",
    "MultiSummary",
    "Paired",
    "Row",
    "caption",
    "cells",
    "cohen_dz",
    "compare_table",
    "efficiency_cells",
    "error_from_metric",
    "error_matrix",
    "format_comparison",
    "headers",
    "higher_is_better",
    "holm",
    "hpo_efficiency",
    "latex_escape",
    "latex_table",
    "markdown_table",
    "multiplicity",
    "paired_difference",
    "paired_power",
    "performance_ratios",
    "plot_metric_vs_flatness",
    "plot_profiles",
    "profile",
    "register_column",
    "render",
    "rho",
    "seed_values",
    "select_sample",
    "summarize",
    "summary_from_frames",
    "t_estimate",
    "to_csv",
    "to_latex",
    "to_markdown",
    "workload_table",
]
