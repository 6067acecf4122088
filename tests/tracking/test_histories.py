"""Per-epoch histories read back from MLflow, and the CLI's compute-based comparisons over them, on a
temporary SQLite store (no Ray)."""

import io
import math
import time

import pandas as pd
import pytest
from mlflow.entities import Metric
from typer.testing import CliRunner

from flatlab.cli.main import app
from flatlab.errors import ConfigError
from flatlab.tracking import runs
from flatlab.tracking.histories import read_histories

runner = CliRunner()
COST = {"sgd": (100, 1.0), "ire": (110, 1.1)}  # passes and training seconds per epoch
ACC = {  # (arm, tuning, seed) -> val/accuracy per epoch
    ("sgd", 1, 0): [0.5, 0.8, 0.9],
    ("sgd", 1, 1): [0.6, 0.7, 0.85],
    ("sgd", 2, 0): [0.9, 0.92, 0.95],
    ("sgd", 2, 1): [0.5, 0.6, 0.8],
    ("ire", 1, 0): [0.8, 0.9, 0.9],
    ("ire", 1, 1): [0.7, 0.8, 0.9],
    ("ire", 2, 0): [0.81, 0.9, 0.9],
    ("ire", 2, 1): [0.9, 0.9, 0.9],
}


def launch(uri, root, name, acc, params):
    exp = runs.get_or_create_experiment(uri, name, runs.artifact_location(root))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    for k, v in {"metric": "val/accuracy", "mode": "max", **params}.items():
        c.log_param(parent, k, v)
    now = int(time.time() * 1000)
    for (arm, tuning, seed), values in acc.items():
        tags = {runs.PARENT: parent, runs.TAG_ROLE: "trial", runs.TAG_ARM: arm, runs.TAG_SEED: str(seed)}
        tags.update({runs.TAG_TUNING: str(tuning), runs.TAG_STAGE: "final", runs.TAG_OUTCOME: "completed"})
        run_id = c.create_run(exp, tags=tags).info.run_id
        passes, seconds = COST[arm]
        m = []
        for e, v in enumerate(values, start=1):
            m += [Metric("val/accuracy", v, now + e, e), Metric("compute/passes", passes * e, now + e, e)]
            m += [Metric("compute/train_s", seconds * e, now + e, e)]
        m.append(Metric("test/accuracy", values[-1], now + 9, len(values)))  # the final model's only: not per epoch
        m.append(Metric("val/accuracy", 0.0, now - 1, 1))  # an older value at epoch 1: the latest counts
        c.log_batch(run_id, metrics=m)
        c.set_terminated(run_id)
    # a search trial: not read
    search = c.create_run(exp, tags={runs.PARENT: parent, runs.TAG_ROLE: "trial", runs.TAG_ARM: "sgd"}).info.run_id
    c.set_terminated(search)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    launch(uri, root, "eq", ACC, {"reference_arm": "sgd", "target_metric": "0.8"})
    # a second workload: sgd only, whose target (its median final value) two of its four runs reach
    launch(uri, root, "eq2", {k: v for k, v in ACC.items() if k[0] == "sgd"}, {})
    return uri, root


def test_read_histories(store):
    uri, _ = store
    h, info = read_histories(uri, "eq")
    assert info.metric == "val/accuracy" and info.reference_arm == "sgd" and info.target_metric == 0.8
    assert len(h) == 8 * 3 and set(h["epoch"]) == {1, 2, 3}
    assert "test/accuracy" not in h.columns or h["test/accuracy"].isna().all()
    row = h[(h["arm"] == "ire") & (h["tuning"] == 1) & (h["seed"] == 1) & (h["epoch"] == 2)].iloc[0]
    assert (row["val/accuracy"], row["compute/passes"], row["compute/train_s"]) == pytest.approx((0.8, 220, 2.2))
    with pytest.raises(ConfigError, match="no study 'nope'"):
        read_histories(uri, "nope")


def test_cli_time_to_target_and_at_equal(store):
    uri, _ = store
    env = {"MLFLOW_TRACKING_URI": uri, "COLUMNS": "200"}
    out = runner.invoke(app, ["compare", "eq", "--time-to-target", "--target", "0.8", "--format", "csv"], env=env)
    assert out.exit_code == 0, out.output
    rows = pd.read_csv(io.StringIO(out.output)).set_index("arm")
    assert rows.loc["sgd", "passes"] == 250 and rows.loc["ire", "passes"] == 110
    assert rows.loc["ire", "passes_speedup"] == pytest.approx(math.exp((math.log(250 / 165) + math.log(200 / 110)) / 2))
    study_target = runner.invoke(app, ["compare", "eq", "--time-to-target", "--format", "markdown"], env=env)
    assert "val/accuracy >= 0.8 (study)" in study_target.output  # Study(target_metric=0.8)
    given = runner.invoke(
        app, ["compare", "eq", "--time-to-target", "--target", "0.9", "--format", "markdown"], env=env
    )
    assert "val/accuracy >= 0.9 (given)" in given.output
    out = runner.invoke(app, ["compare", "eq", "--at-equal", "passes"], env=env)
    assert out.exit_code == 0, out.output
    assert "at 300 passes" in out.output  # sgd's 300, the smaller total
    out = runner.invoke(app, ["compare", "eq", "--at-equal", "steps"], env=env)
    assert out.exit_code != 0 and "--at-equal 'steps': expected one of passes, seconds" in out.output


def test_cli_cost_curves(store, tmp_path):
    uri, _ = store
    args = ["curves", "eq", "--cost", "seconds", "--output", str(tmp_path), "--points", "5"]
    out = runner.invoke(app, args, env={"MLFLOW_TRACKING_URI": uri})
    assert out.exit_code == 0, out.output
    c = pd.read_csv(tmp_path / "val_accuracy_by_seconds.csv")
    assert set(c["arm"]) == {"sgd", "ire"} and c["cost"].max() == pytest.approx(3.3)
    assert (tmp_path / "val_accuracy_by_seconds.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_time_to_target_profiles_over_studies(store, tmp_path):
    uri, _ = store
    plot = tmp_path / "p.png"
    args = ["compare", "eq", "eq2", "--time-to-target", "--format", "csv", "--plot", str(plot)]
    out = runner.invoke(app, args, env={"MLFLOW_TRACKING_URI": uri})
    assert out.exit_code == 0, out.output
    passes = out.output.split("# seconds")[0]
    assert "# passes" in passes and "ire,110.0,,1.0,inf" in passes  # ire is absent from eq2: not solved
    # eq2's target 0.875: sgd 300, miss, 100, miss -> median inf in its only arm
    assert "sgd,250.0,inf,2.272727" in passes
    assert (tmp_path / "time_profiles_passes.png").exists() and (tmp_path / "time_profiles_seconds.png").exists()
    out = runner.invoke(app, ["compare", "eq", "eq2", "--at-equal", "passes"], env={"MLFLOW_TRACKING_URI": uri})
    assert out.exit_code != 0 and "--at-equal read one study" in out.output


def test_a_launch_logs_its_cost_curves(store):
    from flatlab.reports.publish import log_study_analysis
    from flatlab.tracking.trials import parent_runs, read_sample

    uri, _ = store
    parent = parent_runs(uri, "eq")[0].info.run_id
    logged = log_study_analysis(uri, parent, "eq", read_sample(uri, "eq", launch=parent))
    want = {f"cost_curves/val_accuracy_by_{u}.{x}" for u in ("passes", "seconds") for x in ("csv", "png")}
    assert want <= set(logged)
    names = {f.path for f in runs.client(uri).list_artifacts(parent, "cost_curves")}
    assert want <= names


def test_the_analysis_line_names_only_the_folders_written(store):
    from rich.console import Console

    from flatlab.reports.publish import log_study_analysis
    from flatlab.tracking.trials import parent_runs, read_sample

    uri, _ = store
    parent = parent_runs(uri, "eq")[0].info.run_id
    out = io.StringIO()
    console = Console(file=out, width=300)
    logged = log_study_analysis(uri, parent, "eq", read_sample(uri, "eq", launch=parent), console=console)
    written = sorted({p.split("/")[0] for p in logged})
    assert written == ["cost_curves"]  # no flatness measured, not a random-search pool
    assert f"analysis: {len(logged)} files on the launch run (cost_curves/)" in out.getvalue()


def test_cli_cost_curves_of_an_unknown_metric(store, tmp_path):
    uri, _ = store
    args = ["curves", "eq", "--cost", "passes", "--metric", "test/accuracy", "--output", str(tmp_path)]
    out = runner.invoke(app, args, env={"MLFLOW_TRACKING_URI": uri})
    assert out.exit_code != 0
    assert "metric 'test/accuracy' has no per-epoch history here; these have: val/accuracy" in out.output
