"""Performance profiles of arms over workloads (``flatlab compare STUDY_A STUDY_B ...``).

The definition (Dolan & Moré, "Benchmarking optimization software with performance profiles",
*Math. Program.* 91:201-213, 2002; as used by AlgoPerf: Dahl et al., "Benchmarking Neural Network
Training Algorithms", arXiv:2306.07179, 2023): for arm ``a`` and workload ``w`` with
a cost ``c_{a,w} > 0`` (lower is better), the performance ratio is

    r_{a,w} = c_{a,w} / min_b c_{b,w}   (>= 1; 1 for the best arm of the workload),

and the arm's profile is the share of the ``n_w`` workloads on which it is within a factor ``tau`` of
the best,

    rho_a(tau) = |{w : r_{a,w} <= tau}| / n_w,   tau >= 1,

a non-decreasing, right-continuous step function: ``rho_a(1)`` is the share of workloads the arm wins
(ties count for every tied arm), and ``rho_a(tau)`` for large ``tau`` the share it solves at all.

AlgoPerf's cost is the time to reach a workload's validation target. Here the cost is the **test
error** of the arm's final seeds' mean test metric (:func:`error_from_metric`): ``1 − metric`` for an
accuracy-like metric in [0, 1] (higher is better), the metric itself for a loss or perplexity (lower is
better). As in both papers, an arm that did not solve a workload gets ``r = inf`` (never within any
``tau``): here, an arm absent from a study, or without a value of its test metric there.
A workload whose best error is 0 gives ``r = 1`` to every arm with error 0 and ``inf`` to the rest.

The functions work on a plain table (:func:`flatlab.analysis.compare.multi.workload_table`), so they
need no MLflow.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Optional, Sequence

from flatlab.analysis.compare.statistics import finite
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")
mpl_figure = lazy("matplotlib.figure")

TAU_MARGIN = 1.05
"""The default tau_max is this factor above the largest finite ratio, so every step is visible."""


def error_from_metric(mean: float, higher_is_better: bool, *, what: str = "the test metric") -> float:
    """The cost a profile compares: ``1 − mean`` for a higher-is-better metric (an accuracy in
    [0, 1]), ``mean`` for a lower-is-better one (a loss, perplexity or error, >= 0). NaN stays NaN
    (no value: not solved).

    Raises:
        ConfigError: a higher-is-better mean above 1 (not an accuracy-like share, so ``1 − mean`` is
            no error) or a negative lower-is-better mean; ``what`` names the workload and metric.
    """
    if not finite(mean):
        return float("nan")
    mean = float(mean)
    if higher_is_better:
        if mean > 1:
            raise ConfigError(
                f"{what} has mean {mean:g} > 1: a performance profile needs an accuracy-like metric in [0, 1] "
                "(error 1 − metric) or a lower-is-better one (a loss); choose one with --metric"
            )
        return 1.0 - mean
    if mean < 0:
        raise ConfigError(f"{what} has mean {mean:g} < 0: a lower-is-better metric used as an error must be >= 0")
    return mean


def error_matrix(table):
    """The test error of each arm on each workload from a plain table (one row per workload, arm,
    quantity; its ``test_metric`` rows): index the arms (sorted), columns the workloads (in the
    table's order), NaN where an arm has no value on a workload (absent from the study, or no seed
    with a value).

    Raises:
        ConfigError: as :func:`error_from_metric`.
    """
    rows = table[table["test_metric"].astype(bool)]
    workloads = list(dict.fromkeys(table["workload"]))
    arms = sorted(set(table["arm"]))
    out = pd.DataFrame(float("nan"), index=pd.Index(arms, name="arm"), columns=workloads)
    for r in rows.itertuples(index=False):
        out.loc[r.arm, r.workload] = error_from_metric(
            r.mean, bool(r.higher_is_better), what=f"{r.quantity} of {r.workload}"
        )
    return out


def performance_ratios(errors):
    """``r_{a,w} = e_{a,w} / min_b e_{b,w}`` for an error matrix (arms × workloads, as
    :func:`error_matrix`): ``inf`` where the arm has no error (not solved), ``1`` for every arm tied
    with the best, ``inf`` for arms above a best error of 0; a workload without any error is ``inf``
    for every arm."""
    ratios = errors.copy().astype(float)
    for w in errors.columns:
        col = errors[w]
        solved = col[col.map(finite)]
        for arm, e in col.items():
            if not finite(e):
                ratios.loc[arm, w] = math.inf
                continue
            best = float(solved.min())
            ratios.loc[arm, w] = 1.0 if e == best else (math.inf if best == 0 else float(e) / best)
    return ratios


def rho(ratios, tau: float):
    """``rho_a(tau)`` for every arm (a Series over ``ratios``' index): the share of the workloads
    (``ratios``' columns) with ``r_{a,w} <= tau``.

    Raises:
        ConfigError: ``tau < 1`` or no workloads.
    """
    if not finite(tau) or tau < 1:
        raise ConfigError(f"tau={tau!r}; a performance profile is defined for tau >= 1")
    if ratios.shape[1] == 0:
        raise ConfigError("no workloads: a performance profile needs at least one")
    return (ratios <= tau).sum(axis=1) / ratios.shape[1]


def profile(ratios, taus: Sequence[float]):
    """``rho_a(tau)`` at each of ``taus``: index the taus, one column per arm."""
    return pd.DataFrame({t: rho(ratios, t) for t in taus}).T.rename_axis("tau")


def default_tau_max(ratios) -> float:
    """:data:`TAU_MARGIN` times the largest finite ratio (at least ``TAU_MARGIN``)."""
    values = [float(v) for v in ratios.to_numpy().ravel() if finite(v)]
    return TAU_MARGIN * max(values + [1.0])


def breakpoints(ratios, tau_max: float):
    """The taus where some profile steps, within ``[1, tau_max]``, with 1 and ``tau_max``: sorted."""
    inside = {float(v) for v in ratios.to_numpy().ravel() if finite(v) and 1 <= v <= tau_max}
    return sorted(inside | {1.0, float(tau_max)})


def plot_profiles(ratios, path, *, tau_max: Optional[float] = None, title: str = "") -> Path:
    """Save a PNG of the performance profiles: ``rho_a(tau)`` against ``tau`` in ``[1, tau_max]``, one
    step line per arm (drawn ``where="post"``: each value holds from its breakpoint to the next).

    Args:
        ratios: :func:`performance_ratios` (arms × workloads).
        path: the PNG file to write (its folder is created).
        tau_max: the right end of the tau axis (default :func:`default_tau_max`); > 1.
        title: the figure's title (default names the workloads).
    Returns:
        ``path`` as a ``Path``.
    Raises:
        ConfigError: ``tau_max <= 1``; no arms or workloads.
    """
    if ratios.shape[0] == 0 or ratios.shape[1] == 0:
        raise ConfigError("no arms or no workloads: nothing to plot")
    tau_max = default_tau_max(ratios) if tau_max is None else tau_max
    if not finite(tau_max) or tau_max <= 1:
        raise ConfigError(f"tau_max={tau_max!r}; expected a number > 1")
    taus = breakpoints(ratios, tau_max)
    values = profile(ratios, taus)
    fig = mpl_figure.Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    styles = ("-", "--", "-.", ":")
    for i, arm in enumerate(values.columns):
        ax.step(
            taus,
            values[arm].to_numpy(),
            where="post",
            label=arm,
            color=f"C{i % 10}",
            linestyle=styles[i % len(styles)],
            linewidth=1.8,
            alpha=0.9,
        )
    ax.set_xlim(1, tau_max)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("τ (test error within a factor τ of the best arm's)")
    ax.set_ylabel("ρ(τ): share of workloads")
    ax.grid(alpha=0.3)
    ax.legend(
        loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", title="arm"
    )  # beside the axes, under the title
    names = ", ".join(map(str, ratios.columns))
    text = title or f"Performance profiles over {ratios.shape[1]} workloads: {names}"
    ax.set_title(textwrap.fill(text, 60), fontsize="medium")  # long study names wrap instead of leaving the figure
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
