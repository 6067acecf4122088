"""A trial's final model as an MLflow logged model: its flavours, its reload through MLflow's own API (same
outputs as the trained model, no pickle anywhere), its metrics and the weights download."""

from pathlib import Path

import numpy as np
import pytest
import torch

from flatlab import models
from flatlab.tracking import logged_model as lm
from flatlab.tracking import runs


class Spec:
    workload = "digits"
    workload_params = {"model": "mlp", "width": 16}


@pytest.fixture
def logged(tmp_path):
    from flatlab.workloads.registry import build_workload

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "models", (tmp_path / "art").as_uri())
    c = runs.client(uri)
    run = c.create_run(
        exp,
        run_name="sam · a1b2c3d4",
        tags={runs.TAG_ARM: "sam", runs.TAG_TRIAL: "a1b2c3d4", runs.TAG_STAGE: "search", "flatlab.env.python": "3"},
    ).info.run_id
    c.log_param(run, "lr", "0.1")
    torch.manual_seed(0)
    model = build_workload("digits", model="mlp", width=16).build_model()
    with torch.no_grad():  # not the initialisation: the weights must travel, not the seed
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    model_id = lm.log_trial_model(c, run, "sam-a1b2c3d4", model, Spec, step=7)
    return uri, c, exp, run, model, model_id


def test_the_model_loads_through_mlflow_with_the_trained_outputs(logged):
    import mlflow

    uri, c, exp, run, model, model_id = logged
    mlflow.set_tracking_uri(uri)
    try:
        loaded = mlflow.pyfunc.load_model(f"models:/{model_id}")
        x = np.random.default_rng(0).random((5, 64), dtype=np.float32)
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        np.testing.assert_array_equal(loaded.predict(x), expected)
        np.testing.assert_array_equal(loaded.predict(x.astype(np.float64)), expected)  # cast to the network's dtype
        net = loaded.get_raw_model()
        assert isinstance(net, torch.nn.Module) and not net.training
        for (k, a), (_, b) in zip(net.state_dict().items(), model.state_dict().items()):
            assert torch.equal(a, b), k
        assert torch.equal(
            models.load_torch_model(f"models:/{model_id}")(torch.from_numpy(x)).detach(), torch.from_numpy(expected)
        )
    finally:
        mlflow.set_tracking_uri(None)


def test_flavours_and_stored_files_hold_no_pickle_and_no_code(logged):
    import yaml

    uri, c, exp, run, model, model_id = logged
    info = c.get_logged_model(model_id)
    assert (info.name, info.source_run_id, info.model_type, str(info.status)) == (
        "sam-a1b2c3d4",
        run,
        "flatlab",
        "READY",
    )
    folder = Path(info.artifact_location.replace("file://", ""))
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert "data/flatlab/model.safetensors" in files and "data/flatlab/model.json" in files
    assert not [f for f in files if f.endswith((".pkl", ".pickle", ".py", ".pt", ".pth", ".cloudpickle"))], files
    mlmodel = yaml.safe_load((folder / "MLmodel").read_text())
    pyfunc = mlmodel["flavors"]["python_function"]
    assert pyfunc["loader_module"] == "flatlab.models" and pyfunc["data"] == "data/flatlab"
    assert "python_model" not in pyfunc and pyfunc.get("code") is None
    assert mlmodel["flavors"]["flatlab"]["weights"] == "data/flatlab/model.safetensors"
    assert mlmodel["flavors"]["flatlab"]["workload"] == "digits"
    assert any(r.startswith("flatlab==") for r in (folder / "requirements.txt").read_text().split())


def test_the_model_carries_the_runs_params_identity_and_final_metrics(logged):
    uri, c, exp, run, model, model_id = logged
    info = c.get_logged_model(model_id)
    assert info.params == {"lr": "0.1"}
    assert info.tags[runs.TAG_ARM] == "sam" and info.tags[runs.TAG_TRIAL] == "a1b2c3d4"
    assert "flatlab.env.python" not in info.tags  # identity tags only
    assert [o.model_id for o in c.get_run(run).outputs.model_outputs] == [model_id]
    assert [o.step for o in c.get_run(run).outputs.model_outputs] == [7]
    assert lm.run_model_id(c, run) == model_id
    # the worker logs no metric: the driver's copy of the final report, linked to the model, is the only one
    assert info.metrics in (None, []) and c.get_run(run).data.metrics == {}
    from mlflow.entities import Metric

    c.log_batch(run, metrics=[Metric("val/accuracy", 0.9, 1_700_000_000_000, 7, model_id=model_id)])
    assert {m.key: (m.value, m.step) for m in c.get_logged_model(model_id).metrics} == {"val/accuracy": (0.9, 7)}


def test_weights_download_from_the_model_and_from_runs_logged_before(logged, tmp_path):
    from safetensors.torch import load_file, save_file

    uri, c, exp, run, model, model_id = logged
    got = load_file(lm.download_weights(c, run, str(tmp_path / "a")))
    assert all(torch.equal(got[k], v) for k, v in model.state_dict().items())
    old = c.create_run(exp).info.run_id  # a run with the pre-logged-model artifact only
    (tmp_path / "model").mkdir()
    save_file({"w": torch.ones(2)}, str(tmp_path / "model" / "model.safetensors"))
    c.log_artifacts(old, str(tmp_path / "model"), "model")
    assert lm.run_model_id(c, old) is None
    assert torch.equal(load_file(lm.download_weights(c, old, str(tmp_path / "b")))["w"], torch.ones(2))


def test_a_folder_that_is_not_a_flatlab_model_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a flatlab model: .* holds no model.json"):
        models._load_pyfunc(str(tmp_path))
