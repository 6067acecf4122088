"""Axis cosmetics shared by the report plots: integer epoch ticks and tick labels without an offset.

Matplotlib's default :class:`~matplotlib.ticker.ScalarFormatter` moves a common offset or power of ten
(``+9.123e-1``, ``1e6``) into a separate text at the axis end, where it overlaps a long axis label; an
epoch axis gets ticks at 1.5, 2.5 when a trial ran few epochs.
"""

from __future__ import annotations

from typing import Any


def integer_ticks(axis: Any) -> None:
    """Major ticks of ``axis`` (an ``ax.xaxis``/``ax.yaxis``) at integers only: for epochs and steps."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def plain_numbers(ax: Any) -> None:
    """Tick labels of both axes of ``ax`` written out in full (no offset, no ``1e6`` multiplier), so no
    offset text is drawn. Only linear axes with a :class:`~matplotlib.ticker.ScalarFormatter` change: log
    axes and axes with fixed labels (categories, Optuna's parallel coordinates) keep theirs. Call it after
    ``set_xscale``/``set_yscale``, which replace the formatter."""
    from matplotlib.ticker import ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        formatter = axis.get_major_formatter()
        if isinstance(formatter, ScalarFormatter):
            formatter.set_useOffset(False)
            formatter.set_scientific(False)


def plain_figure(fig: Any) -> None:
    """:func:`plain_numbers` on every axes of ``fig``."""
    for ax in fig.axes:
        plain_numbers(ax)
