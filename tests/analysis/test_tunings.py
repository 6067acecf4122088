"""The comparison of a multi-tuning study: two-level intervals and the claims tested over the tunings, checked by
hand on constructed final stages of 3 tunings x 3 seeds."""

import math

import numpy as np
import pandas as pd
import pytest
from rich.console import Console
from scipy import stats

from flatlab.analysis import tunings_text
from flatlab.analysis.compare.text import caption, single_tuning_note
from flatlab.analysis.sample import Sample, StudyInfo
from flatlab.analysis.tunings import compare_tunings
from flatlab.errors import ConfigError
from flatlab.workloads.ranges import ranges_of

SEEDS = (1, 2, 3)


def final_stage(effects):
    """Final-stage trials of arms ``sgd`` and ``sam`` in 3 tunings x 3 seeds. ``effects[k]``: sam's flatness
    minus sgd's in tuning k (the same at every seed up to a small seed pattern), so the paired test of each
    tuning is decided by its sign."""
    rows = []
    pattern = (0.0, 0.05, -0.05)
    for k, effect in enumerate(effects, start=1):
        for j, seed in enumerate(SEEDS):
            s = seed + (k - 1) * 1_000_000
            base = 10.0 + k + pattern[j]
            for arm, flat, acc in (("sgd", base, 0.90), ("sam", base + effect + pattern[j] / 10, 0.91)):
                rows.append(
                    {
                        "arm": arm,
                        "tuning": k,
                        "seed": s,
                        "stage": "final",
                        "outcome": "completed",
                        "test/accuracy": acc + 0.001 * j,
                        "flat/fisher_trace": flat,
                        "run_id": f"{arm}{k}{seed}",
                    }
                )
    df = pd.DataFrame(rows)
    df.attrs.update(metric="val/accuracy", mode="max")
    return df


def test_a_claim_is_tested_over_the_per_tuning_differences():
    c = compare_tunings(final_stage([-2.0, -3.0, -2.5]), study="toy")
    row = c.row("flat/fisher_trace", "sam")
    # each tuning's d_k is its effect (the seed pattern sums to 0): -2, -3, -2.5; the claim: a t over those three
    diffs = [-2.0, -3.0, -2.5]
    assert row.claim.per_tuning == pytest.approx(diffs)
    d = row.claim.estimate
    half = stats.t.ppf(0.975, 2) * np.std(diffs, ddof=1) / math.sqrt(3)
    assert d.mean == pytest.approx(-2.5) and (d.low, d.high) == pytest.approx((-2.5 - half, -2.5 + half))
    assert row.claim.p == pytest.approx(stats.ttest_1samp(diffs, 0.0).pvalue) == row.claim.p_holm  # one arm
    assert row.claim.label == "shown" and row.claim.text == "flatter than sgd"
    assert row.claim.heterogeneity.depends(c.alpha)  # the tunings differ far more than the seeds (.005)
    assert "sam flatter than sgd (flat/fisher_trace)" in tunings_text.summary(c)[0]
    assert c.row("test/accuracy", "sam").claim.text == "more accurate than sgd"  # +0.01 in every tuning, seeds equal


def test_one_tuning_flipping_the_sign_is_inconclusive_and_depends_on_the_tuning():
    c = compare_tunings(final_stage([-2.0, -3.0, +2.0]))
    row = c.row("flat/fisher_trace", "sam")
    assert row.claim.label == "inconclusive" and row.claim.text.startswith("inconclusive (detects ±")
    assert row.claim.heterogeneity.depends(c.alpha) and row.claim.heterogeneity.disagree == 1
    lines = tunings_text.summary(c)
    assert "flat/fisher_trace" not in lines[0] and "sam vs sgd (flat/fisher_trace)" in lines[2]


def test_margins_come_from_the_study_else_the_default_and_the_table_names_them():
    df = final_stage([-0.1, 0.05, 0.02])
    c = compare_tunings(df)
    flat = c.row("flat/fisher_trace", "sam").claim
    assert flat.margin == pytest.approx(0.1 * 12.0) and flat.margin_source == "default (10 % of sgd)"
    assert c.row("test/accuracy", "sam").claim.margin_source == "default (1 point)"
    df.attrs["margins"] = {"flat/fisher_trace": 0.5}  # Study(margins=...) as the launch records it
    own = compare_tunings(df).row("flat/fisher_trace", "sam").claim
    assert (own.margin, own.margin_source) == (0.5, "study")
    cli = compare_tunings(df, margins={"flat/fisher_trace": 0.25}).row("flat/fisher_trace", "sam").claim
    assert (
        (cli.margin, cli.margin_source) == (0.25, "given")
        and cli.label == "equivalent"
        and cli.text == "no difference larger than ±0.25"
    )


def test_the_reference_arm_has_the_two_level_interval_and_the_tuning_share_by_hand():
    c = compare_tunings(final_stage([-2.0, -3.0, -2.5]))
    a = c.row("flat/fisher_trace", "sgd").across
    # sgd: tuning k's values 10 + k + (0, .05, -.05): means 11, 12, 13; MS_within = (2 * .05^2) / 2 = .0025;
    # MS_between = 3 * ((11-12)^2 + 0 + 1) / 2 = 3; sigma2_tuning = (3 - .0025) / 3
    assert a.tuning_means == pytest.approx((11.0, 12.0, 13.0)) and a.median == pytest.approx(12.0)
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert (a.estimate.low, a.estimate.high) == pytest.approx((12 - half, 12 + half))
    tuning = (3 - 0.0025) / 3
    assert a.components.share == pytest.approx(tuning / (tuning + 0.0025))


def test_text_outputs_carry_every_arm_the_claims_and_the_summary():
    c = compare_tunings(final_stage([-2.0, -3.0, +2.0]), study="toy")
    md = tunings_text.to_markdown(c)
    assert "inconclusive (detects ±" in md and "(reference)" in md and md.count("\n| ") >= 4
    assert "depends on the tuning: SD" in md and "p Holm" in md
    frame = pd.read_csv(__import__("io").StringIO(tunings_text.to_csv(c)))
    sam = frame[(frame["arm"] == "sam") & (frame["quantity"] == "flat/fisher_trace")].iloc[0]
    assert [sam["diff_t1"], sam["diff_t2"], sam["diff_t3"]] == pytest.approx([-2.0, -3.0, 2.0])
    assert sam["label"] == "inconclusive" and bool(sam["depends"]) and sam["het_disagree"] == 1
    console = Console(width=250, record=True)
    tunings_text.render(c, console)
    assert "Shown over 3 tunings" in console.export_text()
    assert tunings_text.format_tunings(c, "markdown") == md
    with pytest.raises(
        ConfigError, match=r"--format 'latex' is not supported with tunings; expected one of table, markdown, csv$"
    ):
        tunings_text.format_tunings(c, "latex")


def test_a_new_statistic_is_one_registered_column():
    c = compare_tunings(final_stage([-2.0, -3.0, -2.5]))
    column = tunings_text.Column("p_raw", lambda c: "p (raw)", lambda c, r: f"{r.claim.p:.3f}" if r.claim else "-")
    tunings_text.register_column(column, after="p_holm")
    try:
        head = tunings_text.headers(c)
        assert head[head.index("p Holm") + 1] == "p (raw)"
        rows = dict(zip([(r.quantity, r.arm) for r in c.rows], tunings_text.cells(c)))
        cell = rows[("flat/fisher_trace", "sam")][head.index("p (raw)")]
        assert (
            cell == f"{c.row('flat/fisher_trace', 'sam').claim.p:.3f}" and rows[("flat/fisher_trace", "sgd")][9] == "-"
        )
        with pytest.raises(ConfigError, match="a column named 'p_raw' is registered already"):
            tunings_text.register_column(column)
    finally:
        tunings_text.COLUMNS.remove(column)


def test_a_single_tuning_table_says_its_intervals_leave_the_tuning_out():
    one = final_stage([-2.0, -3.0, -2.5])
    one = one[one["tuning"] == 1].drop(columns="tuning")
    from flatlab.analysis.compare import compare_table

    assert single_tuning_note() in caption(compare_table(one))
    assert "(`flatlab run <study file> --tunings 3`)" in single_tuning_note()  # no study file recorded
    one.attrs["study_file"] = "studies/x.py"
    assert single_tuning_note("studies/x.py") in caption(compare_table(one))
    assert "(`flatlab run studies/x.py --tunings 3`)" in single_tuning_note("studies/x.py")
    sample = Sample.of(one, StudyInfo(name="x"))
    assert sample.tunings == [1] and sample.trials["completed"].all()


def test_an_arms_two_level_interval_is_clipped_to_the_quantitys_range_as_in_a_single_table():
    df = final_stage([-2.0, -3.0, -2.5])
    df["flat/fisher_trace"] = (
        df["flat/fisher_trace"] - 11.5
    )  # sgd's tuning means -0.5, 0.5, 1.5: the raw interval dips below 0
    df.loc[df["flat/fisher_trace"] < 0, "flat/fisher_trace"] = 0.01
    a = compare_tunings(df, ranges=ranges_of("digits")).row("flat/fisher_trace", "sgd").across.estimate
    assert a.low == 0.0 and a.high > 0  # a Fisher trace is >= 0 (flatlab.sharpness.measures declares it)


def test_a_note_every_tuning_has_is_said_once_and_the_others_name_their_tuning():
    df = final_stage([-2.0, -3.0, -2.5])
    df.loc[(df["tuning"] == 2) & (df["arm"] == "sam") & (df["seed"] == 1_000_001), "outcome"] = "diverged"
    c = compare_tunings(df)
    assert [n for n in c.notes if n.startswith("tuning ")] == [
        "tuning 2: sam: seed 1000001 diverged; counted in the seeds run, no values from it."
    ]
    assert not any("tuning 1:" in n or "tuning 3:" in n for n in c.notes)


def test_a_single_table_of_several_tunings_says_it_pools_them():
    from flatlab.analysis.compare import compare_table

    c = compare_table(final_stage([-2.0, -3.0, -2.5]))
    assert c.row("flat/fisher_trace", "sam").summary.n == 9  # every tuning's seeds
    assert any(n.startswith("pooled over 3 independent tunings") for n in c.notes)
