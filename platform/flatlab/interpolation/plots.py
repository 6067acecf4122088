"""PNG figures of interpolation sweeps and sharpness along alpha (logged later as MLflow artifacts).

Uses ``matplotlib.figure.Figure`` with the Agg canvas directly: no pyplot, no global backend switch,
safe in worker processes without a display. Every function writes one PNG and returns its path; the
x axis is always alpha = weight on the FINE-TUNED model (WiSE-FT convention; the seed paper "In Search
of the Successful Interpolation" plots its alpha = weight on the zero-shot model, i.e. ``1 - alpha``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence, Tuple, Union

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from flatlab.errors import ConfigError
from flatlab.interpolation.sweep import SweepResult

PathLike = Union[str, os.PathLike]
_XLABEL = "alpha (weight on the fine-tuned model)"


def _save(fig: Figure, path: PathLike, dpi: int) -> Path:
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise ConfigError(f"plots are written as PNG; the path must end in .png, got {str(path)!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def _values_and_errors(series: Sequence[Any]) -> Tuple[list, list]:
    values = [float(getattr(v, "value", v)) for v in series]
    errors = [float(getattr(v, "stderr", 0.0)) for v in series]
    return values, errors


def _check_len(name: str, alphas: Sequence[float], series: Sequence[Any]) -> None:
    if len(series) != len(alphas):
        raise ConfigError(f"{name!r} has {len(series)} values for {len(alphas)} alphas")


def plot_sweeps(sweeps: Mapping[str, SweepResult], path: PathLike, *, split: str = "ood", dpi: int = 120) -> Path:
    """Accuracy (left) and loss (right) on ``split`` vs alpha, one line per model (``{label: sweep}``).

    Raises:
        ConfigError: no sweeps, a sweep without ``split``, a path not ending in ``.png``.
    """
    if not sweeps:
        raise ConfigError("plot_sweeps needs at least one sweep")
    fig = Figure(figsize=(10, 4))
    ax_acc, ax_loss = fig.subplots(1, 2)
    for label, sweep in sweeps.items():
        if split not in sweep.accuracy:
            raise ConfigError(f"sweep {label!r} has no split {split!r}; it has: {', '.join(sweep.accuracy)}")
        ax_acc.plot(sweep.alphas, sweep.accuracy[split], marker=".", label=label)
        ax_loss.plot(sweep.alphas, sweep.loss[split], marker=".", label=label)
    ax_acc.set(xlabel=_XLABEL, ylabel=f"{split} accuracy", title=f"{split} accuracy vs alpha")
    ax_loss.set(xlabel=_XLABEL, ylabel=f"{split} loss", title=f"{split} loss vs alpha")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_sharpness_vs_alpha(
    alphas: Sequence[float], sharpness: Mapping[str, Sequence[Any]], path: PathLike, *, dpi: int = 120
) -> Path:
    """General sharpness vs alpha, one line per model; values are floats or estimates with ``.value``
    and ``.stderr`` (shaded +-1 standard error).

    Raises:
        ConfigError: no series, a series whose length differs from ``alphas``, a non-PNG path.
    """
    if not sharpness:
        raise ConfigError("plot_sharpness_vs_alpha needs at least one series")
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for label, series in sharpness.items():
        _check_len(label, alphas, series)
        values, errors = _values_and_errors(series)
        ax.plot(alphas, values, marker=".", label=label)
        if any(e == e and e > 0 for e in errors):  # skip NaN / zero errors
            lo = [v - (e if e == e else 0.0) for v, e in zip(values, errors)]
            hi = [v + (e if e == e else 0.0) for v, e in zip(values, errors)]
            ax.fill_between(alphas, lo, hi, alpha=0.2)
    ax.set(xlabel=_XLABEL, ylabel="average adaptive sharpness (loss units)", title="sharpness vs alpha")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_layerwise_heatmap(
    alphas: Sequence[float],
    layerwise: Mapping[str, Sequence[Any]],
    path: PathLike,
    *,
    title: str = "layer-wise sharpness",
    dpi: int = 120,
) -> Path:
    """Heat map of layer-wise sharpness: one row per layer (``{layer: values per alpha}``, e.g.
    ``SharpnessPath.layerwise``), one column per alpha.

    Raises:
        ConfigError: no layers, a row whose length differs from ``alphas``, a non-PNG path.
    """
    if not layerwise:
        raise ConfigError("plot_layerwise_heatmap needs at least one layer")
    rows = []
    for layer, series in layerwise.items():
        _check_len(layer, alphas, series)
        rows.append(_values_and_errors(series)[0])
    names = list(layerwise)
    fig = Figure(figsize=(max(6.0, 0.35 * len(alphas) + 3), max(3.0, 0.28 * len(names) + 1.5)))
    ax = fig.subplots()
    image = ax.imshow(rows, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(names)), labels=names, fontsize="x-small")
    step = max(1, len(alphas) // 10)
    ax.set_xticks(range(0, len(alphas), step), labels=[f"{a:g}" for a in alphas[::step]])
    ax.set(xlabel=_XLABEL, title=title)
    fig.colorbar(image, ax=ax, label="sharpness (loss units)")
    fig.tight_layout()
    return _save(fig, path, dpi)


def plot_pruned_vs_unpruned(
    unpruned: SweepResult, pruned: SweepResult, path: PathLike, *, split: str = "ood", dpi: int = 120
) -> Path:
    """Accuracy and loss on ``split`` vs alpha with and without straggler pruning (seed Algorithm 1)."""
    return plot_sweeps({"interpolation": unpruned, "straggler-pruned": pruned}, path, split=split, dpi=dpi)


def plot_layerwise_interpolation(
    full: SweepResult,
    layers: Mapping[str, SweepResult],
    path: PathLike,
    *,
    splits: Sequence[str] = ("val", "ood"),
    dpi: int = 120,
) -> Path:
    """Seed paper Fig. 2: accuracy vs alpha on each of ``splits`` (one panel each) when only one layer group
    is interpolated (Def. 1.1; ``{group: sweep}``, one line per group, coloured by depth in the given
    order), with the whole-model interpolation ``full`` dashed for reference.

    Raises:
        ConfigError: no layers, a sweep without one of ``splits``, a non-PNG path.
    """
    if not layers:
        raise ConfigError("plot_layerwise_interpolation needs at least one layer group")
    fig = Figure(figsize=(5.5 * len(splits), 4.5))
    axes = fig.subplots(1, len(splits), squeeze=False)[0]
    cmap = matplotlib.colormaps["viridis"]
    for ax, split in zip(axes, splits):
        for i, (group, sweep) in enumerate(layers.items()):
            if split not in sweep.accuracy:
                raise ConfigError(f"layer {group!r} has no split {split!r}; it has: {', '.join(sweep.accuracy)}")
            colour = cmap(i / max(1, len(layers) - 1))
            ax.plot(sweep.alphas, sweep.accuracy[split], marker=".", color=colour, label=group, linewidth=1)
        if split in full.accuracy:
            ax.plot(full.alphas, full.accuracy[split], "k--", label="whole model", linewidth=1.5)
        ax.set(xlabel=_XLABEL, ylabel=f"{split} accuracy", title=f"{split}: one layer interpolated")
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize="xx-small", ncol=2 if len(layers) > 10 else 1)
    fig.tight_layout()
    return _save(fig, path, dpi)
