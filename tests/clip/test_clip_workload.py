"""clip_finetune through the Trainer; clip_interpolate (trains=False) at alpha, with sharpness, straggler
pruning and fine-tuned checkpoints found in MLflow."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from flatlab.errors import ConfigError
from flatlab.interpolation import interpolate
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload
from flatlab.workloads.base import Data, Split, Workload
from flatlab.workloads.clip_data import SubsetSplit
from flatlab.workloads.registry import WORKLOADS


def interp_trainer(params, data, **kw):
    wp = {**params, **kw}
    spec = TrialSpec(workload="clip_interpolate", optimizer="adamw", epochs=1, seed=0, workload_params=wp)
    return Trainer(spec, data)


@pytest.fixture(scope="module")
def eval_data(params):
    return build_workload("clip_interpolate", **params).load_data(0)


def test_registered_with_declared_metrics():
    assert {"clip_finetune", "clip_interpolate"} <= set(WORKLOADS.names())
    assert WORKLOADS.get("clip_interpolate").trains is False
    assert not hasattr(WORKLOADS.get("clip_finetune"), "trains") or WORKLOADS.get("clip_finetune").trains
    for name in ("clip_finetune", "clip_interpolate"):
        assert {"ood/accuracy", "ood/loss", "val/accuracy"} <= set(WORKLOADS.get(name).metrics)


def test_one_finetuning_epoch(finetuned):
    data, m, model = finetuned["data"], finetuned["metrics"], finetuned["trainer"].model
    assert (len(data.train), len(data.val), len(data.extra["ood"])) == (12, 6, 6)
    assert isinstance(data.extra["ood"], SubsetSplit) and data.extra["ood"].classes.tolist() == [0, 2]
    for k in ("train/loss", "train/accuracy", "val/loss", "val/accuracy", "ood/loss", "ood/accuracy", "lr"):
        assert k in m and m[k] == m[k], k
    zero_shot = finetuned["workload"].build_model()
    assert not torch.equal(model.visual.conv1.weight, zero_shot.visual.conv1.weight)  # end to end
    assert not torch.equal(model.head, zero_shot.head)
    assert torch.equal(model.logit_scale, zero_shot.logit_scale)  # a buffer, not trained


def test_ood_subset_is_scored_on_its_logits(finetuned):
    wl, model, ood = finetuned["workload"], finetuned["trainer"].model, finetuned["data"].extra["ood"]
    with torch.no_grad():
        logits = model(ood.inputs)[:, [0, 2]]
    got = wl.evaluate(model, ood)
    assert got["loss"] == pytest.approx(float(F.cross_entropy(logits, ood.targets)), rel=1e-5)
    assert got["accuracy"] == pytest.approx(float((logits.argmax(1) == ood.targets).float().mean()))


def test_interpolation_trial_endpoints_and_no_training(finetuned, params, eval_data):
    ft_model = finetuned["trainer"].model
    at0 = interp_trainer(params, eval_data, finetuned=str(finetuned["path"]), alpha=0.0)
    assert at0.trains is False
    zs = {k: v.clone() for k, v in at0.model.state_dict().items()}
    m0 = at0.run_epoch()
    zero_shot = finetuned["workload"].build_model()
    assert m0["val/loss"] == pytest.approx(finetuned["workload"].evaluate(zero_shot, eval_data.val)["loss"], rel=1e-6)
    assert m0["interp/alpha"] == 0.0 and m0["epoch"] == 1 and "train/loss" not in m0
    at1 = interp_trainer(params, eval_data, finetuned=str(finetuned["path"]), alpha=1.0).run_epoch()
    assert at1["val/loss"] == pytest.approx(finetuned["metrics"]["val/loss"], rel=1e-6)
    assert at1["ood/accuracy"] == pytest.approx(finetuned["metrics"]["ood/accuracy"])
    half = interp_trainer(params, eval_data, finetuned=str(finetuned["path"]), alpha=0.5)
    half.run_epoch()
    expected = interpolate(zs, ft_model.state_dict(), 0.5)
    assert all(torch.allclose(half.model.state_dict()[k], expected[k]) for k in expected)
    assert len(half.optimizer.state) == 0  # no optimizer step was taken


def test_general_sharpness_is_adaptive_average_sharpness_on_the_seeded_ood_subset(finetuned, params, eval_data):
    # The workload goes through the measures registry (avg_sharpness); pin its value to a direct call of the
    # estimator on the subset chosen by hand: 4 of the 6 OOD rows, permutation seeded by sharpness_seed, sorted.
    from flatlab.sharpness import EvalSubset, average_sharpness
    from flatlab.workloads.clip import _SubsetCrossEntropy

    kw = dict(finetuned=str(finetuned["path"]), alpha=1.0, sharpness_draws=3, sharpness_examples=4, sharpness_seed=2,
              sharpness_rho=0.5, sharpness_layerwise=False)
    trainer = interp_trainer(params, eval_data, **kw)
    m = trainer.run_epoch()
    ood = eval_data.extra["ood"]
    idx = torch.randperm(len(ood), generator=torch.Generator().manual_seed(2))[:4].sort().values
    direct = average_sharpness(trainer.model, EvalSubset(((ood.inputs[idx], ood.targets[idx]),)), rho=0.5, n_draws=3,
                               seed=2, loss_fn=_SubsetCrossEntropy(ood.classes))
    assert m["sharpness/general"] == pytest.approx(direct.value, rel=1e-6, abs=1e-9)
    assert m["sharpness/general_stderr"] == pytest.approx(direct.stderr, rel=1e-6, abs=1e-9)
    assert m["sharpness/clean_loss"] == pytest.approx(direct.clean_loss, rel=1e-6)
    assert not any(k.startswith("sharpness/layer/") for k in m)


def test_sharpness_and_straggler_pruning(finetuned, params, eval_data):
    from flatlab.sharpness import group_parameters

    kw = dict(finetuned=str(finetuned["path"]), alpha=1.0, sharpness_draws=3, straggler_draws=2)
    plain = interp_trainer(params, eval_data, **kw).run_epoch()
    again = interp_trainer(params, eval_data, **kw).run_epoch()
    groups = group_parameters(finetuned["trainer"].model, "clip")
    assert plain["sharpness/general"] == again["sharpness/general"]  # same subset, same noise seed
    assert {f"sharpness/layer/{g}" for g in groups} <= set(plain)
    assert "prune/n_stragglers" not in plain
    kw["sharpness_draws"] = 0
    none = interp_trainer(params, eval_data, **kw, prune=True, straggler_threshold=-1e9).run_epoch()
    assert none["prune/n_stragglers"] == 0 and none["ood/loss"] == pytest.approx(plain["ood/loss"], rel=1e-6)
    assert {f"prune/layer_sharpness/{g}" for g in groups} <= set(none)
    everything = interp_trainer(params, eval_data, **kw, prune=True, straggler_threshold=1e9)
    m = everything.run_epoch()
    assert m["prune/n_stragglers"] == len(groups) and m["prune/straggler/visual.transformer.resblocks.1"] == 1.0
    w = everything.model.visual.transformer.resblocks[1].mlp.c_fc.weight  # alpha = 1: the pruned model itself
    assert 0.4 < float((w == 0).float().mean()) < 0.6  # Algorithm 1: a Bernoulli(0.5) half is zeroed


# ---- fine-tuned checkpoints found in MLflow -------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory, finetuned):
    """A SQLite MLflow store holding a fake fine-tune study: one launch, three FINISHED adamw trials."""
    from flatlab.tracking import runs

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "ft_study", runs.artifact_location(root))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    spec = {"workload": "clip_finetune", "workload_params": finetuned["params"]}
    trial_json = root / "trial.json"
    ids = {}
    for lr, aug, seed in ((0.001, "none", 0), (0.01, "none", 0), (0.01, "randaug", 0), (0.01, "randaug", 1)):
        run = c.create_run(exp, tags={runs.PARENT: parent, runs.TAG_ROLE: "trial", runs.TAG_ARM: "adamw"}).info.run_id
        for k, v in (("lr", lr), ("augment", aug), ("seed", seed), ("arm", "adamw")):
            c.log_param(run, k, str(v))
        c.log_artifact(run, str(finetuned["path"]), artifact_path="model")
        trial_json.write_text(json.dumps({"spec": spec, "final_metrics": {}}))
        c.log_artifact(run, str(trial_json))
        c.set_terminated(run, "FINISHED")
        ids[(lr, aug, seed)] = run
    c.set_terminated(parent, "FINISHED")
    return uri, ids


def test_mlflow_reference_finds_the_trial_by_study_arm_and_params(store, tmp_path, monkeypatch):
    from flatlab.workloads.clip_refs import label_of, resolve_checkpoint

    uri, ids = store
    monkeypatch.setenv("FLATLAB_CACHE", str(tmp_path / "cache"))
    ck = resolve_checkpoint("mlflow:ft_study/adamw?lr=1e-3&augment=none", uri)  # 1e-3 matches the logged '0.001'
    assert ck.run_id == ids[(0.001, "none", 0)]
    assert ck.path == tmp_path / "cache" / "checkpoints" / ck.run_id / "model" / "model.safetensors" and ck.path.is_file()
    assert ck.trial["spec"]["workload"] == "clip_finetune"
    assert resolve_checkpoint(f"run:{ids[(0.01, 'none', 0)]}", uri).run_id == ids[(0.01, "none", 0)]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the default, as on flatlab's Ray workers
    assert resolve_checkpoint("mlflow:ft_study/adamw?lr=0.01&augment=randaug&seed=1").run_id == ids[(0.01, "randaug", 1)]
    with pytest.raises(ConfigError, match=r"2 trials of study 'ft_study', arm 'adamw' match lr=0.01&augment=randaug; add a param"):
        resolve_checkpoint("mlflow:ft_study/adamw?lr=0.01&augment=randaug")
    with pytest.raises(ConfigError, match=r"no FINISHED trial .* has lr=0.1; finished trials of that arm: .*augment=none"):
        resolve_checkpoint("mlflow:ft_study/adamw?lr=0.1")
    with pytest.raises(ConfigError, match=r"no study 'other' in"):
        resolve_checkpoint("mlflow:other/adamw")
    with pytest.raises(ConfigError, match=r"expected mlflow:<study>/<arm>"):
        resolve_checkpoint("mlflow:ft_study")
    assert label_of("mlflow:ft_study/adamw?lr=0.01&augment=none") == "lr=0.01, augment=none"


def test_interpolation_trial_with_an_mlflow_reference(store, params, eval_data, finetuned, tmp_path, monkeypatch):
    uri, _ = store
    monkeypatch.setenv("FLATLAB_CACHE", str(tmp_path / "cache"))
    ref = "mlflow:ft_study/adamw?lr=0.001&augment=none"
    m = interp_trainer(params, eval_data, finetuned=ref, tracking_uri=uri, alpha=1.0).run_epoch()
    assert m["val/loss"] == pytest.approx(finetuned["metrics"]["val/loss"], rel=1e-6)
    other = {**params, "init_seed": 3}  # another zero-shot model than the one fine-tuned
    with pytest.raises(ConfigError, match=r"started from another zero-shot model.*init_seed: fine-tuned=0, here=3"):
        interp_trainer(other, eval_data, finetuned=ref, tracking_uri=uri).run_epoch()


def test_parameter_errors(params, eval_data, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ConfigError, match=r"augment='mixup' is not allowed; expected one of 'none', 'flip-crop', 'randaug'"):
        build_workload("clip_finetune", augment="mixup")
    with pytest.raises(ConfigError, match=r"alpha=1.5 is not allowed; expected float in \[0, 1\]"):
        build_workload("clip_interpolate", alpha=1.5)
    with pytest.raises(ConfigError, match=r"classnames='a,b' gives 2 names for the ID set's 3 labels"):
        build_workload("clip_finetune", **{**params, "classnames": "a,b"}).build_model()
    with pytest.raises(ConfigError, match=r"finetuned is empty; give mlflow:<study>/<arm>"):
        interp_trainer(params, eval_data).run_epoch()
    with pytest.raises(ConfigError, match=r"an mlflow:/run: reference needs a tracking URI"):
        interp_trainer(params, eval_data, finetuned="run:abc").run_epoch()
    with pytest.raises(ConfigError, match=r"ood_classes with explicit indices needs a single OOD set"):
        build_workload("clip_interpolate", **{**params, "ood_data": f"{params['ood_data']};b={params['ood_data']}",
                                              "ood_classes": "0,2"}).load_data(0)


def test_without_ood_set(params, finetuned):
    wp = {**params, "ood_data": ""}
    data = build_workload("clip_interpolate", **wp).load_data(0)
    assert data.extra == {}
    m = interp_trainer(wp, data, finetuned=str(finetuned["path"]), alpha=1.0).run_epoch()
    assert "val/accuracy" in m and not any(k.startswith("ood") for k in m)
    with pytest.raises(ConfigError, match=r"sharpness and straggler pruning run on the OOD set; set ood_data"):
        interp_trainer(wp, data, finetuned=str(finetuned["path"]), sharpness_draws=2).run_epoch()


class _NoEval(Workload):
    name = "no_eval"
    trains = False

    def load_data(self, seed):
        s = Split(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long))
        return Data(train=s, val=s)

    def build_model(self):
        return torch.nn.Linear(1, 2)


def test_trains_false_needs_evaluate_only():
    wl = _NoEval()
    with pytest.raises(ConfigError, match=r"workload 'no_eval' declares trains=False but has no evaluate_only"):
        Trainer(TrialSpec(workload="no_eval", optimizer="sgd", epochs=1), wl.load_data(0), workload=wl)
