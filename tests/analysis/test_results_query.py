"""`flatlab results` filters (--arm, --metric/--mode, --filter, --sort, --columns) and flatlab.results()
against pandas computations on an MLflow store built here; integer params stay integers; the table's
launch label and start time."""

import datetime
import io
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

import flatlab
from flatlab.analysis.query import infer_mode
from flatlab.cli.main import app
from flatlab.errors import ConfigError

runner = CliRunner()
T0 = 1_780_000_000_000  # ms since the epoch: 2026-05-28

# (arm, optimizer, outcome, epochs, val/accuracy, flat/fisher_trace, params as MLflow stores them: text)
TRIALS = [
    ("sgd", "sgd", "completed", 10, 0.91, 12.0, {"lr": "0.05", "momentum": "0.9"}),
    ("sgd", "sgd", "completed", 4, 0.88, 9.0, {"lr": "0.2", "momentum": "0.9"}),
    ("sgd", "sgd", "pruned", 2, 0.95, 3.0, {"lr": "0.01", "momentum": "0.9"}),
    ("tsam", "tsam", "completed", 10, 0.93, 7.0, {"lr": "0.1", "rho": "0.05", "s": "3"}),
    ("tsam", "tsam", "completed", 8, 0.90, 5.0, {"lr": "0.03", "rho": "0.2", "s": "5"}),
    ("tsam", "tsam", "error", 1, None, None, {"lr": "0.3", "rho": "0.1", "s": "3"}),
    ("sgd_ire", "sgd_ire", "completed", 10, 0.92, 4.0, {"lr": "0.08", "kappa": "2.0", "mask_interval": "10"}),
    ("sgd_ire", "sgd_ire", "diverged", 3, None, None, {"lr": "0.9", "kappa": "4.5", "mask_interval": "20"}),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A store with an older launch (one trial) and the latest launch (TRIALS); returns (root, latest launch id)."""
    from mlflow.entities import Metric, Param

    from flatlab.tracking import runs

    root = tmp_path_factory.mktemp("root")
    uri = runs.default_tracking_uri(root)
    c = runs.client(uri)
    exp = runs.get_or_create_experiment(uri, "toy", str(root / "mlartifacts"))

    def launch(start, trials):
        parent = c.create_run(exp, start_time=start, tags={runs.TAG_ROLE: "study"}).info.run_id
        c.log_batch(parent, params=[Param("metric", "val/accuracy"), Param("mode", "max")])
        for i, (arm, opt, outcome, epochs, acc, fisher, params) in enumerate(trials):
            tags = {
                runs.PARENT: parent,
                runs.TAG_ARM: arm,
                runs.TAG_OPT: opt,
                runs.TAG_OUTCOME: outcome,
                runs.TAG_SEED: "0",
                runs.TAG_TRIAL: f"t{i}",
            }
            run = c.create_run(exp, start_time=start + 1000 * (i + 1), tags=tags).info.run_id
            metrics = [Metric("epoch", epochs, 0, epochs)]
            for key, value in (("val/accuracy", acc), ("best/val/accuracy", acc), ("flat/fisher_trace", fisher)):
                if value is not None:
                    metrics.append(Metric(key, value, 0, epochs))
            c.log_batch(run, metrics=metrics, params=[Param(k, v) for k, v in params.items()])
        return parent

    launch(T0 - 86_400_000, TRIALS[:1])
    latest = launch(T0, TRIALS)
    return root, latest


def frame(store, **filters):
    return flatlab.results("toy", root=store[0], **filters)


def cli(store, *args):
    return runner.invoke(app, ["results", "toy", "--root", str(store[0]), *args], env={"MLFLOW_TRACKING_URI": ""})


def cli_csv(store, *args):
    res = cli(store, "--format", "csv", *args)
    assert res.exit_code == 0, res.output
    return pd.read_csv(io.StringIO(res.output))


def cli_fails(store, pattern, *args):
    res = cli(store, *args)
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert re.search(pattern, text), text
    assert len(res.output.strip().splitlines()) == 1, res.output  # one line, no traceback


def test_integer_params_stay_integers(store):
    df = frame(store)
    assert len(df) == len(TRIALS)  # the latest launch only
    assert str(df["param.s"].dtype) == "Int64" and str(df["param.mask_interval"].dtype) == "Int64"
    assert str(df["seed"].dtype) == "Int64"
    assert str(df["param.lr"].dtype) == "float64" and str(df["param.kappa"].dtype) == "float64"  # "2.0" is a float
    by_trial = df.set_index("trial_id")
    assert by_trial.loc["t3", "param.s"] == 3 and by_trial.loc["t4", "param.s"] == 5
    assert by_trial["param.s"].isna().sum() == 5  # the sgd and sgd_ire trials have no s
    assert sorted(df["param.mask_interval"].dropna().tolist()) == [10, 20]
    text = cli(store, "--format", "csv").output
    rows = list(pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)["param.s"])
    assert sorted(rows) == ["", "", "", "", "", "3", "3", "5"]  # never 3.0
    table = " ".join(cli(store, "--sort", "trial_id").output.split())
    assert "s=3" in table and "s=3.0" not in table and "mask_interval=10" in table


def test_filter_is_the_pandas_query(store):
    df = frame(store)
    expected = df[(df["outcome"] == "completed") & (df["epochs"] > 5)]
    got = frame(store, filter="outcome == 'completed' and epochs > 5")
    assert list(got["run_id"]) == list(expected["run_id"]) and len(got) == 4
    expected = df[(df["val/accuracy"] > 0.9) & (df["param.lr"] < 0.1)]
    got = frame(store, filter="`val/accuracy` > 0.9 and `param.lr` < 0.1")
    assert (
        list(got["run_id"]) == list(expected["run_id"]) and len(got) == 3
    )  # t0, t6 and the pruned t2; not t3 (lr 0.1)
    assert got.attrs["metric"] == "val/accuracy"
    csv = cli_csv(store, "--filter", "`param.s` == 3")
    assert sorted(csv["trial_id"]) == sorted(df.loc[df["param.s"] == 3, "trial_id"]) == ["t3", "t5"]


def test_a_bad_filter_is_one_clear_line(store):
    with pytest.raises(ConfigError, match=r"--filter 'val/accuracy > 0.9'.*need backticks"):
        frame(store, filter="val/accuracy > 0.9")
    with pytest.raises(ConfigError, match=r"--filter 'epochs \+ 1': not a condition"):
        frame(store, filter="epochs + 1")
    cli_fails(
        store,
        r"error: --filter \"outcome == 'completed' and\": SyntaxError: .*need backticks, e.g. \"`val/accuracy` > 0.9",
        "--filter",
        "outcome == 'completed' and",
    )
    cli_fails(store, r"--filter 'epochs = 1': not a condition", "--filter", "epochs = 1")  # an assignment, not ==
    cli_fails(store, r"--filter 'param.lr < 1'.*need backticks", "--filter", "param.lr < 1")


def test_arms(store):
    df = frame(store)
    got = frame(store, arms=["tsam", "sgd_ire"])
    assert list(got["run_id"]) == list(df.loc[df["arm"].isin(["tsam", "sgd_ire"]), "run_id"])
    assert set(cli_csv(store, "--arm", "tsam", "--arm", "sgd")["arm"]) == {"tsam", "sgd"}
    with pytest.raises(ConfigError, match=r"--arm sam: no such arm.*arms of this study: sgd, sgd_ire, tsam"):
        frame(store, arms="sam")
    cli_fails(store, r"--arm tsma: no such arm \(did you mean 'tsam'", "--arm", "tsma")


def rank_by_hand(df, metric, ascending):
    """Completed first, then pruned, ..., each by the metric, NaN last (the documented ranking)."""
    rank = {"completed": 0, "pruned": 1, "interrupted": 2, "diverged": 3, "error": 4}
    keyed = df.assign(_r=df["outcome"].map(rank))
    return list(
        keyed.sort_values(["_r", metric], ascending=[True, ascending], na_position="last", kind="stable")["trial_id"]
    )


def test_metric_ranks_with_the_inferred_or_given_mode(store):
    df = frame(store)
    got = frame(store, metric="flat/fisher_trace")  # flat/* -> min
    assert got.attrs["mode"] == "min" and got.attrs["metric"] == "flat/fisher_trace"
    assert list(got["trial_id"]) == rank_by_hand(df, "flat/fisher_trace", True)
    assert list(got["trial_id"])[:2] == ["t6", "t4"]  # 4.0 and 5.0, completed; the pruned 3.0 after every completed
    got = frame(store, metric="flat/fisher_trace", mode="max")
    assert list(got["trial_id"]) == rank_by_hand(df, "flat/fisher_trace", False)
    best = frame(store, metric="flat/fisher_trace", best=True)
    assert dict(zip(best["arm"], best["trial_id"])) == {"sgd_ire": "t6", "tsam": "t4", "sgd": "t1"}  # never pruned t2
    assert list(cli_csv(store, "--metric", "flat/fisher_trace", "--best")["trial_id"]) == ["t6", "t4", "t1"]
    with pytest.raises(ConfigError, match=r"--metric 'flat/fisher' is not a metric.*did you mean 'flat/fisher_trace'"):
        frame(store, metric="flat/fisher")
    cli_fails(
        store,
        r"--mode 'lowest' is not supported; expected one of min, max",
        "--metric",
        "flat/fisher_trace",
        "--mode",
        "lowest",
    )


@pytest.mark.parametrize(
    "metric, mode",
    [
        ("val/loss", "min"),
        ("train/loss_smoothed", "min"),
        ("test/perplexity", "min"),
        ("flat/neighbourhood_loss_var", "min"),
        ("flat/avg_sharpness", "min"),
        ("time/epoch_s", "min"),
        ("train/steps_to_target", "min"),
        ("val/accuracy", "max"),
        ("test/f1", "max"),
        ("train/speedup", "max"),
        ("val/pearson", "max"),
    ],
)
def test_inferred_modes(metric, mode):
    assert infer_mode(metric) == mode


def test_sort_and_columns(store):
    df = frame(store)
    got = frame(store, sort="-param.lr")
    assert list(got["trial_id"]) == list(df.sort_values("param.lr", ascending=False, kind="stable")["trial_id"])
    got = frame(store, sort=["arm", "-epochs"])
    assert list(got["trial_id"]) == list(
        df.sort_values(["arm", "epochs"], ascending=[True, False], kind="stable")["trial_id"]
    )
    csv = cli_csv(store, "--sort", "-epochs", "--sort", "trial_id", "--columns", "trial_id,epochs,param.lr")
    assert list(csv.columns) == ["trial_id", "epochs", "param.lr"]
    assert list(csv["trial_id"]) == list(
        df.sort_values(["epochs", "trial_id"], ascending=[False, True], kind="stable")["trial_id"]
    )
    with pytest.raises(
        ConfigError, match=r"--columns s, nope: no such column \(did you mean 'param.s'\?\); available columns: arm, "
    ):
        frame(store, columns="arm,s,nope")
    cli_fails(store, r"--sort nope: no such column; available columns: arm, optimizer", "--sort", "-nope")
    table = " ".join(cli(store, "--columns", "trial_id,val/accuracy,param.s").output.split())
    assert "trial_id" in table and "param.s" in table and "optimizer" not in table


def test_table_shows_a_short_launch_and_a_readable_start(store):
    root, latest = store
    res = cli(store)
    assert res.exit_code == 0, res.output
    first_start = T0 + 1000  # t0, the best completed trial: first row
    when = datetime.datetime.fromtimestamp(first_start / 1000).strftime("%Y-%m-%d %H:%M:%S")
    assert latest[:8] in res.output and latest not in res.output and when in res.output
    csv = cli_csv(store)
    assert set(csv["launch"]) == {latest} and sorted(csv["start_time"]) == [
        T0 + 1000 * (i + 1) for i in range(len(TRIALS))
    ]
    every = cli_csv(store, "--all")
    assert len(every) == len(TRIALS) + 1 and every["launch"].nunique() == 2


def test_cli_and_python_api_give_the_same_frame(store):
    api = frame(
        store,
        arms="tsam",
        filter="outcome == 'completed'",
        metric="flat/fisher_trace",
        columns=["trial_id", "flat/fisher_trace"],
    )
    csv = cli_csv(
        store,
        "--arm",
        "tsam",
        "--filter",
        "outcome == 'completed'",
        "--metric",
        "flat/fisher_trace",
        "--columns",
        "trial_id,flat/fisher_trace",
    )
    assert list(api["trial_id"]) == list(csv["trial_id"]) == ["t4", "t3"]
    assert list(api["flat/fisher_trace"]) == list(csv["flat/fisher_trace"]) == [5.0, 7.0]


def test_by_config_follows_the_metric(store):
    per_config = frame(store, by_config=True, metric="flat/fisher_trace", best=True)
    assert list(per_config["arm"]) == ["sgd_ire", "tsam", "sgd"]  # the completed configurations with the least Tr(F)
    assert list(per_config["flat/fisher_trace mean"]) == [4.0, 5.0, 9.0]
    assert list(per_config.columns).count("flat/fisher_trace mean") == 1
    table = cli(store, "--by-config", "--metric", "flat/fisher_trace")
    header = next(line for line in table.output.splitlines() if "seeds" in line)
    assert header.count("flat/fisher_trace") == 1, table.output
    # --columns takes a pooled metric by the name its header shows: its mean and std columns
    picked = frame(store, by_config=True, metric="flat/fisher_trace", columns="arm,flat/fisher_trace")
    assert list(picked.columns) == ["arm", "flat/fisher_trace mean", "flat/fisher_trace std"]
    whole = frame(store, by_config=True, metric="flat/fisher_trace")
    pd.testing.assert_series_equal(picked["flat/fisher_trace std"], whole["flat/fisher_trace std"])
    csv = cli_csv(store, "--by-config", "--columns", "arm,val/accuracy mean")
    assert list(csv.columns) == ["arm", "val/accuracy mean"]
