"""clip_finetune through the Trainer; clip_interpolate (trains=False) at alpha through its evaluation-only
trial, with sharpness, straggler pruning and fine-tuned checkpoints named by chained references, resolved
at launch and fetched from MLflow."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from flatlab.errors import ConfigError
from flatlab.interpolation import interpolate
from flatlab.study.validate import validate
from flatlab.train.evaluation import evaluate_trial
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload
from flatlab.workloads.base import Data, Split, Workload
from flatlab.workloads.clip_data import SubsetSplit
from flatlab.workloads.registry import WORKLOADS


def interp_spec(params, **kw):
    return TrialSpec(workload="clip_interpolate", optimizer="adamw", epochs=1, seed=0, workload_params={**params, **kw})


def interp_trial(params, data, **kw):
    """The evaluation-only trial of clip_interpolate (``.metrics``, ``.model``)."""
    return evaluate_trial(interp_spec(params, **kw), data)


@pytest.fixture(scope="module")
def eval_data(params):
    return build_workload("clip_interpolate", **params).load_data(0)


def test_registered_with_declared_metrics():
    assert {"clip_finetune", "clip_interpolate"} <= set(WORKLOADS.names())
    assert WORKLOADS.get("clip_interpolate").trains is False
    assert WORKLOADS.get("clip_interpolate").checkpoint_params == ("finetuned",)
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
    with pytest.raises(
        ConfigError, match=r"workload 'clip_interpolate' trains nothing \(trains = False\): run its trials with"
    ):
        Trainer(interp_spec(params, finetuned=str(finetuned["path"])), eval_data)
    zero_shot = finetuned["workload"].build_model()
    zs = {k: v.clone() for k, v in zero_shot.state_dict().items()}
    at0 = interp_trial(params, eval_data, finetuned=str(finetuned["path"]), alpha=0.0)
    m0 = at0.metrics
    assert m0["val/loss"] == pytest.approx(finetuned["workload"].evaluate(zero_shot, eval_data.val)["loss"], rel=1e-6)
    assert m0["interp/alpha"] == 0.0 and m0["epoch"] == 1 and "train/loss" not in m0 and m0["time/epoch_s"] > 0
    assert all(torch.equal(at0.model.state_dict()[k], zs[k]) for k in zs)  # alpha = 0: the zero-shot weights
    at1 = interp_trial(params, eval_data, finetuned=str(finetuned["path"]), alpha=1.0).metrics
    assert at1["val/loss"] == pytest.approx(finetuned["metrics"]["val/loss"], rel=1e-6)
    assert at1["ood/accuracy"] == pytest.approx(finetuned["metrics"]["ood/accuracy"])
    half = interp_trial(params, eval_data, finetuned=str(finetuned["path"]), alpha=0.5)
    expected = interpolate(zs, ft_model.state_dict(), 0.5)
    assert all(torch.allclose(half.model.state_dict()[k], expected[k]) for k in expected)


def test_general_sharpness_is_adaptive_average_sharpness_on_the_seeded_ood_subset(finetuned, params, eval_data):
    # The workload goes through the measures registry (avg_sharpness); pin its value to a direct call of the
    # estimator on the subset chosen by hand: 4 of the 6 OOD rows, permutation seeded by sharpness_seed, sorted.
    from flatlab.sharpness import EvalSubset, average_sharpness
    from flatlab.workloads.clip import SubsetCrossEntropy

    kw = dict(
        finetuned=str(finetuned["path"]),
        alpha=1.0,
        sharpness_draws=3,
        sharpness_examples=4,
        sharpness_seed=2,
        sharpness_rho=0.5,
        sharpness_layerwise=False,
    )
    trial = interp_trial(params, eval_data, **kw)
    m = trial.metrics
    ood = eval_data.extra["ood"]
    idx = torch.randperm(len(ood), generator=torch.Generator().manual_seed(2))[:4].sort().values
    direct = average_sharpness(
        trial.model,
        EvalSubset(((ood.inputs[idx], ood.targets[idx]),)),
        rho=0.5,
        n_draws=3,
        seed=2,
        loss_fn=SubsetCrossEntropy(ood.classes),
    )
    assert m["flat/avg_sharpness"] == pytest.approx(direct.value, rel=1e-6, abs=1e-9)
    assert m["flat/avg_sharpness_stderr"] == pytest.approx(direct.stderr, rel=1e-6, abs=1e-9)
    assert m["flat/avg_sharpness_clean"] == pytest.approx(direct.clean_loss, rel=1e-6)
    assert not any(k.startswith("flat/layer_sharpness") for k in m)


def test_sharpness_and_straggler_pruning(finetuned, params, eval_data):
    from flatlab.sharpness import group_parameters

    kw = dict(finetuned=str(finetuned["path"]), alpha=1.0, sharpness_draws=3, straggler_draws=2)
    plain = interp_trial(params, eval_data, **kw).metrics
    again = interp_trial(params, eval_data, **kw).metrics
    groups = group_parameters(finetuned["trainer"].model, "clip")
    assert plain["flat/avg_sharpness"] == again["flat/avg_sharpness"]  # same subset, same noise seed
    assert {f"flat/layer_sharpness/{g}" for g in groups} <= set(plain)  # §3.1's definition by default
    assert "prune/n_stragglers" not in plain
    kw["sharpness_draws"] = 0
    none = interp_trial(params, eval_data, **kw, prune=True, straggler_threshold=-1e9).metrics
    assert none["prune/n_stragglers"] == 0 and none["ood/loss"] == pytest.approx(plain["ood/loss"], rel=1e-6)
    assert {f"prune/layer_sharpness/{g}" for g in groups} <= set(none)
    everything = interp_trial(params, eval_data, **kw, prune=True, straggler_threshold=1e9)
    m = everything.metrics
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
    from flatlab.interpolation.report import label_of
    from flatlab.interpolation.workload import producing_trial
    from flatlab.study.chain import resolve_reference
    from flatlab.tracking.checkpoints import fetch_run, local_params

    uri, ids = store
    monkeypatch.setenv("FLATLAB_CACHE", str(tmp_path / "cache"))
    run = resolve_reference("mlflow:ft_study/adamw?lr=1e-3&augment=none", uri)  # 1e-3 matches the logged '0.001'
    assert run == f"run:{ids[(0.001, 'none', 0)]}"
    path = fetch_run(uri, ids[(0.001, "none", 0)])
    assert (
        path == tmp_path / "cache" / "checkpoints" / ids[(0.001, "none", 0)] / "model" / "model.safetensors"
        and path.is_file()
    )
    assert producing_trial(path)["spec"]["workload"] == "clip_finetune"  # trial.json beside model/
    assert (
        resolve_reference("mlflow:ft_study/adamw?lr=0.01&augment=randaug&seed=1", uri)
        == f"run:{ids[(0.01, 'randaug', 1)]}"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the default, as on flatlab's Ray workers
    other = ids[(0.01, "none", 0)]
    got = local_params({"finetuned": f"run:{other}", "alpha": 0.5}, ("finetuned",))
    assert got == {
        "finetuned": str(tmp_path / "cache" / "checkpoints" / other / "model" / "model.safetensors"),
        "alpha": 0.5,
    }
    with pytest.raises(
        ConfigError, match=r"2 trials of study 'ft_study', arm 'adamw' match lr=0.01&augment=randaug; add a param"
    ):
        resolve_reference("mlflow:ft_study/adamw?lr=0.01&augment=randaug", uri)
    with pytest.raises(
        ConfigError, match=r"no FINISHED trial .* has lr=0.1; finished trials of that arm: .*augment=none"
    ):
        resolve_reference("mlflow:ft_study/adamw?lr=0.1", uri)
    with pytest.raises(ConfigError, match=r"no study 'other' in"):
        resolve_reference("mlflow:other/adamw", uri)
    with pytest.raises(ConfigError, match=r"expected mlflow:<study>/<arm>"):
        resolve_reference("mlflow:ft_study", uri)
    with pytest.raises(
        ConfigError,
        match=r"finetuned='mlflow:ft_study/adamw': an mlflow: reference is resolved when its study is launched",
    ):
        local_params({"finetuned": "mlflow:ft_study/adamw"}, ("finetuned",))
    assert label_of("mlflow:ft_study/adamw?lr=0.01&augment=none") == "lr=0.01, augment=none"


def alpha_study(params, refs, **kw):
    from flatlab import Arm, Study
    from flatlab import space as sp

    return Study(
        name="alpha",
        workload="clip_interpolate",
        workload_params={**params, **kw},
        arms=(Arm("adamw", space={"finetuned": sp.grid(refs), "alpha": 1.0}),),
        metric="ood/accuracy",
        searcher="grid",
        scheduler="fifo",
        max_epochs=1,
    )


def test_interpolation_trial_with_an_mlflow_reference(store, params, eval_data, finetuned, tmp_path, monkeypatch):
    """The reference is resolved at launch (the study's grid then holds the run), the trial fetches the run's
    model before it builds the workload, and the workload reads a local file."""
    from flatlab.study.chain import chained_params, resolve_chained
    from flatlab.study.trial_loop import evaluation_trial

    uri, ids = store
    monkeypatch.setenv("FLATLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    ref = "mlflow:ft_study/adamw?lr=0.001&augment=none"
    study = resolve_chained(validate(alpha_study(params, [ref])), uri)
    run = f"run:{ids[(0.001, 'none', 0)]}"
    assert study.arm("adamw").dims["finetuned"].values == (run,)
    assert chained_params(study) == {"adamw.finetuned.0": run, "adamw.finetuned.0.source": ref}
    reports = []
    evaluation_trial(
        {"arm": "adamw", "seed": 0, "finetuned": run, "alpha": 1.0},
        study,
        eval_data,
        lambda metrics, checkpoint: reports.append((metrics, checkpoint)),
    )
    ((m, checkpoint),) = reports
    assert checkpoint is None and m["completed"] == 1 and m["diverged"] == 0 and m["epoch"] == 1
    assert m["val/loss"] == pytest.approx(finetuned["metrics"]["val/loss"], rel=1e-6)
    other = resolve_chained(
        alpha_study(params, [ref], init_seed=3), uri
    )  # another zero-shot model than the one fine-tuned
    with pytest.raises(ConfigError, match=r"started from another zero-shot model.*init_seed: fine-tuned=0, here=3"):
        evaluation_trial(
            {"arm": "adamw", "seed": 0, "finetuned": run, "alpha": 1.0}, other, eval_data, lambda m, c: None
        )


def test_references_are_resolved_at_launch_with_every_problem_in_one_error(store, params):
    from flatlab import Arm, Study
    from flatlab.study.chain import chained_params, describe_chained, resolve_chained
    from flatlab.study.space import Fixed, Resolved

    uri, ids = store
    ref, run = "mlflow:ft_study/adamw?lr=0.001&augment=none", f"run:{ids[(0.001, 'none', 0)]}"
    bad = alpha_study(params, [ref, "mlflow:ft_study/adamw?lr=0.1", "mlflow:alpha/adamw", "mlflow:ft_study"])
    with pytest.raises(ConfigError) as err:
        resolve_chained(bad, uri)
    lines = str(err.value).splitlines()
    assert lines[0] == "chained values cannot be resolved (nothing was started):" and len(lines) == 4
    assert lines[1].startswith(
        "  study 'alpha', arm 'adamw', field 'finetuned': no FINISHED trial of study 'ft_study', "
        "arm 'adamw' (latest finished launch) has lr=0.1"
    )
    assert lines[2] == (
        "  study 'alpha', arm 'adamw', field 'finetuned': 'mlflow:alpha/adamw' names this study itself; "
        "chain to an earlier study"
    )
    assert lines[3] == (
        "  study 'alpha', arm 'adamw', field 'finetuned': 'mlflow:ft_study': expected "
        "mlflow:<study>/<arm>[?param=value&...]"
    )
    with pytest.raises(ConfigError, match=r"field 'finetuned': two references of grid\(.*\) name the same trial run"):
        resolve_chained(alpha_study(params, [ref, "mlflow:ft_study/adamw?lr=1e-3&augment=none"]), uri)
    constant = Study(
        name="alpha",
        workload="clip_interpolate",
        workload_params={**params, "finetuned": ref},
        arms=(Arm("adamw", space={"alpha": 1.0}), Arm("adamw", name="fixed", space={"finetuned": ref})),
        searcher="grid",
        scheduler="fifo",
        max_epochs=1,
    )
    resolved = resolve_chained(constant, uri)
    assert resolved.workload_params["finetuned"] == run  # study-wide, too
    assert resolved.arm("fixed").dims["finetuned"] == Resolved(run, source=ref)
    assert resolved.arm("fixed").dims["finetuned.source"] == Fixed(ref)
    assert chained_params(resolved) == {"fixed.finetuned": run, "fixed.finetuned.source": ref}
    assert describe_chained(constant, uri) == [
        f"chained: workload_params, finetuned = {ref}, resolved at launch; now {run}",
        f"chained: arm 'fixed', finetuned = {ref}, resolved at launch; now {run}",
    ]


def test_parameter_errors(params, eval_data, monkeypatch):
    from flatlab.tracking.checkpoints import local_params

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(
        ConfigError, match=r"augment='mixup' is not allowed; expected one of 'none', 'flip-crop', 'randaug'"
    ):
        build_workload("clip_finetune", augment="mixup")
    with pytest.raises(ConfigError, match=r"alpha=1.5 is not allowed; expected float in \[0, 1\]"):
        build_workload("clip_interpolate", alpha=1.5)
    with pytest.raises(ConfigError, match=r"classnames='a,b' gives 2 names for the ID set's 3 labels"):
        build_workload("clip_finetune", **{**params, "classnames": "a,b"}).build_model()
    with pytest.raises(
        ConfigError, match=r"finetuned is empty; give a checkpoint file, or in a study run:<run_id> or mlflow:"
    ):
        interp_trial(params, eval_data)
    with pytest.raises(ConfigError, match=r"finetuned='run:abc': a run: reference needs a tracking URI"):
        local_params({"finetuned": "run:abc"}, ("finetuned",))
    with pytest.raises(
        ConfigError, match=r"finetuned='run:abc' is not a file \(run: and mlflow: references are fetched"
    ):
        interp_trial(params, eval_data, finetuned="run:abc")
    with pytest.raises(ConfigError, match=r"ood_classes with explicit indices needs a single OOD set"):
        build_workload(
            "clip_interpolate",
            **{**params, "ood_data": f"{params['ood_data']};b={params['ood_data']}", "ood_classes": "0,2"},
        ).load_data(0)


def test_without_ood_set(params, finetuned):
    wp = {**params, "ood_data": ""}
    data = build_workload("clip_interpolate", **wp).load_data(0)
    assert data.extra == {}
    m = interp_trial(wp, data, finetuned=str(finetuned["path"]), alpha=1.0).metrics
    assert "val/accuracy" in m and not any(k.startswith("ood") for k in m)
    with pytest.raises(ConfigError, match=r"sharpness and straggler pruning run on the OOD set; set ood_data"):
        interp_trial(wp, data, finetuned=str(finetuned["path"]), sharpness_draws=2)


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
        evaluate_trial(TrialSpec(workload="no_eval", optimizer="sgd", epochs=1), wl.load_data(0), workload=wl)
    with pytest.raises(ConfigError, match=r"workload 'no_eval' trains nothing"):
        Trainer(TrialSpec(workload="no_eval", optimizer="sgd", epochs=1), wl.load_data(0), workload=wl)
    digits = build_workload("digits", model="mlp", width=4, depth=1)
    with pytest.raises(
        ConfigError, match=r"workload 'digits' trains; an evaluation-only trial is for workloads with trains = False"
    ):
        evaluate_trial(TrialSpec(workload="digits", optimizer="sgd", epochs=1), digits.load_data(0), workload=digits)


def test_layer_sharpness_is_the_papers_by_default_and_the_interpolated_models_on_request(finetuned, params, eval_data):
    from flatlab.interpolation import finetuned_layer_sharpness
    from flatlab.sharpness import EvalSubset, group_parameters, layerwise_sharpness
    from flatlab.workloads.clip import SubsetCrossEntropy

    kw = dict(finetuned=str(finetuned["path"]), alpha=0.5, sharpness_draws=2, sharpness_examples=0, sharpness_seed=1)
    paper = interp_trial(params, eval_data, **kw)
    other = interp_trial(params, eval_data, **kw, layer_sharpness="interpolated").metrics
    ood = eval_data.extra["ood"]
    subset, loss_fn = EvalSubset(((ood.inputs, ood.targets),)), SubsetCrossEntropy(ood.classes)
    zs = finetuned["workload"].build_model().state_dict()
    ft = finetuned["trainer"].model.state_dict()
    groups = group_parameters(paper.model, "clip")
    kw = dict(rho=1.0, n_draws=2, seed=1, loss_fn=loss_fn)
    direct = finetuned_layer_sharpness(paper.model, zs, ft, 0.5, subset, groups, **kw)
    at_alpha = layerwise_sharpness(paper.model, subset, "clip", **kw)  # paper.model holds theta_alpha
    for g in groups:
        assert paper.metrics[f"flat/layer_sharpness/{g}"] == pytest.approx(direct[g].value, rel=1e-5, abs=1e-9)
        assert other[f"flat/layer_sharpness_interpolated/{g}"] == pytest.approx(at_alpha[g].value, rel=1e-5, abs=1e-9)
    assert not any(k.startswith("flat/layer_sharpness_interpolated/") for k in paper.metrics)
    with pytest.raises(ConfigError, match=r"layer_sharpness"):
        build_workload("clip_interpolate", **params, layer_sharpness="theta")


def test_layerwise_interpolation_evaluates_one_group_interpolated_at_a_time(finetuned, params, eval_data):
    from flatlab.interpolation import interpolate_keys
    from flatlab.sharpness import group_parameters

    wl = finetuned["workload"]
    zs = wl.build_model().state_dict()
    ft = finetuned["trainer"].model.state_dict()
    kw = dict(finetuned=str(finetuned["path"]), alpha=0.75)
    trial = interp_trial(params, eval_data, **kw, layerwise_interpolation="visual.transformer.resblocks.1, head")
    m = trial.metrics
    assert sorted(k for k in m if k.startswith("layer_interp/ood/accuracy/")) == [
        "layer_interp/ood/accuracy/head",
        "layer_interp/ood/accuracy/visual.transformer.resblocks.1",
    ]
    groups = group_parameters(trial.model, "clip")
    probe = wl.build_model()
    probe.load_state_dict(interpolate_keys(zs, ft, 0.75, groups["head"]))  # by hand: only the head moves
    for split, data in (("val", eval_data.val), ("ood", eval_data.extra["ood"])):
        want = wl.evaluate(probe, data)
        assert m[f"layer_interp/{split}/loss/head"] == pytest.approx(want["loss"], rel=1e-6)
        assert m[f"layer_interp/{split}/accuracy/head"] == pytest.approx(want["accuracy"])
    expected = interpolate(zs, ft, 0.75)  # the trial's model is theta_alpha again afterwards
    assert all(torch.allclose(trial.model.state_dict()[k], expected[k]) for k in expected)
    every = interp_trial(params, eval_data, **kw, layerwise_interpolation="all").metrics
    assert {f"layer_interp/val/loss/{g}" for g in groups} <= set(every)
    with pytest.raises(ConfigError, match=r"layerwise_interpolation names 'block9', not a layer group of this model"):
        interp_trial(params, eval_data, **kw, layerwise_interpolation="block9")
