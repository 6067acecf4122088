"""Published curves (`flatlab curves`): the curve-set format and its loader, the per-epoch comparison on
a hand-made table, DeepOBS's reference file against the numbers in DeepOBS's own files, a study's
declaration, and the command on a real SQLite MLflow store."""

import io
import json
import math
import re
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest

from flatlab.analysis import curve_sets
from flatlab.analysis import published as pub
from flatlab.errors import ConfigError
from flatlab.workloads.ranges import ranges_of

REPO = Path(__file__).resolve().parents[2]
DEEPOBS = REPO / "studies" / "published" / "deepobs_fmnist_2c2d.json"
T975_2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # Student t_{0.975, 2}, closed form (4.3026527)

# A hand-made curve set: curve "c", two published runs, epochs 0..3 (entry 0: before training).
# Published ranges: accuracy [0.80, 0.82] / [0.85, 0.87] / [0.90, 0.92] after epochs 1 / 2 / 3,
# loss [0.50, 0.60] / [0.40, 0.45] / [0.30, 0.35].
TOY = {
    "format": "flatlab-published-curves",
    "version": 1,
    "title": "toy curves",
    "citation": "A. Author, Toy, 2024",
    "source": "hand-made",
    "first_epoch": 0,
    "metrics": {"acc": "test/accuracy", "loss": "test/loss", "train_eval": None},
    "curves": {
        "c": {
            "settings": {"lr": 0.1},
            "runs": [
                {
                    "seed": 1,
                    "path": "runs/1.json",
                    "values": {
                        "acc": [0.1, 0.80, 0.85, 0.90],
                        "loss": [2.3, 0.50, 0.40, 0.30],
                        "train_eval": [9.0, 9.0, 9.0, 9.0],
                    },
                },
                {"seed": 2, "values": {"acc": [0.1, 0.82, 0.87, 0.92], "loss": [2.3, 0.60, 0.45, 0.35]}},
            ],
        },
        "d": {"runs": [{"seed": 1, "values": {"acc": [0.1, None, 0.5]}}]},
    },
}
# flatlab's arm "a": seeds 0, 1, 2 (loss after epoch 3 only from seed 0; epoch 4 has no published value).
FLATLAB = {
    ("test/accuracy", 1): [0.80, 0.81, 0.82],  # mean 0.81: inside
    ("test/accuracy", 2): [0.88, 0.89, 0.90],  # mean 0.89: above 0.87, interval [0.865, 0.915] overlaps
    ("test/accuracy", 3): [0.70, 0.71, 0.72],  # mean 0.71: below 0.90, interval [0.685, 0.735] does not overlap
    ("test/accuracy", 4): [0.95, 0.95, 0.95],  # no published value: not compared
    ("test/loss", 1): [0.55, 0.55, 0.55],  # inside, zero-width interval
    ("test/loss", 2): [0.2, 0.3, 0.4],  # mean 0.3: below 0.40, interval [0.052, 0.548] overlaps
    ("test/loss", 3): [0.33],  # one seed: inside, no interval
}


def write(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


def flatlab_frame(arm="a"):
    return pd.DataFrame(
        [
            {"arm": arm, "seed": s, "metric": m, "epoch": e, "value": v}
            for (m, e), vals in FLATLAB.items()
            for s, v in enumerate(vals)
        ]
    )


@pytest.fixture
def toy(tmp_path):
    return curve_sets.load_curves(write(tmp_path / "toy.json", TOY))


def hand_ci(values):
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T975_2 * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def test_inside_and_outside_the_published_range_per_epoch(toy):
    c = pub.compare_curves(toy, flatlab_frame(), {"a": "c"})
    rows = c.rows.set_index(["metric", "epoch"])
    assert sorted(rows.index) == [
        ("test/accuracy", 1),
        ("test/accuracy", 2),
        ("test/accuracy", 3),
        ("test/loss", 1),
        ("test/loss", 2),
        ("test/loss", 3),
    ]  # epochs both sides have
    expect = {
        ("test/accuracy", 1): ("inside", True),
        ("test/accuracy", 2): ("above", True),
        ("test/accuracy", 3): ("below", False),
        ("test/loss", 1): ("inside", True),
        ("test/loss", 2): ("below", True),
        ("test/loss", 3): ("inside", None),
    }
    for key, (where, overlap) in expect.items():
        assert rows.loc[key, "where"] == where, key
        assert rows.loc[key, "overlap"] == overlap, key
    mean, low, high = hand_ci([0.88, 0.89, 0.90])
    r = rows.loc[("test/accuracy", 2)]
    assert (r["n"], r["pub_n"]) == (3, 2)
    assert (r["mean"], r["ci_low"], r["ci_high"]) == pytest.approx((mean, low, high), abs=1e-12)
    assert (r["pub_mean"], r["pub_min"], r["pub_max"]) == pytest.approx((0.86, 0.85, 0.87), abs=1e-12)
    assert high == pytest.approx(0.9148420, abs=1e-6) and low == pytest.approx(0.8651580, abs=1e-6)
    assert math.isnan(rows.loc[("test/loss", 3), "ci_low"]) and rows.loc[("test/loss", 3), "n"] == 1


def test_the_interval_stays_inside_the_values_the_metric_can_take(toy):
    # accuracy [0.99, 1.0, 1.0]: mean 0.996667, half-width t·s/√3 = 4.30265·0.0057735/√3 = 0.014342, so the
    # t-interval reaches 1.011 -> clipped at 1 (as `flatlab compare` does); loss [0.01, 0.2, 0.4]: mean
    # 0.203333, half-width 4.30265·0.195021/√3 = 0.484461 -> [−0.281, 0.688], clipped at 0 for a registered
    # workload whose loss is ≥ 0 and left as it is with no workload (a loss may then be negative)
    frame = pd.DataFrame(
        [
            {"arm": "a", "seed": i, "metric": m, "epoch": 3, "value": v}
            for m, vals in (("test/accuracy", [0.99, 1.0, 1.0]), ("test/loss", [0.01, 0.2, 0.4]))
            for i, v in enumerate(vals)
        ]
    )
    mean, low, high = hand_ci([0.99, 1.0, 1.0])
    assert high == pytest.approx(1.0110088, abs=1e-6)
    _, loss_low, loss_high = hand_ci([0.01, 0.2, 0.4])
    assert loss_low == pytest.approx(-0.2811274, abs=1e-6)
    for workload, expect_loss_low in (("fashion_mnist", 0.0), (None, loss_low)):
        rows = pub.compare_curves(toy, frame, {"a": "c"}, ranges=ranges_of(workload)).rows.set_index("metric")
        acc, loss = rows.loc["test/accuracy"], rows.loc["test/loss"]
        assert (acc["mean"], acc["ci_low"], acc["ci_high"]) == pytest.approx((mean, low, 1.0), abs=1e-12)
        assert (loss["ci_low"], loss["ci_high"]) == pytest.approx((expect_loss_low, loss_high), abs=1e-12)
        assert acc["where"] == "above" and bool(acc["overlap"]) is False  # published [0.90, 0.92]


def test_the_summary_counts_epochs_and_names_where_flatlab_falls_outside(toy):
    c = pub.compare_curves(toy, flatlab_frame(), {"a": "c"})
    s = c.summary.set_index("metric")
    assert s.loc["test/accuracy", ["epochs", "inside", "above", "below", "overlap", "with_interval"]].tolist() == [
        3,
        1,
        1,
        1,
        2,
        3,
    ]
    assert s.loc["test/accuracy", "outside_epochs"] == "below at 3; above at 2"
    assert s.loc["test/loss", ["epochs", "inside", "above", "below", "overlap", "with_interval"]].tolist() == [
        3,
        2,
        0,
        1,
        2,
        2,
    ]
    assert s.loc["test/loss", "outside_epochs"] == "below at 2"
    lines = pub.summary_lines(c)
    assert lines[0] == (
        "a vs c, test/accuracy: inside the published range at 1 of 3 epochs; outside: below at 3; "
        "above at 2; flatlab's interval overlaps it at 2 of 3."
    )
    assert any("as few as 2 run(s)" in n for n in c.notes) and any("single flatlab seed" in n for n in c.notes)


def test_epoch_and_metric_selection_and_arms_without_values(toy):
    c = pub.compare_curves(toy, flatlab_frame(), {"a": "c", "b": "c"}, metrics=["test/accuracy"], epochs=[2, 3, 7])
    assert c.rows[["arm", "metric", "epoch"]].values.tolist() == [["a", "test/accuracy", 2], ["a", "test/accuracy", 3]]
    assert c.summary["outside_epochs"].tolist() == ["below at 3; above at 2"]
    assert any("arm 'b': no flatlab values" in n for n in c.notes)
    # curve "d" holds a null at epoch 1: that epoch is missing on the published side
    d = pub.compare_curves(toy, flatlab_frame(), {"a": "d"}, metrics=["test/accuracy"])
    assert d.rows["epoch"].tolist() == [2] and d.rows["where"].tolist() == ["above"] and d.rows["pub_n"].tolist() == [1]
    assert pub._epoch_list([7, 1, 2, 3, 9, 10]) == "1-3, 7, 9-10"


def test_bad_comparison_arguments_name_the_valid_values(toy):
    with pytest.raises(
        ConfigError, match=r"metric\(s\) test/perplexity not in .*toy.json; it maps test/accuracy, test/loss"
    ):
        pub.compare_curves(toy, flatlab_frame(), {"a": "c"}, metrics=["test/perplexity"])
    with pytest.raises(ConfigError, match=r"arm 'a' -> curve 'zz': not in .*; curves: c, d"):
        pub.compare_curves(toy, flatlab_frame(), {"a": "zz"})
    with pytest.raises(ConfigError, match=r"confidence=1.5; expected a number in \(0, 1\)"):
        pub.compare_curves(toy, flatlab_frame(), {"a": "c"}, confidence=1.5)
    with pytest.raises(ConfigError, match=r"lack the column\(s\) epoch"):
        pub.compare_curves(toy, flatlab_frame().drop(columns="epoch"), {"a": "c"})


def test_text_outputs_carry_the_values_the_summary_and_the_citation(toy):
    from rich.console import Console

    c = pub.compare_curves(toy, flatlab_frame(), {"a": "c"})
    md = pub.to_markdown(c)
    assert (
        "| a (c) | test/accuracy | 2 | 0.8900 | [0.8652, 0.9148] | 3 | 0.8600 | 0.8500-0.8700 | 2 | ABOVE | yes |" in md
    )
    assert "| a (c) | test/loss | 3 | 0.3300 | - | 1 | 0.3250 | 0.3000-0.3500 | 2 | inside | - |" in md
    assert "Published: A. Author, Toy, 2024" in md and "below at 3; above at 2" in md
    out = io.StringIO()
    pub.render(c, Console(file=out, width=250))
    text = out.getvalue()
    assert "flatlab beside toy curves" in text and "ABOVE" in text and "published: A. Author, Toy, 2024" in text


# ---------------------------------------------------------------------------------------------------
# The format's loader


def test_the_markdown_shows_the_file_as_found_in_a_checkout_never_absolute(tmp_path, monkeypatch):
    # a study ran from a checkout (since deleted) whose launch recorded the file's absolute path
    ran = tmp_path / "wt" / "gone" / "studies" / "published" / "toy.json"
    ran.parent.mkdir(parents=True)
    c = pub.compare_curves(curve_sets.load_curves(write(ran, TOY)), flatlab_frame(), {"a": "c"})
    elsewhere = tmp_path / "main"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert pub.to_markdown(c).endswith("Published: A. Author, Toy, 2024 (studies/published/toy.json)\n")
    # under the working directory: relative to it, whatever the spelling
    monkeypatch.chdir(tmp_path / "wt")
    assert pub.shown_path(ran) == "gone/studies/published/toy.json"
    assert pub.shown_path("gone/studies/../studies/published/toy.json") == "gone/studies/published/toy.json"
    assert pub.shown_path(ran, cwd=ran.parent) == "toy.json"
    # outside it: from the nearest folder named studies (not the file's own name), else the name alone
    nested = tmp_path / "studies" / "x" / "studies" / "studies.json"
    assert pub.shown_path(nested, cwd=elsewhere) == "studies/studies.json"
    assert pub.shown_path("../wt/gone/studies/published/toy.json", cwd=elsewhere) == "studies/published/toy.json"
    assert pub.shown_path("published/toy.json", cwd=ran.parents[1]) == "published/toy.json"  # relative to cwd given
    assert pub.shown_path(tmp_path / "curves" / "toy.json", cwd=elsewhere) == "toy.json"


def test_the_loader_reads_runs_metadata_and_nulls(toy):
    assert (toy.title, toy.first_epoch, toy.compared()) == (
        "toy curves",
        0,
        {"test/accuracy": "acc", "test/loss": "loss"},
    )
    run = toy.curves["c"].runs[0]
    assert (run.seed, run.path, run.commit, run.values["acc"]) == (1, "runs/1.json", "", (0.1, 0.80, 0.85, 0.90))
    assert toy.curves["c"].meta == {"settings": {"lr": 0.1}}
    assert math.isnan(toy.curves["d"].runs[0].values["acc"][1])
    f = toy.frame("c")
    assert len(f) == 16 and set(f["metric"]) == {"test/accuracy", "test/loss"}  # train_eval maps to null: not compared
    assert f[(f["seed"] == 2) & (f["metric"] == "test/loss") & (f["epoch"] == 2)]["value"].tolist() == [0.45]


def test_first_epoch_shifts_the_list_entries(tmp_path):
    doc = json.loads(json.dumps(TOY))
    doc["first_epoch"] = 1  # entry 0 is after epoch 1
    f = curve_sets.load_curves(write(tmp_path / "t.json", doc)).frame("c")
    assert f[(f["seed"] == 1) & (f["metric"] == "test/accuracy")]["epoch"].tolist() == [1, 2, 3, 4]


def test_the_loader_rejects_a_malformed_file_naming_every_field(tmp_path):
    bad = json.loads(json.dumps(TOY))
    bad["version"] = 2
    del bad["citation"]
    bad["curves"]["c"]["runs"][1]["values"]["loss"][2] = "0.45"
    bad["curves"]["c"]["runs"][1]["values"]["valid_acc"] = [0.5]
    bad["curves"]["d"]["runs"].append({"seed": 1, "values": {"acc": [0.1]}})
    path = write(tmp_path / "bad.json", bad)
    with pytest.raises(ConfigError) as info:
        curve_sets.load_curves(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: not a valid curve-set file:")
    assert "version=2; expected 1" in msg
    assert "citation=None; expected a non-empty string" in msg
    assert "curves['c'].runs[1].values.loss[2]='0.45'; expected a number or null" in msg
    assert "curves['c'].runs[1].values.valid_acc: not declared in metrics (declared: acc, loss, train_eval)" in msg
    assert "curves['d'].runs: seeds [1, 1] repeat a seed" in msg


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(format="deepobs"), r"format='deepobs'; expected 'flatlab-published-curves'"),
        (lambda d: d.update(metrics={"acc": None}), r"metrics: no list is mapped to a flatlab metric"),
        (lambda d: d.update(first_epoch=-1), r"first_epoch=-1; expected an int >= 0"),
        (lambda d: d.update(curves={}), r"curves=\{\}; expected a non-empty object"),
        (lambda d: d["curves"]["c"].update(runs=[]), r"curves\['c'\].runs=\[\]; expected a non-empty list of runs"),
        (lambda d: d["curves"]["c"]["runs"][0].pop("seed"), r"curves\['c'\].runs\[0\].seed=None; expected an int"),
        (
            lambda d: d["curves"]["c"]["runs"][0].update(values=[1]),
            r"curves\['c'\].runs\[0\].values=\[1\]; expected an object",
        ),
    ],
)
def test_each_format_rule_has_its_message(tmp_path, change, message):
    doc = json.loads(json.dumps(TOY))
    change(doc)
    with pytest.raises(ConfigError, match=message):
        curve_sets.load_curves(write(tmp_path / "x.json", doc))


def test_missing_and_non_json_files(tmp_path):
    with pytest.raises(ConfigError, match=r"nope.json: no such curve-set file"):
        curve_sets.load_curves(str(tmp_path / "nope.json"))
    (tmp_path / "x.json").write_text("{'not': json}")
    with pytest.raises(ConfigError, match=r"x.json: not a JSON file"):
        curve_sets.load_curves(str(tmp_path / "x.json"))
    (tmp_path / "l.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"the top level is a list; expected an object"):
        curve_sets.load_curves(str(tmp_path / "l.json"))


# ---------------------------------------------------------------------------------------------------
# DeepOBS's reference file holds the numbers of DeepOBS's own files


SGD = "deepobs/baselines/fmnist_2c2d/GradientDescentOptimizer/num_epochs__100__batch_size__128__lr__1.5848931925e-01"
MOM = (
    "deepobs/baselines/fmnist_2c2d/MomentumOptimizer/num_epochs__100__batch_size__128__momentum__9.9e-01__"
    "use_nesterov__False__lr__2.5118864315e-03"
)
ADAM = (
    "deepobs/baselines/fmnist_2c2d/AdamOptimizer/num_epochs__100__batch_size__128__beta1__9.e-01__beta2__9.99e-01__"
    "epsilon__1.e-08__lr__2.5118864315e-04"
)


@pytest.fixture(scope="module")
def deepobs():
    return curve_sets.load_curves(str(DEEPOBS))


def run_of(curves, curve, seed):
    return next(r for r in curves.curves[curve].runs if r.seed == seed)


def test_deepobs_reference_holds_the_tuned_settings_with_their_seeds(deepobs):
    assert "Schneider, Lukas Balles and Philipp Hennig" in deepobs.citation and "ICLR" in deepobs.citation
    assert deepobs.first_epoch == 0 and deepobs.compared() == {
        "test/accuracy": "test_accuracies",
        "test/loss": "test_losses",
    }
    assert set(deepobs.curves) == {
        "fmnist_2c2d/sgd",
        "fmnist_2c2d/momentum",
        "fmnist_2c2d/adam",
    }  # DeepOBS has no fmnist_mlp baseline
    folders = {
        "fmnist_2c2d/sgd": (SGD, (45, 47)),
        "fmnist_2c2d/momentum": (MOM, (45, 50)),
        "fmnist_2c2d/adam": (ADAM, (45, 47)),
    }
    for name, (folder, seeds) in folders.items():
        curve = deepobs.curves[name]
        assert curve.meta["settings_folder"] == folder
        assert tuple(r.seed for r in curve.runs) == seeds
        for r in curve.runs:
            assert r.path.startswith(folder + f"/random_seed__{r.seed}__") and r.path.endswith(".json")
            assert re.fullmatch(r"[0-9a-f]{40}", r.commit)
            assert all(
                len(r.values[k]) == 101 for k in ("test_accuracies", "test_losses", "train_losses", "train_accuracies")
            )
        s = curve.meta["settings"]
        assert (s["batch_size"], s["num_epochs"], s["weight_decay"], s["lr_sched_epochs"]) == (128, 100, None, None)
    assert deepobs.curves["fmnist_2c2d/sgd"].meta["settings"]["learning_rate"] == 0.15848931925
    assert deepobs.curves["fmnist_2c2d/momentum"].meta["settings"]["hyperparams"] == {
        "momentum": 0.99,
        "use_nesterov": False,
    }
    assert deepobs.curves["fmnist_2c2d/adam"].meta["settings"]["hyperparams"] == {
        "beta1": 0.9,
        "beta2": 0.999,
        "epsilon": 1e-08,
    }


def test_deepobs_reference_values_equal_the_cited_files(deepobs):
    # deepobs/baselines/fmnist_2c2d/GradientDescentOptimizer/num_epochs__100__batch_size__128__lr__1.5848931925e-01/
    #   random_seed__45__2019-02-15-16-58-34.json (commit af662ac6): test_accuracies[1], [3], [100]; test_losses[1]
    sgd45 = run_of(deepobs, "fmnist_2c2d/sgd", 45).values
    assert (sgd45["test_accuracies"][1], sgd45["test_accuracies"][3], sgd45["test_accuracies"][100]) == (
        0.8336338141025641,
        0.8830128205128205,
        0.9263822115384616,
    )
    assert sgd45["test_losses"][1] == 0.4263836451065846 and sgd45["train_losses"][100] == 4.843073132248649e-05
    #   random_seed__47__2019-02-15-16-59-04.json (commit 26c0ff7c)
    sgd47 = run_of(deepobs, "fmnist_2c2d/sgd", 47).values
    assert (sgd47["test_accuracies"][1], sgd47["test_accuracies"][3], sgd47["test_accuracies"][100]) == (
        0.8616786858974359,
        0.891426282051282,
        0.9202724358974359,
    )
    assert sgd47["test_losses"][100] == 0.6960880295970501
    # the rounded figures: 0.834 / 0.862 after epoch 1, 0.883 / 0.891 after epoch 3, 0.926 / 0.920 at the end
    assert [round(v["test_accuracies"][e], 3) for e in (1, 3, 100) for v in (sgd45, sgd47)] == [
        0.834,
        0.862,
        0.883,
        0.891,
        0.926,
        0.920,
    ]
    # .../MomentumOptimizer/num_epochs__100__batch_size__128__momentum__9.9e-01__use_nesterov__False__
    #   lr__2.5118864315e-03/random_seed__50__2019-02-15-17-00-22.json (commit 26c0ff7c)
    mom50 = run_of(deepobs, "fmnist_2c2d/momentum", 50).values
    assert (mom50["test_accuracies"][2], mom50["test_losses"][100]) == (0.8790064102564102, 0.7397954725684264)
    # .../AdamOptimizer/num_epochs__100__batch_size__128__beta1__9.e-01__beta2__9.99e-01__epsilon__1.e-08__
    #   lr__2.5118864315e-04/random_seed__47__2019-02-15-16-59-05.json (commit 26c0ff7c)
    adam47 = run_of(deepobs, "fmnist_2c2d/adam", 47).values
    assert (adam47["test_losses"][1], adam47["test_accuracies"][100]) == (0.4065383137800755, 0.9227764423076923)
    #   random_seed__45__2019-02-15-16-58-48.json (commit 26c0ff7c)
    adam45 = run_of(deepobs, "fmnist_2c2d/adam", 45).values
    assert (adam45["test_accuracies"][1], adam45["test_losses"][12]) == (0.8570713141025641, 0.25001714789332485)
    # DeepOBS seeds the initialisation: seed 45 starts every optimizer from the same network (entry 0)
    starts = {run_of(deepobs, c, 45).values["test_accuracies"][0] for c in deepobs.curves}
    assert starts == {0.16296073717948717}
    # DeepOBS evaluates 78 batches of 128 = 9,984 test images: every accuracy is k / 9984
    assert all(
        abs(v * 9984 - round(v * 9984)) < 1e-6
        for c in deepobs.curves.values()
        for r in c.runs
        for v in r.values["test_accuracies"]
    )


# ---------------------------------------------------------------------------------------------------
# A study's declaration


def study_file(tmp_path, published):
    (tmp_path / "curves.json").write_text(json.dumps(TOY))
    f = tmp_path / "s.py"
    f.write_text(
        "from flatlab import Arm, Published, Study\n"
        "STUDY = Study(name='s', workload='digits', arms=(Arm('sgd'), Arm('adamw', name='adam')), "
        f"published={published})\n"
    )
    return str(f)


def test_a_study_declares_its_reference_relative_to_the_study_file(tmp_path, monkeypatch):
    from flatlab.study.loader import load_studies
    from flatlab.study.plan import plan

    monkeypatch.chdir(REPO)  # not the study file's folder
    path = study_file(tmp_path, "Published('curves.json', arms={'sgd': 'c', 'adam': 'd'})")
    s = load_studies(path)[0]
    assert s.published.path == str(tmp_path / "curves.json") and s.published.arms == {"sgd": "c", "adam": "d"}
    assert plan(s)["published"] == {"path": str(tmp_path / "curves.json"), "arms": {"sgd": "c", "adam": "d"}}
    from flatlab.reports.published_runs import launch_param

    recorded = json.loads(launch_param(s.published)["published"])  # the declaration and the file's citation
    assert recorded == {**plan(s)["published"], "citation": "A. Author, Toy, 2024"} and launch_param(None) == {}


def test_a_bad_declaration_lists_every_problem_with_the_file(tmp_path):
    from flatlab.study.loader import load_studies

    path = study_file(tmp_path, "Published('curves.json', arms={'sgd': 'zz', 'sam': 'c'})")
    with pytest.raises(ConfigError) as info:
        load_studies(path)
    msg = str(info.value)
    assert (
        f"{path}: study 's': published.arms['sgd']='zz' is not a curve of {tmp_path / 'curves.json'}; curves: c, d"
        in msg
    )
    assert f"{path}: study 's': published.arms: 'sam' is not an arm of the study; arms: sgd, adam" in msg
    path = study_file(tmp_path, "Published('missing.json', arms={'sgd': 'c'})")
    with pytest.raises(ConfigError, match=r"study 's': published.path: .*missing.json: no such curve-set file"):
        load_studies(path)
    path = study_file(tmp_path, "'curves.json'")
    with pytest.raises(ConfigError, match=r"published='curves.json'; expected None or Published\(path, arms="):
        load_studies(path)


# ---------------------------------------------------------------------------------------------------
# From MLflow, and the command line


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Study "toy": a launch that declared the toy curves (arm a -> curve c), a grid of arm "a" (seeds 0-2,
    per-epoch test metrics at steps 1-4, seed 0's epoch 2 logged twice: a resumed trial) and arm "x"
    (one seed that diverged)."""
    root = tmp_path_factory.mktemp("mlflow")
    return launched_store(root, write(root / "toy.json", TOY))


def launched_store(root, curves):
    """The store of :func:`store` in ``root``, its launch declaring the curve-set file ``curves``."""
    from mlflow.entities import Metric, Param

    from flatlab.reports.published_runs import launch_param
    from flatlab.tracking import runs

    uri = f"sqlite:///{root / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "toy", runs.artifact_location(root))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    declared = launch_param(curve_sets.Published(curves, {"a": "c"}))["published"]
    c.log_batch(parent, params=[Param("metric", "val/accuracy"), Param("mode", "max"), Param("published", declared)])
    now = int(time.time() * 1000)
    for seed in range(3):
        tags = {
            runs.PARENT: parent,
            runs.TAG_ROLE: "trial",
            runs.TAG_ARM: "a",
            runs.TAG_SEED: str(seed),
            runs.TAG_OUTCOME: "completed",
            runs.TAG_TRIAL: f"a_{seed}",
        }
        run_id = c.create_run(exp, tags=tags, start_time=now + seed).info.run_id
        metrics = [Metric(m, vals[seed], now + e, e) for (m, e), vals in FLATLAB.items() if seed < len(vals)]
        metrics += [Metric("val/accuracy", 0.9, now, 4), Metric("epoch", 4.0, now, 4)]
        if seed == 0:  # an epoch logged again after a resume: its last value counts
            metrics += [Metric("test/accuracy", 0.5, now - 10, 2)]
        c.log_batch(run_id, metrics=metrics)
        c.set_terminated(run_id, status="FINISHED")
    tags = {
        runs.PARENT: parent,
        runs.TAG_ROLE: "trial",
        runs.TAG_ARM: "x",
        runs.TAG_SEED: "0",
        runs.TAG_OUTCOME: "diverged",
    }
    run_id = c.create_run(exp, tags=tags, start_time=now).info.run_id
    c.log_batch(run_id, metrics=[Metric("test/accuracy", 0.1, now, 1), Metric("epoch", 1.0, now, 1)])
    c.set_terminated(run_id, status="FAILED")
    return uri, curves, parent


def test_compare_study_reads_the_declared_reference_and_the_histories(store):
    from flatlab.reports.published_runs import compare_study, declared_reference

    uri, curves, _ = store
    assert declared_reference(uri, "toy") == curve_sets.Published(curves, {"a": "c"})
    got = compare_study(uri, "toy")
    want = pub.compare_curves(curve_sets.load_curves(curves), flatlab_frame(), {"a": "c"})
    cols = ["arm", "metric", "epoch", "n", "mean", "ci_low", "ci_high", "pub_min", "pub_max", "where"]
    pd.testing.assert_frame_equal(got.rows[cols], want.rows[cols], check_dtype=False)
    assert got.summary["outside_epochs"].tolist() == ["below at 3; above at 2", "below at 2"]
    assert got.notes[0] == "flatlab: the best configuration runs of each arm (3 completed)."
    # --map and another file
    other = compare_study(uri, "toy", path=curves, arms={"a": "d"}, metrics=["test/accuracy"])
    assert other.rows["epoch"].tolist() == [2] and other.rows["where"].tolist() == ["above"]


def test_log_curves_puts_the_comparison_on_the_launch_run_and_never_raises(store):
    from rich.console import Console

    from flatlab import Arm, Study
    from flatlab.reports.published_runs import log_curves
    from flatlab.tracking import runs

    uri, curves, parent = store
    out = io.StringIO()
    study = Study(name="toy", workload="digits", arms=(Arm("sgd", name="a"),))
    assert log_curves(uri, parent, study, Console(file=out, width=200)) == [
        "published/curves.md",
        "published/curves.csv",
    ]
    c = runs.client(uri)
    md = open(c.download_artifacts(parent, "published/curves.md")).read()
    assert "| a (c) | test/accuracy | 3 | 0.7100 |" in md and "Published: A. Author, Toy, 2024" in md
    assert "a vs c, test/accuracy: inside the published range at 1 of 3 epochs" in out.getvalue()
    out = io.StringIO()
    assert log_curves(uri, parent, Study(name="nope", workload="digits", arms=(Arm("sgd"),)), Console(file=out)) == []
    assert "no published-curve comparison: no study 'nope'" in out.getvalue()


def test_cli_curves(store):
    from typer.testing import CliRunner

    from flatlab.cli.main import app

    uri, curves, _ = store
    runner = CliRunner()
    res = runner.invoke(app, ["curves", "toy", "--tracking-uri", uri, "--format", "csv"])
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(io.StringIO(res.output))
    assert rows[["metric", "epoch", "where"]].values.tolist() == [
        ["test/accuracy", 1, "inside"],
        ["test/accuracy", 2, "above"],
        ["test/accuracy", 3, "below"],
        ["test/loss", 1, "inside"],
        ["test/loss", 2, "below"],
        ["test/loss", 3, "inside"],
    ]
    res = runner.invoke(app, ["curves", "toy", "--tracking-uri", uri, "--epochs", "1-2", "--metric", "test/accuracy"])
    assert res.exit_code == 0, res.output
    assert "ABOVE" in res.output and "inside the published range at 1 of 2 epochs; outside: above at 2" in res.output
    res = runner.invoke(
        app, ["curves", "toy", "--tracking-uri", uri, "--format", "markdown", "--published", curves, "--map", "a=d"]
    )
    assert res.exit_code == 0, res.output
    assert "| a (d) | test/accuracy | 2 | 0.8900 |" in res.output
    for args, message in (
        (["--map", "a"], "--map 'a'; expected ARM=CURVE"),
        (["--epochs", "3-1"], "--epochs '3-1'; expected epochs and ranges such as 1-3,10"),
        (["--format", "html"], "--format 'html' is not supported; expected one of table, markdown, csv"),
        (["--metric", "test/perplexity"], "metric(s) test/perplexity not in"),
        (["--map", "zz=c"], "no flatlab values"),
    ):
        res = runner.invoke(app, ["curves", "toy", "--tracking-uri", uri, *args])
        if args[0] == "--map" and args[1] == "zz=c":  # an arm with no runs: a note, not an error
            assert res.exit_code == 0 and message in res.output, res.output
        else:
            assert res.exit_code == 2 and message in res.output, res.output


def test_a_study_without_a_declared_reference_asks_for_a_file(tmp_path):
    from mlflow.entities import Param
    from typer.testing import CliRunner

    from flatlab.cli.main import app
    from flatlab.tracking import runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "plain", runs.artifact_location(tmp_path))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_batch(parent, params=[Param("metric", "val/accuracy")])
    res = CliRunner().invoke(app, ["curves", "plain", "--tracking-uri", uri])
    assert (
        res.exit_code == 2
        and "study 'plain' declares no published reference" in res.output
        and "--published FILE" in res.output
    )


# ---------------------------------------------------------------------------------------------------
# A recorded file that has moved (the checkout the study ran from, deleted)


@pytest.fixture
def moved(tmp_path, monkeypatch):
    """A launch of "toy" that recorded <tmp>/wt/gone/studies/published/toy.json, since deleted, and a
    checkout <tmp>/main holding studies/published/toy.json, the working directory."""
    gone = tmp_path / "wt" / "gone" / "studies" / "published" / "toy.json"
    gone.parent.mkdir(parents=True)
    (tmp_path / "runs").mkdir()
    uri, _, _ = launched_store(tmp_path / "runs", write(gone, TOY))
    shutil.rmtree(tmp_path / "wt")
    found = tmp_path / "main" / "studies" / "published" / "toy.json"
    found.parent.mkdir(parents=True)
    write(found, TOY)
    monkeypatch.chdir(tmp_path / "main")
    return uri, gone, found


def test_curves_reads_a_moved_file_from_the_checkout_at_the_working_directory(moved, capsys):
    from typer.testing import CliRunner

    from flatlab.cli.main import app
    from flatlab.reports.published_runs import compare_study

    uri, gone, found = moved
    note = f"note: the curve-set file recorded at launch, {gone}, is missing; using {found} instead\n"
    got = compare_study(uri, "toy")  # the Python API
    assert capsys.readouterr().err == note and got.curves.path == str(found)
    want = pub.compare_curves(curve_sets.load_curves(str(found)), flatlab_frame(), {"a": "c"})
    cols = ["arm", "metric", "epoch", "n", "mean", "pub_min", "pub_max", "where"]
    pd.testing.assert_frame_equal(got.rows[cols], want.rows[cols], check_dtype=False)
    res = CliRunner().invoke(app, ["curves", "toy", "--tracking-uri", uri, "--format", "markdown"])
    assert res.exit_code == 0 and res.stderr == note, res.output
    assert "| a (c) | test/accuracy | 3 | 0.7100 |" in res.stdout
    assert res.stdout.endswith("Published: A. Author, Toy, 2024 (studies/published/toy.json)\n")


def test_curves_names_the_recorded_file_and_the_one_tried_when_neither_exists(moved, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flatlab.cli.main import app
    from flatlab.reports.published_runs import compare_study

    uri, gone, found = moved
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    message = (
        f"study 'toy': the curve-set file its launch recorded, {gone}, does not exist, nor does "
        f"{elsewhere / 'studies' / 'published' / 'toy.json'} (the same file under the working directory); "
        "give the file with --published FILE"
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        compare_study(uri, "toy")
    res = CliRunner().invoke(app, ["curves", "toy", "--tracking-uri", uri])
    assert res.exit_code == 2 and res.stderr == f"error: {message}\n", res.output
    res = CliRunner().invoke(
        app, ["curves", "toy", "--tracking-uri", uri, "--published", str(found), "--format", "csv"]
    )
    assert res.exit_code == 0 and res.stderr == "", res.output  # the file given: no look-up, no note
    assert pd.read_csv(io.StringIO(res.stdout))["where"].tolist() == [
        "inside",
        "above",
        "below",
        "inside",
        "below",
        "inside",
    ]


def test_a_moved_file_is_replaced_only_by_the_same_reference(tmp_path):
    from flatlab.reports.published_runs import reference_curves

    checkout = tmp_path / "main"
    found = checkout / "studies" / "published" / "toy.json"
    found.parent.mkdir(parents=True)
    gone = tmp_path / "gone" / "studies" / "published" / "toy.json"
    record = {"path": str(gone), "arms": {"a": "c", "b": "d"}, "citation": "A. Author, Toy, 2024"}
    write(found, {**TOY, "citation": "B. Other, Another, 2025"})
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"study 's': the curve-set file its launch recorded, {gone}, does not exist, and {found} is another "
            "reference: it cites 'B. Other, Another, 2025', the launch's file 'A. Author, Toy, 2024'; "
            "give the file with --published FILE"
        ),
    ):
        reference_curves(record, "s", cwd=checkout)
    # a launch recorded before the citation was: the curves alone are checked
    curves, note = reference_curves({**record, "citation": None}, "s", cwd=checkout)
    assert (curves.path, curves.citation) == (str(found), "B. Other, Another, 2025")
    assert note == f"note: the curve-set file recorded at launch, {gone}, is missing; using {found} instead"
    write(found, {**TOY, "curves": {"c": TOY["curves"]["c"]}})
    with pytest.raises(
        ConfigError, match=re.escape(f"{found} is another reference: it has no curve d (curves: c); give")
    ):
        reference_curves(record, "s", cwd=checkout)
    # the recorded file, while it exists, whatever the checkout holds
    gone.parent.mkdir(parents=True)
    write(gone, TOY)
    curves, note = reference_curves(record, "s", cwd=checkout)
    assert (curves.path, note) == (str(gone), None)
    # not under a studies/ folder: the file's name under the working directory
    write(found, TOY)
    elsewhere = tmp_path / "x" / "toy.json"
    curves, note = reference_curves({**record, "path": str(elsewhere)}, "s", cwd=found.parent)
    assert curves.path == str(found) and note.endswith(f"using {found} instead")


def test_parse_helpers():
    from flatlab.cli.curves import parse_epochs, parse_map

    assert parse_epochs("1-3, 10,2") == [1, 2, 3, 10, 2] and parse_epochs(None) is None
    assert parse_map(["sgd=fmnist_2c2d/sgd", " adam = x "]) == {"sgd": "fmnist_2c2d/sgd", "adam": "x"}
    with pytest.raises(ConfigError, match=r"--epochs 'a'"):
        parse_epochs("a")
    with pytest.raises(ConfigError, match=r"--map '=x'; expected ARM=CURVE"):
        parse_map(["=x"])
