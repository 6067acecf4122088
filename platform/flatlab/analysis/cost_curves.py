"""Each arm's metric against its compute: the median and a band over final runs, in passes or seconds.

From the per-epoch histories (:mod:`flatlab.analysis.histories`): on a grid of ``points`` costs from 0 to
the largest total of any run (passes: ``compute/passes``; seconds: ``compute/train_s``), each run's value
at cost x is its metric at its last epoch whose cumulative cost is <= x (a step function; no value
before its first epoch ends, none beyond its own total). Per arm and x: the median over the runs with a
value (seeds and tunings pooled) and the band between their 25th and 75th percentiles, with ``n``, the
runs that contributed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import numpy as np

from flatlab.analysis.histories import check, runs, unit_column
from flatlab.analysis.plot_axes import plain_numbers
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")
matplotlib = lazy("matplotlib")
plt = lazy("matplotlib.pyplot")  # first read after matplotlib.use("Agg") in the plotting function

BAND = (25.0, 75.0)
"""The band's percentiles."""


def cost_curves(histories: Any, metric: str, unit: str, points: int = 50) -> Any:
    """The curves as a table: ``arm``, ``unit``, ``cost`` (the grid, in ``unit``), ``median``, ``low``,
    ``high`` (the :data:`BAND` percentiles), ``n`` (runs with a value there; rows with none left out).

    Raises:
        ConfigError: an unknown unit, a missing column, fewer than 2 points.
    """
    if points < 2:
        raise ConfigError(f"points must be at least 2; got {points!r}")
    column = unit_column(unit)
    h = check(histories, (column, metric))
    top = float(np.nanmax(h[column].to_numpy(dtype=float)))
    grid = np.linspace(0.0, top, points)
    by_arm: dict = {}
    for (_run, arm, _t, _s), rows in runs(h):
        rows = rows[np.isfinite(rows[metric].to_numpy(dtype=float))]
        cost, value = rows[column].to_numpy(dtype=float), rows[metric].to_numpy(dtype=float)
        at = np.searchsorted(cost, grid * (1 + 1e-12), side="right") - 1  # last epoch with cost <= x
        y = np.where(at >= 0, value[np.clip(at, 0, None)] if value.size else np.nan, np.nan)
        y = np.where(grid <= (cost[-1] if cost.size else -1) * (1 + 1e-12), y, np.nan)
        by_arm.setdefault(arm, []).append(y)
    out: List[dict] = []
    for arm, ys in sorted(by_arm.items()):
        stack = np.vstack(ys)
        for i, x in enumerate(grid):
            col = stack[:, i][np.isfinite(stack[:, i])]
            if col.size:
                low, med, high = np.percentile(col, [BAND[0], 50.0, BAND[1]])
                out.append(dict(arm=arm, unit=unit, cost=float(x), median=med, low=low, high=high, n=int(col.size)))
    return pd.DataFrame(out)


def plot_cost_curves(curves: Any, metric: str, path: Path, title: str = "") -> Path:
    """The curves of :func:`cost_curves` as a PNG at ``path`` (median line, band shaded, one colour per arm)."""
    matplotlib.use("Agg")
    unit = str(curves["unit"].iloc[0]) if len(curves) else ""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for arm, rows in curves.groupby("arm", sort=True):
        (line,) = ax.plot(rows["cost"], rows["median"], label=arm)
        ax.fill_between(rows["cost"], rows["low"], rows["high"], color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel({"passes": "passes (gradient evaluations)", "seconds": "training seconds"}.get(unit, unit))
    ax.set_ylabel(metric)
    ax.set_title(title or f"{metric} against {unit}: median and {BAND[0]:g}-{BAND[1]:g}th percentiles", fontsize=9)
    ax.legend(fontsize=8)
    plain_numbers(ax)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
