"""TSAM Fig. 2: mean and variance of ``L(theta* + eps)``, ``eps ~ N(0, sigma^2 I)``, against the noise
scale ``sigma``, one line per arm, from a study's MLflow trials.

A study asks for the sweep with ``measures={"neighbourhood_loss": {"sigmas": [...], ...}}``; every trial
then logs ``flat/neighbourhood_loss/sigma_<s>`` and ``flat/neighbourhood_loss/sigma_<s>_var``
(:mod:`flatlab.sharpness.measures`). After the study, :func:`log_flatness_sweep` (called by the runner's
post-study step) averages them over seeds per arm and logs, on the launch's parent run:

* ``flatness_sweep/neighbourhood_loss_vs_sigma.csv``: one row per (arm, sigma): ``mean`` (the seeds'
  average of the mean perturbed loss), ``mean_std`` (its standard deviation over seeds), ``var`` and
  ``var_std`` (likewise for the variance over noise draws), ``seeds`` (how many trials);
* ``flatness_sweep/neighbourhood_loss_vs_sigma.png``: two panels (mean, variance) against sigma (log
  scale), one line per arm, error bars one standard deviation over seeds.

Trials used: the final-stage trials (``Study(final_seeds=...)``) when there are any, else every completed
trial of the latest launch (a grid study's seeds).
"""

from __future__ import annotations

import logging
import re
import tempfile
from pathlib import Path
from typing import Any, List, Optional

logger = logging.getLogger(__name__)

MEAN_PREFIX = "flat/neighbourhood_loss/sigma_"
ARTIFACT_DIR = "flatness_sweep"
STEM = "neighbourhood_loss_vs_sigma"
_SIGMA = re.compile(r"^flat/neighbourhood_loss/sigma_([0-9.e+-]+)$")  # the mean's key; + "_var" for the variance


def wants_sweep(measures: Any) -> bool:
    """Whether a study's ``measures`` declaration asks for a sigma sweep (``neighbourhood_loss`` with ``sigmas``)."""
    params = (measures or {}).get("neighbourhood_loss") if hasattr(measures or {}, "get") else None
    return bool(params and params.get("sigmas"))


def sweep_table(df):
    """Per (arm, sigma) statistics over seeds from a trials frame (:func:`flatlab.tracking.results.trials_frame`).

    Args:
        df: one row per trial with ``arm``, ``stage``, ``outcome`` and the ``flat/neighbourhood_loss/sigma_<s>``
            and ``flat/neighbourhood_loss/sigma_<s>_var`` columns.
    Returns:
        A ``pandas.DataFrame`` with columns ``arm``, ``sigma`` (float), ``mean``, ``mean_std``, ``var``,
        ``var_std`` (loss units; ``_var`` in loss units^2; ``_std``: sample standard deviation over seeds,
        NaN for one seed) and ``seeds``, sorted by arm (first appearance) then sigma. Empty when no trial
        has sweep columns.
    """
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flatlab.tracking.plot_axes import plain_figure

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


def log_flatness_sweep(tracking_uri: str, parent_run_id: str, study: Any, console: Optional[Any] = None) -> List[str]:
    """After a study: log the sweep's CSV and figure (module docstring) on ``parent_run_id``, if the study
    asked for a sweep (:func:`wants_sweep`); otherwise do nothing.

    Never raises: a failure is logged as a warning (the trials are already recorded).

    Returns:
        The artifact paths logged.
    """
    if not wants_sweep(getattr(study, "measures", None)):
        return []
    from flatlab.tracking import runs
    from flatlab.tracking.results import trials_frame

    logged: List[str] = []
    try:
        table = sweep_table(trials_frame(tracking_uri, study.name))
        if table.empty:
            logger.warning("flatness sweep: no trial of %s logged %s*", study.name, MEAN_PREFIX)
            return logged
        client = runs.client(runs.existing_store(tracking_uri))
        client.log_text(parent_run_id, table.to_csv(index=False), f"{ARTIFACT_DIR}/{STEM}.csv")
        logged.append(f"{ARTIFACT_DIR}/{STEM}.csv")
        with tempfile.TemporaryDirectory() as tmp:
            png = plot_sweep(
                table, Path(tmp) / f"{STEM}.png", title=f"{study.name}: loss around the solution (TSAM Fig. 2)"
            )
            client.log_artifact(parent_run_id, str(png), ARTIFACT_DIR)
        logged.append(f"{ARTIFACT_DIR}/{STEM}.png")
    except Exception as exc:  # noqa: BLE001 - the study's results stand
        logger.warning("flatness sweep: not logged for run %s: %s", parent_run_id, exc)
    if console is not None and logged:
        console.print(f"flatness sweep (TSAM Fig. 2): {', '.join(logged)} on run {parent_run_id}")
    return logged


__all__ = ["log_flatness_sweep", "plot_sweep", "sweep_table", "wants_sweep"]
