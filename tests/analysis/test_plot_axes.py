"""Report plots: integer epoch ticks and no offset text (``+9.123e-1``, ``1e6``) next to an axis label."""

from types import SimpleNamespace

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter, MaxNLocator

from flatlab.analysis.plot_axes import plain_numbers

# accuracies that differ in the 5th decimal: matplotlib's default labels them as an offset (+9.123e-1)
CURVES = {"r1": [0.91231, 0.91234, 0.91236], "r2": [0.91232, 0.91235]}


class FakeClient:
    """``get_metric_history`` as MLflow's client returns it: metrics with step (= epoch), value, timestamp."""

    def get_metric_history(self, run_id, key):
        return [SimpleNamespace(step=e + 1, value=v, timestamp=1000 + e) for e, v in enumerate(CURVES[run_id])]


def _drawn(monkeypatch, build):
    """The figures ``build()`` saves, drawn by Agg (offset texts are set while drawing)."""
    figs = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: figs.append(fig))
    build()
    monkeypatch.undo()
    for fig in figs:
        FigureCanvasAgg(fig).draw()
    return figs


def _offset_texts(fig):
    return [a.get_offset_text().get_text() for ax in fig.axes if ax.get_visible() for a in (ax.xaxis, ax.yaxis)]


def test_the_data_would_show_an_offset_by_default():
    fig = Figure()
    ax = fig.subplots()
    ax.plot([1, 2, 3], CURVES["r1"])
    FigureCanvasAgg(fig).draw()
    assert ax.yaxis.get_offset_text().get_text() != ""  # what the report must not show
    assert any(t != int(t) for t in ax.get_xticks())  # and half-epoch ticks


def test_learning_curves_have_integer_epoch_ticks_and_no_offset(monkeypatch, tmp_path):
    from flatlab.reports.study_report import plot_learning_curves

    df = pd.DataFrame(
        {
            "run_id": ["r1", "r2"],
            "arm": ["sgd", "tsam"],
            "outcome": ["completed", "pruned"],
            "stage": ["search", "search"],
        }
    )
    (fig,) = _drawn(monkeypatch, lambda: plot_learning_curves(FakeClient(), df, "val/accuracy", tmp_path / "c.png"))
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["sgd (1 trials)", "tsam (1 trials)"]
    for ax in panels:
        locator = ax.xaxis.get_major_locator()
        assert isinstance(locator, MaxNLocator) and locator._integer
        lo, hi = ax.get_xlim()
        shown = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert shown and all(t == int(t) for t in shown)
        assert ax.xaxis.get_major_formatter().get_useOffset() is False
        assert ax.yaxis.get_major_formatter().get_useOffset() is False
    assert _offset_texts(fig) == ["", "", "", ""]
    labels = [t.get_text() for t in panels[0].get_yticklabels() if t.get_text()]
    assert labels and all(label.startswith("0.9123") for label in labels)  # written out in full


def test_metric_vs_flatness_has_no_offset_and_keeps_its_log_axis(monkeypatch, tmp_path):
    from flatlab.analysis.compare import plot_metric_vs_flatness

    df = pd.DataFrame(
        {
            "arm": ["sgd", "sgd", "sam", "sam"],
            "seed": [0, 1, 0, 1],
            "outcome": ["completed"] * 4,
            "test/accuracy": [0.91231, 0.91233, 0.91235, 0.91237],
            "flat/fisher_trace": [1_000_001.0, 1_000_002.0, 1_000_003.0, 1_000_004.0],  # linear: "+1e6" by default
            "flat/sharpness": [1e-4, 1e-3, 1e-2, 1e-1],  # four decades: log x
        }
    )
    (fig,) = _drawn(monkeypatch, lambda: plot_metric_vs_flatness(df, tmp_path / "f.png", all_trials=True))
    fisher, sharp = [ax for ax in fig.axes if ax.get_visible()]
    assert fisher.get_xlabel().startswith("flat/fisher_trace") and fisher.get_xscale() == "linear"
    assert sharp.get_xscale() == "log" and isinstance(sharp.xaxis.get_major_formatter(), LogFormatter)
    assert fisher.xaxis.get_major_formatter().get_useOffset() is False
    assert _offset_texts(fig) == ["", "", "", ""]
    boxes = sorted((t.get_window_extent() for t in fisher.get_xticklabels() if t.get_text()), key=lambda b: b.x0)
    assert len(boxes) >= 2 and all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))  # full labels do not collide
    # the legend (one entry per arm) is the figure's, right of every panel: it covers no point
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["sam", "sgd"] and not fisher.get_legend()
    box = legend.get_window_extent()
    assert all(box.x0 >= ax.get_window_extent().x1 for ax in (fisher, sharp))


def test_parallel_coordinates_are_readable(monkeypatch, tmp_path):
    """Optuna's parallel coordinates after tidy_parallel_coordinate: one title (the caller's), at most five
    plain labels per parameter axis (a narrow log range gets no 7.5x10^-2 minor labels), no near-white
    line, and the colour bar clear of the last axis' labels."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    import optuna

    from flatlab.analysis.plot_axes import tidy_parallel_coordinate
    from flatlab.reports.study_report import _optuna_png

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.create_study(direction="maximize")
    dists = {
        "lr": optuna.distributions.FloatDistribution(0.07, 0.08, log=True),
        "rho": optuna.distributions.FloatDistribution(0.11, 0.12, log=True),
    }
    for lr, rho, acc in ((0.071, 0.111, 0.5), (0.075, 0.115, 0.7), (0.079, 0.119, 0.9)):
        st.add_trial(optuna.trial.create_trial(params={"lr": lr, "rho": rho}, distributions=dists, value=acc))

    def draw():
        return optuna.visualization.matplotlib.plot_parallel_coordinate(st, target_name="val/accuracy")

    (fig,) = _drawn(
        monkeypatch, lambda: _optuna_png(draw, tmp_path / "p.png", "sam: val/accuracy", tidy=tidy_parallel_coordinate)
    )
    main = fig.axes[0]
    assert main.get_title() == "" and fig.get_suptitle() == "sam: val/accuracy"
    cbar = next(ax for ax in fig.axes if getattr(ax, "_colorbar", None) is not None)
    twins = [ax for ax in fig.axes if ax is not main and ax is not cbar]
    assert len(twins) == 2
    for ax in twins:
        lo, hi = sorted(ax.get_ylim())
        labels = [t for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]
        assert 2 <= len(labels) <= 6 and not any("10^" in t.get_text() or "times" in t.get_text() for t in labels)
        assert not [t for t in ax.get_yticklabels(minor=True) if t.get_text()]
    (lines,) = main.collections
    worst = lines.get_cmap()(lines.norm(0.5))
    best = lines.get_cmap()(lines.norm(0.9))
    assert np.mean(worst[:3]) < 0.85 and np.mean(best[:3]) < np.mean(worst[:3])  # not near-white; the best darkest
    label_right = max(t.get_window_extent().x1 for t in twins[-1].get_yticklabels() if t.get_text())
    assert cbar.get_window_extent().x0 > label_right  # the colour bar starts right of the last labels


def test_optuna_pngs_have_no_offset(monkeypatch, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flatlab.reports.study_report import _optuna_png

    def draw():
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], CURVES["r1"])
        ax.set_xticks([1, 2, 3], ["a", "b", "c"])  # fixed labels (as Optuna's parallel coordinates): left alone
        return ax

    (fig,) = _drawn(monkeypatch, lambda: _optuna_png(draw, tmp_path / "o.png", "t"))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["a", "b", "c"]
    assert _offset_texts(fig) == ["", ""]


def test_plain_numbers_leaves_log_axes_alone():
    ax = Figure().subplots()
    ax.set_yscale("log")
    before = ax.yaxis.get_major_formatter()
    plain_numbers(ax)
    assert ax.yaxis.get_major_formatter() is before and ax.xaxis.get_major_formatter().get_useOffset() is False
    with pytest.raises(AttributeError):
        before.get_useOffset()
