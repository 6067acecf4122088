"""TSAM Fig. 2: mean and variance of ``L(theta* + eps)``, ``eps ~ N(0, sigma^2 I)``, against the noise
scale ``sigma``, one line per arm, from a study's MLflow trials.

A study asks for the sweep with ``measures={"neighbourhood_loss": {"sigmas": [...], ...}}``; every trial
then logs ``flat/neighbourhood_loss/sigma_<s>`` and ``flat/neighbourhood_loss/sigma_<s>_var``
(:mod:`flatlab.sharpness.measures`). After the study, :func:`sweep_table` averages them over seeds per arm
and :func:`plot_sweep` draws them; :func:`flatlab.reports.publish.log_flatness_sweep` logs, on the launch's
parent run:

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

MEAN_PREFIX = "flat/neighbourhood_loss/sigma_"
ARTIFACT_DIR = "flatness_sweep"
STEM = "neighbourhood_loss_vs_sigma"
_SIGMA = re.compile(r"^flat/neighbourhood_loss/sigma_([0-9.e+-]+)$")  # the mean's key; + "_var" for the variance


def wants_sweep(measures: Any) -> bool:
    """Whether a study's ``measures`` declaration asks for a sigma sweep (``neighbourhood_loss`` with ``sigmas``)."""
    params = (measures or {}).get("neighbourhood_loss") if hasattr(measures or {}, "get") else None
    return bool(params and params.get("sigmas"))


def sweep_table(df):
    """Per (arm, sigma) statistics over seeds from a trials frame (:func:`flatlab.tracking.trials.trials_frame`).

    Args:
        df: one row per trial with ``arm``, ``stage``, ``outcome`` and the ``flat/neighbourhood_loss/sigma_<s>``
            and ``flat/neighbourhood_loss/sigma_<s>_var`` columns.
    Returns:
        A ``pandas.DataFrame`` with columns ``arm``, ``sigma`` (float), ``mean``, ``mean_std``, ``var``,
        ``var_std`` (loss units; ``_var`` in loss units^2; ``_std``: sample standard deviation over seeds,
        NaN for one seed) and ``seeds``, sorted by arm (first appearance) then sigma. Empty when no trial
        has sweep columns.
    """
    # pandas on first use: importing this module stays light
    import pandas as pd

    cols = ["arm", "sigma", "mean", "mean_std", "var", "var_std", "seeds"]
    if df is None or len(df) == 0:
        return pd.DataFrame(columns=cols)
    rows = df
    if "outcome" in rows:
        rows = rows[rows["outcome"] == "completed"]
    if "stage" in rows and (rows["stage"] == "final").any():
        rows = rows[rows["stage"] == "final"]
    sigmas = sorted(((float(m.group(1)), c) for c in rows.columns if (m := _SIGMA.match(c))), key=lambda t: t[0])
    out = []
    for arm in dict.fromkeys(rows["arm"]):
        part = rows[rows["arm"] == arm]
        for sigma, col in sigmas:
            means = part[col].dropna().astype(float)
            var_col = col + "_var"
            vars_ = part[var_col].dropna().astype(float) if var_col in part else pd.Series(dtype=float)
            if means.empty:
                continue
            out.append(
                {
                    "arm": arm,
                    "sigma": sigma,
                    "mean": means.mean(),
                    "mean_std": means.std(ddof=1),
                    "var": vars_.mean() if len(vars_) else float("nan"),
                    "var_std": vars_.std(ddof=1) if len(vars_) else float("nan"),
                    "seeds": int(len(means)),
                }
            )
    return pd.DataFrame(out, columns=cols)


def plot_sweep(table, path: Path, title: str = "") -> Path:
    """Write the two-panel figure of :func:`sweep_table`'s ``table`` to ``path`` (PNG) and return ``path``.

    Raises:
        ValueError: an empty table.
    """
    # matplotlib on first use: importing this module stays light
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib on first use: importing this module stays light
    import matplotlib.pyplot as plt

    if table is None or len(table) == 0:
        raise ValueError("no neighbourhood-loss sweep to plot (no trial logged flat/neighbourhood_loss/sigma_*)")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for arm in dict.fromkeys(table["arm"]):
        t = table[table["arm"] == arm]
        n = int(t["seeds"].max())
        for ax, key in zip(axes, ("mean", "var")):
            err = t[f"{key}_std"].fillna(0.0)
            ax.errorbar(
                t["sigma"], t[key], yerr=err, marker="o", capsize=3, label=f"{arm} ({n} seed{'s' if n != 1 else ''})"
            )
    for ax, label in zip(axes, ("mean of L(θ*+ε)", "variance of L(θ*+ε)")):
        ax.set_xscale("log")
        ax.set_xlabel("σ (ε ~ N(0, σ² I))")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title or "Loss in a Gaussian neighbourhood of the solution (TSAM Fig. 2)")
    plain_figure(fig)  # the variance axis (~1e-5) without an offset text by its label, as the report plots
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
