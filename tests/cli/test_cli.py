import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flatlab.cli.main import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(
        app, ["run", str(REPO / "studies/digits_demo.py"), "--dry-run", "--trials", "3", "--epochs", "5"]
    )
    assert res.exit_code == 0, res.output
    assert "digits_demo" in res.output and "6 trials x up to 5 epochs" in res.output
    assert "lr ~ loguniform(0.001, 1)" in res.output and "adamw" in res.output
    assert not (tmp_path / "flatlab-runs").exists()
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


@pytest.mark.parametrize(
    "train, said",
    [
        ({}, "flatness of each completed trial's final model, after epoch 8 (flat/<measure>): hessian_trace"),
        (
            {"stop_at_train_loss": 0.1},
            "flatness of each completed trial's final model (flat/<measure>): at the first epoch "
            "whose mean training loss is <= 0.1 (stop_at_train_loss), else after epoch 8: hessian_trace",
        ),
        (
            {"measure_at_train_loss": 0.3},
            "flatness of each completed trial at the first epoch whose mean training loss is "
            "<= 0.3 (flat_at_target/<measure>, if reached) and after epoch 8 (flat/<measure>): hessian_trace",
        ),
    ],
)
def test_dry_run_says_which_models_flatness_is_measured_on(tmp_path, monkeypatch, train, said):
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "s.py"
    study.write_text(
        "from flatlab import Arm, Study\n"
        f"STUDY = Study(name='s', workload='digits', train={train!r}, max_epochs=8, "
        f"measures={{'hessian_trace': {{}}}}, "
        "arms=(Arm('sgd', space={'lr': 0.1}),))\n"
    )
    res = runner.invoke(app, ["run", str(study), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert said in " ".join(res.output.split())  # the console wraps long lines


def test_invalid_study_fails_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from flatlab import Arm, Study\nfrom flatlab import space as sp\n"
        "STUDY = Study(name='bad', workload='digits', arms=(Arm('sgd', space={'lr': sp.loguniform(0.0, 1.0)}),))\n"
    )
    res = runner.invoke(app, ["run", str(bad)])
    assert res.exit_code == 2
    assert "loguniform: low > 0 must hold for a log range" in res.output and "bad.py" in res.output
    assert "arm 'sgd', field 'lr'" in res.output
    assert not (tmp_path / "flatlab-runs").exists()


def test_listings(monkeypatch):
    monkeypatch.chdir(REPO)
    res = runner.invoke(app, ["studies"])
    assert res.exit_code == 0, res.output
    lines = {line.split()[0]: line.split(None, 1)[1] for line in res.output.splitlines() if line.startswith("studies/")}
    assert lines["studies/digits_demo.py"].startswith("-  ") and "SGD vs AdamW" in lines["studies/digits_demo.py"]
    assert lines["studies/deepobs_fmnist.py"].startswith("paper, cpu  ")  # SCALES = ("paper", "cpu")
    assert lines["studies/fmnist_flatness.py"].startswith("cpu, cpu-replicate, paper, smoke  ")
    assert (
        lines["studies/examples/extensions.py"].startswith("-  ")
        and "Lion against SGD on two moons" in lines["studies/examples/extensions.py"]
    )
    assert lines["studies/examples/two_moons.py"].startswith("(module)  ")
    assert "studies/_flatness_arms.py" not in lines and "examples (studies/examples/):" in res.output
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()
    res = runner.invoke(app, ["optimizers"])
    assert res.exit_code == 0 and "momentum" in res.output and "float in [0, 1)" in res.output
    res = runner.invoke(app, ["workloads"])
    assert (
        res.exit_code == 0
        and "digits" in res.output
        and "one of 'mlp', 'cnn'" in res.output
        and "label_smoothing" in res.output
    )


def test_studies_lists_each_folder_with_scales_parsing_nothing_it_runs(tmp_path):
    (tmp_path / "b.py").write_text(
        '"""Two scales,\nthe first the default.\n\nMore."""\nSCALES = ("x", "y")\ndef build(scale): ...\n'
    )
    (tmp_path / "a.py").write_text('raise SystemExit("a listed file ran")\nSTUDY = None\n')
    (tmp_path / "_shared.py").write_text('"""Skipped."""\n')
    (tmp_path / "c.py").write_text('"""Computed."""\nfrom flatlab import Study as STUDY\nSCALES = tuple("pq")\n')
    (tmp_path / "broken.py").write_text("STUDY = = 1\n")
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "helper.py").write_text('"""A module."""\nX = 1\n')
    (tmp_path / "_private").mkdir()
    (tmp_path / "_private" / "d.py").write_text("STUDY = None\n")
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, ["studies", str(tmp_path)])
    assert res.exit_code == 0, res.output
    t = str(tmp_path)
    w = len(f"{t}/more/helper.py")
    assert res.output.splitlines() == [
        f"{'file':{w}s}  scales      about",
        f"{t + '/a.py':{w}s}  -           ",
        f"{t + '/b.py':{w}s}  x, y        Two scales, the first the default.",
        f"{t + '/broken.py':{w}s}  -           (syntax error: invalid syntax, line 1)",
        f"{t + '/c.py':{w}s}  (computed)  Computed.",
        "",
        f"more ({t}/more/):",
        f"{t + '/more/helper.py':{w}s}  (module)    A module.",
        "",
        "scales: the values of `flatlab run FILE --scale NAME`, the first the default; -: no --scale (one setting); "
        "(module): not a study file, a module the study files next to it import",
    ]
    res = runner.invoke(app, ["studies", str(tmp_path / "empty")])
    assert res.exit_code == 2 and f"no study files in {tmp_path / 'empty'} or its subfolders" in res.output


def test_the_failure_line_names_the_studys_log_file(tmp_path):
    from flatlab.cli.run import failure_line
    from flatlab.study.launches import log_file

    log = log_file(tmp_path / "root" / "s")
    assert str(log) == f"{tmp_path}/root/s/logs/flatlab.log"
    assert failure_line("s", 3, 3, "studies/s.py", log) == (
        f"every trial of s failed (3 of 3); see {tmp_path}/root/s/logs/flatlab.log and `flatlab results s`"
    )
    assert failure_line("s", 2, 0, "studies/s.py", log).startswith(
        "every trial of s failed (2 of 2); see "
    )  # store holds fewer
    assert failure_line("s", 1, 4, "studies/s.py", log) == (
        "1 of 4 trials of s failed; `flatlab results s` shows their errors, "
        "`flatlab run studies/s.py --resume` retries them"
    )
    assert failure_line("s", 0, 4, "studies/s.py", log) == ""


def test_results_format_and_output_must_agree(tmp_path):
    def fails(*args):
        res = runner.invoke(app, ["results", "x", "--root", str(tmp_path), *args])
        assert res.exit_code == 2
        return res.output

    assert "expected one of table, csv, parquet" in fails("--format", "xlsx")
    assert "--format parquet needs --output PATH" in fails("--format", "parquet")
    assert "ends in .parquet; make them agree" in fails("--format", "csv", "--output", str(tmp_path / "t.parquet"))
    assert "cannot tell the format from its suffix" in fails("--output", str(tmp_path / "t.xlsx"))
    assert "--format table prints to the terminal" in fails("--format", "table", "--output", str(tmp_path / "t.csv"))
    assert not any(tmp_path.iterdir())  # nothing queried, nothing written


@pytest.mark.parametrize(
    "fmt, output, expected",
    [
        (None, None, "table"),
        ("csv", None, "csv"),
        (None, "r.CSV", "csv"),
        (None, "r.parquet", "parquet"),
        ("parquet", "r.parquet", "parquet"),
        ("csv", "results.txt", "csv"),
    ],
)
def test_results_format_from_flag_or_suffix(fmt, output, expected):
    from flatlab.cli.results import export_format

    assert export_format(fmt, None if output is None else Path(output)) == expected


def test_dry_run_of_fig4_names_the_steps_to_target_reference(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["run", str(REPO / "studies/ire_fig4_llama.py"), "--dry-run", "--scale", "smoke"])
    assert res.exit_code == 0, res.output
    assert res.output.count("train/steps_to_target against the reference arm 'adamw'") == 3  # one per model size


def test_a_misspelt_study_field_is_a_clear_error_not_a_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "typo.py"
    bad.write_text(
        "from flatlab import Arm, Study\n"
        "STUDY = Study(name='t', workload='digits', arms=(Arm('sgd'),), referance_arm='sgd')\n"
    )
    res = runner.invoke(app, ["run", str(bad), "--dry-run"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "Study() has no field 'referance_arm' (did you mean 'reference_arm'?)" in " ".join(res.output.split())
    bad.write_text(
        "from flatlab import Arm, Study\n"
        "STUDY = Study(name='t', workload='digits', arms=(Arm('sgd'),), curve_smoothing=0.5)\n"
    )
    res = runner.invoke(app, ["run", str(bad), "--dry-run"])
    assert res.exit_code == 2 and "is a trainer parameter: put it in train={...}" in " ".join(res.output.split())


@pytest.mark.parametrize(
    "searcher, seeds, pooled", [("grid", (0, 1), True), ("grid", (0,), False), ("optuna", (0, 1), False)]
)
def test_run_ends_with_seed_means_when_every_grid_point_ran_with_every_seed(
    tmp_path, monkeypatch, searcher, seeds, pooled
):
    import pandas as pd

    import flatlab.study.runner as runner_mod
    import flatlab.tracking.trials as results_mod

    space = "sp.grid([0.1])" if searcher == "grid" else "sp.loguniform(0.01, 0.1)"
    study = tmp_path / "seeds.py"
    study.write_text(
        "from flatlab import Arm, Study\nfrom flatlab import space as sp\n"
        f"STUDY = Study(name='seeds', workload='digits', arms=(Arm('sgd', space={{'lr': {space}}}),), "
        f"searcher={searcher!r}, seeds={seeds!r}, scheduler='fifo', max_epochs=1)\n"
    )
    trials = pd.DataFrame(
        {
            "arm": ["sgd", "sgd"],
            "trial_id": ["t1", "t0"],
            "status": ["FINISHED"] * 2,
            "outcome": ["completed"] * 2,
            "epochs": [1, 1],
            "seed": [1, 0],
            "val/accuracy": [0.9, 0.8],
            "best/val/accuracy": [0.9, 0.8],
            "test/accuracy": [0.9, 0.7],
            "param.lr": [0.1, 0.1],
        }
    )  # best first, as trials_frame returns it
    trials.attrs.update(metric="val/accuracy", mode="max")
    outcome = runner_mod.StudyOutcome(
        study="seeds",
        tracking_uri="sqlite:///x.db",
        experiment_id="1",
        parent_run_id="p",
        experiment_path="e",
        interrupted=False,
        num_trials=2,
        num_errors=0,
        wall_s=1.0,
    )
    monkeypatch.setattr(runner_mod, "run_study", lambda s, opts, console=None: outcome)  # no Ray: the summary only
    monkeypatch.setattr(results_mod, "trials_frame", lambda uri, name, **kw: trials)
    res = runner.invoke(app, ["run", str(study), "--root", str(tmp_path)])
    assert res.exit_code == 0, res.output
    if pooled:
        assert "best configuration per arm, mean and std over 2 seeds" in res.output
        assert "0.85" in res.output and "0.8" in res.output  # the mean of val/accuracy and of test/accuracy
    else:
        assert "best trial per arm (from MLflow)" in res.output and "t1" in res.output and "±" not in res.output
        # the trial, with the score that chose its configuration (the mean 0.85 of its 2 seeds) and the rule's line
        assert "0.85" in res.output and "chosen on completed search trials" in " ".join(res.output.split())
    # where to look next: the UI of the SQLite store, served on 127.0.0.1, opened in the training view
    mlflow = Path(sys.executable).parent / "mlflow"  # absolute: works where the venv is not active
    assert f"MLflow UI: `{mlflow} server --backend-store-uri sqlite:///x.db --host 127.0.0.1 --port 5000`" in res.output
    assert "/#/experiments/1/runs?workflowType=machine_learning&viewStateShareKey=flatlab" in res.output


def test_results_under_a_root_with_no_store_is_an_error_and_creates_nothing(tmp_path):
    res = runner.invoke(app, ["results", "digits_demo", "--root", str(tmp_path / "nowhere")])
    assert res.exit_code == 2
    assert "no MLflow store at" in res.output and "pass --root" in " ".join(res.output.split())
    assert not (tmp_path / "nowhere").exists()
    res = runner.invoke(app, ["interpolation-report", "rft_clip_alpha", "--root", str(tmp_path)])
    assert res.exit_code == 2 and "no MLflow store at" in res.output
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("given, seen", [(None, "False"), ("true", "True")])
def test_the_cli_turns_mlflow_progress_bars_off_unless_the_user_set_them(given, seen):
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"}
    env.update({"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": given} if given else {})
    code = (
        "import flatlab.cli.main; "
        "from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as bar; "
        "print(bar.get())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == seen, out.stderr


def test_arms_without_a_completed_trial_are_named_even_with_no_trial_in_mlflow(monkeypatch):
    # an interrupted launch: only sam's trials reached MLflow (one pruned), the other arms none at all
    import io

    import pandas as pd
    from rich.console import Console

    import flatlab.cli.results as cli_main

    out = io.StringIO()
    monkeypatch.setattr(cli_main, "console", Console(file=out, width=300))
    trials = pd.DataFrame({"arm": ["sam", "sam"], "outcome": ["pruned", "completed"]})
    best = pd.DataFrame({"arm": ["sam"]})
    cli_main._say_arms_without_answer(trials, best, ["sgd", "sam", "adamw"])
    assert (
        out.getvalue().strip()
        == "no completed trial (pruned, diverged, failed or unfinished), so no best for: sgd, adamw"
    )
    out.truncate(0), out.seek(0)
    cli_main._say_arms_without_answer(trials.iloc[:0], best.iloc[:0], ["sgd", "sam"])  # nothing reached MLflow
    assert out.getvalue().strip().endswith("so no best for: sgd, sam")
    out.truncate(0), out.seek(0)
    cli_main._say_arms_without_answer(trials, best)  # `flatlab results`: the arms of the trials only
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    "args, said",
    [
        (
            ["compare", "s", "--rank-by", "banana"],
            "--rank-by 'banana' is not supported; expected one of final, best-epoch",
        ),
        (["results", "s", "--rank-by", "last"], "--rank-by 'last' is not supported; expected one of final, best-epoch"),
        (["compare", "s", "--confidence", "95"], "--confidence 95.0: expected a number in (0, 1)"),
        (["curves", "s", "--confidence", "0"], "--confidence 0.0: expected a number in (0, 1)"),
    ],
)
def test_ranking_and_confidence_options_are_checked_before_any_store_is_read(tmp_path, args, said):
    # a study whose table would not use --rank-by (one with a final stage) used to take any value silently
    res = runner.invoke(app, [*args, "--root", str(tmp_path / "runs")])
    assert res.exit_code == 2 and said in " ".join(res.output.split()), res.output
    assert not (tmp_path / "runs").exists()


def test_command_help_joins_each_paragraph_keeps_list_items_and_drops_rest_backticks():
    from flatlab.cli.app import command_help

    doc = """Run it.

        Exit status: 0 when done; 1 when
        every trial failed (``--resume`` continues).

        Steps:
        - first, on
          two lines
        - second
        """
    assert command_help(doc) == (
        "Run it.\n\nExit status: 0 when done; 1 when every trial failed (--resume continues).\n\n"
        "Steps:\n- first, on two lines\n- second"
    )


def test_run_help_wraps_its_paragraphs_once(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    res = runner.invoke(app, ["run", "--help"])
    assert res.exit_code == 0
    assert "1 when every trial of a study failed; 2 for invalid input" in res.output and "``" not in res.output
