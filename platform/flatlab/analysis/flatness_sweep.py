"""A measure's sweep against its swept parameter, one line per arm, from a study's MLflow trials: TSAM
Fig. 2 (mean and variance of ``L(theta* + eps)``, ``eps ~ N(0, sigma^2 I)``, against the noise scale
``sigma``), and TSAM Figs. 5-6 (the SAM objective against ``rho``, the tilted objective against ``t``).
The functions below take the measure and its parameter, Fig. 2's ``neighbourhood_loss`` and ``sigma`` by
default; the CSV and PNG of another sweep are named ``flatness_sweep/<measure>_vs_<param>`` (:func:`stem`).

A study asks for the sweep with ``measures={"neighbourhood_loss": {"sigmas": [...], ...}}``; every trial
then logs ``flat/neighbourhood_loss/sigma_<s>`` and ``flat/neighbourhood_loss/sigma_<s>_var``
(:mod:`flatlab.sharpness.measures`); likewise ``sam_objective``'s ``rhos`` and ``tilted_objective``'s
``ts`` (:data:`flatlab.ranges.SWEEPS`), with the mean only. After the study, :func:`sweep_table`
averages them over seeds per arm and :func:`plot_sweep` draws them;
:func:`flatlab.reports.publish.log_flatness_sweep` logs, on the launch's parent run:

* ``flatness_sweep/neighbourhood_loss_vs_sigma.csv``: one row per (arm, sigma): ``mean`` (the seeds'
  average of the mean perturbed loss), ``mean_std`` (its standard deviation over seeds), ``var`` and
  ``var_std`` (likewise for the variance over noise draws), ``seeds`` (how many trials);
* ``flatness_sweep/neighbourhood_loss_vs_sigma.png``: two panels (mean, variance) against sigma (log
  scale), one line per arm, error bars one standard deviation over seeds.

Trials used: the final-stage trials (``Study(final_seeds=...)``) when there are any, else every completed
trial of the latest launch (a grid study's seeds).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from flatlab.analysis.plot_axes import plain_figure
from flatlab.lazy import lazy

pd = lazy("pandas")
matplotlib = lazy("matplotlib")
plt = lazy("matplotlib.pyplot")  # first read after matplotlib.use("Agg") in the plotting function

ARTIFACT_DIR = "flatness_sweep"
NEIGHBOURHOOD = ("neighbourhood_loss", "sigma")  # TSAM Fig. 2's sweep: the default of every function here
_LABELS = {  # (x-axis label, y-axis label of the mean) per swept measure; others get plain names
    "neighbourhood_loss": ("σ (ε ~ N(0, σ² I))", "mean of L(θ*+ε)"),
    "sam_objective": ("ρ", "max over ‖ε‖ ≤ ρ of L(θ+ε)"),
    "tilted_objective": ("t", "(1/t) log E exp(t L(θ+ε))"),
}


def stem(measure: str, param: str) -> str:
    """The artifacts' file stem of a sweep: ``<measure>_vs_<param>`` (``neighbourhood_loss_vs_sigma``)."""
    return f"{measure}_vs_{param}"


def wants_sweep(measures: Any, measure: str = "neighbourhood_loss", list_param: str = "sigmas") -> bool:
    """Whether a study's ``measures`` declaration asks ``measure`` for a sweep (its ``list_param`` set; by
    default ``neighbourhood_loss`` with ``sigmas``)."""
    params = (measures or {}).get(measure) if hasattr(measures or {}, "get") else None
    return bool(params and params.get(list_param))


def sweep_table(df, measure: str = "neighbourhood_loss", param: str = "sigma"):
    """Per (arm, value) statistics over seeds from a trials frame (:func:`flatlab.tracking.trials.trials_frame`).

    Args:
        df: one row per trial with ``arm``, ``stage``, ``outcome`` and the ``flat/<measure>/<param>_<v>``
            columns (and ``flat/<measure>/<param>_<v>_var`` where the measure logs a variance over draws).
        measure, param: the swept measure and the parameter it sweeps (default: TSAM Fig. 2's
            ``neighbourhood_loss`` over ``sigma``; ``sam_objective`` over ``rho``, ``tilted_objective``
            over ``t``).
    Returns:
        A ``pandas.DataFrame`` with columns ``arm``, ``<param>`` (float), ``mean``, ``mean_std``, ``var``,
        ``var_std`` (loss units; ``_var`` in loss units^2, NaN without ``_var`` columns; ``_std``: sample
        standard deviation over seeds, NaN for one seed) and ``seeds``, sorted by arm (first appearance)
        then value. Empty when no trial has sweep columns.
    """
    cols = ["arm", param, "mean", "mean_std", "var", "var_std", "seeds"]
    key = re.compile(rf"^flat/{re.escape(measure)}/{re.escape(param)}_([0-9.e+-]+)$")  # the mean; + "_var"
    if df is None or len(df) == 0:
        return pd.DataFrame(columns=cols)
    rows = df
    if "outcome" in rows:
        rows = rows[rows["outcome"] == "completed"]
    if "stage" in rows and (rows["stage"] == "final").any():
        rows = rows[rows["stage"] == "final"]
    values = sorted(((float(m.group(1)), c) for c in rows.columns if (m := key.match(c))), key=lambda t: t[0])
    out = []
    for arm in dict.fromkeys(rows["arm"]):
        part = rows[rows["arm"] == arm]
        for value, col in values:
            means = part[col].dropna().astype(float)
            var_col = col + "_var"
            vars_ = part[var_col].dropna().astype(float) if var_col in part else pd.Series(dtype=float)
            if means.empty:
                continue
            out.append(
                {
                    "arm": arm,
                    param: value,
                    "mean": means.mean(),
                    "mean_std": means.std(ddof=1),
                    "var": vars_.mean() if len(vars_) else float("nan"),
                    "var_std": vars_.std(ddof=1) if len(vars_) else float("nan"),
                    "seeds": int(len(means)),
                }
            )
    return pd.DataFrame(out, columns=cols)


def plot_sweep(table, path: Path, title: str = "", measure: str = "neighbourhood_loss", param: str = "sigma") -> Path:
    """Write the figure of :func:`sweep_table`'s ``table`` (of ``measure`` over ``param``) to ``path`` (PNG)
    and return ``path``: the mean against the swept value, one line per arm, error bars one standard
    deviation over seeds, and a second panel for the variance over draws when the table has one. The x
    axis is logarithmic when every value is > 0, else symmetric-logarithmic (a tilt t = 0).

    Raises:
        ValueError: an empty table.
    """
    matplotlib.use("Agg")
    if table is None or len(table) == 0:
        raise ValueError(f"no {measure} sweep to plot (no trial logged flat/{measure}/{param}_*)")
    keys = ("mean", "var") if table["var"].notna().any() else ("mean",)
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    axes = axes[0]
    for arm in dict.fromkeys(table["arm"]):
        t = table[table["arm"] == arm]
        n = int(t["seeds"].max())
        for ax, key in zip(axes, keys):
            err = t[f"{key}_std"].fillna(0.0)
            ax.errorbar(
                t[param], t[key], yerr=err, marker="o", capsize=3, label=f"{arm} ({n} seed{'s' if n != 1 else ''})"
            )
    xlabel, ylabel = _LABELS.get(measure, (param, measure))
    positive = table[param][table[param] > 0]
    for ax, label in zip(axes, (ylabel, "variance of L(θ*+ε)")):
        if len(positive) == len(table):
            ax.set_xscale("log")
        else:
            ax.set_xscale("symlog", linthresh=float(positive.min()) if len(positive) else 1.0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(
        title
        or (
            "Loss in a Gaussian neighbourhood of the solution (TSAM Fig. 2)"
            if measure == NEIGHBOURHOOD[0]
            else f"{measure} against {param}"
        )
    )
    plain_figure(fig)  # the variance axis (~1e-5) without an offset text by its label, as the report plots
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
