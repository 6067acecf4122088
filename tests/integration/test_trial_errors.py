"""A trial that raises keeps its error: ``error.txt`` (message and traceback) and a one-line
``flatlab.error`` tag in MLflow, shown by ``flatlab results``; the tag goes when the trial resumes and
finishes. Plus the text helpers and the callback's tag lifecycle without Ray."""

import pytest
from typer.testing import CliRunner

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.cli.main import app
from flatlab.study.validate import validate
from flatlab.tracking import runs
from flatlab.tracking.trial_errors import one_line, read_trial_error
from test_services import FAIL_AFTER_FIRST_EPOCH

TRACEBACK = """ray::ImplicitFunc.train() (pid=4242, ip=127.0.0.1, actor_id=ab12, repr=run_trial)
  File "/x/trainable.py", line 42, in run_trial
    metrics = trainer.run_epoch()
  File "<string>", line 24, in run_epoch
RuntimeError: injected trial failure
"""


def test_one_line_takes_the_final_exception_line():
    assert one_line(TRACEBACK) == "RuntimeError: injected trial failure"
    chained = (
        "Traceback (most recent call last):\n  File 'a', line 1\nKeyError: 'x'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File 'b', line 2\n"
        "flatlab.train.checkpoint.CheckpointError: /ckpt/trainer.json: not a JSON trainer state\n"
    )
    assert one_line(chained) == "CheckpointError: /ckpt/trainer.json: not a JSON trainer state"
    assert one_line("ray.exceptions.RayTaskError(ValueError): bad value\n  more") == "ValueError: bad value"
    assert one_line("KeyboardInterrupt") == "KeyboardInterrupt"
    long = one_line("ValueError: " + "x" * 400)
    assert len(long) == 250 and long.endswith("…") and long.startswith("ValueError: xxx")
    assert one_line("something odd happened\n  detail") == "something odd happened"


def test_read_trial_error_keeps_the_latest_failure(tmp_path):
    f = tmp_path / "error.txt"
    f.write_text(
        "Failure # 1 (occurred at 2025-01-01_00-00-00)\nold: first\n"
        f"Failure # 2 (occurred at 2025-01-01_00-01-00)\n{TRACEBACK}"
    )

    class T:
        error_file = str(f)

    assert read_trial_error(T()) == TRACEBACK.strip()

    class Gone:
        error_file = str(tmp_path / "vanished.txt")

        def get_error(self):
            return None

    assert read_trial_error(Gone()) == f"the trial raised, but Tune's error file could not be read ({Gone.error_file})"


def test_error_tag_and_artifact_then_cleared_on_restart(tmp_path):
    from flatlab.tracking.callback import MLflowTrialLogger

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "errs", artifact_root=str(tmp_path / "art"))  # not ./mlruns
    c = runs.client(uri)
    parent = c.create_run(exp).info.run_id
    f = tmp_path / "err.txt"
    f.write_text(f"Failure # 1 (occurred at now)\n{TRACEBACK}")

    class T:
        trial_id, config, error_file = "t1", {"arm": "sgd", "seed": 0}, str(f)

    cb = MLflowTrialLogger(uri, exp, parent, {}, {"sgd": "sgd"}, metric="val/accuracy", mode="max")
    cb.on_trial_start(0, [], T())
    cb.on_trial_error(0, [], T())
    f.unlink()  # Ray's session folder may vanish at once: the text was read in on_trial_error
    cb.flush()
    run = c.search_runs([exp], filter_string=f"tags.`{runs.TAG_TRIAL}` = 't1'")[0]
    assert run.info.status == "FAILED" and run.data.tags[runs.TAG_ERROR] == "RuntimeError: injected trial failure"
    path = c.download_artifacts(run.info.run_id, "error.txt", str(tmp_path))
    assert open(path).read() == TRACEBACK.strip() + "\n"
    cb.on_trial_restore(0, [], T())  # --resume of the errored trial
    cb._last["t1"] = {"epoch": 3, "val/accuracy": 0.9, "completed": 1}  # its last report: the whole budget ran
    cb.on_trial_complete(0, [], T())
    cb.close()
    run = c.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and runs.TAG_ERROR not in run.data.tags
    assert cb.errors == []


@pytest.mark.integration
@pytest.mark.slow
def test_trial_raising_at_epoch_2_keeps_its_error_in_mlflow(tmp_path, monkeypatch):
    import ray

    from flatlab.study.runner import RunOptions, run_study

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAIL_AFTER_FIRST_EPOCH)  # imported by Ray's workers
    mark = tmp_path / "fail-now"
    mark.touch()
    monkeypatch.setenv(
        "PYTHONPATH", ":".join(p for p in (str(hook), __import__("os").environ.get("PYTHONPATH", "")) if p)
    )
    monkeypatch.setenv("FLATLAB_TEST_FAIL_MARK", str(mark))
    monkeypatch.setenv("RAY_ADDRESS", "local")  # a new local instance, never a Ray head found running on this machine
    study = validate(
        Study(
            name="errs",
            workload="digits",
            workload_params={"width": 16},
            arms=(Arm("sgd", space={"lr": sp.loguniform(0.01, 0.1)}),),
            num_trials=1,
            max_epochs=2,
            scheduler="fifo",
        )
    )
    root = tmp_path / "root"
    try:
        outcome = run_study(study, RunOptions(root=root, num_cpus=1))
    finally:
        ray.shutdown()
    assert outcome.num_errors == 1
    c = runs.client(outcome.tracking_uri)
    (run,) = c.search_runs([outcome.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    assert run.info.status == "FAILED" and run.data.tags[runs.TAG_OUTCOME] == "error"
    assert run.data.tags[runs.TAG_ERROR] == "RuntimeError: injected trial failure"
    text = open(c.download_artifacts(run.info.run_id, "error.txt", str(tmp_path))).read()
    assert (
        "RuntimeError: injected trial failure" in text
        and "in run_epoch" in text
        and 'raise RuntimeError("injected' in text
    )
    res = CliRunner().invoke(app, ["results", "errs", "--root", str(root)], terminal_width=400)
    assert res.exit_code == 0, res.output
    header = next(line for line in res.output.splitlines() if "outcome" in line)
    assert "error" in header and "RuntimeError: injected trial" in res.output, res.output  # the cell may wrap
    csv = CliRunner().invoke(app, ["results", "errs", "--root", str(root), "--format", "csv"])
    assert csv.exit_code == 0 and "RuntimeError: injected trial failure" in csv.output, csv.output

    mark.unlink()  # fixed: the resumed trial finishes and loses the stale tag
    try:
        again = run_study(study, RunOptions(root=root, num_cpus=1, resume=True))
    finally:
        ray.shutdown()
    assert again.num_errors == 0
    run = c.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and runs.TAG_ERROR not in run.data.tags
