"""The launch record: the budget a --resume reuses, the Optuna studies a --continue grows, and what a
restored experiment tells the searcher and the progress line."""

import json
import socket
import time
import warnings
from types import SimpleNamespace

import optuna
import pytest

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.errors import ConfigError
from flatlab.study.launches import Launch, continued_studies, resume_budget, resume_checkpoint_every, space_difference
from flatlab.study.prepare import prepare
from flatlab.study.progress import ProgressPrinter
from flatlab.study.searchers import ArmSearcher
from flatlab.study.validate import validate

METRIC = "val/accuracy"


def study(lr_high=0.5, searcher="optuna"):
    arms = (Arm("sgd", space={"lr": sp.loguniform(0.01, lr_high)}), Arm("adamw", space={"lr": 3e-3}))
    return validate(Study(name="s", workload="digits", arms=arms, num_trials=2, max_epochs=3, searcher=searcher))


def record(tmp_path, **fields):
    """A launch.json of study "s" under tmp_path written as a launch would (or by hand, ``raw``)."""
    path = tmp_path / "s" / "launch.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fields))
    return Launch.read(tmp_path, "s")


def test_resume_reuses_the_launch_overrides_and_refuses_different_ones(tmp_path):
    recorded = record(
        tmp_path, overrides={"trials": 4, "epochs": 15, "final_seeds": None, "tunings": None, "scale": "demo"}
    )
    nothing = {"trials": None, "epochs": None, "final_seeds": None, "tunings": None, "scale": None}
    assert resume_budget(recorded, nothing) == recorded.overrides
    assert resume_budget(recorded, dict(nothing, epochs=15)) == recorded.overrides  # repeating one is fine
    with pytest.raises(
        ConfigError, match=r"--trials 5 differs from the launch being resumed, which ran with --trials 4"
    ):
        resume_budget(recorded, dict(nothing, trials=5), "s")
    with pytest.raises(ConfigError, match=r"--final-seeds 2 differs .* ran with the study file's value"):
        resume_budget(recorded, dict(nothing, final_seeds=2))
    with pytest.raises(ConfigError, match=r"--scale full differs .* --scale demo"):
        resume_budget(recorded, dict(nothing, scale="full"))
    # a record written before overrides were kept: the options as given
    assert resume_budget(record(tmp_path, experiment_name="x"), dict(nothing, trials=2)) == dict(nothing, trials=2)


def test_the_launch_record_round_trips_and_reads_older_records(tmp_path):
    launch = Launch(
        path=tmp_path / "s" / "launch.json",
        experiment_name="s-1",
        parent_run_id="p",
        overrides={"trials": 2},
        checkpoint_every=None,
        optuna_studies={"sgd": "s-1.sgd"},
    )
    launch.write(status="killed", num_errors=1)
    again = Launch.read(tmp_path, "s")
    assert again == launch and (again.status, again.num_errors, again.done) == ("killed", 1, False)
    assert json.loads(launch.path.read_text())["optuna_studies"] == {"sgd": "s-1.sgd"}
    assert "path" not in json.loads(launch.path.read_text())
    assert Launch.read(tmp_path, "s").write(status="finished", num_errors=0).done
    old = record(tmp_path, experiment_name="s-0", parent_run_id="q", status="finished", unknown_key=1)  # older flatlab
    assert (old.experiment_name, old.overrides, old.optuna_studies, old.done) == ("s-0", None, {}, True)
    assert resume_checkpoint_every(old, 3) == 3  # cadence not recorded: the study file's
    assert resume_checkpoint_every(record(tmp_path, checkpoint_every=None), 3) is None  # recorded: by time
    with pytest.raises(ConfigError, match=r"checkpoint_every='7'; expected null or an int >= 1"):
        resume_checkpoint_every(record(tmp_path, checkpoint_every="7"), 3, "s")
    (tmp_path / "s" / "launch.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"launch.json: not a launch record \(a JSON object expected\)"):
        Launch.read(tmp_path, "s")
    assert Launch.read(tmp_path, "other") is None


def test_prepare_of_a_resume_takes_the_launchs_budget_and_cadence(tmp_path):
    path = tmp_path / "s.py"
    path.write_text(
        "from flatlab import Arm, Study\nSTUDY = Study(name='s', workload='digits', arms=(Arm('sgd'),), "
        "max_epochs=20, num_trials=8, checkpoint_every=5)\n"
    )
    root = tmp_path / "root"
    given = {"trials": None, "epochs": None, "final_seeds": None, "scale": None, "checkpoint_every": None}
    (new,) = prepare(str(path), dict(given, trials=3, epochs=40), root)
    assert (new.study.num_trials, new.study.max_epochs, new.study.checkpoint_every) == (3, 40, 5)
    assert new.budget == {"trials": 3, "epochs": 40, "final_seeds": None, "tunings": None, "scale": None}
    record(root, overrides=new.budget, checkpoint_every=2)
    (resumed,) = prepare(str(path), given, root, resume=True)
    assert (resumed.study.num_trials, resumed.study.max_epochs, resumed.study.checkpoint_every) == (3, 40, 2)
    assert resumed.budget == new.budget
    (again,) = prepare(str(path), dict(given, checkpoint_every=4), root, resume=True)  # a cadence may change
    assert again.study.checkpoint_every == 4
    with pytest.raises(
        ConfigError, match=r"--epochs 20 differs from the launch being resumed, which ran with --epochs 40"
    ):
        prepare(str(path), dict(given, epochs=20), root, resume=True)
    with pytest.raises(ConfigError, match=r"--resume and --continue exclude each other"):
        prepare(str(path), given, root, resume=True, continue_=True)
    with pytest.raises(ConfigError, match=r"unknown launch option\(s\) trails; expected trials, epochs"):
        prepare(str(path), {"trails": 2}, root)


def _previous(tmp_path, s):
    """A launch "L" of ``s`` that ran one trial per arm (its Optuna studies in tmp_path/optuna.db)."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = ArmSearcher(s, optuna_storage=storage, launch="L")
    for n in range(2):
        tid = f"t{n}"
        searcher.suggest(tid)
        searcher.on_trial_complete(tid, {"epoch": 3, METRIC: 0.5, "completed": 1})
    return Launch(
        path=tmp_path / "launch.json",
        experiment_name="L",
        parent_run_id="p1",
        optuna_storage=storage,
        optuna_prefix="L",
    )


def test_continue_names_the_previous_studies_and_refuses_a_changed_space(tmp_path):
    previous = _previous(tmp_path, study())
    prefix, names = continued_studies(previous, study(), "launch.json")
    assert prefix == "L" and names == {"sgd": "L.sgd", "adamw": "L.adamw"}
    with pytest.raises(
        ConfigError,
        match=r"arm 'sgd' of study 's' searches a different space than the Optuna study 'L.sgd' .*lr: "
        r"FloatDistribution\(high=0.5",
    ):
        continued_studies(previous, study(lr_high=0.9), "launch.json")
    with pytest.raises(
        ConfigError, match=r"--continue: study 's' has no previous launch to continue \(missing launch.json\)"
    ):
        continued_studies(None, study(), "launch.json")
    with pytest.raises(ConfigError, match="searcher='grid'"):
        continued_studies(
            previous,
            study(searcher="grid").__class__(
                name="s", workload="digits", arms=(Arm("sgd", space={"lr": sp.grid([0.1])}),), searcher="grid"
            ),
            "launch.json",
        )


def test_space_difference_names_each_parameter():
    f = optuna.distributions.FloatDistribution
    assert space_difference({"lr": f(0.1, 1.0)}, {"lr": f(0.1, 1.0)}) == ""
    assert space_difference({"lr": f(0.1, 1.0), "wd": f(0, 1)}, {"lr": f(0.1, 1.0), "m": f(0, 1)}) == (
        "m: searched now, not before; wd: searched before, not now"
    )


def test_a_continued_search_adds_to_the_same_study_with_fresh_random_points(tmp_path):
    s = study()
    previous = _previous(tmp_path, s)
    first = optuna.load_study(study_name="L.sgd", storage=previous.optuna_storage).trials[0].params["lr"]
    again = ArmSearcher(s, optuna_storage=previous.optuna_storage, launch="L")  # what --continue builds
    config = again.suggest("u0")
    trials = optuna.load_study(study_name="L.sgd", storage=previous.optuna_storage).trials
    assert len(trials) == 2 and trials[1].user_attrs["tune_trial_id"] == "u0"
    assert config["lr"] == trials[1].params["lr"] != first  # a sampler seeded as before would draw `first` again


def test_a_restored_searcher_reports_no_step_twice(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    s = ArmSearcher(study(), optuna_storage=storage, launch="L")
    s.suggest("t0")
    for epoch in (1, 2):
        s.on_trial_result("t0", {"epoch": epoch, METRIC: 0.1 * epoch})
    path = tmp_path / "state"
    s.save(str(path))  # the experiment state Tune kept, with the values not yet written to Optuna
    fresh = ArmSearcher(study(), optuna_storage=storage, launch="L")
    fresh.restore(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna's "step already reported" would raise here
        for epoch in (1, 2, 3):  # the trial re-runs from its checkpoint of epoch 0
            fresh.on_trial_result("t0", {"epoch": epoch, METRIC: 0.5})
        fresh.on_trial_complete("t0", {"epoch": 3, METRIC: 0.5})  # stopped there: pruned
    t0 = optuna.load_study(study_name="L.sgd", storage=storage).trials[0]
    assert t0.intermediate_values == {1: 0.1, 2: 0.2, 3: 0.5}


def _trial(tid, status, arm="sgd", **last):
    return SimpleNamespace(trial_id=tid, status=status, config={"arm": arm}, last_result=last)


def test_progress_counts_trials_that_ended_before_a_resume(capsys):
    p = ProgressPrinter(5, METRIC, "max")
    trials = [
        _trial("a", "TERMINATED", epoch=3, completed=1, **{METRIC: 0.7}),
        _trial("b", "TERMINATED", epoch=1, **{METRIC: 0.9}),  # pruned
        _trial("c", "PENDING"),
        _trial("d", "RUNNING"),
    ]
    p.on_step_begin(0, trials)
    p.on_trial_start(0, trials, trials[3])
    assert p.status().split("]")[1].startswith(" trials: 2 done / 1 running / 2 pending")
    assert p._done == {"a": "completed", "b": "pruned"}
    assert p.best() == "0.7000 (sgd a)"  # the pruned trial's 0.9 is not a candidate


def test_progress_best_is_the_study_s_one_answer_over_completed_search_trials(capsys):
    # selection's rule: completed search trials only, final-epoch values, configurations by their mean
    # over seeds; a running trial's epoch, a pruned trial and a final-stage re-run never count
    p = ProgressPrinter(8, METRIC, "max", every_s=0.0)

    def trial(tid, arm, lr, seed, stage="search", **last):
        return SimpleNamespace(
            trial_id=tid,
            status="TERMINATED",
            last_result=last,
            config={"arm": arm, "lr": lr, "seed": seed, "stage": stage},
        )

    assert p.best() == "-"
    running = trial("r", "sam", 0.1, 0)
    p.on_trial_start(0, [running], running)
    p.on_trial_result(0, [running], running, {"epoch": 2, METRIC: 0.99})  # not its last epoch
    assert p.best() == "-" and "best val/accuracy -" in capsys.readouterr().out
    ended = [
        trial("a", "sgd", 0.1, 0, epoch=5, completed=1, **{METRIC: 0.80}),
        trial("b", "sgd", 0.1, 1, epoch=5, completed=1, **{METRIC: 0.90}),  # same config: mean 0.85
        trial("c", "sam", 0.1, 0, epoch=5, completed=1, **{METRIC: 0.84}),
        trial("d", "sam", 0.2, 0, epoch=2, **{METRIC: 0.95}),  # pruned
        trial("e", "tsam", 0.1, 0, "final", epoch=5, completed=1, **{METRIC: 0.97}),
    ]  # final stage
    for t in ended:
        p.on_trial_complete(0, ended, t)
    assert p.best() == "0.8500 (sgd b, mean of 2 seeds)"
    p.on_trial_complete(0, ended, running)  # r's last report was its epoch 2 without `completed`: pruned
    assert p.best() == "0.8500 (sgd b, mean of 2 seeds)"
    better = trial("f", "sam", 0.3, 0, epoch=5, completed=1, **{METRIC: 0.86})
    p.on_trial_complete(0, [better], better)
    assert p.best() == "0.8600 (sam f)"
    p = ProgressPrinter(2, "train/loss", "min")
    low = [
        trial("g", "sgd", 0.1, 0, epoch=5, completed=1, **{"train/loss": 0.3}),
        trial("h", "sgd", 0.2, 0, epoch=5, completed=1, **{"train/loss": 0.2}),
    ]
    p.on_step_begin(0, low)  # restored after a resume
    assert p.best() == "0.2000 (sgd h)"


def test_progress_says_a_failed_trial_will_resume_or_failed(capsys, tmp_path):
    p = ProgressPrinter(2, METRIC, "max")
    err = tmp_path / "error.txt"
    err.write_text(
        "Failure # 1 (occurred at 2026-01-01)\nray.exceptions.ActorDiedError: The actor died unexpectedly\n  more\n"
    )
    t = SimpleNamespace(
        trial_id="a", status="ERROR", config={"arm": "sgd"}, last_result={"epoch": 2}, error_file=str(err)
    )
    p.on_trial_start(0, [t], t)
    p.on_trial_recover(0, [t], t)
    p.on_trial_error(0, [t], t)
    out = capsys.readouterr().out.splitlines()
    assert (
        "failed" in out[0]
        and "will resume from its last checkpoint: ActorDiedError: The actor died unexpectedly" in out[0]
    )
    assert out[1].split()[:2] == ["failed", "sgd"]
    assert out[1].endswith("ActorDiedError: The actor died unexpectedly (--resume retries it)")
    assert len([line for line in out if "actor died" in line]) == 2  # one line each, not Ray's multi-line message


def test_the_interrupt_hint_names_the_root_and_cluster_the_resume_needs(tmp_path, monkeypatch):
    from flatlab.study.runner import RunOptions, resume_command

    monkeypatch.chdir(tmp_path)
    assert resume_command(RunOptions(source="s.py")) == "flatlab run s.py --resume"  # ./flatlab-runs
    assert resume_command(RunOptions(root=tmp_path / "flatlab-runs", source="s.py")) == "flatlab run s.py --resume"
    other = tmp_path / "my runs"
    assert resume_command(RunOptions(root=other, source="s.py", address="10.0.0.5:6379")) == (
        f"flatlab run s.py --resume --root '{other}' --address 10.0.0.5:6379"
    )
    assert resume_command(RunOptions()) == "flatlab run <study file> --resume"


def test_a_resume_logs_to_the_launch_s_store_and_refuses_another(tmp_path, monkeypatch):
    from flatlab.study.launch_record import launch_tracking_uri
    from flatlab.study.runner import RunOptions

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    launch = Launch(path=tmp_path / "launch.json", tracking_uri="sqlite:////data/store.db")
    default = f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}"
    assert launch_tracking_uri(RunOptions(resume=True), launch, tmp_path) == "sqlite:////data/store.db"
    assert launch_tracking_uri(RunOptions(continue_=True), launch, tmp_path) == "sqlite:////data/store.db"
    assert launch_tracking_uri(RunOptions(resume=True, tracking_uri="sqlite:////data/store.db"), launch, tmp_path) == (
        "sqlite:////data/store.db"
    )
    with pytest.raises(ConfigError, match="--resume: --tracking-uri sqlite:////elsewhere.db is not the store"):
        launch_tracking_uri(RunOptions(resume=True, tracking_uri="sqlite:////elsewhere.db"), launch, tmp_path)
    assert launch_tracking_uri(RunOptions(), None, tmp_path) == default
    assert (
        launch_tracking_uri(RunOptions(resume=True), Launch(path=tmp_path / "old.json"), tmp_path) == default
    )  # an old record


def test_a_resume_takes_the_launch_s_store_at_a_new_address_and_refuses_other_stores(tmp_path, monkeypatch):
    """A tracking server that moved (a SLURM job's head node, between a cancelled job and its
    resubmission) serves the same store at a new URI: the store that holds the launch's run is taken."""
    from mlflow.tracking import MlflowClient

    from flatlab.study.launch_record import launch_tracking_uri as _tracking_uri
    from flatlab.study.runner import RunOptions
    from flatlab.tracking.runs import holds_run

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"  # the backend store the old server wrote
    c = MlflowClient(tracking_uri=store)
    exp = c.create_experiment("s")
    run = c.create_run(exp).info.run_id
    other = f"sqlite:///{tmp_path / 'other.db'}"
    MlflowClient(tracking_uri=other).create_run(MlflowClient(tracking_uri=other).create_experiment("s"))
    launch = Launch(
        path=tmp_path / "launch.json", tracking_uri="http://10.0.0.5:5000", parent_run_id=run, experiment_id=exp
    )
    assert _tracking_uri(RunOptions(resume=True, tracking_uri=store), launch, tmp_path) == store
    with pytest.raises(
        ConfigError,
        match=rf"--tracking-uri {other} is not the store of the launch it finishes "
        rf"\(http://10.0.0.5:5000; it does not hold the launch's run {run}\)",
    ):
        _tracking_uri(RunOptions(resume=True, tracking_uri=other), launch, tmp_path)
    missing = tmp_path / "missing.db"
    with pytest.raises(ConfigError, match="is not the store of the launch"):
        _tracking_uri(RunOptions(resume=True, tracking_uri=f"sqlite:///{missing}"), launch, tmp_path)
    assert not missing.exists()  # asking created no store
    assert not holds_run(store, run, "999") and not holds_run(store, "0" * 32, exp)
    assert not holds_run("file:///nowhere", run, exp)  # neither SQLite nor a server: not opened
    with socket.socket() as s:  # a closed port: no answer, at once (no MLflow retries)
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    t0 = time.monotonic()
    assert not holds_run(f"http://127.0.0.1:{closed}", run, exp)
    assert time.monotonic() - t0 < 10


def test_a_refused_resume_leaves_no_folder_behind(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from flatlab.cli.main import app

    monkeypatch.chdir(tmp_path)
    demo = __import__("pathlib").Path(__file__).resolve().parents[2] / "studies" / "digits_demo.py"
    res = CliRunner().invoke(app, ["run", str(demo), "--resume", "--root", str(tmp_path / "runs")])
    assert res.exit_code == 2 and "--resume: no earlier launch of study 'digits_demo'" in " ".join(res.output.split())
    assert not (tmp_path / "runs").exists()


def test_a_trial_that_took_over_a_killed_driver_s_run_is_shown_with_the_id_mlflow_knows(capsys):
    p = ProgressPrinter(2, METRIC, "max", every_s=0.0)
    p.took_over = {"new1": "old1"}.get  # LaunchRecords.took_over on a resume
    t = SimpleNamespace(
        trial_id="new1",
        status="TERMINATED",
        config={"arm": "sgd", "lr": 0.1, "seed": 0},
        last_result={"epoch": 3, "completed": 1, METRIC: 0.8},
    )
    u = SimpleNamespace(
        trial_id="own2",
        status="TERMINATED",
        config={"arm": "sam", "lr": 0.1, "seed": 0},
        last_result={"epoch": 3, "completed": 1, METRIC: 0.7},
    )
    p.on_trial_complete(0, [t, u], t)
    p.on_trial_complete(0, [t, u], u)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["done", "sgd", "new1"] and lines[0].endswith("(in MLflow: trial old1)")
    assert not any("in MLflow" in line for line in lines if "own2" in line)
    assert p.best() == "0.8000 (sgd old1)"


def test_continue_grows_the_optuna_study_of_every_tuning(tmp_path):
    import dataclasses

    two = dataclasses.replace(study(), tunings=2)
    previous = _previous(tmp_path, two)
    prefix, names = continued_studies(previous, two, "launch.json")
    assert prefix == "L" and names == {"sgd": "L.sgd", "adamw": "L.adamw", "sgd@2": "L.sgd@2", "adamw@2": "L.adamw@2"}
