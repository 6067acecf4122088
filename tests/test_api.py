"""flatlab.run / flatlab.results: exported lazily, options checked before anything starts (the runs
themselves: tests/test_readme_snippet.py and tests/tracking/test_results_query.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

import flatlab
from flatlab import Arm, Study
from flatlab.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
STUDY = Study(name="api", workload="digits", arms=(Arm("sgd", space={"lr": 0.1}),), num_trials=1, max_epochs=1)


def test_import_flatlab_stays_light():
    code = (
        "import sys, flatlab; flatlab.run; flatlab.results; "
        "print(sorted(m for m in ('ray', 'mlflow', 'pandas', 'optuna') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "platform"), "PATH": ""},
    ).stdout
    assert out.strip() == "[]"
    assert {"run", "results"} <= set(flatlab.__all__)
    with pytest.raises(AttributeError, match="module 'flatlab' has no attribute 'nope'"):
        flatlab.nope  # noqa: B018


def test_options_are_checked_before_anything_starts(tmp_path):
    with pytest.raises(
        ConfigError, match=r"unknown option 'trails' \(did you mean 'trials'\?\); valid options: studies, scale, trials"
    ):
        flatlab.run(STUDY, trails=2, root=tmp_path)
    with pytest.raises(ConfigError, match=r"scale=/studies=\) choose among a study file's studies; this is a Study"):
        flatlab.run(STUDY, scale="smoke", root=tmp_path)
    with pytest.raises(ConfigError, match=r"study 'nope' is not in .*digits_demo.py; studies there: digits_demo"):
        flatlab.run(REPO / "studies" / "digits_demo.py", studies="nope", root=tmp_path)
    with pytest.raises(ConfigError, match=r"does not exist \(a relative path is read from the working directory"):
        flatlab.run("no/such/study.py", root=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written


def test_results_of_a_missing_store_is_an_error_that_creates_nothing(tmp_path):
    with pytest.raises(ConfigError, match="no MLflow store at"):
        flatlab.results("api", root=tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def test_results_times_are_utc_timestamps_while_the_cli_keeps_ms(tmp_path):
    import io

    import pandas as pd
    from mlflow.entities import Param
    from typer.testing import CliRunner

    from flatlab.cli.main import app
    from flatlab.tracking import runs

    t0 = 1_780_000_000_000  # ms since the epoch: 2026-05-28 20:26:40 UTC
    uri = runs.default_tracking_uri(tmp_path)
    c = runs.client(uri)
    exp = runs.get_or_create_experiment(uri, "times", str(tmp_path / "mlartifacts"))
    parent = c.create_run(exp, start_time=t0, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_batch(parent, params=[Param("metric", "val/accuracy"), Param("mode", "max")])
    ended = c.create_run(
        exp, start_time=t0 + 1_000, tags={runs.PARENT: parent, runs.TAG_ARM: "sgd", runs.TAG_TRIAL: "t0"}
    )
    c.set_terminated(ended.info.run_id, end_time=t0 + 61_500)
    c.create_run(
        exp, start_time=t0 + 2_000, tags={runs.PARENT: parent, runs.TAG_ARM: "sgd", runs.TAG_TRIAL: "t1"}
    )  # running

    df = flatlab.results("times", root=tmp_path, sort="start_time")
    assert str(df["start_time"].dtype) == str(df["end_time"].dtype) == "datetime64[ns, UTC]"
    assert list(df["trial_id"]) == ["t0", "t1"]
    assert list(df["start_time"]) == [
        pd.Timestamp("2026-05-28 20:26:41", tz="UTC"),
        pd.Timestamp("2026-05-28 20:26:42", tz="UTC"),
    ]
    assert [t.value // 1_000_000 for t in df["start_time"]] == [t0 + 1_000, t0 + 2_000]  # ns -> the runs' ms
    assert df.loc[0, "end_time"] == pd.Timestamp(t0 + 61_500, unit="ms", tz="UTC") and pd.isna(df.loc[1, "end_time"])
    later = flatlab.results("times", root=tmp_path, filter="start_time > '2026-05-28 20:26:41.5+00:00'")
    assert list(later["trial_id"]) == ["t1"]

    def cli_csv(*args):
        res = CliRunner().invoke(
            app,
            ["results", "times", "--root", str(tmp_path), "--format", "csv", *args],
            env={"MLFLOW_TRACKING_URI": ""},
        )
        assert res.exit_code == 0, res.output
        return pd.read_csv(io.StringIO(res.output))

    csv = cli_csv("--sort", "-start_time")
    assert list(csv["trial_id"]) == ["t1", "t0"] and list(csv["start_time"]) == [t0 + 2_000, t0 + 1_000]
    assert csv.loc[1, "end_time"] == t0 + 61_500 and pd.isna(csv.loc[0, "end_time"])
    assert list(cli_csv("--filter", f"start_time > {t0 + 1_500}")["trial_id"]) == ["t1"]
