"""Axis cosmetics shared by the report plots: integer epoch ticks, tick labels without an offset, and
Optuna's parallel-coordinate plot made readable.

Matplotlib's default :class:`~matplotlib.ticker.ScalarFormatter` moves a common offset or power of ten
(``+9.123e-1``, ``1e6``) into a separate text at the axis end, where it overlaps a long axis label; an
epoch axis gets ticks at 1.5, 2.5 when a trial ran few epochs. Optuna's parallel coordinates carry a title
of their own under the caller's, label narrow log ranges at every minor tick (``7.3×10⁻²`` ...), draw the
worst trials near-white and put the colour bar over the last axis' labels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from flatlab.lazy import lazy

ticker = lazy("matplotlib.ticker")
mpl_colors = lazy("matplotlib.colors")


def integer_ticks(axis: Any) -> None:
    """Major ticks of ``axis`` (an ``ax.xaxis``/``ax.yaxis``) at integers only: for epochs and steps."""
    axis.set_major_locator(ticker.MaxNLocator(integer=True))


def plain_numbers(ax: Any) -> None:
    """Tick labels of both axes of ``ax`` written out in full (no offset, no ``1e6`` multiplier), so no
    offset text is drawn. Only linear axes with a :class:`~matplotlib.ticker.ScalarFormatter` change: log
    axes and axes with fixed labels (categories, Optuna's parallel coordinates) keep theirs. Call it after
    ``set_xscale``/``set_yscale``, which replace the formatter."""
    for axis in (ax.xaxis, ax.yaxis):
        formatter = axis.get_major_formatter()
        if isinstance(formatter, ticker.ScalarFormatter):
            formatter.set_useOffset(False)
            formatter.set_scientific(False)


def plain_figure(fig: Any) -> None:
    """:func:`plain_numbers` on every axes of ``fig``."""
    for ax in fig.axes:
        plain_numbers(ax)


def tidy_parallel_coordinate(fig: Any, ax: Any) -> None:
    """Make Optuna's matplotlib parallel-coordinate plot (``ax``, in ``fig``) readable: its own title
    removed (the caller's goes above the figure), each parameter axis labelled with at most five plain
    numbers (no ``7.5×10⁻²`` minor-tick labels on narrow log ranges), the lines' colour map cut
    to its darker 60 % so that the worst trials are not drawn near-white (the best stay darkest), and
    the colour bar moved right of the last parameter's tick labels."""
    ax.set_title("")
    colorbars = [a for a in fig.axes if a is not ax and getattr(a, "_colorbar", None) is not None]
    for coll in ax.collections:
        cmap = coll.get_cmap()
        shades = np.linspace(0.4, 1.0, 256)
        coll.set_cmap(mpl_colors.ListedColormap(cmap(shades if not cmap.name.endswith("_r") else shades[::-1])))
    plain = ticker.FuncFormatter(lambda v, _: f"{v:.3g}")
    for twin in fig.axes:
        if twin is ax or twin in colorbars or twin.get_yticklabels() and not _numeric_ticks(twin):
            continue  # the objective's axis, the colour bar, and categorical parameters keep theirs
        twin.yaxis.set_major_locator(ticker.MaxNLocator(nbins=5))
        twin.yaxis.set_major_formatter(plain)
        twin.yaxis.set_minor_locator(ticker.NullLocator())
        twin.yaxis.set_minor_formatter(ticker.NullFormatter())
    fig.set_size_inches(fig.get_size_inches()[0] * 1.25, fig.get_size_inches()[1])
    for cax in colorbars:  # after the widening: the colour bar keeps its width, moved right
        box = cax.get_position()
        cax.set_position([box.x0 + 0.06, box.y0, box.width, box.height])


def _numeric_ticks(ax: Any) -> bool:
    """Whether ``ax``'s y tick labels are placed by a locator (numbers), not fixed (categories)."""
    return not isinstance(ax.yaxis.get_major_locator(), ticker.FixedLocator)
