"""The snippets of the README and docs/ run as written and do what they say."""

import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

from flatlab.study.validate import validate

REPO = Path(__file__).resolve().parents[1]


def _snippet(heading: str, doc: str = "README.md") -> str:
    text = (REPO / doc).read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_study_validates_as_written():
    """The README's study is a valid study file: it validates (workload, arms, fields, measures)."""
    namespace: dict = {}
    exec(compile(_snippet("## A study"), "README study", "exec"), namespace)
    study = validate(namespace["STUDY"], "README.md")
    assert [a.name for a in study.arms] == ["sgd", "sam", "sgd_ire"]
    assert study.workload == "fashion_mnist" and study.final_seeds == (1, 2, 3)


def test_optimizer_snippet_trains_with_sgd_ire():
    code = _snippet("## The optimizers outside a study", "docs/design.md")
    torch.manual_seed(0)
    out = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README snippet", "exec"), namespace)
    opt = namespace["opt"]
    assert type(opt).__name__ == "IRE" and opt.kappa == 2.0 and opt.mask_interval == 10
    assert float(namespace["loss"]) < 0.3  # digits, 200 steps of SGD-IRE from a cross-entropy of ~2.3
    assert opt.active and opt._flat_fraction == pytest.approx(0.8, abs=1e-3)  # ⌊0.8·p⌋ flat (+ ties)
    assert "opt/flat_fraction" in out.getvalue()


@pytest.mark.slow
@pytest.mark.integration
def test_python_api_snippet_runs_a_study_and_reads_it_back(tmp_path, monkeypatch):
    """docs/cli.md's notebook snippet as written: flatlab.run on a Study through local Ray, then
    flatlab.results with a filter and a sort, checked against a pandas computation on the full frame."""
    import ray

    import flatlab

    code = _snippet("## From Python (notebooks)", "docs/cli.md")
    monkeypatch.chdir(tmp_path)  # the snippet's root="flatlab-runs" is relative
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = io.StringIO()
    namespace: dict = {}
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README snippet", "exec"), namespace)
    finally:
        ray.shutdown()
    outcome, df = namespace["outcome"], namespace["df"]
    assert type(outcome).__name__ == "StudyOutcome" and outcome.study == "notebook_demo"
    assert outcome.num_trials == 4 and not outcome.interrupted
    assert (tmp_path / "flatlab-runs" / "mlflow.db").is_file()
    every = flatlab.results("notebook_demo", root=tmp_path / "flatlab-runs")
    assert len(every) == 4 and set(every["arm"]) == {"sgd", "adamw"}
    expected = every[every["outcome"] == "completed"].sort_values("val/accuracy", ascending=False, kind="stable")
    assert list(df["run_id"]) == list(expected["run_id"]) and len(df) >= 1
    assert (df["launch"] == outcome.parent_run_id).all() and (df["epochs"] == 3).all()
    printed = out.getvalue()
    assert "param.lr" in printed and f"{df['val/accuracy'].iloc[0]:.6f}"[:4] in printed


def test_logged_model_snippet_predicts_digits_with_the_best_model(tmp_path, monkeypatch):
    """docs/mlflow_ui.md's snippet as written, on a launch with three logged digits models: an untrained
    search trial, a trained search trial, and an untrained final-stage re-run with the highest
    val/accuracy. flatlab's rule picks the trained search trial (final-stage runs are not candidates),
    and its inputs are the ones the model was trained on (accuracy of a trained model, not chance)."""
    import mlflow
    from mlflow.entities import Metric, Param

    from flatlab.tracking import logged_model as lm
    from flatlab.tracking import runs
    from flatlab.workloads.registry import build_workload

    class Spec:
        workload = "digits"
        workload_params = {"model": "mlp", "width": 16}

    root = tmp_path / "flatlab-runs"
    root.mkdir()
    uri = f"sqlite:///{root / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "digits_flatness_demo", (root / "mlartifacts").as_uri())
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_batch(parent, params=[Param("metric", "val/accuracy"), Param("mode", "max")])
    workload = build_workload("digits", model="mlp", width=16)
    train = workload.load_data(seed=0).train
    torch.manual_seed(0)
    ids = {}
    for name, arm, stage, steps, acc in (
        ("sgd-a1", "sgd", "search", 0, 0.5),
        ("sam-trained", "sam", "search", 300, 0.95),
        ("sam-final-seed2", "sam", "final", 0, 0.99),
    ):
        model = workload.build_model()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(train.inputs), train.targets).backward()
            opt.step()
        tags = {
            runs.PARENT: parent,
            runs.TAG_ROLE: "trial",
            runs.TAG_ARM: arm,
            runs.TAG_SEED: "1",
            runs.TAG_OUTCOME: "completed",
            runs.TAG_STAGE: stage,
            runs.TAG_TRIAL: name,
        }
        run = c.create_run(exp, run_name=name, tags=tags).info.run_id
        c.log_batch(run, params=[Param("lr", "0.1")])
        ids[name] = lm.log_trial_model(c, run, name, model, Spec)
        c.log_batch(run, metrics=[Metric("val/accuracy", acc, 0, 0, model_id=ids[name]), Metric("epoch", 3, 0, 0)])
        c.set_terminated(run)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("FLATLAB_ROOT", raising=False)
    out = io.StringIO()
    namespace: dict = {}
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(_snippet("## Logged models", "docs/mlflow_ui.md"), "mlflow_ui snippet", "exec"), namespace)
    finally:
        mlflow.set_tracking_uri(None)
    assert namespace["best"].model_id == ids["sam-trained"] and namespace["logits"].shape == (1797, 10)
    accuracy = float(out.getvalue().split()[-1])
    assert out.getvalue().startswith("sam-trained accuracy on all 1,797 digits") and accuracy > 0.9
    assert isinstance(namespace["net"], torch.nn.Module)
