"""Does flatness predict generalisation in this study? Kendall's rank correlation between each flatness
measure and (a) the test metric, (b) the generalisation gap (test loss − final training loss), over every
completed trial of the study (search and final stage, every arm), pooled and per arm (Jiang et al., ICLR
2020, "Fantastic Generalization Measures and Where to Find Them"), and on request per value of a parameter
(``by``: e.g. per fine-tuned model of an alpha study, τ over its alpha grid, the seed "In Search of the
Successful Interpolation"'s sharpness against OOD accuracy along the path); for a grid study also the granulated
τ (Ψ) over its searched axes, the mean over axes of τ within groups where only that axis changes
(:mod:`flatlab.analysis.correlation`).

The models are clustered: the trials of one tuning share its search, and the final seeds of one
configuration share its hyperparameters. Each τ's interval and p-value come from a cluster bootstrap
that resamples tunings, then configurations (arm and ``param.*`` values) within each drawn tuning, then
the trials of each drawn configuration; the p-values of one table are Holm-adjusted together (Holm 1979).

A sharpness measure (``flat/*``: lower = flatter) is associated with better generalisation when τ > 0
against the gap (flatter, smaller gap) or, for an accuracy, τ < 0 against the test metric: an association
over the trained models, not a cause.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from flatlab.analysis.compare.columns import number
from flatlab.analysis.compare.statistics import CONFIDENCE, holm
from flatlab.analysis.compare.text import markdown_table
from flatlab.analysis.console_table import make_table, print_table
from flatlab.analysis.correlation import Correlation, Granulated, granulated_tau, kendall_tau
from flatlab.analysis.plot_axes import plain_numbers
from flatlab.analysis.sample import FLAT_PREFIX, TUNING_KEY, Sample
from flatlab.analysis.selection import canonical, config_key
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

pd = lazy("pandas")
mpl_figure = lazy("matplotlib.figure")

GAP = "gap (test loss - train loss)"
AUXILIARY = ("_stderr", "_clean")
POOLED = "all arms"


@dataclass(frozen=True)
class CorrelationRow:
    """τ of one measure against one target over one set of models (``scope``: an arm, or all arms);
    ``p_holm``: the cluster bootstrap p-value Holm-adjusted over every τ of the table (NaN: no τ)."""

    measure: str
    target: str
    scope: str
    correlation: Correlation
    p_holm: float = float("nan")


@dataclass(frozen=True)
class FlatnessPrediction:
    """:func:`flatness_correlations`' answer: ``rows`` pooled first, then per arm; ``granulated`` per
    (measure, target) for a grid study; ``models`` the trials used; ``notes`` what was left out."""

    study: str
    test_metric: str
    rows: Tuple[CorrelationRow, ...]
    granulated: Dict[Tuple[str, str], Granulated]
    models: int
    confidence: float
    notes: Tuple[str, ...] = ()

    def frame(self) -> Any:
        """One row per (measure, target, scope): ``n``, ``tunings``, ``configurations``, ``tau``, ``p``,
        ``p_holm``, ``low``, ``high``, ``reason``."""
        return pd.DataFrame(
            [
                dict(
                    measure=r.measure, target=r.target, scope=r.scope, n=c.n, tunings=units[0], configurations=units[1]
                )
                | dict(tau=c.tau, p=c.p, p_holm=r.p_holm, low=c.low, high=c.high, reason=c.reason)
                for r in self.rows
                for c, units in [(r.correlation, r.correlation.units or (0, 0))]
            ]
        )


def flatness_correlations(
    data: Any,
    *,
    measures: Optional[Sequence[str]] = None,
    confidence: float = CONFIDENCE,
    resamples: int = 1000,
    seed: int = 0,
    target: Optional[str] = None,
    by: Optional[str] = None,
) -> FlatnessPrediction:
    """Kendall's τ between every flatness measure and the test metric and the generalisation gap
    (module docstring), each with a cluster bootstrap interval and p-value (tunings, then configurations,
    then trials: :func:`~flatlab.analysis.correlation.kendall_tau` with :func:`clusters`), and the
    p-values of the whole table Holm-adjusted together (every measure, target and scope is one family).

    Args:
        data: a :class:`~flatlab.analysis.sample.Sample` (or ``trials_frame`` table).
        measures: the ``flat/*`` measures (default every one recorded, auxiliary ones excluded).
        confidence, resamples, seed: of the cluster bootstrap.
        target: the metric τ is taken against (beside the gap); default the first test metric recorded
            (:meth:`Sample.test_metric`), else the study's metric (an alpha study's ``ood/accuracy``).
        by: a column (``param.finetuned``, ``arm`` ...): the rows also hold one scope per its value, named
            ``<by>=<value>``, after the per-arm ones.
    Raises:
        ConfigError: no completed trial with a flatness measure; an unknown measure; ``by`` or ``target``
            not a column of the trials.
    """
    sample = Sample.of(data)
    models = sample.completed()
    recorded = [m for m in models.measures(FLAT_PREFIX) if not m.endswith(AUXILIARY)]
    wanted = [m if m.startswith(FLAT_PREFIX) else FLAT_PREFIX + m for m in (measures or recorded)]
    unknown = [m for m in wanted if m not in recorded]
    if unknown or not wanted:
        raise ConfigError(
            f"study {sample.info.name!r}: no completed trial recorded {', '.join(unknown) or 'a flatness measure'}; "
            f"measures there: {', '.join(recorded) or '(none)'}"
        )
    df = models.trials.copy()
    test = target or default_target(models)
    for column, what in ((by, "by"), (target, "target")):
        if column is not None and column not in df.columns:
            raise ConfigError(f"{what}={column!r} is not a column of study {sample.info.name!r}'s trials")
    targets, notes = [test], []
    if {"test/loss", "train/loss"} <= set(df.columns):
        df[GAP] = df["test/loss"].astype(float) - df["train/loss"].astype(float)
        targets.append(GAP)
    else:
        notes.append("no generalisation gap: the trials recorded no test/loss and train/loss")
    scopes = [(POOLED, df)] + [(arm, df[df["arm"] == arm]) for arm in sorted(set(df["arm"]))]
    if by is not None:
        scopes += [(f"{by}={v}", df[df[by] == v]) for v in sorted(set(df[by].dropna()), key=str)]
    rows: List[CorrelationRow] = []
    for m in wanted:
        for target in targets:
            for scope, part in scopes:
                tau = kendall_tau(
                    _column(part, m),
                    _column(part, target),
                    clusters=clusters(part),
                    confidence=confidence,
                    n_resamples=resamples,
                    seed=seed,
                )
                rows.append(CorrelationRow(m, target, scope, tau))
    adjusted = holm([r.correlation.p for r in rows])
    rows = [replace(r, p_holm=p) for r, p in zip(rows, adjusted)]
    granulated = _granulated(df, wanted, targets, sample.info.searcher, notes)
    return FlatnessPrediction(sample.info.name, test, tuple(rows), granulated, len(df), float(confidence), tuple(notes))


def default_target(sample: Sample) -> str:
    """What τ is taken against unless told: the first test metric recorded (:meth:`Sample.test_metric`),
    else the study's metric (an alpha study's ``ood/accuracy``)."""
    return sample.test_metric() or sample.info.metric


def clusters(df: Any) -> List[Tuple[int, Tuple[Any, ...]]]:
    """Each trial's cluster path ``(tuning, configuration)``: its tuning (1..S) and its configuration, the
    arm with :func:`~flatlab.analysis.selection.config_key` of its ``param.*`` values (seed, stage and
    tuning are not params), so a final-stage re-run shares the configuration of the search trial it
    repeats and the arms of one tuning share that tuning."""
    params = [c for c in df.columns if c.startswith("param.")]
    tunings = df[TUNING_KEY] if TUNING_KEY in df.columns else [1] * len(df)
    return [
        (int(k), (arm, config_key(dict(zip(params, values)))))
        for k, arm, values in zip(tunings, df["arm"], df[params].itertuples(index=False, name=None))
    ]


def _column(df: Any, name: str) -> np.ndarray:
    return df[name].astype(float).to_numpy() if name in df.columns else np.full(len(df), np.nan)


def _level(value: Any) -> Any:
    """An axis value as a group key: a missing value (NaN, None, pandas' NA) is the level ``None``."""
    return None if value is None or canonical(value) is None else value


def _granulated(df: Any, measures: List[str], targets: List[str], searcher: Optional[str], notes: List[str]):
    """Ψ per (measure, target) over the searched axes of a grid study: every ``param.*`` column that varies
    within some arm, and the arm where there are several. A missing value (an arm-specific axis such as
    SAM's rho is missing for SGD) is a level of its own. Each axis's groups hold every other axis fixed,
    the arm-specific ones included, so a group varies along one axis only: arms that differ in an axis
    (SGD, and SAM at some rho) share no group of the arm axis. The seed is held fixed within a group and
    not averaged over. Empty for other searchers (Ψ needs a grid)."""
    if searcher != "grid":
        return {}
    levels = {c: df[c].map(_level) for c in df.columns if c.startswith("param.")}
    params = [c for c, v in levels.items() if v.groupby(df["arm"]).nunique(dropna=False).max() > 1]
    axes = params + (["arm"] if df["arm"].nunique() > 1 else [])
    if not axes:
        notes.append("no granulated tau: the grid has no axis that varies over the models")
        return {}
    records = [{**{a: _level(row[a]) for a in axes}, "seed": row.get("seed")} for _, row in df.iterrows()]
    out = {}
    for m in measures:
        for target in targets:
            full = granulated_tau(records, _column(df, m), _column(df, target))
            per_axis = {a: v for a, v in full.per_axis.items() if a != "seed"}
            finite = [v for v in per_axis.values() if np.isfinite(v)]
            psi = float(np.mean(finite)) if finite else float("nan")
            groups = {a: n for a, n in full.groups.items() if a != "seed"}
            skipped = tuple(g for g in full.skipped if g.axis != "seed")
            out[(m, target)] = Granulated(per_axis, psi, groups, full.models, skipped, full.reason)
    return out


def cells(p: FlatnessPrediction) -> Tuple[List[str], List[List[str]]]:
    """Headers and rows of the table: measure, target, models (scope), n with its tunings and
    configurations, τ with its cluster bootstrap interval, p and p Holm."""
    pct = f"{p.confidence * 100:g}%"
    head = ["measure", "target", "models", "n (tunings, configs)", f"Kendall τ [{pct} CI]", "p", "p Holm"]
    body = []
    for r in p.rows:
        c = r.correlation
        tau = f"- ({c.reason})" if c.reason or not np.isfinite(c.tau) else f"{c.tau:+.3f} [{c.low:+.3f}, {c.high:+.3f}]"
        n = f"{c.n} ({', '.join(map(str, c.units))})" if c.units else str(c.n)
        body.append([r.measure, r.target, r.scope, n, tau, _p(c.p), _p(r.p_holm)])
    return head, body


def _p(value: float) -> str:
    return f"{value:.3g}" if np.isfinite(value) else "-"


def caption(p: FlatnessPrediction) -> List[str]:
    """The lines under the table: Ψ per (measure, target) for a grid, how to read τ, and the notes."""
    lines = []
    for (m, target), g in p.granulated.items():
        axes = ", ".join(f"{a} {number(v, signed=True)}" for a, v in g.per_axis.items())
        lines.append(f"granulated τ (Ψ) of {m} against {target}: {number(g.psi, signed=True)} ({axes})")
    family = sum(np.isfinite(r.correlation.p) for r in p.rows)
    return lines + [
        "Kendall's τ-b over the completed trials (search and final stage), pooled over arms and per arm "
        "(Jiang et al. 2020). Trials that share a tuning or a configuration are not independent: the interval "
        "and p come from a cluster bootstrap that resamples tunings, then configurations within each drawn "
        "tuning, then the trials of each drawn configuration (Davison & Hinkley 1997, §3.8); p is the "
        f"two-sided level at which the percentile interval excludes 0. p Holm: Holm over the {family} τ of this "
        "table.",
        "flat/* is lower = flatter: τ > 0 against the gap, or τ < 0 against an accuracy, means that flatter "
        "models are associated with better generalisation here; an association over these models, not a cause.",
        *p.notes,
    ]


def title(p: FlatnessPrediction) -> str:
    return f"{p.study}: does flatness predict generalisation? ({p.models} trained models)"


def to_markdown(p: FlatnessPrediction) -> str:
    """The table as markdown, with its title and caption."""
    head, body = cells(p)
    lines = [f"### {title(p)}", "", markdown_table(head, body, left=3), ""]
    return "\n".join(lines + [f"- {line}" for line in caption(p)]) + "\n"


def render(p: FlatnessPrediction, console: Any) -> None:
    """Print the table with rich (numbers never split), then its caption."""
    console.print(f"[bold]{title(p)}[/bold]")
    head, body = cells(p)
    print_table(console, make_table(head, body), "use --format markdown")
    for line in caption(p):
        console.print(line, soft_wrap=True, markup=False)


def plot_scatter(data: Any, measure: str, path: Path) -> Path:
    """Save a PNG: the test metric and the generalisation gap (two panels) against ``measure`` over the
    completed trials, one colour per arm."""
    sample = Sample.of(data).completed()
    df = sample.trials.copy()
    test = default_target(sample)
    targets = [test] + ([GAP] if {"test/loss", "train/loss"} <= set(df.columns) else [])
    if GAP in targets:
        df[GAP] = df["test/loss"].astype(float) - df["train/loss"].astype(float)
    fig = mpl_figure.Figure(figsize=(5.2 * len(targets), 4.0), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(targets)))
    for ax, target in zip(axes, targets):
        for i, (arm, part) in enumerate(df.groupby("arm")):
            ax.scatter(_column(part, measure), _column(part, target), s=14, color=f"C{i % 10}", label=arm, alpha=0.8)
        ax.set_xlabel(f"{measure} (lower = flatter)")
        ax.set_ylabel(target)
        ax.grid(alpha=0.3)
        plain_numbers(ax)
    axes[0].legend(fontsize="small")
    fig.suptitle(f"{sample.info.name}: {measure} against generalisation ({len(df)} trained models)", fontsize="small")
    fig.savefig(path, dpi=110)
    return Path(path)
