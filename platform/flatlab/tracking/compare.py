"""The paper table of a study (``flatlab compare``): each arm over seeds, and paired against a reference arm.

Over the final-stage trials (``Study(final_seeds=...)``: each arm's best configuration re-run over fresh
seeds, tag ``flatlab.stage=final``), or, where a launch has no final stage (grid studies), over each
arm's best configuration (mean validation metric over its completed seeds) with all its seeds. For
each arm and each quantity (the test metric, every ``flat/<measure>``, epochs or steps to a target):

* mean, sample standard deviation (ddof = 1) and the t-interval of the mean over seeds,
  ``mean ± t_{(1+c)/2, n-1} · std / √n`` (Student; e.g. IRE Table 1 and TSAM Table 2 report means
  over seeds);
* against the reference arm, the paired per-seed difference ``d_s = arm_s − reference_s`` (seeds
  matched by seed value): its mean, t-interval, the paired t-test's two-sided p-value
  (``scipy.stats.ttest_rel``) and how many seeds favour each side.

Only completed trials give values. Seeds that diverged, errored, were pruned or interrupted are
counted as run (the ``seeds`` column reads "values / run") and named in the notes; a seed that missed
a target is counted in "k/n reached". With fewer than two values the std, intervals and p-value are
NaN, printed "-".

Also :func:`hpo_efficiency`: the share of a paper grid's compute that an Optuna + ASHA search of the
same arm needed to reach the grid's best validation metric.
"""

from __future__ import annotations

import logging
import math
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from flatlab.errors import ConfigError

logger = logging.getLogger(__name__)

CONFIDENCE = 0.95
FLAT_PREFIX = "flat/"
AUXILIARY = ("_stderr", "_clean")  # flat/<measure>_stderr, _clean: shown only when asked for by name
EPOCHS_TO_TARGET = "train/epochs_to_target"
STEPS_TO_TARGET = "train/steps_to_target"
TARGET_REACHED = "train/target_reached"  # 1.0 reached, 0.0 missed (a training-loss target)
TARGETS = (EPOCHS_TO_TARGET, STEPS_TO_TARGET)
FORMATS = ("table", "markdown", "latex", "csv")
_HIGHER_BETTER = ("accuracy", "acc", "top1", "top5", "f1", "auc", "bleu")
_LOWER_BETTER = ("loss", "perplexity", "error", "nll")


@dataclass(frozen=True)
class Estimate:
    """Mean, sample std (ddof = 1) and the t-interval ``[low, high]`` of the mean over ``n`` values.

    ``std``, ``low``, ``high`` are NaN for ``n < 2``; everything is NaN for ``n = 0``."""

    n: int
    mean: float
    std: float
    low: float
    high: float


@dataclass(frozen=True)
class Paired:
    """Paired per-seed differences ``arm − reference`` over ``n`` matched seeds.

    ``estimate`` describes the differences (mean, std, t-interval); ``p`` is the two-sided paired
    t-test's p-value (NaN for ``n < 2`` or when all differences are equal, where t is undefined);
    ``arm_better``/``ref_better``/``ties`` count seeds by the quantity's direction."""

    estimate: Estimate
    p: float
    arm_better: int
    ref_better: int
    ties: int


@dataclass(frozen=True)
class Row:
    """One arm, one quantity: ``summary`` over its seeds, ``runs`` seeds run (counting failures and
    misses), ``diff`` against the reference (``None`` for the reference arm itself)."""

    quantity: str
    arm: str
    runs: int
    summary: Estimate
    diff: Optional[Paired]


@dataclass(frozen=True)
class Comparison:
    """A study's paper table, as computed by :func:`compare_table`.

    Attributes:
        metric: the test metric (e.g. ``test/accuracy``).
        reference: the arm every other arm is paired against.
        confidence: of every interval (e.g. 0.95).
        source: ``final`` (final-stage trials) or ``best configuration`` (no final stage).
        quantities: the table's quantities in order (metric, ``flat/*``, then targets).
        higher_is_better: per quantity, the direction that counts as better.
        rows: one :class:`Row` per quantity and arm, quantity-major, reference arm first.
        seeds: the per-seed sample, one row per (arm, seed): ``arm``, ``seed``, ``outcome``,
            ``run_id`` and one column per quantity (NaN where the seed gave no value).
        notes: what the table leaves out and why (failed seeds, missed targets, duplicates).
        study: the study's name, for titles.
    """

    metric: str
    reference: str
    confidence: float
    source: str
    quantities: Tuple[str, ...]
    higher_is_better: Mapping[str, bool]
    rows: Tuple[Row, ...]
    seeds: Any = field(repr=False)
    notes: Tuple[str, ...] = ()
    study: str = ""

    @property
    def arms(self) -> List[str]:
        """Arms in table order (the reference first)."""
        return list(dict.fromkeys(r.arm for r in self.rows))

    def row(self, quantity: str, arm: str) -> Row:
        """The row of ``arm`` for ``quantity``.

        Raises:
            ConfigError: no such quantity or arm in the table (the message lists the valid ones).
        """
        for r in self.rows:
            if r.quantity == quantity and r.arm == arm:
                return r
        raise ConfigError(
            f"no row for quantity {quantity!r} and arm {arm!r}; quantities: {', '.join(self.quantities)}; "
            f"arms: {', '.join(self.arms)}"
        )

    def frame(self):
        """The table as numbers, one row per (quantity, arm): ``quantity``, ``arm``, ``higher_is_better``,
        ``runs``, ``n``, ``mean``, ``std``, ``ci_low``, ``ci_high`` and, against the reference,
        ``diff_n``, ``diff_mean``, ``diff_std``, ``diff_low``, ``diff_high``, ``p``, ``arm_better``,
        ``ref_better``, ``ties`` (NaN for the reference arm)."""
        import pandas as pd

        out = []
        for r in self.rows:
            s, d = r.summary, r.diff
            row = {"quantity": r.quantity, "arm": r.arm, "higher_is_better": self.higher_is_better[r.quantity],
                   "runs": r.runs, "n": s.n, "mean": s.mean, "std": s.std, "ci_low": s.low, "ci_high": s.high}
            nan = float("nan")
            row.update({
                "diff_n": d.estimate.n if d else nan, "diff_mean": d.estimate.mean if d else nan,
                "diff_std": d.estimate.std if d else nan, "diff_low": d.estimate.low if d else nan,
                "diff_high": d.estimate.high if d else nan, "p": d.p if d else nan,
                "arm_better": d.arm_better if d else nan, "ref_better": d.ref_better if d else nan,
                "ties": d.ties if d else nan,
            })
            out.append(row)
        return pd.DataFrame(out)


# ---------------------------------------------------------------------------------------------------
# Statistics


def t_estimate(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean, sample std and the two-sided Student-t interval of the mean of the finite ``values``:
    ``mean ± t.ppf((1 + confidence) / 2, n − 1) · std / √n`` (std with ddof = 1).

    Fewer than two values: NaN std and interval (never an exception)."""
    import numpy as np
    from scipy import stats

    x = np.asarray([v for v in values if v is not None], dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    nan = float("nan")
    if n == 0:
        return Estimate(0, nan, nan, nan, nan)
    mean = float(x.mean())
    if n < 2:
        return Estimate(1, mean, nan, nan, nan)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
    return Estimate(n, mean, std, mean - half, mean + half)


def paired_difference(arm: Mapping[Any, float], reference: Mapping[Any, float], *, higher_is_better: bool,
                      confidence: float = CONFIDENCE) -> Paired:
    """The paired comparison of two arms' per-seed values (``{seed: value}``), over the seeds where
    both have a finite value: differences ``arm − reference``, their :func:`t_estimate`, the paired
    t-test's two-sided p-value (``scipy.stats.ttest_rel``) and the seeds favouring each side.

    ``p`` is NaN for fewer than two matched seeds, and when every difference is equal (zero
    variance: the t statistic is undefined)."""
    import numpy as np
    from scipy import stats

    seeds = [s for s in arm if s in reference and _finite(arm[s]) and _finite(reference[s])]
    a = np.asarray([arm[s] for s in seeds], dtype=float)
    b = np.asarray([reference[s] for s in seeds], dtype=float)
    d = a - b
    estimate = t_estimate(d.tolist(), confidence)
    p = float("nan")
    if len(d) >= 2 and float(np.ptp(d)) > 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(stats.ttest_rel(a, b).pvalue)
    better = int((d > 0).sum() if higher_is_better else (d < 0).sum())
    ties = int((d == 0).sum())
    return Paired(estimate, p, better, len(d) - better - ties, ties)


def higher_is_better(quantity: str, study_metric: str = "", study_mode: str = "max") -> bool:
    """Whether a larger value of ``quantity`` is better: ``flat/*`` (lower = flatter) and epochs or
    steps to target are lower-is-better; accuracy-like names higher; loss, perplexity and error
    lower; a test metric named like the study metric (``test/x`` for ``val/x``) follows the study's
    mode; anything else counts as higher-is-better."""
    if quantity.startswith(FLAT_PREFIX) or quantity in TARGETS:
        return False
    leaf = quantity.rsplit("/", 1)[-1].lower()
    if any(w in leaf for w in _HIGHER_BETTER):
        return True
    if any(w in leaf for w in _LOWER_BETTER):
        return False
    if study_metric and leaf == study_metric.rsplit("/", 1)[-1].lower():
        return study_mode == "max"
    return True


# ---------------------------------------------------------------------------------------------------
# Which trials the table is over


def default_reference(arms: Sequence[str], recorded: Optional[str] = None) -> str:
    """The reference arm when none is asked for: the study's ``reference_arm`` as recorded on the
    launch (``recorded``) if it is one of ``arms``, else the arm named ``sgd`` (the baseline every
    flat-minima paper compares with), else the first arm alphabetically.

    Raises:
        ConfigError: ``arms`` is empty.
    """
    arms = sorted(set(arms))
    if not arms:
        raise ConfigError("no arms to compare: the study has no trials")
    if recorded and recorded not in ("None", "") and recorded in arms:
        return recorded
    return "sgd" if "sgd" in arms else arms[0]


def select_sample(df) -> Tuple[Any, str, List[str]]:
    """The trials a paper table is over, one per (arm, seed).

    The final-stage trials (``stage == "final"``) where the frame has any; otherwise, per arm, the
    best configuration (``param.*`` values; the one with the best mean ``best/<metric>``, else
    ``<metric>``, over its completed trials, by the frame's ``attrs`` metric and mode) with all its
    seeds. Where an (arm, seed) appears twice, the latest started trial is kept (noted).

    Args:
        df: a :func:`flatlab.tracking.results.trials_frame` table.
    Returns:
        ``(sample, source, notes)``: the chosen rows, ``"final"`` or ``"best configuration"``, and notes.
    Raises:
        ConfigError: ``df`` has no trials.
    """
    import pandas as pd

    if df is None or df.empty:
        raise ConfigError("no trials recorded for this study: nothing to compare")
    notes: List[str] = []
    if "stage" in df.columns and (df["stage"] == "final").any():
        sample, source = df[df["stage"] == "final"], "final"
        left = sorted(set(df["arm"]) - set(sample["arm"]))
        if left:
            notes.append(f"no final-stage trials for {', '.join(left)}: not in the table.")
    else:
        metric, mode = df.attrs.get("metric", "val/accuracy"), df.attrs.get("mode", "max")
        key = f"best/{metric}" if _has_values(df, f"best/{metric}") else metric
        params = [c for c in df.columns if c.startswith("param.")]
        done = _completed(df)
        parts = []
        for _, g in df.groupby("arm", sort=True):
            groups = [sub for _, sub in g.groupby(params, dropna=False, sort=False)] if params else [g]
            scores = []
            for sub in groups:
                vals = pd.to_numeric(sub.loc[done.loc[sub.index], key], errors="coerce") if key in sub else pd.Series(dtype=float)
                vals = vals[vals.map(_finite)]
                best = vals.mean() if len(vals) else float("nan")
                scores.append(best if mode == "max" else -best if _finite(best) else best)
            finite = [i for i, s in enumerate(scores) if _finite(s)]
            pick = max(finite, key=lambda i: scores[i]) if finite else 0  # first-best on ties
            parts.append(groups[pick])
        sample, source = pd.concat(parts), "best configuration"
    if "start_time" in sample.columns:
        sample = sample.sort_values("start_time", kind="stable", na_position="first")
    dup = sample.duplicated(["arm", "seed"], keep="last")
    if dup.any():
        pairs = ", ".join(f"{a} seed {s}" for a, s in sample.loc[dup, ["arm", "seed"]].itertuples(index=False))
        notes.append(f"repeated trials ({pairs}): the latest started of each is used.")
        sample = sample[~dup]
    sample = sample.sort_values(["arm", "seed"], kind="stable").reset_index(drop=True)
    sample.attrs.update(df.attrs)
    return sample, source, notes


# ---------------------------------------------------------------------------------------------------
# The table


def compare_table(df, *, metric: Optional[str] = None, reference: str, measures: Optional[Sequence[str]] = None,
                  confidence: float = CONFIDENCE, study: str = "") -> Comparison:
    """The paper table of a study's trials (see the module docstring for the statistics).

    Args:
        df: a :func:`flatlab.tracking.results.trials_frame` table (``attrs`` metric and mode).
        metric: the test metric (default ``test/perplexity``, ``test/accuracy`` or ``test/loss``, the
            first recorded).
        reference: the arm every other arm is paired against.
        measures: the ``flat/*`` measures to include (``fisher_trace`` or ``flat/fisher_trace``;
            default every one recorded in the sample except the auxiliary ``*_stderr`` and ``*_clean``).
        confidence: of the t-intervals, in (0, 1).
        study: the study's name, for titles.
    Returns:
        A :class:`Comparison`; quantities: the metric, the measures, then ``train/epochs_to_target``
        and/or ``train/steps_to_target`` where the launch has a target.
    Raises:
        ConfigError: no trials; unknown metric, reference arm or measure (listing the valid ones);
            ``confidence`` outside (0, 1).
    """
    from flatlab.tracking.results import _test_metric

    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise ConfigError(f"confidence={confidence!r}; expected a number in (0, 1), e.g. 0.95")
    sample, source, notes = select_sample(df)
    metric = metric or _test_metric(df) or "test/accuracy"
    if not _has_values(sample, metric):
        valid = sorted(c for c in sample.columns if "/" in c and not c.startswith(("param.", "best/")) and _has_values(sample, c))
        raise ConfigError(f"metric {metric!r} has no values in the compared trials; metrics there: {', '.join(valid) or '(none)'}")
    arms = sorted(sample["arm"].unique())
    if reference not in arms:
        raise ConfigError(f"reference arm {reference!r} is not in the compared trials; arms: {', '.join(arms)}")
    flat = [c for c in sorted(sample.columns) if c.startswith(FLAT_PREFIX) and _has_values(sample, c)]
    if measures is None:  # by default the measures' values, not their Monte-Carlo errors or clean losses
        flat = [c for c in flat if not c.endswith(AUXILIARY)]
    if measures is not None:
        wanted = [m if m.startswith(FLAT_PREFIX) else FLAT_PREFIX + m for m in measures]
        unknown = [m for m in wanted if m not in flat]
        if unknown:
            raise ConfigError(f"measures {', '.join(unknown)} not recorded in the compared trials; measures there: {', '.join(flat) or '(none)'}")
        flat = wanted
    targets = [q for q in TARGETS if q in df.columns and (_has_values(df, q) or (q == EPOCHS_TO_TARGET and _has_values(df, TARGET_REACHED)))]
    quantities = (metric, *flat, *targets)
    mode = df.attrs.get("mode", "max")
    better = {q: higher_is_better(q, df.attrs.get("metric", ""), mode) for q in quantities}

    done = _completed(sample)
    seeds = seed_values(sample, quantities)

    ordered = [reference] + [a for a in arms if a != reference]
    for arm in ordered:
        mine = seeds[seeds["arm"] == arm]
        failed = mine[~done.loc[mine.index]]
        if len(failed):
            what = ", ".join(f"seed {s} {o or 'unfinished'}" for s, o in failed[["seed", "outcome"]].itertuples(index=False))
            notes.append(f"{arm}: {what}; counted in the seeds run, no values from {'it' if len(failed) == 1 else 'them'}.")
        for q in targets:
            missed = mine[done.loc[mine.index] & mine[q].isna()]
            if len(missed):
                which = ", ".join(map(str, missed["seed"]))
                notes.append(f"{arm}: seed{'s' if len(missed) > 1 else ''} {which} completed without reaching the target ({q}).")

    if flat and _has_values(sample, TARGET_REACHED):
        notes.append("flat/* rows: measured at the training-loss target (stop_at_train_loss); seeds that missed it "
                     "are counted in the seeds run and give no flatness value.")
    rows = []
    for q in quantities:
        ref = _by_seed(seeds, reference, q)
        for arm in ordered:
            mine = _by_seed(seeds, arm, q)
            diff = None if arm == reference else paired_difference(mine, ref, higher_is_better=better[q], confidence=confidence)
            runs = int((seeds["arm"] == arm).sum())
            rows.append(Row(q, arm, runs, t_estimate(list(mine.values()), confidence), diff))
    return Comparison(metric, reference, float(confidence), source, quantities, better, tuple(rows), seeds.reset_index(drop=True),
                      tuple(notes), study)


def seed_values(sample, quantities: Sequence[str]):
    """Per (arm, seed) row of ``sample``: ``arm``, ``seed``, ``outcome``, ``run_id`` and each quantity's
    value, NaN unless the trial completed with a finite value (and, for ``train/epochs_to_target`` and
    every ``flat/*`` measure, ``train/target_reached == 1`` where recorded: flatness is compared at the
    matched training loss, so a seed that never reached it gives no flatness value)."""
    import pandas as pd

    done = _completed(sample)
    seeds = sample[[c for c in ("arm", "seed", "outcome", "run_id") if c in sample.columns]].copy()
    for q in quantities:
        values = pd.to_numeric(sample[q], errors="coerce") if q in sample else pd.Series(float("nan"), index=sample.index)
        keep = done & values.map(_finite)
        if (q == EPOCHS_TO_TARGET or q.startswith(FLAT_PREFIX)) and _has_values(sample, TARGET_REACHED):
            keep &= pd.to_numeric(sample[TARGET_REACHED], errors="coerce") == 1.0
        seeds[q] = values.where(keep)
    return seeds


def _by_seed(seeds, arm: str, quantity: str) -> Dict[Any, float]:
    mine = seeds[(seeds["arm"] == arm) & seeds[quantity].notna()]
    return dict(zip(mine["seed"], mine[quantity].astype(float)))


def _completed(df):
    """Trials that completed: outcome ``completed`` (or, untagged, MLflow status FINISHED)."""
    outcome = df["outcome"].fillna("") if "outcome" in df else None
    if outcome is None:
        return df["status"] == "FINISHED" if "status" in df else df["arm"].notna()
    untagged = (outcome == "") & (df["status"] == "FINISHED") if "status" in df else outcome == "__never__"
    return (outcome == "completed") | untagged


def _has_values(df, column: str) -> bool:
    import pandas as pd

    return column in df.columns and bool(pd.to_numeric(df[column], errors="coerce").map(_finite).any())


def _finite(v: Any) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------------
# Text output


def _num(v: Any, signed: bool = False) -> str:
    """4 significant digits, the whole integer part always (no exponent for step counts); ``-`` for NaN."""
    if not _finite(v):
        return "-"
    v = float(v)
    digits = max(4, int(math.floor(math.log10(abs(v)))) + 1 if v else 1)
    return f"{v:{'+' if signed else ''}.{digits}g}"


def _p(v: float) -> str:
    return f"{v:.3g}" if _finite(v) else "-"


def headers(comparison: Comparison) -> List[str]:
    """Column headers of the text tables (the markdown, LaTeX and rich outputs share them)."""
    pct = f"{comparison.confidence * 100:g}%"
    ref = comparison.reference
    return ["quantity", "arm", "seeds", "mean ± std", f"{pct} CI", f"Δ vs {ref}", f"Δ {pct} CI", "p (paired t)",
            f"seeds better arm:{ref}:tie"]


def cells(comparison: Comparison) -> List[List[str]]:
    """The text cells of each row, in :func:`headers` order."""
    out = []
    for r in comparison.rows:
        s, d = r.summary, r.diff
        seeds = f"{s.n}/{r.runs}" + (" reached" if r.quantity in TARGETS else "")
        spread = "-" if s.n == 0 else _num(s.mean) + ("" if not _finite(s.std) else f" ± {_num(s.std)}")
        ci = f"[{_num(s.low)}, {_num(s.high)}]" if _finite(s.low) else "-"
        if d is None:
            delta = dci = p = fav = "-"
        else:
            e = d.estimate
            delta = _num(e.mean, signed=True)
            dci = f"[{_num(e.low, signed=True)}, {_num(e.high, signed=True)}]" if _finite(e.low) else "-"
            p = _p(d.p)
            fav = f"{d.arm_better}:{d.ref_better}:{d.ties}" if e.n else "-"
        out.append([r.quantity, r.arm, seeds, spread, ci, delta, dci, p, fav])
    return out


def caption(comparison: Comparison) -> List[str]:
    """The lines under a table: what was compared, how, and what was left out."""
    c = comparison
    pct = f"{c.confidence * 100:g}%"
    over = "final-stage trials (each arm's best configuration over fresh seeds)" if c.source == "final" else (
        "each arm's best configuration (mean validation metric over its completed seeds), all its seeds")
    higher = [q for q in c.quantities if c.higher_is_better[q]]
    lower = [q for q in c.quantities if not c.higher_is_better[q]]
    lines = [
        f"Over {over}. seeds: seeds with a value / seeds run; mean ± sample std (ddof 1); {pct} CI: Student t "
        "interval of the mean over seeds.",
        f"Δ: per-seed difference arm − {c.reference}, seeds matched by seed value, with its {pct} t interval; "
        f"p: two-sided paired t-test; seeds better: seeds where the arm beats {c.reference} : where {c.reference} "
        "beats the arm : ties.",
        "Better is " + "; ".join(x for x in (f"higher {', '.join(higher)}" if higher else "",
                                            f"lower {', '.join(lower)}" if lower else "") if x) + " (flat/*: lower = flatter).",
        "Only completed trials give values; '-': no value, or fewer than 2 seeds (no std, CI or p).",
    ]
    if any(q in TARGETS for q in c.quantities):
        lines.append("To-target rows: k/n reached counts every seed run (failed seeds did not reach it); "
                     "their statistics and differences are over the seeds that reached it.")
    return lines + list(c.notes)


def to_markdown(comparison: Comparison) -> str:
    """A GitHub markdown table (title, table, then the caption as a list); numbers as printed by
    :func:`cells`, so they can be parsed back."""
    title = f"### {comparison.study + ': ' if comparison.study else ''}{comparison.metric} and flatness vs {comparison.reference}"
    table = markdown_table(headers(comparison), cells(comparison), left=2)
    return "\n".join([title, "", table, ""] + [f"- {line}" for line in caption(comparison)]) + "\n"


def markdown_table(head: Sequence[str], body: Sequence[Sequence[str]], left: int = 1) -> str:
    """A pipe table, the first ``left`` columns left-aligned and the rest right; ``|`` in a cell is escaped."""
    def line(cells_: Sequence[str]) -> str:
        return "| " + " | ".join(str(x).replace("|", "\\|") for x in cells_) + " |"

    rule = "|" + "|".join(["---"] * left + ["---:"] * (len(head) - left)) + "|"
    return "\n".join([line(head), rule] + [line(r) for r in body])


_LATEX = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "Δ": r"$\Delta$", "−": "-"}


def latex_escape(text: str) -> str:
    """``text`` with LaTeX's special characters escaped (``±`` and ``Δ`` as math)."""
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


def latex_table(head: Sequence[str], body: Sequence[Sequence[str]], caption_text: str = "", groups: Sequence[int] = ()) -> str:
    """A booktabs ``table`` environment (``\\usepackage{booktabs}``); ``groups``: row indices
    before which a ``\\midrule`` goes."""
    lines = [r"\begin{table}[t]", r"\centering", r"\begin{tabular}{ll" + "r" * (len(head) - 2) + "}", r"\toprule",
             " & ".join(latex_escape(h) for h in head) + r" \\", r"\midrule"]
    for i, r in enumerate(body):
        if i in groups and i:
            lines.append(r"\midrule")
        lines.append(" & ".join(latex_escape(c) for c in r) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption_text:
        lines.append(r"\caption{" + latex_escape(caption_text) + "}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def to_latex(comparison: Comparison) -> str:
    """A booktabs table, one block per quantity, the caption as ``\\caption``."""
    body = cells(comparison)
    starts = [i for i, r in enumerate(comparison.rows) if i == 0 or r.quantity != comparison.rows[i - 1].quantity]
    return latex_table(headers(comparison), body, " ".join(caption(comparison)), starts)


def to_csv(comparison: Comparison) -> str:
    """:meth:`Comparison.frame` as CSV, full precision."""
    return comparison.frame().to_csv(index=False)


def render(comparison: Comparison, console: Any) -> None:
    """Print the table with rich: one section per quantity, the caption under it."""
    from rich.table import Table

    title = f"{comparison.study + ': ' if comparison.study else ''}{comparison.metric} and flatness vs {comparison.reference}"
    table = Table(*headers(comparison), title=title)
    for col in table.columns:
        col.overflow = "fold"
    for i, (r, row) in enumerate(zip(comparison.rows, cells(comparison))):
        first = i == 0 or r.quantity != comparison.rows[i - 1].quantity
        if first and i:
            table.add_section()
        table.add_row(*([row[0] if first else ""] + row[1:]))
    console.print(table)
    for line in caption(comparison):
        console.print(line, soft_wrap=True)


def format_comparison(comparison: Comparison, fmt: str) -> str:
    """``markdown``, ``latex`` or ``csv`` text.

    Raises:
        ConfigError: another format.
    """
    writers = {"markdown": to_markdown, "latex": to_latex, "csv": to_csv}
    if fmt not in writers:
        raise ConfigError(f"--format {fmt!r} is not supported; expected one of {', '.join(FORMATS)}")
    return writers[fmt](comparison)


# ---------------------------------------------------------------------------------------------------
# Plot and MLflow


def plot_metric_vs_flatness(data, path, *, metric: Optional[str] = None, all_trials: bool = False) -> Path:
    """Save a PNG: the test metric against each flatness measure, one point per seed (completed
    trials), one colour per arm (the legend right of the panels, off the points); one panel per
    ``flat/*`` measure (log x where a measure is positive and spans more than two decades). Linear axes' tick labels carry no offset text
    (:func:`flatlab.tracking.plot_axes.plain_numbers`).

    Args:
        data: a :class:`Comparison`, or a ``trials_frame`` table (its :func:`select_sample` is plotted).
        path: the PNG file to write (its folder must exist).
        metric: the test metric when ``data`` is a table (default as in :func:`compare_table`).
        all_trials: with a table, plot every completed trial (a search's trials, one point each)
            instead of its :func:`select_sample`.
    Returns:
        ``path`` as a ``Path``.
    Raises:
        ConfigError: no trials, or no ``flat/*`` measure with values.
    """
    import numpy as np
    import pandas as pd
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from flatlab.tracking.plot_axes import plain_numbers
    from flatlab.tracking.results import _test_metric

    if isinstance(data, Comparison):
        seeds, metric, title = data.seeds, data.metric, data.study
    else:
        sample = data[_completed(data)] if all_trials else select_sample(data)[0]
        metric = metric or _test_metric(data) or "test/accuracy"
        seeds = seed_values(sample, [metric] + [c for c in sample.columns if c.startswith(FLAT_PREFIX)])
        title = ""
    measures = [c for c in seeds.columns if c.startswith(FLAT_PREFIX) and _has_values(seeds, c)]
    if not measures:
        raise ConfigError("no flat/* measure recorded in the compared trials: nothing to plot against the test metric")
    cols = min(3, len(measures))
    nrows = math.ceil(len(measures) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.6 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, cols, squeeze=False)).ravel()
    colours = {arm: f"C{i % 10}" for i, arm in enumerate(sorted(seeds["arm"].unique()))}
    for ax, m in zip(axes, measures):
        x_all = pd.to_numeric(seeds[m], errors="coerce")
        for arm, colour in colours.items():
            mine = seeds["arm"] == arm
            x, y = x_all[mine], pd.to_numeric(seeds.loc[mine, metric], errors="coerce")
            ok = x.map(_finite) & y.map(_finite)
            ax.scatter(x[ok], y[ok], color=colour, label=arm, s=28, alpha=0.85)
        pos = x_all[x_all.map(_finite)]
        if len(pos) and (pos > 0).all() and pos.max() / pos.min() > 100:
            ax.set_xscale("log")
        ax.set_xlabel(f"{m} (lower = flatter)")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if ax.get_xscale() == "linear":  # labels written out in full (1000001.5) need room: about 4 ticks
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        plain_numbers(ax)
    for ax in axes[len(measures):]:
        ax.set_visible(False)
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}  # every arm, once
    fig.legend(handles.values(), handles.keys(), loc="outside right upper", fontsize="small", title="arm")  # off the points
    if title:
        fig.suptitle(f"{title}: {metric} against flatness\n(one point per seed)", fontsize="medium")
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


def log_comparison(tracking_uri: str, parent_run_id: str, df, reference: Optional[str] = None, *,
                   metric: Optional[str] = None, confidence: float = CONFIDENCE, artifact_path: str = "compare",
                   study: str = "") -> List[str]:
    """Log the comparison of ``df`` to the launch's parent run: ``<artifact_path>/comparison.md``,
    ``comparison.csv``, ``comparison.json`` (the text table through ``log_table``, which MLflow's UI
    shows as a table) and, where flatness was measured, ``metric_vs_flatness.png``
    (``MlflowClient.log_text``/``log_artifact``).

    ``reference`` defaults to :func:`default_reference` with the parent run's param ``reference_arm``.
    Never raises (and never creates a store): a failure is logged as a warning and that artifact is
    skipped.

    Returns:
        The artifact paths logged.
    """
    from flatlab.tracking import runs

    logged: List[str] = []
    try:
        client = runs.client(runs.existing_store(tracking_uri))  # never creates a store
        if reference is None:
            recorded = client.get_run(parent_run_id).data.params.get("reference_arm")
            reference = default_reference(df["arm"].unique() if df is not None and "arm" in df else [], recorded)
        comparison = compare_table(df, metric=metric, reference=reference, confidence=confidence, study=study)
    except Exception as exc:  # noqa: BLE001
        logger.warning("compare: no comparison table for run %s: %s", parent_run_id, exc)
        return logged
    for name, write in (("comparison.md", to_markdown), ("comparison.csv", to_csv)):
        try:
            client.log_text(parent_run_id, write(comparison), f"{artifact_path}/{name}")
            logged.append(f"{artifact_path}/{name}")
        except Exception as exc:  # noqa: BLE001
            logger.warning("compare: logging %s to run %s failed: %s", name, parent_run_id, exc)
    try:  # the text table as an MLflow table artifact: the UI shows every column (its csv preview cuts them)
        import pandas as pd

        client.log_table(parent_run_id, data=pd.DataFrame(cells(comparison), columns=headers(comparison)),
                         artifact_file=f"{artifact_path}/comparison.json")
        logged.append(f"{artifact_path}/comparison.json")
    except Exception as exc:  # noqa: BLE001
        logger.warning("compare: logging comparison.json to run %s failed: %s", parent_run_id, exc)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            png = plot_metric_vs_flatness(comparison, Path(tmp) / "metric_vs_flatness.png")
            client.log_artifact(parent_run_id, str(png), artifact_path)
            logged.append(f"{artifact_path}/{png.name}")
    except Exception as exc:  # noqa: BLE001
        logger.warning("compare: no metric-vs-flatness plot for run %s: %s", parent_run_id, exc)
    return logged


# ---------------------------------------------------------------------------------------------------
# HPO efficiency


def hpo_efficiency(grid_df, search_df, *, metric: str, mode: str, tolerance: float, arm: Optional[str] = None) -> Dict[str, Any]:
    """The fraction of a paper grid's compute an Optuna + ASHA search of the same arm needed to reach
    the grid's best validation metric (issue 12, item 9).

    Compute is trial-epochs (column ``epochs``). The grid's best is the best ``best/<metric>``
    (else ``<metric>``) of its completed trials, a single trial's value (stricter than the best
    configuration's mean over seeds). The search's trials are taken in start order (``start_time``)
    and their epochs summed up to and including the first completed trial whose value is within
    ``tolerance`` of the grid's best (``>= best − tolerance`` for ``mode="max"``, ``<= best + tolerance``
    for ``"min"``); pruned, diverged and errored trials add their epochs but never count as reaching
    it. Final-stage trials (``stage == "final"``) are left out of both.

    Args:
        grid_df, search_df: ``trials_frame`` tables of the grid study and the search study.
        metric: the validation metric (e.g. ``val/accuracy``).
        mode: ``max`` or ``min``.
        tolerance: absolute, in the metric's units, >= 0.
        arm: only this arm's trials of both (default all trials).
    Returns:
        ``{"metric", "mode", "tolerance", "grid_best", "target", "grid_trials", "grid_epochs",
        "search_trials", "search_total_epochs", "reached", "trials_used", "search_epochs",
        "fraction", "run_id", "trial_id"}``; when the search never reaches the target, ``reached`` is
        False and ``trials_used``, ``search_epochs``, ``fraction``, ``run_id``, ``trial_id`` are None.
    Raises:
        ConfigError: ``mode`` not max/min, a negative or non-finite ``tolerance``, a frame without
            the ``epochs``/metric/``start_time`` columns, or a grid without a completed trial.
    """
    import pandas as pd

    if mode not in ("max", "min"):
        raise ConfigError(f"mode={mode!r}; expected 'max' or 'min'")
    if not _finite(tolerance) or tolerance < 0:
        raise ConfigError(f"tolerance={tolerance!r}; expected a finite number >= 0 in {metric}'s units")

    def trials(df, name: str):
        if df is None or df.empty:
            raise ConfigError(f"the {name} study has no trials")
        if arm is not None:
            if arm not in set(df["arm"]):
                raise ConfigError(f"arm {arm!r} is not in the {name} study; arms: {', '.join(sorted(set(df['arm'])))}")
            df = df[df["arm"] == arm]
        if "stage" in df.columns:
            df = df[df["stage"] != "final"]
        key = f"best/{metric}" if _has_values(df, f"best/{metric}") else metric
        missing = [c for c in ("epochs", key) if c not in df.columns]
        if missing:
            raise ConfigError(f"the {name} study's trials have no {', '.join(missing)} column")
        return df, key

    grid, gkey = trials(grid_df, "grid")
    search, skey = trials(search_df, "search")
    gvals = pd.to_numeric(grid.loc[_completed(grid), gkey], errors="coerce")
    gvals = gvals[gvals.map(_finite)]
    if gvals.empty:
        raise ConfigError(f"the grid study has no completed trial with {gkey}: no best to reach")
    best = float(gvals.max() if mode == "max" else gvals.min())
    target = best - tolerance if mode == "max" else best + tolerance
    if "start_time" not in search.columns or search["start_time"].isna().any():
        raise ConfigError("the search study's trials need start_time (trials_frame records it) to be taken in order")
    search = search.sort_values("start_time", kind="stable")
    epochs = pd.to_numeric(search["epochs"], errors="coerce").fillna(0)
    svals = pd.to_numeric(search[skey], errors="coerce")
    hits = _completed(search) & svals.map(_finite) & ((svals >= target) if mode == "max" else (svals <= target))
    grid_epochs = int(pd.to_numeric(grid["epochs"], errors="coerce").fillna(0).sum())
    out: Dict[str, Any] = {
        "metric": metric, "mode": mode, "tolerance": float(tolerance), "grid_best": best, "target": target,
        "grid_trials": int(len(grid)), "grid_epochs": grid_epochs, "search_trials": int(len(search)),
        "search_total_epochs": int(epochs.sum()), "reached": bool(hits.any()), "trials_used": None,
        "search_epochs": None, "fraction": None, "run_id": None, "trial_id": None,
    }
    if hits.any():
        pos = int(hits.to_numpy().argmax())  # first hit in start order
        used = int(epochs.iloc[: pos + 1].sum())
        first = search.iloc[pos]
        out.update(trials_used=pos + 1, search_epochs=used, fraction=used / grid_epochs if grid_epochs else None,
                   run_id=first.get("run_id"), trial_id=first.get("trial_id"))
    return out


def efficiency_cells(results: Mapping[str, Mapping[str, Any]]) -> Tuple[List[str], List[List[str]]]:
    """Headers and text cells of :func:`hpo_efficiency` results per arm (``{arm: result}``)."""
    head = ["arm", "grid best", "target", "grid trial-epochs", "search trial-epochs to target", "trials used",
            "fraction of grid compute"]
    body = []
    for a, r in results.items():
        reached = r["reached"]
        body.append([a, _num(r["grid_best"]), _num(r["target"]), str(r["grid_epochs"]),
                     f"{r['search_epochs']}" if reached else f"not reached ({r['search_total_epochs']} spent)",
                     f"{r['trials_used']}/{r['search_trials']}" if reached else f"-/{r['search_trials']}",
                     _num(r["fraction"]) if reached and r["fraction"] is not None else "-"])
    return head, body
