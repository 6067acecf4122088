"""The verdict on an arm against the reference, tested at the level of the tuning.

The estimand is the difference between the arms *as tuned by the study's protocol*,
delta = E[y_arm] − E[y_ref] over independent tunings and seeds, in the model
y[a,k,s] = mu_a + u[a,k] + v[k,s] + e[a,k,s] (u: tuning k's effect on arm a; v: seed s's, shared by matched
seeds; e: the rest). Each tuning k gives one value d_k, the mean over its matched seeds of arm − reference,
and the S values d_k are independent with one variance, sigma^2_tuning(Δ) + sigma^2_seed(Δ) / m.

* :func:`tuning_t_test`: the one-sample t over the d_k (S − 1 degrees of freedom): estimate, interval,
  two-sided p. Vectorised over leading axes, so a simulation calls the same code.
* :func:`tost`: the two one-sided tests of equivalence at margin ±m (Schuirmann, *J. Pharmacokin.
  Biopharm.* 15:657-680, 1987) over the same d_k.
* :func:`heterogeneity`: whether the difference depends on the tuning: the one-way ANOVA F of the
  per-seed differences across tunings, the between-tuning SD and the tunings whose sign disagrees.
* :func:`claims`: a family (the arms of one quantity against one reference): Holm across the arms for
  each of the three tests, and the label: **directional** ("flatter than sgd") when p_Holm < alpha, **"no
  difference larger than ±m"** when the Holm-adjusted TOST passes, else **inconclusive**, with the
  smallest effect the design detects at power 0.8 (:func:`flatlab.analysis.design.detectable_effect`).

An interval that excludes 0 never carries an equivalence or "no difference" label, and a directional
label always has an interval on its side of 0 (p_Holm >= p). The rule, its simulated error rates and the
design arithmetic are in docs/comparing.md; the model follows Bouthillier et al., MLSys 2021, "Accounting
for Variance in Machine Learning Benchmarks" (the tuning as the unit of replication).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

from flatlab.analysis.compare.statistics import CONFIDENCE, Estimate, finite, holm
from flatlab.analysis.design import detectable_effect
from flatlab.analysis.replication import variance_components
from flatlab.analysis.sample import AT_TARGET_PREFIX, FLAT_PREFIX
from flatlab.errors import ConfigError
from flatlab.lazy import lazy

stats = lazy("scipy.stats")

NAN = float("nan")
ALPHA = round(1 - CONFIDENCE, 12)
SHOWN, EQUIVALENT, INCONCLUSIVE = "shown", "equivalent", "inconclusive"
"""The three labels of a claim (:attr:`Claim.label`)."""


@dataclass(frozen=True)
class Heterogeneity:
    """Whether arm − reference depends on the tuning (:func:`heterogeneity`).

    Attributes:
        sd: the between-tuning SD of the difference, sqrt(sigma^2_tuning) of the per-seed differences
            (one-way random-effects ANOVA; the quantity's units); NaN where undefined.
        f, df_between, df_within, p: the one-way ANOVA F = MS_between / MS_within of the per-seed
            differences across tunings and its p-value (NaN where no tuning has two seeds).
        disagree: tunings whose d_k has the sign opposite to the across-tuning estimate.
        p_holm: ``p`` Holm-adjusted across the arms of the family (set by :func:`claims`).
    """

    sd: float
    f: float
    df_between: int
    df_within: int
    p: float
    disagree: int
    p_holm: float = NAN

    def depends(self, alpha: float = ALPHA) -> bool:
        """Whether the heterogeneity is significant after Holm (``p_holm < alpha``)."""
        return finite(self.p_holm) and self.p_holm < alpha


@dataclass(frozen=True)
class Claim:
    """One arm against the reference for one quantity, at the level of the tuning (:func:`claims`).

    Attributes:
        quantity, arm, reference: which.
        per_tuning: d_k per tuning (NaN where a tuning has no matched seed).
        estimate: the mean of the d_k with its Student t interval over the S' tunings with a value.
        p, p_holm: the two-sided one-sample t-test of mean d_k = 0, raw and Holm-adjusted across arms.
        margin: the equivalence margin m (the quantity's units; NaN: no equivalence test).
        margin_source: where m came from: ``study``, ``default (1 point)``, ``default (10 % of sgd)``.
        p_equivalence, p_equivalence_holm: the TOST p-value at ±m, raw and Holm-adjusted.
        detectable: the smallest |delta| this design detects with power 0.8 (same units).
        heterogeneity: does the difference depend on the tuning (:class:`Heterogeneity`).
        label: ``shown``, ``equivalent`` or ``inconclusive``.
        direction: the sign of the estimate (+1, −1, 0).
        text: the label in the quantity's own words (``flatter than sgd``).
    """

    quantity: str
    arm: str
    reference: str
    per_tuning: Tuple[float, ...]
    estimate: Estimate
    p: float
    p_holm: float
    margin: float
    margin_source: str
    p_equivalence: float
    p_equivalence_holm: float
    detectable: float
    heterogeneity: Heterogeneity
    label: str
    direction: int
    text: str


def tuning_t_test(d: Any, confidence: float = CONFIDENCE) -> Tuple[Any, Any, Any, Any, Any]:
    """The one-sample t-test of mean(d_k) = 0 over the last axis of ``d`` (S tunings; NaN: left out).

    ``t = mean / (sd / sqrt(S))`` with S − 1 degrees of freedom, two-sided ``p = 2 T_{S−1}(−|t|)`` and the
    interval ``mean ± t_{(1+c)/2, S−1} · sd / sqrt(S)``. When every d_k is equal (sd = 0), t is ±inf or 0/0:
    the limit is taken, p = 0 for a non-zero mean and p = 1 for a zero one, with a zero-width interval. Fewer
    than two values: NaN p and interval.

    Args:
        d: shape ``(..., S)``, the per-tuning differences (the quantity's units).
        confidence: the interval's level, in (0, 1).
    Returns:
        ``(n, mean, sd, (low, high), p)``, each of shape ``(...)`` (floats for a 1-D ``d``).
    """
    x = np.asarray(d, dtype=float)
    ok = np.isfinite(x)
    n = ok.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, x, 0.0).sum(axis=-1) / n
        dev = np.where(ok, x - mean[..., None], 0.0)
        sd = np.sqrt((dev**2).sum(axis=-1) / (n - 1))
        sd = np.where(sd <= 1e-12 * np.maximum(np.abs(mean), 1e-300), 0.0, sd)  # all equal up to rounding
        se = sd / np.sqrt(n)
        df = np.maximum(n - 1, 1)
        t = mean / se
        p = 2 * stats.t.sf(np.abs(t), df)
        p = np.where(se == 0, np.where(mean == 0, 1.0, 0.0), p)
        half = stats.t.ppf((1 + confidence) / 2, df) * se
    few = n < 2
    p = np.where(few, NAN, p)
    low, high = np.where(few, NAN, mean - half), np.where(few, NAN, mean + half)
    sd = np.where(few, NAN, sd)
    mean = np.where(n == 0, NAN, mean)
    return _scalar(n), _scalar(mean), _scalar(sd), (_scalar(low), _scalar(high)), _scalar(p)


def tost(d: Any, margin: Any) -> Any:
    """The TOST p-value of equivalence within ±``margin`` over the last axis of ``d`` (S tunings).

    Two one-sided t-tests with S − 1 degrees of freedom, H0: delta <= −m against delta > −m, and H0:
    delta >= m against delta < m; the p-value is the larger of the two (Schuirmann 1987). Rejecting at alpha
    is the (1 − 2 alpha) t interval lying inside (−m, m). Equal d_k (sd = 0): p = 0 if |mean| < m, else 1.
    A non-finite or non-positive margin, or fewer than two values: NaN.

    Args:
        d: shape ``(..., S)``, the per-tuning differences.
        margin: m > 0, broadcastable to ``d.shape[:-1]`` (the quantity's units).
    """
    n, mean, sd, _, _ = tuning_t_test(d)
    n, mean, sd = np.asarray(n), np.asarray(mean, dtype=float), np.asarray(sd, dtype=float)
    m = np.broadcast_to(np.asarray(margin, dtype=float), mean.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        se = sd / np.sqrt(n)
        df = np.maximum(n - 1, 1)
        p_low = stats.t.sf((mean + m) / se, df)  # H0: delta <= -m
        p_high = stats.t.cdf((mean - m) / se, df)  # H0: delta >= m
        p = np.maximum(p_low, p_high)
        p = np.where(se == 0, np.where(np.abs(mean) < m, 0.0, 1.0), p)
    p = np.where((n < 2) | ~np.isfinite(m) | (m <= 0), NAN, p)
    return _scalar(p)


def heterogeneity(per_seed: Sequence[Sequence[float]], estimate: float) -> Heterogeneity:
    """Whether the per-seed differences vary across tunings more than the seed noise explains.

    The one-way ANOVA of ``per_seed[k]`` (tuning k's per-seed differences arm − reference) across the
    tunings: F = MS_between / MS_within with (S − 1, N − S) degrees of freedom and its upper-tail p-value
    (Searle, Casella & McCulloch, *Variance Components*, 1992, ch. 3-4). MS_within = 0 (every tuning's
    seeds agree exactly): p = 0 if the tunings differ, else 1. No tuning with two seeds: F and p NaN.

    Args:
        per_seed: one sequence per tuning (NaN dropped; a tuning without values is left out).
        estimate: the across-tuning estimate whose sign the disagreeing tunings are counted against.
    """
    rows = [np.asarray([v for v in r if finite(v)], dtype=float) for r in per_seed]
    rows = [r for r in rows if r.size]
    c = variance_components(rows) if rows else None
    s, n = len(rows), sum(r.size for r in rows)
    f = p = NAN
    if c is not None and finite(c.ms_between) and finite(c.ms_within):
        if c.ms_within > 0:
            f = c.ms_between / c.ms_within
            p = float(stats.f.sf(f, s - 1, n - s))
        else:
            f, p = (math.inf, 0.0) if c.ms_between > 0 else (NAN, 1.0)
    sign = np.sign(estimate) if finite(estimate) else 0.0
    disagree = int(sum(1 for r in rows if sign and np.sign(r.mean()) == -sign))
    sd = math.sqrt(c.tuning) if c is not None and finite(c.tuning) else NAN
    return Heterogeneity(sd, f, max(s - 1, 0), max(n - s, 0), p, disagree)


def claims(
    quantity: str,
    reference: str,
    per_seed: Mapping[str, Sequence[Sequence[float]]],
    *,
    higher_is_better: bool,
    margin: Optional[float] = None,
    margin_source: str = "",
    alpha: float = ALPHA,
    detect: bool = True,
) -> Tuple[Claim, ...]:
    """The claims of one family: every arm of ``per_seed`` against ``reference`` for one quantity.

    Args:
        quantity: the quantity's name (``test/accuracy``, ``flat/fisher_trace``); it chooses the words.
        reference: the reference arm's name.
        per_seed: arm -> per tuning, the per-seed differences arm − reference over the matched seeds (tunings
            in one order for every arm; an empty tuning is left out).
        higher_is_better: the quantity's direction (flatness: lower is flatter).
        margin, margin_source: the equivalence margin m > 0 and where it came from (``None``: no TOST).
        alpha: the family-wise level, in (0, 1).
        detect: compute each claim's detectable effect (a root search; simulations skip it: NaN).
    Returns:
        One :class:`Claim` per arm, in ``per_seed``'s order.
    Raises:
        ConfigError: ``alpha`` outside (0, 1), or a margin that is not a positive number.
    """
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise ConfigError(f"alpha must be a number in (0, 1), e.g. 0.05; got {alpha!r}")
    if margin is not None and not (finite(margin) and float(margin) > 0):
        raise ConfigError(f"the equivalence margin of {quantity} must be a positive number; got {margin!r}")
    arms = list(per_seed)
    d = {a: [float(np.mean(r)) if len(r) else NAN for r in (_finite(t) for t in per_seed[a])] for a in arms}
    tests = {a: tuning_t_test(d[a], 1 - alpha) for a in arms}
    m = NAN if margin is None else float(margin)
    p_eq = {a: tost(d[a], m) for a in arms}
    het = {a: heterogeneity(per_seed[a], tests[a][1]) for a in arms}
    p_holm = dict(zip(arms, holm([tests[a][4] for a in arms])))
    eq_holm = dict(zip(arms, holm([p_eq[a] for a in arms])))
    het_holm = dict(zip(arms, holm([het[a].p for a in arms])))
    out = []
    for a in arms:
        n, mean, sd, (low, high), p = tests[a]
        direction = int(np.sign(mean)) if finite(mean) else 0
        detectable = detectable_effect(sd, n, alpha / max(len(arms), 1)) if detect and finite(sd) else NAN
        kind = label(p_holm[a], eq_holm[a], low, high, alpha)
        text = _text(kind, quantity, direction, higher_is_better, reference, m, detectable)
        estimate = Estimate(int(n), float(mean), float(sd), float(low), float(high))
        tested = dict(p=float(p), p_holm=p_holm[a], p_equivalence=float(p_eq[a]), p_equivalence_holm=eq_holm[a])
        out.append(
            Claim(
                quantity=quantity,
                arm=a,
                reference=reference,
                per_tuning=tuple(d[a]),
                estimate=estimate,
                margin=m,
                margin_source=margin_source,
                detectable=float(detectable),
                label=kind,
                direction=direction,
                text=text,
                heterogeneity=replace(het[a], p_holm=het_holm[a]),
                **tested,
            )  # fmt: skip
        )
    return tuple(out)


def label(p_holm: float, eq_holm: float, low: float, high: float, alpha: float) -> str:
    """``shown`` when p_Holm < alpha; ``equivalent`` when the Holm-adjusted TOST passes and the interval
    contains 0 (never beside an interval that excludes it); else ``inconclusive``."""
    if finite(p_holm) and p_holm < alpha:
        return SHOWN
    if finite(eq_holm) and eq_holm < alpha and not (low > 0 or high < 0):
        return EQUIVALENT
    return INCONCLUSIVE


def words(quantity: str, better: bool) -> str:
    """How the arm compares in the quantity's own words: flatness (``flat/``, ``flat_at_target/``, the measures
    over training ``flat_curve*/``) ``flatter``/``sharper``, accuracy ``more accurate``/``less accurate``, a
    loss or perplexity ``lower``/``higher``, steps or epochs to a target ``faster``/``slower``; otherwise
    ``better``/``worse``. ``better``: in the quantity's good direction."""
    q = quantity.lower()
    if q.startswith((FLAT_PREFIX, AT_TARGET_PREFIX, "flat_curve")):
        return "flatter" if better else "sharper"
    if "accuracy" in q:
        return "more accurate" if better else "less accurate"
    if "to_target" in q:
        return "faster to the target" if better else "slower to the target"
    if "loss" in q or "perplexity" in q:
        return "lower" if better else "higher"
    return "better" if better else "worse"


def _text(label: str, quantity: str, direction: int, higher: bool, ref: str, m: float, detect: float) -> str:
    if label == SHOWN:
        return f"{words(quantity, (direction > 0) == higher)} than {ref}"
    if label == EQUIVALENT:
        return f"no difference larger than {margin_text(m)}"
    return f"inconclusive (detects ±{_num(detect)})" if finite(detect) else "inconclusive"


def margin_text(m: float) -> str:
    """A margin as the labels write it: ``±0.01``."""
    return f"±{_num(m)}"


def _num(v: float) -> str:
    return f"{v:.3g}"


def _finite(values: Sequence[float]) -> list:
    return [float(v) for v in values if finite(v)]


def _scalar(a: Any) -> Any:
    """A 0-d array as a Python number; anything else unchanged."""
    a = np.asarray(a)
    return a.item() if a.ndim == 0 else a
