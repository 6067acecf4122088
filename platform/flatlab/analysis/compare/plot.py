"""The figure of a comparison: the test metric against each flatness measure, one point per seed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import numpy as np

from flatlab.analysis.compare.select import select_sample
from flatlab.analysis.compare.statistics import finite
from flatlab.analysis.compare.table import FLAT_PREFIX, Comparison, seed_values
from flatlab.analysis.plot_axes import plain_numbers
from flatlab.analysis.results import _test_metric
from flatlab.analysis.sample import has_values
from flatlab.analysis.selection import completed
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")
mpl_figure = lazy("matplotlib.figure")
ticker = lazy("matplotlib.ticker")


def plot_metric_vs_flatness(data, path, *, metric: Optional[str] = None, all_trials: bool = False) -> Path:
    """Save a PNG: the test metric against each flatness measure, one point per seed (completed
    trials), one colour per arm (the legend right of the panels, off the points); one panel per
    ``flat/*`` measure (log x where a measure is positive and spans more than two decades). Linear axes' tick
    labels carry no offset text
    (:func:`flatlab.analysis.plot_axes.plain_numbers`).

    Args:
        data: a :class:`Comparison`, or a ``trials_frame`` table (its :func:`select_sample` is plotted).
        path: the PNG file to write (its folder must exist).
        metric: the test metric when ``data`` is a table (default as in :func:`compare_table`).
        all_trials: with a table, plot every completed trial (a search's trials, one point each)
            instead of its :func:`select_sample`.
    Returns:
        ``path`` as a ``Path``.
    Raises:
        ConfigError: no trials, or no ``flat/*`` measure with values.
    """
    if isinstance(data, Comparison):
        seeds, metric, title = data.seeds, data.metric, data.study
    else:
        sample = data[completed(data)] if all_trials else select_sample(data)[0]
        metric = metric or _test_metric(data) or "test/accuracy"
        seeds = seed_values(sample, [metric] + [c for c in sample.columns if c.startswith(FLAT_PREFIX)])
        title = ""
    measures = [c for c in seeds.columns if c.startswith(FLAT_PREFIX) and has_values(seeds, c)]
    if not measures:
        raise ConfigError("no flat/* measure recorded in the compared trials: nothing to plot against the test metric")
    cols = min(3, len(measures))
    nrows = math.ceil(len(measures) / cols)
    fig = mpl_figure.Figure(figsize=(4.2 * cols, 3.6 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, cols, squeeze=False)).ravel()
    colours = {arm: f"C{i % 10}" for i, arm in enumerate(sorted(seeds["arm"].unique()))}
    for ax, m in zip(axes, measures):
        x_all = pd.to_numeric(seeds[m], errors="coerce")
        for arm, colour in colours.items():
            mine = seeds["arm"] == arm
            x, y = x_all[mine], pd.to_numeric(seeds.loc[mine, metric], errors="coerce")
            ok = x.map(finite) & y.map(finite)
            ax.scatter(x[ok], y[ok], color=colour, label=arm, s=28, alpha=0.85)
        pos = x_all[x_all.map(finite)]
        if len(pos) and (pos > 0).all() and pos.max() / pos.min() > 100:
            ax.set_xscale("log")
        ax.set_xlabel(f"{m} (lower = flatter)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if ax.get_xscale() == "linear":  # labels written out in full (1000001.5) need room: about 4 ticks
            ax.xaxis.set_major_locator(ticker.MaxNLocator(nbins=4))
        plain_numbers(ax)
    for ax in axes[len(measures) :]:
        ax.set_visible(False)
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}  # every arm, once
    fig.legend(
        handles.values(), handles.keys(), loc="outside right upper", fontsize="small", title="arm"
    )  # off the points
    if title:
        fig.suptitle(f"{title}: {metric} against flatness\n(one point per seed)", fontsize="medium")
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path
