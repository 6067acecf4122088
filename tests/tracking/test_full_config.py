"""Every trial's full configuration in MLflow and trial.json, the environment, and MLflow's UI settings."""

import json
import os

import torch

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.study.trial_spec import resolved_config, trial_spec
from flatlab.tracking import runs

STUDY = Study(
    name="full",
    workload="digits",
    workload_params={"depth": 3},
    train={"label_smoothing": 0.05},
    arms=(Arm("sgd", space={"lr": sp.loguniform(0.01, 0.5)}), Arm("adamw", space={"lr": 3e-3, "batch_size": 32})),
    max_epochs=4,
)

# digits declares model="mlp", width=128; its recipe is batch_size=64, schedule="cosine"; sgd declares
# momentum=0.9, nesterov=False, weight_decay=0.0 (optim/basic.py, workloads/digits.py, train/config.py)
EXPECTED_SGD = {
    "optimizer": {"lr": 0.2, "weight_decay": 0.0, "momentum": 0.9, "nesterov": False},
    "workload": {"model": "mlp", "width": 128, "depth": 3, "val_fraction": 0.2, "test_fraction": 0.2},
}


def test_resolved_config_fills_every_default_for_an_arm_that_searches_only_lr():
    got = resolved_config(STUDY, {"arm": "sgd", "seed": 0, "lr": 0.2})
    assert got["optimizer"] == EXPECTED_SGD["optimizer"]
    assert got["workload"] == EXPECTED_SGD["workload"]
    trainer = got["trainer"]
    assert trainer["batch_size"] == 64 and trainer["schedule"] == "cosine"  # the workload's recipe
    assert trainer["label_smoothing"] == 0.05  # the study's train={...}
    assert trainer["curve_smoothing"] == 0.9 and trainer["clip_norm"] is None  # TRAINER_HPARAMS defaults
    assert trainer["epochs"] == 4
    adamw = resolved_config(STUDY, {"arm": "adamw", "seed": 1, "lr": 3e-3, "batch_size": 32})
    assert adamw["optimizer"] == {"lr": 3e-3, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
    assert adamw["trainer"]["batch_size"] == 32  # an arm's own value beats the workload's recipe


def test_trainer_runs_with_the_resolved_recipe():
    from flatlab.train.trainer import Trainer
    from flatlab.workloads.registry import build_workload

    config = {"arm": "adamw", "seed": 0, "lr": 3e-3, "batch_size": 32}
    spec = trial_spec(STUDY, config)
    trainer = Trainer(spec, build_workload("digits").load_data(0))
    resolved = resolved_config(STUDY, config)
    assert trainer.hp == {k: v for k, v in resolved["trainer"].items() if k != "epochs"}
    assert trainer.workload.params == resolved["workload"]


def test_trial_params_keep_plain_names_and_prefix_the_resolved_values():
    config = {"arm": "sgd", "seed": 0, "lr": 0.2, runs.STAGE_KEY: "final"}
    params = runs.trial_params(config, resolved_config(STUDY, config))
    assert params["lr"] == "0.2" and params["arm"] == "sgd" and params["seed"] == "0"
    assert runs.STAGE_KEY not in params  # a tag, not a param
    assert params["opt.lr"] == "0.2" and params["opt.momentum"] == "0.9" and params["opt.nesterov"] == "False"
    assert params["train.batch_size"] == "64" and params["train.clip_norm"] == "None" and params["train.epochs"] == "4"
    assert params["wl.width"] == "128" and params["wl.model"] == "mlp"
    from flatlab.train.config import TRAINER_HPARAMS

    n_resolved = 4 + len(TRAINER_HPARAMS) + 1 + 5  # sgd's, the trainer's and epochs, digits' declarations
    assert sum(runs.is_resolved_param(k) for k in params) == n_resolved
    assert runs.trial_params(dict(config), resolved_config(STUDY, config)) == params  # same strings every time


def _store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, STUDY.name, (tmp_path / "art").as_uri())
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_param(parent, "metric", "val/accuracy")
    return uri, exp, parent, c


def test_child_run_params_hold_the_full_config_and_results_show_only_the_searched_ones(tmp_path):
    from flatlab.tracking.callback import MLflowTrialLogger
    from flatlab.tracking.trials import trials_frame

    uri, exp, parent, c = _store(tmp_path)
    cb = MLflowTrialLogger(
        uri,
        exp,
        parent,
        tags={"flatlab.env.torch": "x"},
        arm_optimizer={"sgd": "sgd"},
        metric="val/accuracy",
        mode="max",
        study=STUDY,
        resolve=resolved_config,
    )
    config = {"arm": "sgd", "seed": 0, "lr": 0.2}
    cb._start_run(c, "t1", config)
    run = c.get_run(cb._run_ids["t1"])
    expected = runs.trial_params(config, resolved_config(STUDY, config))
    assert run.data.params == expected
    assert run.data.params["train.batch_size"] == "64" and run.data.params["opt.momentum"] == "0.9"
    # a resumed trial: the run is found again; logging the same values again is what MLflow accepts
    cb2 = MLflowTrialLogger(
        uri,
        exp,
        parent,
        tags={},
        arm_optimizer={},
        metric="val/accuracy",
        mode="max",
        study=STUDY,
        resolve=resolved_config,
    )
    cb2._start_run(c, "t1", dict(config))
    assert cb2._run_ids["t1"] == run.info.run_id
    from mlflow.entities import Param

    c.log_batch(run.info.run_id, params=[Param(k, v) for k, v in cb2._params(dict(config)).items()])
    df = trials_frame(uri, STUDY.name)
    params = sorted(col for col in df.columns if col.startswith("param."))
    assert params == ["param.lr"] and df.loc[0, "param.lr"] == 0.2


def test_pickled_callback_keeps_its_study_and_an_old_state_has_none(tmp_path):
    import pickle

    from flatlab.tracking.callback import MLflowTrialLogger

    cb = MLflowTrialLogger(
        "sqlite:///x.db",
        "1",
        "p",
        tags={},
        arm_optimizer={},
        metric="m",
        mode="max",
        study=STUDY,
        log=tmp_path / "s" / "flatlab.log",
    )
    back = pickle.loads(pickle.dumps(cb))
    assert back.study == STUDY and back.log == str(tmp_path / "s" / "flatlab.log")
    old = cb.__getstate__()
    del old["study"], old["log"]
    fresh = MLflowTrialLogger.__new__(MLflowTrialLogger)
    fresh.__setstate__(old)
    assert fresh.study is None and fresh._params({"arm": "sgd", "lr": 1}) == {"arm": "sgd", "lr": "1"}
    assert fresh.log is None


def test_trial_json_holds_the_resolved_config(tmp_path):
    from flatlab.tracking.artifacts import WorkerTracking, log_trial_artifacts
    from flatlab.train.resolved import resolve_spec

    uri, exp, parent, c = _store(tmp_path)
    c.create_run(exp, tags={runs.PARENT: parent, runs.TAG_TRIAL: "t9"})
    config = {"arm": "sgd", "seed": 2, "lr": 0.2}
    spec = trial_spec(STUDY, config)
    run_id = log_trial_artifacts(
        WorkerTracking(uri, exp, parent, log_models=False),
        "t9",
        torch.nn.Linear(1, 1),
        spec,
        {"val/accuracy": 0.5},
        resolved=resolve_spec(spec),
    )
    path = c.download_artifacts(run_id, "trial.json", str(tmp_path))
    info = json.loads(open(path).read())
    assert info["spec"]["optimizer_params"] == {"lr": 0.2}  # what the study set
    assert info["resolved"] == json.loads(json.dumps(resolved_config(STUDY, config)))
    assert info["resolved"]["trainer"]["batch_size"] == 64 and info["resolved"]["optimizer"]["momentum"] == 0.9


def test_experiments_are_marked_as_training_experiments_new_and_existing(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = runs.client(uri)
    old = c.create_experiment("made_before")  # as an older flatlab made it: no kind
    assert runs.TAG_EXPERIMENT_KIND not in c.get_experiment(old).tags
    assert runs.get_or_create_experiment(uri, "made_before") == old
    assert c.get_experiment(old).tags[runs.TAG_EXPERIMENT_KIND] == "custom_model_development"
    new = runs.get_or_create_experiment(uri, "made_now", (tmp_path / "art").as_uri())
    assert c.get_experiment(new).tags["mlflow.experimentKind"] == "custom_model_development"


def test_environment_tags_and_installed_packages():
    import mlflow
    import ray

    from flatlab.tracking.environment import environment_tags, installed_packages

    tags = environment_tags()
    assert tags["flatlab.env.cuda"] == (torch.version.cuda or "none")
    assert tags["flatlab.env.ray"] == ray.__version__ and tags["flatlab.env.mlflow"] == mlflow.__version__
    assert tags["flatlab.env.torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert set(tags) == {f"flatlab.env.{k}" for k in ("python", "platform", "torch", "cuda", "ray", "optuna", "mlflow")}
    lines = installed_packages().splitlines()
    assert f"mlflow=={mlflow.__version__}" in lines and f"ray=={ray.__version__}" in lines
    assert lines == sorted(lines, key=lambda s: s.split("==")[0].lower())


def test_flatlab_clients_turn_off_mlflows_view_run_lines(monkeypatch, tmp_path):
    from mlflow.environment_variables import MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT

    monkeypatch.delenv(runs.SUPPRESS_URL_ENV, raising=False)
    runs.client(f"sqlite:///{tmp_path / 'm.db'}")
    assert os.environ[runs.SUPPRESS_URL_ENV] == "true" and MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.get() is True
    monkeypatch.setenv(runs.SUPPRESS_URL_ENV, "false")  # a user who wants them keeps them
    runs.client(f"sqlite:///{tmp_path / 'm.db'}")
    assert MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.get() is False
