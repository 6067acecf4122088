"""`flatlab compare`: the paper table's statistics against hand computations (with many arms: Holm's
adjustment within each quantity, Cohen's d_z, the notes on few seeds), its text outputs, the
HPO-efficiency measure, and the command on a real SQLite MLflow store."""

import io
import math
import random
import re
import time

import pandas as pd
import pytest
from rich.console import Console

from flatlab.analysis import compare as cmp
from flatlab.errors import ConfigError
from flatlab.reports.publish import log_comparison
from flatlab.workloads.ranges import ranges_of

# Student t quantiles t_{0.975, nu}: nu = 2 in closed form, nu = 3 checked against the closed-form CDF below.
T975_2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
T975_3 = 3.182446305284263


def t_cdf_3(t):
    """Student t CDF with 3 degrees of freedom (closed form)."""
    u = t / math.sqrt(3)
    return 0.5 + (u / (1 + u * u) + math.atan(u)) / math.pi


def p_two_sided(t, nu):
    """Two-sided p-value of a t statistic with nu = 2 or 3 degrees of freedom (closed forms)."""
    if nu == 2:
        return 1 - abs(t) / math.sqrt(2 + t * t)
    return 2 * (1 - t_cdf_3(abs(t)))


def test_the_hand_quantiles_are_right():
    assert 0.5 + T975_2 / (2 * math.sqrt(2 + T975_2**2)) == pytest.approx(0.975, abs=1e-12)  # closed-form CDF, nu = 2
    assert T975_2 == pytest.approx(4.3026527, rel=1e-7)
    assert t_cdf_3(T975_3) == pytest.approx(0.975, abs=1e-12)


# Final stage, reference sgd. sam's seed 5 errored; ire's seed 2 diverged. Target: a training loss
# (train/epochs_to_target with train/target_reached); sgd missed it with seed 3, ire with seed 4. The
# trials stopped at their target (stop_at_train_loss): flat/fisher_trace is the final model's, at the
# target where reached; the missed seeds' is after their last epoch.
FINAL = {
    #        seed: (outcome, test/accuracy, flat/fisher_trace, epochs_to_target or None=missed)
    "sgd": {
        1: ("completed", 0.90, 10.0, 10),
        2: ("completed", 0.92, 12.0, 12),
        3: ("completed", 0.91, 11.0, None),
        4: ("completed", 0.89, 13.0, 11),
    },
    "sam": {
        1: ("completed", 0.93, 8.0, 8),
        2: ("completed", 0.94, 9.0, 9),
        3: ("completed", 0.92, 7.0, 10),
        4: ("completed", 0.93, 8.0, 8),
        5: ("error", None, None, None),
    },
    "ire": {
        1: ("completed", 0.95, 5.0, 6),
        2: ("diverged", -1.798e308, None, None),
        3: ("completed", 0.90, 6.0, 7),
        4: ("completed", 0.94, 4.0, None),
    },
}


def final_frame():
    rows = []
    for arm, seeds in FINAL.items():
        for seed, (outcome, acc, fisher, epochs) in seeds.items():
            reached = None if outcome != "completed" else float(epochs is not None)
            rows.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "outcome": outcome,
                    "stage": "final",
                    "test/accuracy": acc,
                    "flat/fisher_trace": fisher,
                    "train/epochs_to_target": epochs,
                    "train/target_reached": reached,
                    "best/val/accuracy": acc,
                    "epochs": 20,
                    "run_id": f"{arm}{seed}",
                    "start_time": 1000 + seed,
                }
            )
    # search trials: never in the table, however good
    rows.append(
        {
            "arm": "sgd",
            "seed": 0,
            "outcome": "completed",
            "stage": "search",
            "test/accuracy": 0.99,
            "flat/fisher_trace": 1.0,
            "best/val/accuracy": 0.99,
            "epochs": 20,
            "run_id": "s0",
            "start_time": 10,
        }
    )
    df = pd.DataFrame(rows)
    df.attrs["metric"], df.attrs["mode"] = "val/accuracy", "max"
    return df


@pytest.fixture(scope="module")
def comparison():
    return cmp.compare_table(final_frame(), reference="sgd", study="toy")


def hand_ci(values, tq):
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, sd, mean - tq * sd / math.sqrt(n), mean + tq * sd / math.sqrt(n)


def test_mean_std_and_t_interval_per_arm(comparison):
    assert comparison.source == "final" and comparison.metric == "test/accuracy"
    assert comparison.quantities == (
        "test/accuracy",
        "flat/fisher_trace",
        "flat_at_target/fisher_trace",
        "train/epochs_to_target",
    )
    assert comparison.arms == ["sgd", "ire", "sam"]  # the reference first
    sam = comparison.row("test/accuracy", "sam")
    mean, sd, lo, hi = hand_ci([0.93, 0.94, 0.92, 0.93], T975_3)
    assert (sam.runs, sam.summary.n) == (5, 4)  # the errored seed is run but has no value
    assert (sam.summary.mean, sam.summary.std, sam.summary.low, sam.summary.high) == pytest.approx(
        (mean, sd, lo, hi), rel=1e-10
    )
    assert sd == pytest.approx(math.sqrt(0.0002 / 3)) and hi - mean == pytest.approx(0.0129917, abs=1e-6)
    ire = comparison.row("test/accuracy", "ire")  # the diverged seed's sentinel is not a value
    mean, sd, lo, hi = hand_ci([0.95, 0.90, 0.94], T975_2)
    assert ire.summary.n == 3 and (ire.summary.mean, ire.summary.low, ire.summary.high) == pytest.approx(
        (mean, lo, hi), rel=1e-10
    )
    assert comparison.row("test/accuracy", "sgd").summary.mean == pytest.approx(0.905)  # the search trial is left out


def test_an_arm_without_final_trials_is_named_in_the_notes():
    df = final_frame()
    extra = pd.DataFrame([{"arm": "adamw", "seed": 0, "outcome": "completed", "stage": "search", "test/accuracy": 0.8}])
    both = pd.concat([df, extra], ignore_index=True)
    both.attrs.update(df.attrs)
    c = cmp.compare_table(both, reference="sgd")
    assert "adamw" not in c.arms and "no final-stage trials for adamw: not in the table." in c.notes


def test_paired_difference_ci_and_p_value_against_the_reference(comparison):
    sam = comparison.row("test/accuracy", "sam").diff
    d = [0.03, 0.02, 0.01, 0.04]  # sam - sgd, seeds 1..4
    mean, sd, lo, hi = hand_ci(d, T975_3)
    t = mean / (sd / 2)
    assert t == pytest.approx(3.8729833, rel=1e-6)
    e = sam.estimate
    assert e.n == 4 and (e.mean, e.std, e.low, e.high) == pytest.approx((0.025, sd, lo, hi), rel=1e-9)
    assert sam.p == pytest.approx(p_two_sided(t, 3), rel=1e-9)
    assert (sam.arm_better, sam.ref_better, sam.ties) == (4, 0, 0)

    ire = comparison.row("test/accuracy", "ire").diff  # seeds 1, 3, 4 matched: d = 0.05, -0.01, 0.05
    mean, sd, lo, hi = hand_ci([0.05, -0.01, 0.05], T975_2)
    assert (ire.estimate.n, ire.estimate.mean, ire.estimate.low, ire.estimate.high) == pytest.approx(
        (3, 0.03, lo, hi), rel=1e-9
    )
    assert ire.p == pytest.approx(p_two_sided(1.5, 2), rel=1e-9) and ire.p == pytest.approx(0.272393, abs=1e-6)
    assert (ire.arm_better, ire.ref_better, ire.ties) == (2, 1, 0)
    assert comparison.row("test/accuracy", "sgd").diff is None


def test_flatness_counts_lower_as_better(comparison):
    assert comparison.higher_is_better == {
        "test/accuracy": True,
        "flat/fisher_trace": False,
        "flat_at_target/fisher_trace": False,
        "train/epochs_to_target": False,
    }
    # at the training-loss target: sgd's seed 3 missed it, so it gives no value there and the pairs are
    # seeds 1, 2, 4: 8-10, 9-12, 8-13
    sam = comparison.row("flat_at_target/fisher_trace", "sam").diff
    assert (
        sam.estimate.n == 3
        and sam.estimate.mean == pytest.approx(-10 / 3)
        and (sam.arm_better, sam.ref_better) == (3, 0)
    )
    sgd = comparison.row("flat_at_target/fisher_trace", "sgd")
    assert (sgd.summary.n, sgd.runs, sgd.summary.mean) == (3, 4, pytest.approx(35 / 3))
    # the final models: every completed seed, sgd's seed 3 (11.0) and ire's seed 4 (4.0) included
    sgd = comparison.row("flat/fisher_trace", "sgd")
    assert (sgd.summary.n, sgd.runs, sgd.summary.mean) == (4, 4, pytest.approx(11.5))
    sam = comparison.row("flat/fisher_trace", "sam").diff  # seeds 1-4: 8-10, 9-12, 7-11, 8-13
    assert (
        sam.estimate.n == 4 and sam.estimate.mean == pytest.approx(-3.5) and (sam.arm_better, sam.ref_better) == (4, 0)
    )
    assert comparison.row("flat/fisher_trace", "ire").summary.mean == pytest.approx(5.0)  # seeds 1, 3, 4: 5, 6, 4
    assert any(n.startswith("flat_at_target/* rows: the flat/* of the seeds that reached") for n in comparison.notes)


def test_targets_count_k_of_n_reached_and_pair_only_seeds_that_reached(comparison):
    rows = {a: comparison.row("train/epochs_to_target", a) for a in ("sgd", "sam", "ire")}
    assert {a: (r.summary.n, r.runs) for a, r in rows.items()} == {"sgd": (3, 4), "sam": (4, 5), "ire": (2, 4)}
    assert rows["sgd"].summary.mean == pytest.approx(11.0)  # seeds 1, 2, 4
    sam = rows["sam"].diff  # seeds 1, 2, 4: 8-10, 9-12, 8-11
    assert sam.estimate.n == 3 and sam.estimate.mean == pytest.approx(-8 / 3) and sam.arm_better == 3
    ire = rows["ire"].diff  # only seed 1 reached in both: one pair, no interval or test
    assert ire.estimate.n == 1 and ire.estimate.mean == pytest.approx(-4.0)
    assert math.isnan(ire.estimate.low) and math.isnan(ire.p)
    body = {(c[0], c[1]): c for c in cmp.cells(comparison)}
    assert body[("train/epochs_to_target", "ire")][2] == "2/4 reached"
    assert body[("train/epochs_to_target", "ire")][6:11] == ["-"] * 5  # CI, d_z, p, Holm p and marker of one pair
    assert body[("train/epochs_to_target", "sgd")][2] == "3/4 reached"
    notes = " ".join(comparison.notes)
    assert "sam: seed 5 error" in notes and "ire: seed 2 diverged" in notes
    assert "sgd: seed 3 completed without reaching the target (train/epochs_to_target)." in notes
    assert (
        "ire: seed 4 completed without" in notes
        and "ire: seed 2 diverged; counted in the seeds run, no values from it." in notes
    )


def test_one_seed_gives_dashes_not_an_exception():
    df = final_frame()
    one = df[df["seed"] == 1].reset_index(drop=True)
    one.attrs.update(df.attrs)
    c = cmp.compare_table(one, reference="sgd")
    row = c.row("test/accuracy", "sam")
    assert row.summary.n == 1 and math.isnan(row.summary.std) and math.isnan(row.diff.p)
    cells = dict(((r[0], r[1]), r) for r in cmp.cells(c))[("test/accuracy", "sam")]
    assert cells[2:] == ["1/1", "0.93", "-", "+0.03", "-", "-", "-", "-", "-", "1:0:0"]
    assert (
        cmp.caption(c)[-len(c.notes) - 1]
        == "No paired test: every arm has fewer than 2 seeds matched with sgd (or all its differences are equal)."
    )


NUMBER = r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?"


def parse_markdown(text):
    """The markdown table back into numbers: {(quantity, arm): {field: float}}."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|")]
    head = [h.strip() for h in lines[0].strip("|").split("|")]
    out = {}
    for ln in lines[2:]:
        cells = dict(zip(head, (c.strip() for c in ln.strip("|").split("|"))))
        rec = {}
        m = re.fullmatch(rf"({NUMBER})/({NUMBER})(?: reached)?", cells["seeds"])
        rec["n"], rec["runs"] = float(m[1]), float(m[2])
        m = re.fullmatch(rf"({NUMBER})(?: ± ({NUMBER}))?", cells["mean ± std"])
        rec["mean"], rec["std"] = float(m[1]), float(m[2]) if m[2] else float("nan")
        for key, col in (("ci", "95% CI"), ("dci", "Δ 95% CI")):
            m = re.fullmatch(rf"\[({NUMBER}), ({NUMBER})\]", cells[col])
            rec[f"{key}_low"], rec[f"{key}_high"] = (float(m[1]), float(m[2])) if m else (float("nan"),) * 2
        rec["diff"] = float(cells["Δ vs sgd"]) if cells["Δ vs sgd"] != "-" else float("nan")
        rec["p"] = float(cells["p (paired t)"]) if cells["p (paired t)"] != "-" else float("nan")
        fav = cells["seeds better arm:sgd:tie"]
        rec["fav"] = tuple(map(int, fav.split(":"))) if fav != "-" else None
        out[(cells["quantity"], cells["arm"])] = rec
    return out


def same_at_printed_precision(printed, value, digits):
    if isinstance(value, float) and math.isnan(value):
        return math.isnan(printed)
    if value == 0:
        return printed == 0
    last = 10 ** (math.floor(math.log10(abs(value))) - digits + 1)  # one unit of the last printed digit
    return abs(printed - value) <= last / 2 + 1e-15


def test_markdown_round_trips_at_the_printed_precision(comparison):
    text = cmp.to_markdown(comparison)
    parsed = parse_markdown(text)
    assert len(parsed) == len(comparison.rows) == 12
    for r in comparison.rows:
        got = parsed[(r.quantity, r.arm)]
        s = r.summary
        assert (got["n"], got["runs"]) == (s.n, r.runs)
        for key, value in (("mean", s.mean), ("std", s.std), ("ci_low", s.low), ("ci_high", s.high)):
            assert same_at_printed_precision(got[key], value, 4), (r.quantity, r.arm, key, got[key], value)
        d = r.diff
        if d is None:
            assert math.isnan(got["diff"]) and got["fav"] is None
            continue
        for key, value in (("diff", d.estimate.mean), ("dci_low", d.estimate.low), ("dci_high", d.estimate.high)):
            assert same_at_printed_precision(got[key], value, 4), (r.quantity, r.arm, key)
        assert same_at_printed_precision(got["p"], d.p, 3)
        assert got["fav"] == (d.arm_better, d.ref_better, d.ties)
    assert parsed[("test/accuracy", "sam")]["mean"] == 0.93 and parsed[("test/accuracy", "sam")]["diff"] == 0.025
    assert "- sam: seed 5 error" in text


def test_latex_and_csv_contain_the_values(comparison):
    tex = cmp.to_latex(comparison)
    assert r"\begin{tabular}" in tex and r"\toprule" in tex and r"\bottomrule" in tex
    assert r"test/accuracy & sgd & 4/4 & 0.905 $\pm$ 0.01291" in tex
    assert r"flat/fisher\_trace" in tex and "2/4 reached" in tex and r"$\Delta$ vs sgd" in tex and r"95\% CI" in tex
    assert tex.count(r"\midrule") == 4  # under the header, then between the four quantities
    csv = pd.read_csv(io.StringIO(cmp.to_csv(comparison)))
    row = csv[(csv["quantity"] == "test/accuracy") & (csv["arm"] == "sam")].iloc[0]
    sam = comparison.row("test/accuracy", "sam")
    assert row["mean"] == pytest.approx(0.93) and row["ci_high"] == pytest.approx(sam.summary.high, rel=1e-12)
    assert row["p"] == pytest.approx(sam.diff.p, rel=1e-12) and row["diff_mean"] == pytest.approx(0.025)
    assert (row["runs"], row["n"], row["arm_better"], row["ref_better"]) == (5, 4, 4, 0)
    assert csv[csv["arm"] == "sgd"]["diff_mean"].isna().all()


def test_rich_table_shows_every_arm_and_the_caption(comparison):
    console = Console(record=True, width=200)
    cmp.render(comparison, console)
    out = console.export_text()
    assert "toy: test/accuracy and flatness vs sgd" in out and "0.93 ± 0.008165" in out and "4:0:0" in out
    assert "paired t-test" in out and "lower flat/fisher_trace" in out


def test_unknown_reference_metric_and_measure_list_the_valid_values():
    df = final_frame()
    with pytest.raises(ConfigError, match=r"reference arm 'adam' is not in the compared trials; arms: ire, sam, sgd"):
        cmp.compare_table(df, reference="adam")
    with pytest.raises(ConfigError, match=r"metric 'test/loss' has no values.*metrics there: .*test/accuracy"):
        cmp.compare_table(df, reference="sgd", metric="test/loss")
    with pytest.raises(ConfigError, match=r"measures flat/hessian_trace not recorded.*flat/fisher_trace"):
        cmp.compare_table(df, reference="sgd", measures=["hessian_trace"])
    with pytest.raises(ConfigError, match=r"confidence=1.5"):
        cmp.compare_table(df, reference="sgd", confidence=1.5)
    assert cmp.compare_table(df, reference="sgd", measures=["fisher_trace"]).quantities[1] == "flat/fisher_trace"


def test_default_reference():
    from flatlab.analysis.selection import reference_arm

    assert reference_arm(["sam", "sgd", "adamw"]) == "sgd"
    assert reference_arm(["sam", "sgd", "adamw"], "adamw") == "adamw"
    assert reference_arm(["sam", "adamw"], "None") == "adamw"  # nothing recorded: first alphabetically
    assert reference_arm(["sam", "adamw"], "gone") == "adamw"
    with pytest.raises(ConfigError, match="no arms to compare"):
        reference_arm([])
    df = final_frame()
    df.attrs["reference_arm"] = "ire"  # the study's, as trials_frame reads it from the launch
    assert cmp.compare_table(df).reference == "ire" and cmp.compare_table(final_frame()).reference == "sgd"


def grid_frame():
    """A grid study without a final stage: two sam configurations (rho) x 2 seeds, one sgd configuration."""
    rows = []
    spec = [("sam", 0.05, {0: 0.90, 1: 0.94}), ("sam", 0.1, {0: 0.93, 1: 0.93}), ("sgd", None, {0: 0.91, 1: 0.89})]
    for arm, rho, vals in spec:
        for seed, v in vals.items():
            rows.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "outcome": "completed",
                    "stage": "search",
                    "best/val/accuracy": v,
                    "val/accuracy": v,
                    "test/accuracy": v - 0.01,
                    "param.rho": rho,
                    "param.lr": 0.1,
                    "epochs": 10,
                    "run_id": f"{arm}{rho}{seed}",
                    "start_time": 100 + len(rows),
                }
            )
    # rho 0.2: its one completed seed is the best single trial, the other diverged -> mean over completed 0.96
    rows.append(
        {
            "arm": "sam",
            "seed": 0,
            "outcome": "diverged",
            "stage": "search",
            "best/val/accuracy": 0.2,
            "val/accuracy": None,
            "param.rho": 0.2,
            "param.lr": 0.1,
            "epochs": 3,
            "run_id": "d",
            "start_time": 1,
        }
    )
    df = pd.DataFrame(rows)
    df.attrs["metric"], df.attrs["mode"] = "val/accuracy", "max"
    return df


def test_grid_study_compares_each_arms_best_configuration_with_its_seeds():
    sample, source, _ = cmp.select_sample(grid_frame())
    assert source == "best configuration"
    sam = sample[sample["arm"] == "sam"]
    assert set(sam["param.rho"]) == {0.1} and sorted(sam["seed"]) == [0, 1]  # mean 0.93 beats 0.92; 0.2 never completed
    c = cmp.compare_table(grid_frame(), reference="sgd")
    d = c.row("test/accuracy", "sam").diff  # 0.92-0.90, 0.92-0.88
    assert c.source == "best configuration" and d.estimate.mean == pytest.approx(0.03) and d.estimate.n == 2
    assert "each arm's best configuration" in cmp.caption(c)[0]


def test_plot_metric_against_flatness_writes_a_png(comparison, tmp_path):
    path = cmp.plot_metric_vs_flatness(comparison, tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    assert cmp.plot_metric_vs_flatness(final_frame(), tmp_path / "g.png").exists()
    with pytest.raises(ConfigError, match="no flat/\\* measure"):
        cmp.plot_metric_vs_flatness(grid_frame(), tmp_path / "h.png")


def search_frame():
    """Search trials listed out of start order: B(start 50) C(100, pruned, best value) A(200) D(300)."""
    rows = [
        ("A", 200, 10, "completed", 0.937),
        ("B", 50, 10, "completed", 0.90),
        ("C", 100, 2, "pruned", 0.97),
        ("D", 300, 10, "completed", 0.96),
        ("E", 400, 10, "completed", 0.99),
        ("F", 500, 5, "completed", 0.99),
    ]
    df = pd.DataFrame(
        [
            {
                "arm": "sam",
                "trial_id": t,
                "start_time": s,
                "epochs": e,
                "outcome": o,
                "best/val/accuracy": v,
                "stage": "search",
            }
            for t, s, e, o, v in rows
        ]
    )
    final = {
        "arm": "sam",
        "trial_id": "Z",
        "start_time": 10,
        "epochs": 10,
        "outcome": "completed",
        "best/val/accuracy": 1.0,
        "stage": "final",
    }
    return pd.concat([df, pd.DataFrame([final])], ignore_index=True)


def test_hpo_efficiency_sums_trial_epochs_in_start_order_until_the_grids_best():
    grid = grid_frame()[lambda d: d["arm"] == "sam"]  # best completed trial 0.94; compute 4 x 10 + 3 = 43
    out = cmp.hpo_efficiency(grid, search_frame(), metric="val/accuracy", mode="max", tolerance=0.005)
    # target 0.935: B (10) and the pruned C (2) do not count, A reaches it: 10 + 2 + 10 trial-epochs
    assert (out["grid_best"], out["target"], out["grid_epochs"]) == pytest.approx((0.94, 0.935, 43))
    assert (out["reached"], out["trial_id"], out["trials_used"], out["search_epochs"]) == (True, "A", 3, 22)
    assert out["fraction"] == pytest.approx(22 / 43) and out["search_trials"] == 6  # the final-stage trial is left out
    strict = cmp.hpo_efficiency(grid, search_frame(), metric="val/accuracy", mode="max", tolerance=0.0)
    assert (strict["trial_id"], strict["search_epochs"]) == ("D", 32)
    never = cmp.hpo_efficiency(
        grid,
        search_frame()[lambda d: d["trial_id"].isin(["A", "B", "C"])],
        metric="val/accuracy",
        mode="max",
        tolerance=0.0,
    )
    assert never["reached"] is False and never["fraction"] is None and never["search_total_epochs"] == 22


def test_hpo_efficiency_minimising_and_bad_input():
    grid = pd.DataFrame({"arm": ["a"] * 2, "outcome": ["completed"] * 2, "epochs": [5, 5], "best/val/loss": [0.5, 0.4]})
    search = pd.DataFrame(
        {
            "arm": ["a"] * 3,
            "outcome": ["completed"] * 3,
            "epochs": [1, 2, 3],
            "start_time": [3, 2, 1],
            "best/val/loss": [0.42, 0.6, 0.9],
        }
    )
    out = cmp.hpo_efficiency(grid, search, metric="val/loss", mode="min", tolerance=0.05)
    assert (out["target"], out["search_epochs"], out["fraction"]) == pytest.approx((0.45, 6, 0.6))
    with pytest.raises(ConfigError, match="mode='up'; expected 'max' or 'min'"):
        cmp.hpo_efficiency(grid, search, metric="val/loss", mode="up", tolerance=0.0)
    with pytest.raises(ConfigError, match="tolerance=-0.1"):
        cmp.hpo_efficiency(grid, search, metric="val/loss", mode="min", tolerance=-0.1)
    with pytest.raises(ConfigError, match="need start_time"):
        cmp.hpo_efficiency(grid, search.drop(columns="start_time"), metric="val/loss", mode="min", tolerance=0.0)
    with pytest.raises(ConfigError, match="arm 'b' is not in the grid study; arms: a"):
        cmp.hpo_efficiency(grid, search, metric="val/loss", mode="min", tolerance=0.0, arm="b")


# ---------------------------------------------------------------------------------------------------
# Through a real SQLite MLflow store and the command line


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from mlflow.entities import Metric, Param

    from flatlab.tracking import runs

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "toy", runs.artifact_location(root))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    params = {"metric": "val/accuracy", "mode": "max", "reference_arm": "sam", "source": "studies/toy.py"}
    c.log_batch(parent, params=[Param(k, v) for k, v in params.items()])
    now = int(time.time() * 1000)
    for arm, seeds in FINAL.items():
        for seed, (outcome, acc, fisher, epochs) in seeds.items():
            tags = {
                runs.PARENT: parent,
                runs.TAG_ROLE: "trial",
                runs.TAG_ARM: arm,
                runs.TAG_SEED: str(seed),
                runs.TAG_OUTCOME: outcome,
                "flatlab.stage": "final",
                runs.TAG_TRIAL: f"{arm}_{seed}",
            }
            run_id = c.create_run(exp, tags=tags, start_time=now + seed).info.run_id
            metrics = {"epoch": 20.0, "best/val/accuracy": 0.9}
            if outcome == "completed":
                metrics.update(
                    {
                        "test/accuracy": acc,
                        "flat/fisher_trace": fisher,
                        "train/target_reached": float(epochs is not None),
                    }
                )
                if epochs is not None:
                    metrics["train/epochs_to_target"] = float(epochs)
            c.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
            c.set_terminated(run_id, status="FINISHED" if outcome == "completed" else "FAILED")
    search = c.create_run(
        exp,
        tags={
            runs.PARENT: parent,
            runs.TAG_ROLE: "trial",
            runs.TAG_ARM: "sgd",
            runs.TAG_SEED: "0",
            runs.TAG_OUTCOME: "completed",
        },
    ).info.run_id  # no stage tag: a search trial
    c.log_batch(
        search,
        metrics=[
            Metric("test/accuracy", 0.99, now, 0),
            Metric("epoch", 5.0, now, 0),
            Metric("best/val/accuracy", 0.95, now, 0),
        ],
    )
    return uri, parent


def test_trials_frame_records_stage_launch_and_times(store):
    from flatlab.tracking.trials import trials_frame

    uri, parent = store
    df = trials_frame(uri, "toy")
    assert (df["launch"] == parent).all() and len(df) == 14
    assert df["stage"].value_counts().to_dict() == {"final": 13, "search": 1}
    assert df["start_time"].notna().all() and df.loc[df["stage"] == "final", "end_time"].notna().all()
    assert (df.loc[df["stage"] == "final", "end_time"] >= df.loc[df["stage"] == "final", "start_time"]).all()


def test_compare_from_mlflow_matches_the_hand_made_frame(store, comparison):
    from flatlab.tracking.trials import trials_frame

    uri, _ = store
    c = cmp.compare_table(trials_frame(uri, "toy"), reference="sgd")
    assert c.quantities == comparison.quantities
    for r in comparison.rows:
        got = c.row(r.quantity, r.arm)
        assert (got.runs, got.summary.n) == (r.runs, r.summary.n)
        assert got.summary.mean == pytest.approx(r.summary.mean, nan_ok=True)
        if r.diff is not None:
            assert got.diff.p == pytest.approx(r.diff.p, nan_ok=True)


def test_log_comparison_puts_the_table_and_plot_on_the_parent_run(store):
    from flatlab.tracking import runs
    from flatlab.tracking.trials import trials_frame

    uri, parent = store
    logged = log_comparison(uri, parent, trials_frame(uri, "toy"), study="toy")
    assert logged == [
        "compare/comparison.md",
        "compare/comparison.csv",
        "compare/comparison.json",
        "compare/metric_vs_flatness.png",
    ]
    c = runs.client(uri)
    assert sorted(a.path for a in c.list_artifacts(parent, "compare")) == sorted(logged)
    md = open(c.download_artifacts(parent, "compare/comparison.md")).read()
    assert "vs sam" in md  # the reference recorded on the launch
    # the same table as an MLflow table artifact: every column, as the markdown shows them
    import json

    table = json.loads(open(c.download_artifacts(parent, "compare/comparison.json")).read())
    comparison = cmp.compare_table(trials_frame(uri, "toy"), reference="sam", study="toy")
    assert table["columns"] == cmp.headers(comparison) and table["data"] == cmp.cells(comparison)
    assert table["columns"][7:11] == ["d_z", "p (paired t)", "p Holm", "sig."]  # effect size and Holm's adjustment
    csv = pd.read_csv(c.download_artifacts(parent, "compare/comparison.csv"))
    assert {"d_z", "p_holm", "tests", "significant"} <= set(csv.columns)
    assert log_comparison(uri, parent, trials_frame(uri, "toy"), reference="nope") == []  # warns, never raises


def test_log_comparison_never_creates_a_store(tmp_path, caplog):
    db = tmp_path / "none.db"
    assert log_comparison(f"sqlite:///{db}", "p", final_frame(), reference="sgd") == []
    assert not db.exists() and "no comparison table for run p" in caplog.text


def test_cli_compare(store, tmp_path):
    from typer.testing import CliRunner

    from flatlab.cli.main import app

    uri, _ = store
    runner = CliRunner()
    res = runner.invoke(app, ["compare", "toy", "--tracking-uri", uri, "--format", "markdown"])
    assert res.exit_code == 0, res.output
    parsed = parse_markdown(res.output.replace("vs sam", "vs sgd").replace("arm:sam:tie", "arm:sgd:tie"))
    assert parsed[("test/accuracy", "sgd")]["diff"] == pytest.approx(-0.025)  # against the recorded reference, sam
    assert "(`flatlab run studies/toy.py --tunings 3`)" in res.output  # the study file the launch recorded
    res = runner.invoke(
        app, ["compare", "toy", "--tracking-uri", uri, "--reference", "sgd", "--plot", str(tmp_path / "p.png")]
    )
    assert res.exit_code == 0, res.output
    assert "0.93 ± 0.008165" in res.output and "4:0:0" in res.output and (tmp_path / "p.png").exists()
    res = runner.invoke(app, ["compare", "toy", "--tracking-uri", uri, "--reference", "adam"])
    assert (
        res.exit_code == 2 and "reference arm 'adam' is not in the compared trials; arms: ire, sam, sgd" in res.output
    )
    res = runner.invoke(app, ["compare", "nope", "--tracking-uri", uri])
    assert res.exit_code == 2 and "no study 'nope'" in res.output and "toy" in res.output
    assert "--root" in res.output and "FLATLAB_ROOT" in res.output  # where the store it searched comes from
    res = runner.invoke(app, ["compare", "toy", "--tracking-uri", uri, "--metric", "test/loss"])
    assert res.exit_code == 2 and "metrics there:" in res.output and "test/accuracy" in res.output
    res = runner.invoke(app, ["compare", "toy", "--tracking-uri", uri, "--format", "html"])
    assert res.exit_code == 2 and "expected one of table, markdown, latex, csv" in res.output
    res = runner.invoke(
        app, ["compare", "toy", "--tracking-uri", uri, "--format", "csv", "--against", "toy", "--tolerance", "0.01"]
    )
    assert res.exit_code == 0, res.output
    table, efficiency = res.output.split("\n\n", 1)  # two CSV blocks
    assert len(pd.read_csv(io.StringIO(table))) == 12
    eff = pd.read_csv(io.StringIO(efficiency)).set_index("arm")
    # only sgd has a search trial (final-stage trials are not search): the study against itself needs it alone
    assert list(eff.index) == ["sgd"] and eff.loc["sgd", "grid_epochs"] == 5 and eff.loc["sgd", "fraction"] == 1.0
    res = runner.invoke(app, ["compare", "toy", "--tracking-uri", uri, "--against", "toy"])
    assert res.exit_code == 0, res.output
    assert "HPO efficiency: toy (search) against toy (grid)" in res.output and "fraction of grid compute" in res.output
    full = pd.read_csv(
        io.StringIO(runner.invoke(app, ["compare", "toy", "--tracking-uri", uri, "--format", "csv"]).output)
    )
    assert "flat/fisher_trace" in set(full["quantity"])  # which measures it keeps: test_compare_at_target.py
    for given in ("flat/fisher_trace", "fisher_trace"):  # --measure keeps it and the test metric
        res = runner.invoke(app, ["compare", "toy", "--tracking-uri", uri, "--format", "csv", "--measure", given])
        assert res.exit_code == 0, res.output
        assert set(pd.read_csv(io.StringIO(res.output))["quantity"]) == set(full["quantity"]) & {
            "test/accuracy",
            "flat/fisher_trace",
            "flat_at_target/fisher_trace",
            "train/epochs_to_target",
            "train/steps_to_target",
        }
    res = runner.invoke(app, ["compare", "toy", "--tracking-uri", uri, "--measure", "flat/nope"])
    assert res.exit_code == 2 and "measures flat/nope not recorded in the compared trials" in res.output


# ---------------------------------------------------------------------------------------------------
# Many arms: Holm (1979) within each quantity, Cohen's d_z, few seeds


def test_holm_by_hand_with_the_monotonicity_step():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, raised to 0.06 by
    # the running maximum so that a larger raw p never gets a smaller adjusted one)
    assert cmp.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)


def test_holm_caps_at_one_skips_missing_tests_and_follows_the_input_order():
    assert cmp.holm([0.5, 0.6]) == [1.0, 1.0]  # 2 x 0.5 = 1.0; 0.6 -> max(1.0, 0.6)
    out = cmp.holm([0.01, float("nan"), 0.04, None])  # m = 2: the NaN / None tests are not in the family
    assert out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.04) and math.isnan(out[1]) and math.isnan(out[3])
    assert cmp.holm([0.2]) == [0.2] and cmp.holm([]) == []
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    perm = [3, 0, 4, 2, 1]
    assert cmp.holm([p[i] for i in perm]) == [cmp.holm(p)[i] for i in perm]  # invariant to the order
    assert all(
        h <= min(1.0, len(p) * x) + 1e-15 and h >= x for h, x in zip(cmp.holm(p), p)
    )  # between raw and Bonferroni
    with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\]; got 1.5"):
        cmp.holm([0.1, 1.5])


# ---------------------------------------------------------------------------------------------------
# Cohen's d_z


def test_cohen_dz_of_hand_made_paired_seeds():
    arm = {1: 0.93, 2: 0.94, 3: 0.92, 4: 0.93}
    ref = {1: 0.90, 2: 0.92, 3: 0.91, 4: 0.89, 5: 0.5}  # seed 5 has no partner
    d = cmp.paired_difference(arm, ref, higher_is_better=True)
    # d = 0.03, 0.02, 0.01, 0.04: mean 0.025, std sqrt(0.0005 / 3), so d_z = 0.025 / sqrt(0.0005 / 3) = sqrt(3.75)
    assert d.d_z == pytest.approx(math.sqrt(3.75), rel=1e-9)
    assert d.d_z * math.sqrt(4) == pytest.approx(3.8729833, rel=1e-6)  # t = d_z * sqrt(n), the paired t statistic
    flat = cmp.paired_difference({1: 8.0, 2: 9.0, 3: 7.0}, {1: 10.0, 2: 12.0, 3: 11.0}, higher_is_better=False)
    # d = -2, -3, -4: mean -3, std 1 -> d_z = -3 (negative: the arm is flatter)
    assert flat.d_z == pytest.approx(-3.0) and flat.arm_better == 3
    assert math.isnan(cmp.paired_difference({1: 1.0}, {1: 0.0}, higher_is_better=True).d_z)  # one pair
    assert math.isnan(cmp.paired_difference({1: 1.0, 2: 2.0}, {1: 0.0, 2: 1.0}, higher_is_better=True).d_z)  # std 0


def test_paired_power_against_a_simulation():
    # n = 3, d_z = 1: the share of |t| > t_{0.975, 2} over simulated paired differences d ~ N(1, 1)
    rng = random.Random(0)
    hits, trials = 0, 40000
    for _ in range(trials):
        d = [rng.gauss(1.0, 1.0) for _ in range(3)]
        mean = sum(d) / 3
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
        hits += abs(mean / (sd / math.sqrt(3))) > T975_2
    assert cmp.paired_power(3, 1.0, 0.05) == pytest.approx(hits / trials, abs=0.01)
    assert cmp.paired_power(3, 0.0, 0.05) == pytest.approx(0.05, abs=1e-9)  # no effect: the test's level
    assert cmp.paired_power(10, 1.0) > 0.79 > cmp.paired_power(5, 1.0) > cmp.paired_power(3, 1.0)
    with pytest.raises(ValueError, match="n >= 2"):
        cmp.paired_power(1, 1.0)


# ---------------------------------------------------------------------------------------------------
# In the table


def test_holm_is_applied_within_each_quantity(comparison):
    sam, ire = comparison.row("test/accuracy", "sam"), comparison.row("test/accuracy", "ire")
    p_sam, p_ire = p_two_sided(3.8729833462, 3), p_two_sided(1.5, 2)  # the closed forms of test_compare.py
    assert p_sam == pytest.approx(0.030466, abs=1e-6) and sam.diff.p == pytest.approx(p_sam, rel=1e-8)
    # family of 2: sam's 2 x 0.0305 = 0.0609; ire's 1 x 0.272 (already above)
    assert sam.p_holm == pytest.approx(2 * p_sam, rel=1e-8) and ire.p_holm == pytest.approx(p_ire, rel=1e-8)
    assert comparison.significant(sam) is False  # raw p < 0.05, not after the adjustment
    assert [r.arm for r in comparison.family("test/accuracy")] == ["ire", "sam"]
    # one test in the target family (ire has one matched pair: no test): Holm leaves it alone
    target = comparison.row("train/epochs_to_target", "sam")
    assert [r.arm for r in comparison.family("train/epochs_to_target")] == ["sam"]
    assert target.p_holm == target.diff.p and target.p_holm < 0.05 and comparison.significant(target) is True
    assert comparison.significant(comparison.row("train/epochs_to_target", "ire")) is None
    assert math.isnan(comparison.row("test/accuracy", "sgd").p_holm) and comparison.alpha == 0.05
    assert sam.diff.d_z == pytest.approx(math.sqrt(3.75), rel=1e-9)


def test_every_renderer_carries_the_new_columns(comparison, tmp_path):
    head = cmp.headers(comparison)
    assert head[7:11] == ["d_z", "p (paired t)", "p Holm", "sig."]
    body = {(r[0], r[1]): r for r in cmp.cells(comparison)}
    assert body[("test/accuracy", "sam")][7:11] == ["+1.94", "0.0305", "0.0609", "ns"]
    assert body[("train/epochs_to_target", "sam")][10] == "*"
    assert body[("test/accuracy", "sgd")][7:11] == ["-"] * 4
    md = cmp.to_markdown(comparison)
    assert "| d_z | p (paired t) | p Holm | sig. |" in md and "| +1.94 | 0.0305 | 0.0609 | ns |" in md
    assert r"+1.94 & 0.0305 & 0.0609 & ns" in cmp.to_latex(comparison)
    csv = pd.read_csv(io.StringIO(cmp.to_csv(comparison))).set_index(["quantity", "arm"])
    row = csv.loc[("test/accuracy", "sam")]
    assert row["d_z"] == pytest.approx(math.sqrt(3.75)) and row["p_holm"] == pytest.approx(2 * row["p"])
    assert row["tests"] == 2 and not row["significant"] and csv.loc[("train/epochs_to_target", "sam"), "significant"]
    assert pd.isna(csv.loc[("test/accuracy", "sgd"), "significant"])
    console = Console(record=True, width=160)
    cmp.render(comparison, console)
    out = console.export_text()
    assert "test/accuracy (higher is better; 2 tests, Holm-adjusted)" in out
    assert "flat/fisher_trace (lower = flatter; 2 tests, Holm-adjusted)" in out  # ire's seeds 1, 3, 4 pair too
    assert "flat_at_target/fisher_trace (lower = flatter; 1 test, Holm-adjusted)" in out
    assert "│ sam │ 4/5   │ 0.93 ± 0.008165 │" in out  # one line per arm at 160 columns


def test_the_caption_counts_the_tests_and_names_what_survives_the_adjustment(comparison):
    text = "\n".join(cmp.caption(comparison))
    assert (
        "each quantity is one family of tests, the arms' paired tests against sgd (test/accuracy: 2, "
        "flat/fisher_trace: 2, flat_at_target/fisher_trace: 1, train/epochs_to_target: 1)"
    ) in text
    assert "Holm's (1979) step-down method within its quantity" in text and "4 quantities, 6 tests in all" in text
    # the final models' flat/*: sam's seeds 1-4 differ by -2, -3, -4, -5 (t = -5.42, p = 0.0123, Holm x2
    # = 0.0246), ire's seeds 1, 3, 4 by -5, -5, -9 (p = 0.0416); at the target sam's p is 0.0634
    assert (
        "Significant after Holm's adjustment (adjusted p < 0.05), against sgd: test/accuracy: none; "
        "flat/fisher_trace: ire, sam; flat_at_target/fisher_trace: none; train/epochs_to_target: sam."
    ) in text
    assert "d_z: Cohen's d_z effect size, mean(Δ) / std(Δ)" in text
    # the paired tests are over 3 (sam's flatness, target) to 4 seeds (sam's accuracy)
    few = next(line for line in cmp.caption(comparison) if line.startswith("Few seeds"))
    assert "n = 3 to 4 seeds" in few and "n − 1 degrees of freedom and low power" in few
    assert f"probability {cmp.paired_power(3, 1.0):.2f} at 0.05" in few and "0.18" in few


def many_arms_frame(seeds=(1, 2, 3)):
    """8 arms x 4 quantities (test/accuracy, three flat/* measures), noise only: arm k's per-seed
    differences from sgd are (+e, -e, k e / 2), so |t| is small and no test is significant."""
    rows = []
    arms = ["sgd", "a1", "a2", "a3", "a4", "a5", "a6", "a7"]
    for k, arm in enumerate(arms):
        shift = [0.0] * len(seeds) if k == 0 else [0.01, -0.01, 0.005 * k] + [0.0] * (len(seeds) - 3)
        for seed, s in zip(seeds, shift):
            rows.append(
                {
                    "arm": arm,
                    "seed": seed,
                    "outcome": "completed",
                    "stage": "final",
                    "test/accuracy": 0.9 + 0.001 * seed + s,
                    "flat/a": 10 + seed + 100 * s,
                    "flat/b": 1 + 0.1 * seed + 10 * s,
                    "flat/c": 5 + seed - 100 * s,
                }
            )
    df = pd.DataFrame(rows)
    df.attrs["metric"], df.attrs["mode"] = "val/accuracy", "max"
    return df


def test_eight_arms_by_four_quantities_do_not_read_as_28_discoveries():
    c = cmp.compare_table(many_arms_frame(), reference="sgd")
    assert len(c.quantities) == 4 and all(len(c.family(q)) == 7 for q in c.quantities)
    assert all(r.p_holm >= r.diff.p for r in c.rows if r.tested)
    lines = cmp.caption(c)
    text = "\n".join(lines)
    assert "each quantity is one family of 7 tests, the arms' paired tests against sgd;" in text
    assert "4 quantities, 28 tests in all, each quantity adjusted on its own" in text
    assert (
        "No difference from sgd is significant after Holm's adjustment: every adjusted p >= 0.05 (28 tests)." in lines
    )
    assert "n = 3 seeds" in text and "probability 0.18" in text
    assert {r[10] for r in cmp.cells(c) if r[1] != "sgd"} == {"ns"}


def test_no_few_seeds_note_from_five_seeds_on():
    c = cmp.compare_table(many_arms_frame(seeds=(1, 2, 3, 4, 5)), reference="sgd")
    assert all(r.diff.estimate.n == 5 for r in c.rows if r.tested)
    assert not any(line.startswith("Few seeds") for line in cmp.caption(c))


@pytest.mark.parametrize("width", [80, 200])
def test_rich_table_never_splits_a_number_or_an_arm_name(width):
    """Every cell (intervals included) on one line at any width; a table wider than the console says so."""
    df = final_frame()
    df["arm"] = df["arm"].replace({"sam": "adam_with_sam"})
    comparison = cmp.compare_table(df, reference="sgd", study="toy", ranges=ranges_of("digits"))
    console = Console(record=True, width=width)
    cmp.render(comparison, console)
    lines = console.export_text().splitlines()
    shown = {c.strip() for line in lines if line.startswith("│") for c in line.strip("│").split("│")}
    body = cmp.cells(comparison)
    assert {cell for row in body for cell in row[1:]} <= shown and "[+0.004457, +0.04554]" in shown
    notes = [line for line in lines if line.startswith("the table is ")]
    if width == 80:  # one line under each of the 4 tables, with the columns it needs
        assert notes == [
            f"the table is {n} columns wide; this terminal has 80: widen it, or use --format markdown"
            for n in (138, 129, 130, 136)
        ]  # flat_at_target: ire's CI clipped to [0, 11.85]
        assert max(len(line) for line in lines if line.startswith("│")) == 138
    else:
        assert notes == [] and max(len(line) for line in lines if line.startswith("│")) <= 200
        assert "│ p (paired t) │" in "".join(lines).replace("┃", "│")  # headers on one line when it fits


def test_the_title_says_flatness_only_when_the_table_has_some(comparison):
    assert cmp.to_markdown(comparison).splitlines()[0] == "### toy: test/accuracy and flatness vs sgd"
    df = final_frame()
    bare = cmp.compare_table(
        df.drop(columns=[c for c in df.columns if c.startswith("flat")]), reference="sgd", study="toy"
    )
    assert not any(q.startswith("flat") for q in bare.quantities)
    assert cmp.to_markdown(bare).splitlines()[0] == "### toy: test/accuracy vs sgd"


def test_an_unknown_ranking_is_refused_also_where_a_final_stage_leaves_it_unused():
    df = final_frame()
    assert cmp.compare_table(df, reference="sgd", study="toy", rank_by="best-epoch").source == "final"
    with pytest.raises(ConfigError, match="rank_by='banana' is not supported; expected one of final, best-epoch"):
        cmp.compare_table(df, reference="sgd", study="toy", rank_by="banana")
