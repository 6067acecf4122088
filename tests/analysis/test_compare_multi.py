"""`flatlab compare STUDY_A STUDY_B ...`: the summary over workloads and the performance profiles, on a
fixed table of three workloads computed by hand, and the command on a real SQLite MLflow store."""

import io
import math
import time

import pandas as pd
import pytest

from flatlab.analysis.compare import multi, multi_text, profiles
from flatlab.errors import ConfigError

# Three workloads. digits and fmnist: test accuracy (higher is better); toy: test loss (lower is
# better). ire is not in toy; flat/extra is recorded on digits only.
METRIC = {
    ("digits", "test/accuracy", True): {"sgd": 0.97, "sam": 0.98, "ire": 0.96},
    ("fmnist", "test/accuracy", True): {"sgd": 0.90, "sam": 0.88, "ire": 0.90},
    ("toy", "test/loss", False): {"sgd": 0.5, "sam": 0.4},
}
FLAT = {
    "digits": {
        "flat/fisher_trace": {"sgd": 10.0, "sam": 5.0, "ire": 20.0},
        "flat/extra": {"sgd": 1.0, "sam": 1.0, "ire": 1.0},
    },
    "fmnist": {"flat/fisher_trace": {"sgd": 4.0, "sam": 2.0, "ire": 1.0}},
    "toy": {"flat/fisher_trace": {"sgd": 2.0, "sam": 3.0}},
}


def fixed_table():
    rows = []
    for (w, q, higher), means in METRIC.items():
        rows += [
            dict(workload=w, arm=a, quantity=q, mean=m, higher_is_better=higher, test_metric=True)
            for a, m in means.items()
        ]
        for f, values in FLAT[w].items():
            rows += [
                dict(workload=w, arm=a, quantity=f, mean=m, higher_is_better=False, test_metric=False)
                for a, m in values.items()
            ]
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def summary():
    return multi.summarize(fixed_table())


def cell(summary, arm, workload, column):
    f = summary.frame
    return f.loc[(f["arm"] == arm) & (f["workload"] == workload), column].iloc[0]


def test_ranks_by_each_workloads_metric_and_direction(summary):
    assert summary.reference == "sgd" and summary.arms == ("sgd", "ire", "sam")
    assert summary.workloads == ("digits", "fmnist", "toy") and summary.metrics["toy"] == "test/loss"
    ranks = {(a, w): cell(summary, a, w, "rank") for a in summary.arms for w in summary.workloads}
    assert {k: v for k, v in ranks.items() if not pd.isna(v)} == {
        ("sam", "digits"): 1,
        ("sgd", "digits"): 2,
        ("ire", "digits"): 3,
        ("sgd", "fmnist"): 1,
        ("ire", "fmnist"): 1,
        ("sam", "fmnist"): 3,  # sgd and ire tie at 0.90: both 1
        ("sam", "toy"): 1,
        ("sgd", "toy"): 2,  # the lower loss ranks first
    }
    assert pd.isna(ranks[("ire", "toy")]) and cell(summary, "sgd", "toy", "ranked") == 2


def test_metric_and_flatness_relative_to_the_reference(summary):
    assert cell(summary, "sam", "digits", "diff") == pytest.approx(0.01)
    assert cell(summary, "sam", "digits", "ratio") == pytest.approx(0.98 / 0.97)
    assert cell(summary, "sam", "fmnist", "diff") == pytest.approx(-0.02)
    assert (cell(summary, "sam", "toy", "diff"), cell(summary, "sam", "toy", "ratio")) == pytest.approx((-0.1, 0.8))
    assert summary.measures == ("flat/fisher_trace",)  # flat/extra is on digits only
    fisher = {
        (a, w): cell(summary, a, w, "flat/fisher_trace ratio")
        for a in ("ire", "sam")
        for w in ("digits", "fmnist", "toy")
    }
    assert {k: v for k, v in fisher.items() if not math.isnan(v)} == pytest.approx(
        {
            ("ire", "digits"): 2.0,
            ("ire", "fmnist"): 0.25,
            ("sam", "digits"): 0.5,
            ("sam", "fmnist"): 0.5,
            ("sam", "toy"): 1.5,
        }
    )
    assert math.isnan(fisher[("ire", "toy")])
    assert "not in every study, so not summarized: flat/extra (only digits)." in summary.notes
    assert "ire: not in toy ('-'; counted as not solved, r = inf, in the profiles)." in summary.notes


def test_performance_ratios_and_profiles_by_hand(summary):
    # test errors: digits sgd 0.03, sam 0.02, ire 0.04; fmnist 0.10, 0.12, 0.10; toy (loss) 0.5, 0.4, ire missing
    r = summary.ratios
    expected = {"sgd": [1.5, 1.0, 1.25], "ire": [2.0, 1.0, math.inf], "sam": [1.0, 1.2, 1.0]}
    for arm, values in expected.items():
        assert list(r.loc[arm]) == pytest.approx(values), arm
    assert (
        cell(summary, "sgd", "digits", "error") == pytest.approx(0.03) and cell(summary, "sgd", "toy", "error") == 0.5
    )
    # rho_a(tau) = share of the 3 workloads with r <= tau
    third = 1 / 3
    at = profiles.profile(r, [1.0, 1.22, 1.25, 1.6, 2.5, 100.0])
    assert list(at["sgd"]) == pytest.approx([third, third, 2 * third, 1, 1, 1])
    assert list(at["sam"]) == pytest.approx([2 * third, 1, 1, 1, 1, 1])
    assert list(at["ire"]) == pytest.approx([third, third, third, third, 2 * third, 2 * third])  # toy never solved
    assert dict(multi.wins(summary)) == pytest.approx({"sgd": third, "ire": third, "sam": 2 * third})
    assert profiles.default_tau_max(r) == pytest.approx(2.1)  # 1.05 x the largest finite ratio
    assert profiles.breakpoints(r, 1.3) == pytest.approx([1.0, 1.2, 1.25, 1.3])
    with pytest.raises(ConfigError, match=r"tau=0.5; a performance profile is defined for tau >= 1"):
        profiles.rho(r, 0.5)


def test_error_from_metric_and_a_best_error_of_zero():
    assert (
        profiles.error_from_metric(0.97, True) == pytest.approx(0.03) and profiles.error_from_metric(0.5, False) == 0.5
    )
    assert math.isnan(profiles.error_from_metric(float("nan"), True))
    with pytest.raises(
        ConfigError, match=r"test/bleu of glue has mean 35 > 1: a performance profile needs an accuracy-like"
    ):
        profiles.error_from_metric(35.0, True, what="test/bleu of glue")
    with pytest.raises(ConfigError, match=r"mean -0.1 < 0"):
        profiles.error_from_metric(-0.1, False)
    errors = pd.DataFrame({"w": [0.0, 0.1, float("nan")], "v": [0.2, 0.1, 0.4]}, index=["a", "b", "c"])
    r = profiles.performance_ratios(errors)
    assert list(r["w"]) == [1.0, math.inf, math.inf] and list(r["v"]) == pytest.approx([2.0, 1.0, 4.0])


def test_the_summary_in_every_format(summary):
    head = multi_text.headers(summary)
    assert head == [
        "arm",
        "workload",
        "test metric",
        "mean",
        "rank",
        "Δ vs sgd",
        "ratio vs sgd",
        "test error",
        "r (error / best)",
        "flat/fisher_trace / sgd",
    ]
    body = {(c[0], c[1]): c for c in multi_text.cells(summary)}
    assert body[("sam", "fmnist")] == [
        "sam",
        "fmnist",
        "test/accuracy",
        "0.88",
        "3/3",
        "-0.02",
        "0.9778",
        "0.12",
        "1.2",
        "0.5",
    ]
    assert body[("ire", "toy")] == ["ire", "toy", "test/loss"] + ["-"] * 7
    assert body[("sgd", "digits")][4:] == ["2/3", "-", "-", "0.03", "1.5", "-"]  # the reference's own ratios
    md = multi_text.to_markdown(summary)
    assert md.startswith("### 3 workloads (digits, fmnist, toy): test metric and flatness relative to sgd")
    assert "| sam | toy | test/loss | 0.4 | 1/2 | -0.1 | 0.8 | 0.4 | 1 | 1.5 |" in md
    assert "ρ(1)): sgd 0.33, ire 0.33, sam 0.67." in md
    csv = pd.read_csv(io.StringIO(multi_text.format_summary(summary, "csv")))
    assert len(csv) == 9 and csv.loc[(csv["arm"] == "ire") & (csv["workload"] == "toy"), "r"].iloc[0] == math.inf
    assert r"sam & toy & test/loss & 0.4 & 1/2" in multi_text.format_summary(summary, "latex")
    with pytest.raises(ConfigError, match="--format 'html' is not supported"):
        multi_text.format_summary(summary, "html")


def test_average_over_workloads_is_glues_avg_column(summary):
    # digits, fmnist and toy mix accuracies with a loss: no average, and a note says why
    assert summary.averages == {} and any("differ in direction" in n for n in summary.notes)
    accuracies = fixed_table()
    accuracies = accuracies[accuracies["workload"] != "toy"]
    two = multi.summarize(accuracies)
    # by hand: sgd (0.97 + 0.90) / 2, sam (0.98 + 0.88) / 2, ire (0.96 + 0.90) / 2
    assert two.averages == pytest.approx({"sgd": 0.935, "sam": 0.93, "ire": 0.93})
    assert "workloads (the AVG column of a GLUE table; '-': an arm without a value in some workload): " in (
        multi_text.to_markdown(two)
    )
    assert "sgd 0.935, ire 0.93, sam 0.93." in multi_text.to_markdown(two)
    missing = accuracies[~((accuracies["arm"] == "ire") & (accuracies["workload"] == "fmnist"))]
    assert math.isnan(multi.summarize(missing).averages["ire"])  # ire has no fmnist value: no average


def test_plot_profiles_writes_a_png(summary, tmp_path):
    path = profiles.plot_profiles(summary.ratios, tmp_path / "sub" / "profiles.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    with pytest.raises(ConfigError, match=r"tau_max=1.0; expected a number > 1"):
        profiles.plot_profiles(summary.ratios, tmp_path / "x.png", tau_max=1.0)


def test_reference_and_bad_tables():
    t = fixed_table()
    assert multi.summarize(t, reference="sam").reference == "sam"
    assert multi.summarize(t, recorded="sam").reference == "sam"  # the studies' own, in every workload
    assert multi.summarize(t, recorded="ire").reference == "sgd"  # ire is not in toy: the selection rule's default
    with pytest.raises(ConfigError, match=r"reference arm 'ire' is not in every study; arms in all of them: sam, sgd"):
        multi.summarize(t, reference="ire")
    with pytest.raises(ConfigError, match=r"lacks column\(s\) test_metric"):
        multi.summarize(t.drop(columns="test_metric"))
    two = t.copy()
    two.loc[two["quantity"] == "flat/extra", "test_metric"] = True
    with pytest.raises(
        ConfigError, match=r"workload 'digits' has 2 test metrics \(test/accuracy, flat/extra\); expected one"
    ):
        multi.summarize(two)
    apart = t.copy()
    apart.loc[apart["workload"] == "toy", "arm"] = "adam"
    with pytest.raises(ConfigError, match=r"the studies share no arm.*toy: adam"):
        multi.summarize(apart)
    neg = t.copy()
    neg.loc[
        (neg["arm"] == "sgd") & (neg["quantity"] == "flat/fisher_trace") & (neg["workload"] == "toy"), "mean"
    ] = -1.0
    assert math.isnan(cell(multi.summarize(neg), "sam", "toy", "flat/fisher_trace ratio"))  # no ratio across a sign


# ---------------------------------------------------------------------------------------------------
# Through a real SQLite MLflow store and the command line

STUDIES = {  # study: {arm: {seed: (test/accuracy, flat/fisher_trace)}}
    "wa": {
        "sgd": {1: (0.96, 9.0), 2: (0.98, 11.0)},
        "sam": {1: (0.975, 4.0), 2: (0.985, 6.0)},
        "ire": {1: (0.95, 19.0), 2: (0.97, 21.0)},
    },
    "wb": {"sgd": {1: (0.89, 3.0), 2: (0.91, 5.0)}, "sam": {1: (0.87, 1.0), 2: (0.89, 3.0)}},
    "wc": {"adam": {1: (0.5, 1.0), 2: (0.6, 1.0)}},
}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from mlflow.entities import Metric, Param

    from flatlab.tracking import runs

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    c = runs.client(uri)
    now = int(time.time() * 1000)
    for study, arms in STUDIES.items():
        exp = runs.get_or_create_experiment(uri, study, runs.artifact_location(root))
        parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
        c.log_batch(parent, params=[Param("metric", "val/accuracy"), Param("mode", "max")])
        for arm, seeds in arms.items():
            for seed, (acc, fisher) in seeds.items():
                tags = {
                    runs.PARENT: parent,
                    runs.TAG_ROLE: "trial",
                    runs.TAG_ARM: arm,
                    runs.TAG_SEED: str(seed),
                    runs.TAG_OUTCOME: "completed",
                    "flatlab.stage": "final",
                    runs.TAG_TRIAL: f"{arm}_{seed}",
                }
                run_id = c.create_run(exp, tags=tags, start_time=now + seed).info.run_id
                metrics = {"epoch": 5.0, "test/accuracy": acc, "flat/fisher_trace": fisher, "best/val/accuracy": acc}
                c.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()])
                c.set_terminated(run_id, status="FINISHED")
    return uri, root


def test_cli_compare_several_studies(store, tmp_path):
    from typer.testing import CliRunner

    from flatlab.cli.main import app

    uri, _ = store
    runner = CliRunner()
    plot = tmp_path / "p.png"
    res = runner.invoke(app, ["compare", "wa", "wb", "--tracking-uri", uri, "--format", "csv", "--plot", str(plot)])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(io.StringIO(res.stdout)).set_index(["arm", "workload"])
    assert (
        table.loc[("sam", "wa"), "rank"] == 1
        and table.loc[("sgd", "wa"), "rank"] == 2
        and table.loc[("ire", "wa"), "rank"] == 3
    )
    assert table.loc[("sam", "wb"), "rank"] == 2 and table.loc[("sam", "wb"), "diff"] == pytest.approx(-0.02)
    assert table.loc[("sam", "wa"), "flat/fisher_trace ratio"] == pytest.approx(0.5)
    assert table.loc[("sam", "wb"), "flat/fisher_trace ratio"] == pytest.approx(0.5)
    assert table.loc[("sgd", "wa"), "r"] == pytest.approx(1.5) and table.loc[("sam", "wb"), "r"] == pytest.approx(1.2)
    assert table.loc[("ire", "wb"), "r"] == math.inf and pd.isna(table.loc[("ire", "wb"), "mean"])
    assert plot.read_bytes()[:4] == b"\x89PNG" and f"wrote the performance profiles to {plot}" in res.stderr

    res = runner.invoke(
        app,
        [
            "compare",
            "wa",
            "wb",
            "--tracking-uri",
            uri,
            "--root",
            str(tmp_path),
            "--format",
            "markdown",
            "--reference",
            "sam",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "| sgd | wb | test/accuracy | 0.9 | 1/2 | +0.02 | 1.023 | 0.1 | 1 | 2 |" in res.stdout
    default = tmp_path / "compare" / "profiles_wa+wb.png"
    assert default.exists() and f"wrote the performance profiles to {default}" in res.stderr

    res = runner.invoke(app, ["compare", "wa", "wb", "--tracking-uri", uri, "--plot", str(plot)])
    assert res.exit_code == 0, res.output
    assert (
        "2 workloads (wa, wb): test metric and flatness relative to sgd" in res.output
        and "ire: not in wb" in res.output
    )


def test_cli_compare_several_studies_bad_input(store, tmp_path):
    from typer.testing import CliRunner

    from flatlab.cli.main import app

    uri, _ = store
    runner = CliRunner()
    cases = [
        (
            ["wa", "wb", "--reference", "ire"],
            "reference arm 'ire' is not in every study; arms in all of them: sam, sgd",
        ),
        (["wa", "wc"], "the studies share no arm"),
        (["wa", "wb", "--against", "wa"], "--against compares one grid study with a search study"),
        (["wa", "wa"], "study wa given twice"),
        (["wa", "--tau-max", "2"], "--tau-max is for the performance profiles of several studies"),
        (["wa", "nope"], "no study 'nope'"),
        (["wa", "wb", "--tau-max", "0.5"], "tau_max=0.5; expected a number > 1"),
    ]
    for args, message in cases:
        res = runner.invoke(app, ["compare", *args, "--tracking-uri", uri, "--plot", str(tmp_path / "x.png")])
        assert res.exit_code == 2 and message in res.output, (args, res.output)


def test_flatness_is_compared_at_the_matched_training_loss_where_a_study_measured_there():
    import pandas as pd

    from flatlab.analysis.compare.multi import COLUMNS, summarize

    rows = []
    for w, arm, acc, end, at in (
        ("a", "sgd", 0.9, 4.0, None),
        ("a", "sam", 0.91, 2.0, None),
        ("b", "sgd", 0.8, 10.0, 6.0),
        ("b", "sam", 0.82, 30.0, 3.0),
    ):
        rows.append(
            {
                "workload": w,
                "arm": arm,
                "quantity": "test/accuracy",
                "mean": acc,
                "higher_is_better": True,
                "test_metric": True,
            }
        )
        rows.append(
            {
                "workload": w,
                "arm": arm,
                "quantity": "flat/fisher_trace",
                "mean": end,
                "higher_is_better": False,
                "test_metric": False,
            }
        )
        if at is not None:
            rows.append(
                {
                    "workload": w,
                    "arm": arm,
                    "quantity": "flat_at_target/fisher_trace",
                    "mean": at,
                    "higher_is_better": False,
                    "test_metric": False,
                }
            )
    table = pd.DataFrame(rows)[[c for c in COLUMNS if c in pd.DataFrame(rows).columns]]
    s = summarize(table, reference="sgd")
    ratio = s.frame.set_index(["arm", "workload"])["flat/fisher_trace ratio"]
    assert ratio[("sam", "a")] == pytest.approx(0.5)  # a: flat/* (measured where it stopped)
    assert ratio[("sam", "b")] == pytest.approx(0.5)  # b: flat_at_target/* 3/6, not the end's 30/10
    assert any("flatness in b: at the matched training loss" in n for n in s.notes)
