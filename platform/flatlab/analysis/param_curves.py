"""Per-epoch curves of one arm, one curve per value of a searched parameter, each at that value's best
configuration (TSAM paper, Fig. 3: test accuracy over training for each t).

For each value ``v`` of parameter ``by`` (e.g. ``t``), the arm's completed search trials with ``by = v``
compete by the study's own rule (:mod:`flatlab.analysis.selection`: the mean of the study metric over
seeds, chosen on validation, never on test); the curve of ``v`` is the mean over that configuration's
seeds of a per-epoch metric (e.g. ``test/accuracy``, logged every epoch with ``test_every_epoch``), at
the epochs every seed recorded. Reading the histories is the caller's (this module reads no store).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from flatlab.analysis.plot_axes import integer_ticks, plain_numbers
from flatlab.analysis.selection import best_configurations, frame_trials
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

mpl_figure = lazy("matplotlib.figure")


@dataclass(frozen=True)
class ValueCurve:
    """The curve of one value of the parameter.

    Attributes:
        value: the parameter's value.
        config: the chosen configuration's params (``param.*`` without the prefix).
        score: its mean of the study metric over seeds (the selection score).
        runs: its trials' row labels in the trials table (one per seed).
        points: ``(epoch, mean, standard deviation over seeds (0 for one seed), seeds)``, epochs ascending.
    """

    value: Any
    config: Mapping[str, Any]
    score: float
    runs: Tuple[Any, ...]
    points: Tuple[Tuple[int, float, float, int], ...] = ()


def best_per_value(df, arm: str, by: str) -> List[ValueCurve]:
    """The best configuration of ``arm`` at each value of parameter ``by``, values ascending.

    Args:
        df: a ``trials_frame`` table (its ``attrs`` give the study's ``metric`` and ``mode``).
        arm: the arm whose trials are split by ``by``.
        by: a parameter the arm searches (column ``param.<by>``).

    Returns:
        One :class:`ValueCurve` without points per value that has a completed trial.

    Raises:
        ConfigError: no trial of ``arm`` in ``df``, or ``by`` is not one of its parameters.
    """
    rows = df[df["arm"] == arm] if not df.empty else df
    if rows.empty:
        raise ConfigError(f"no trial of arm {arm!r}; arms: {', '.join(sorted(set(df.get('arm', []))))}")
    column = f"param.{by}"
    if column not in rows.columns or rows[column].isna().all():
        params = sorted(c[len("param.") :] for c in rows.columns if c.startswith("param."))
        raise ConfigError(f"arm {arm!r} has no parameter {by!r}; its parameters: {', '.join(params)}")
    trials = [replace(t, arm=repr(rows.loc[t.ref, column])) for t in frame_trials(rows)]
    best = best_configurations(trials, rows.attrs.get("mode", "max"))
    out = []
    for config in best.values():
        label = config.trials[0].ref
        out.append(
            ValueCurve(
                value=_plain(rows.loc[label, column]),
                config={c[len("param.") :]: _plain(rows.loc[label, c]) for c in rows.columns if c.startswith("param.")},
                score=config.mean,
                runs=tuple(t.ref for t in config.trials),
            )
        )
    return sorted(out, key=lambda c: (not isinstance(c.value, (int, float)), c.value))


def mean_curve(histories: Sequence[Mapping[int, float]]) -> Tuple[Tuple[int, float, float, int], ...]:
    """``(epoch, mean, sd, n)`` over seeds at every epoch where each history has a finite value.

    Args:
        histories: one ``{epoch: value}`` per seed.

    Returns:
        Epochs ascending; ``sd`` is the sample standard deviation (0 for one seed); empty without histories.
    """
    if not histories:
        return ()
    common = set.intersection(*(set(e for e, v in h.items() if math.isfinite(v)) for h in histories))
    out = []
    for epoch in sorted(common):
        values = [float(h[epoch]) for h in histories]
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        out.append((int(epoch), math.fsum(values) / len(values), sd, len(values)))
    return tuple(out)


def plot_value_curves(curves: Sequence[ValueCurve], by: str, metric: str, title: str, path: Path) -> Path:
    """Save a PNG: ``metric`` against the epoch, one line (mean over seeds, a band of +- one sd) per value.

    Raises:
        ValueError: no curve has a point.
    """
    drawn = [c for c in curves if c.points]
    if not drawn:
        raise ValueError(f"no curve of {metric!r} to draw")
    fig = mpl_figure.Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for i, c in enumerate(drawn):
        epochs, means, sds = (list(x) for x in zip(*((p[0], p[1], p[2]) for p in c.points)))
        ax.plot(epochs, means, color=f"C{i % 10}", label=f"{by} = {c.value:g}" if _number(c.value) else str(c.value))
        low, high = [m - s for m, s in zip(means, sds)], [m + s for m, s in zip(means, sds)]
        ax.fill_between(epochs, low, high, color=f"C{i % 10}", alpha=0.2)
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    integer_ticks(ax.xaxis)
    plain_numbers(ax)
    fig.savefig(path, dpi=110)
    return Path(path)


def _plain(value: Any) -> Any:
    """A table cell as a Python value (numpy scalars as ``int``/``float``)."""
    return value.item() if hasattr(value, "item") else value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def curves_summary(curves: Sequence[ValueCurve], by: str, metric: str) -> Dict[str, Any]:
    """The curves as plain JSON-ready data: ``{"by", "metric", "values": [{value, config, score, points}]}``."""
    return {
        "by": by,
        "metric": metric,
        "values": [
            {
                "value": c.value,
                "config": {k: _plain(v) for k, v in c.config.items() if _present(v)},
                "score": c.score,
                "points": [list(p) for p in c.points],
            }
            for c in curves
        ],
    }


def _present(v: Any) -> bool:
    """Whether ``v`` is a value, not NaN or pandas' NA (a parameter this trial's arm does not have)."""
    try:
        return bool(v == v)
    except TypeError:  # pandas.NA: its truth value is ambiguous
        return False


def _plain(v: Any) -> Any:
    """A numpy scalar as the Python number JSON writes."""
    return v.item() if hasattr(v, "item") else v
