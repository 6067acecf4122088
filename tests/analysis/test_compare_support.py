"""Intervals of arms' means clipped to the quantity's range (accuracy in [0, 1]; Fisher trace and losses
>= 0; a Hutchinson Hessian trace unbounded), never the paired differences; and the caption's counts."""

import math

import pandas as pd
import pytest
from rich.console import Console

from flatlab.analysis import compare as cmp
from flatlab.analysis.compare.statistics import clip, t_estimate
from flatlab.analysis.compare.table import quantity_support
from flatlab.ranges import LOSS, NO_RANGES, NONNEGATIVE, Ranges
from flatlab.sharpness.measures import Measure, measure_support
from flatlab.workloads.ranges import ranges_of

T975_1 = math.tan(math.pi * 0.475)  # t_{0.975, 1} in closed form: 12.7062...
T975_2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # t_{0.975, 2}: 4.3027...
NAN = float("nan")
# seed: (test/accuracy, test/loss, flat/fisher_trace, flat/hessian_trace); NaN: no value from that seed
SEEDS = {
    "ref": {1: (0.99, 0.0, 0.0, 0.0), 2: (1.0, 1.0, 1.0, 1.0), 3: (1.0, NAN, NAN, NAN)},
    "arm": {1: (0.90, 0.2, 2.0, 2.0), 2: (0.91, 0.3, 4.0, NAN), 3: (0.92, NAN, NAN, NAN)},
}


def frame(workload="digits"):
    rows = [
        {
            "arm": arm,
            "seed": seed,
            "outcome": "completed",
            "stage": "final",
            "test/accuracy": acc,
            "test/loss": loss,
            "flat/fisher_trace": fisher,
            "flat/hessian_trace": hessian,
            "best/val/accuracy": acc,
            "epochs": 5,
            "run_id": f"{arm}{seed}",
            "start_time": seed,
        }
        for arm, seeds in SEEDS.items()
        for seed, (acc, loss, fisher, hessian) in seeds.items()
    ]
    df = pd.DataFrame(rows)
    df.attrs.update(metric="val/accuracy", mode="max", workload=workload)
    return df


def test_clip_by_hand():
    fisher = t_estimate([0.0, 1.0])  # mean 0.5, std sqrt(0.5), half-width t_1 * std / sqrt(2) = t_1 / 2
    assert (fisher.low, fisher.high) == pytest.approx((0.5 - T975_1 / 2, 0.5 + T975_1 / 2), rel=1e-12)
    clipped = clip(fisher, NONNEGATIVE)
    assert (clipped.n, clipped.mean, clipped.std) == (fisher.n, fisher.mean, fisher.std)
    assert clipped.low == 0.0 and clipped.high == pytest.approx(0.5 + T975_1 / 2, rel=1e-12)
    acc = t_estimate([0.99, 1.0, 1.0])  # mean 0.99667, std 0.01 / sqrt(3), half-width t_2 * 0.01 / 3
    assert acc.high == pytest.approx(2.99 / 3 + T975_2 * 0.01 / 3, rel=1e-12) and acc.high > 1
    assert (clip(acc, (0.0, 1.0)).low, clip(acc, (0.0, 1.0)).high) == pytest.approx(
        (2.99 / 3 - T975_2 * 0.01 / 3, 1.0), rel=1e-12
    )
    assert clip(acc, None) is acc and clip(acc, (0.0, 2.0)) is acc  # unbounded, or already inside: unchanged
    one = t_estimate([5.0])
    assert clip(one, NONNEGATIVE) is one  # no interval to clip (NaN stays NaN)


def test_ranges_per_quantity():
    def q(quantity, workload=None):
        return quantity_support(quantity, ranges_of(workload))

    assert q("test/accuracy") == (0.0, 1.0) == q("val/accuracy", "toy/tsam_wave")
    assert q("test/loss", "digits") == (0.0, math.inf) == q("train/loss", "digits")
    assert q("test/loss") is None  # no workload known: a loss may be negative (the toys')
    assert q("val/loss", "toy/tsam_kink") is None and q("test/loss", "no_such_wl") is None
    assert q("test/perplexity", "lm/wikitext2") == (1.0, math.inf)  # exp of a loss >= 0
    assert q("test/matthews", "glue/cola") == (-1.0, 1.0)
    assert q("flat/fisher_trace") == NONNEGATIVE == q("flat_at_target/fisher_trace")
    assert q("flat/hessian_trace", "digits") is None  # Tr(H) < 0 at a saddle; v^T H v of any sign
    assert q("flat/avg_sharpness", "digits") is None  # a difference of losses
    assert q("flat/neighbourhood_loss/sigma_0.01", "digits") == NONNEGATIVE
    assert q("flat/neighbourhood_loss/sigma_0.01", "toy/tsam_wave") is None
    assert q("flat/neighbourhood_loss/sigma_0.01_var", "toy/tsam_wave") == NONNEGATIVE
    assert measure_support("flat/param_norm", NONNEGATIVE) is None  # not declared: unbounded
    assert q("train/epochs_to_target") is None


def test_the_analysis_knows_only_the_names_unless_handed_the_ranges():
    assert quantity_support("test/accuracy") == (0.0, 1.0) and quantity_support("test/loss") is None
    assert quantity_support("flat/fisher_trace") is None and NO_RANGES == Ranges()
    given = Ranges(loss=(0.0, math.inf), measures={"flat/x_<s>": LOSS, "flat/y": (0.0, 2.0)})
    assert quantity_support("test/loss", given) == (0.0, math.inf) == quantity_support("flat/x_0.1", given)
    assert quantity_support("flat_at_target/y", given) == (0.0, 2.0) and quantity_support("flat/z", given) is None
    assert quantity_support("test/perplexity", given) == (1.0, math.inf)


def test_a_measures_support_must_name_its_metrics():
    with pytest.raises(ValueError, match=r"support names 'flat/y', not one of its metrics"):
        Measure("x", "", "", (), lambda *a: {}, ("flat/x",), {"flat/y": NONNEGATIVE})
    with pytest.raises(ValueError, match=r"must be \(low, high\) with low <= high or LOSS"):
        Measure("x", "", "", (), lambda *a: {}, ("flat/x",), {"flat/x": (1.0, 0.0)})
    assert Measure("x", "", "", (), lambda *a: {}, ("flat/x",), {"flat/x": LOSS}).support == {"flat/x": LOSS}


def test_arm_intervals_are_clipped_and_differences_tests_are_not():
    c = cmp.compare_table(
        frame(), reference="ref", measures=["fisher_trace", "hessian_trace"], ranges=ranges_of("digits")
    )
    ref_acc = c.row("test/accuracy", "ref")
    assert ref_acc.clipped and ref_acc.summary.high == 1.0 and ref_acc.summary.mean == pytest.approx(2.99 / 3)
    assert not c.row("test/accuracy", "arm").clipped  # [0.8852, 0.9348]: inside [0, 1]
    fisher = c.row("flat/fisher_trace", "arm")  # [2, 4]: mean 3, half-width t_1 * sqrt(2) / sqrt(2)
    assert (fisher.summary.low, fisher.summary.high) == pytest.approx((0.0, 3.0 + T975_1), rel=1e-12)
    assert c.row("flat/fisher_trace", "ref").summary.low == 0.0
    hessian = c.row("flat/hessian_trace", "ref")  # unbounded: the negative bound stays
    assert not hessian.clipped and hessian.summary.low == pytest.approx(0.5 - T975_1 / 2, rel=1e-12)
    d = c.row("flat/fisher_trace", "arm").diff  # differences 2, 3: [2.5 -+ t_1 / 2], below zero kept
    assert d.estimate.low == pytest.approx(2.5 - T975_1 / 2, rel=1e-12) and d.estimate.low < 0
    raw = cmp.paired_difference({1: 0.90, 2: 0.91, 3: 0.92}, {1: 0.99, 2: 1.0, 3: 1.0}, higher_is_better=True)
    assert c.row("test/accuracy", "arm").diff == raw  # the test and its p-value are unchanged
    assert c.frame().set_index(["quantity", "arm"]).loc[("flat/fisher_trace", "arm"), "ci_low"] == 0.0
    md = cmp.to_markdown(c)
    assert "| [0, 15.71] |" in md and "| [0, 6.853] |" in md  # 3 + t_1, 0.5 + t_1 / 2 at 4 digits
    notes = [line for line in cmp.caption(c) if "clipped" in line]
    assert notes == [
        "CI of a mean clipped to the quantity's range where the t interval reaches outside it "
        "(test/accuracy in [0, 1]; flat/fisher_trace ≥ 0): the true mean lies in it too, so the coverage "
        "is unchanged; Δ intervals are not clipped."
    ]
    assert r"flat/fisher\_trace $\geq$ 0" in cmp.to_latex(c)


def test_a_loss_is_clipped_only_where_the_workload_says_it_is_nonnegative():
    digits = cmp.compare_table(frame(), metric="test/loss", reference="ref", measures=[], ranges=ranges_of("digits"))
    assert digits.row("test/loss", "ref").summary.low == 0.0  # [0.0, 1.0]: 0.5 - t_1 / 2 < 0
    toy = cmp.compare_table(
        frame(), metric="test/loss", reference="ref", measures=[], ranges=ranges_of("toy/tsam_wave")
    )
    assert toy.row("test/loss", "ref").summary.low == pytest.approx(0.5 - T975_1 / 2, rel=1e-12)
    assert not any("clipped" in line for line in cmp.caption(toy))


def test_one_test_and_no_test_read_correctly():
    c = cmp.compare_table(
        frame(), reference="ref", measures=["hessian_trace"], ranges=ranges_of("digits")
    )  # hessian: arm has 1 seed, no test
    text = " ".join(cmp.caption(c))
    assert "1 quantity, 1 test in all" in text and "1 tests" not in text
    assert "against ref: test/accuracy: arm." in text  # differences -0.09, -0.09, -0.08: t = -26, p = 0.0015
    console = Console(record=True, width=250)
    cmp.render(c, console)
    out = console.export_text()
    assert "test/accuracy (higher is better; 1 test, Holm-adjusted)" in out
    assert "flat/hessian_trace (lower = flatter; no paired test)" in out and "0 tests" not in out
