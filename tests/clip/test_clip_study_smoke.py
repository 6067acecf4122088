"""End to end: ``flatlab run studies/rft_clip.py --scale smoke`` (fine-tune study, then the alpha study
that finds its checkpoints in MLflow) through Ray Tune on local Ray (2 CPUs), then
the report ``flatlab run`` builds after the alpha study (and ``flatlab interpolation-report`` again); checked
in MLflow. Offline: tiny random-weight model, generated images."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flatlab.tracking.logged_model import run_model_id

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STUDY_FILE = Path(__file__).resolve().parents[2] / "studies" / "rft_clip.py"
FT, ALPHA = "rft_clip_smoke_finetune", "rft_clip_smoke_alpha"


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    import ray

    from flatlab.cli.main import app

    root = tmp_path_factory.mktemp("root")
    mp = pytest.MonkeyPatch()
    mp.setenv("FLATLAB_CACHE", str(tmp_path_factory.mktemp("cache")))  # generated images, downloaded checkpoints
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    ray.shutdown()  # a fresh local Ray inherits this environment
    cli = CliRunner()
    try:
        run = cli.invoke(app, ["run", str(STUDY_FILE), "--scale", "smoke", "--root", str(root), "--num-cpus", "2"])
        (root / "after_run.txt").write_text(run.output + "\n" + _report_listing(root))  # before the command re-logs it
        report = cli.invoke(app, ["interpolation-report", ALPHA, "--root", str(root)])
    finally:
        ray.shutdown()
        mp.undo()
    assert run.exit_code == 0, run.output + repr(run.exception)
    assert report.exit_code == 0, report.output + repr(report.exception)
    return root


def _report_listing(root):
    """Names of the files under report/ on the alpha study's launch run, one per line."""
    from flatlab.tracking import runs
    from flatlab.tracking.trials import parent_runs

    uri = f"sqlite:///{(root / 'mlflow.db').resolve()}"
    parents = parent_runs(uri, ALPHA)
    if not parents:
        return ""
    return "\n".join(Path(a.path).name for a in runs.client(uri).list_artifacts(parents[0].info.run_id, "report"))


def _children(client, uri, study):
    from flatlab.tracking import runs
    from flatlab.tracking.trials import parent_runs

    parent = parent_runs(uri, study)[0]
    kids = client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`{runs.PARENT}` = '{parent.info.run_id}'"
    )
    return parent, kids


def test_finetune_study_logs_the_grid_with_models(smoke):
    from flatlab.tracking import runs

    uri = f"sqlite:///{(smoke / 'mlflow.db').resolve()}"
    c = runs.client(uri)
    parent, kids = _children(c, uri, FT)
    assert parent.info.status == "FINISHED" and len(kids) == 6  # 2 lr x 3 augmentations at smoke scale
    assert {(k.data.params["lr"], k.data.params["augment"]) for k in kids} == {
        (lr, aug) for lr in ("0.001", "0.01") for aug in ("none", "flip-crop", "randaug")
    }
    for k in kids:
        assert k.info.status == "FINISHED"
        assert {"val/accuracy", "ood/accuracy", "ood/loss", "train/loss"} <= set(k.data.metrics)
        assert run_model_id(c, k.info.run_id)  # the fine-tuned model: a logged model (safetensors inside)


def test_alpha_study_metrics_per_alpha(smoke):
    from flatlab.tracking import runs

    uri = f"sqlite:///{(smoke / 'mlflow.db').resolve()}"
    c = runs.client(uri)
    _, ft_kids = _children(c, uri, FT)
    parent, kids = _children(c, uri, ALPHA)
    assert parent.info.status == "FINISHED" and len(kids) == 36  # 6 models x 3 alphas x {unpruned, pruned}
    assert all(k.info.status == "FINISHED" for k in kids)
    by = {(k.data.params["finetuned"], float(k.data.params["alpha"]), k.data.tags[runs.TAG_ARM]): k for k in kids}
    assert {a for _, a, _ in by} == {0.0, 0.5, 1.0}
    for (_ref, alpha, arm), k in by.items():
        m = k.data.metrics
        assert {"interp/alpha", "val/loss", "val/accuracy", "ood/loss", "ood/accuracy"} <= set(m)
        assert m["interp/alpha"] == alpha
        if arm == "unpruned":
            assert {
                "flat/avg_sharpness",
                "flat/layer_sharpness/visual.transformer.resblocks.0",  # §3.1's definition
                "flat/layer_sharpness/head",
                "layer_interp/ood/accuracy/head",  # Fig. 2: one group interpolated at a time
                "layer_interp/val/accuracy/visual.transformer.resblocks.0",
            } <= set(m)
        else:
            assert "prune/n_stragglers" in m and "flat/avg_sharpness" not in m
        assert "model" not in {a.path for a in c.list_artifacts(k.info.run_id)}  # evaluation-only: no weights
    # alpha = 0 is the zero-shot model for every fine-tuned model, pruned or not
    zero = {round(k.data.metrics["ood/loss"], 6) for (_, a, _), k in by.items() if a == 0.0}
    assert len(zero) == 1
    # each reference was resolved at launch to its trial's run; alpha = 1 (unpruned) is exactly the
    # fine-tuned model of that run, fetched from MLflow
    sources = {
        v: parent.data.params[k + ".source"]
        for k, v in parent.data.params.items()
        if k.startswith("unpruned.finetuned.") and not k.endswith(".source")
    }
    for ft in ft_kids:
        ref = f"mlflow:{FT}/adamw?lr={ft.data.params['lr']}&augment={ft.data.params['augment']}"
        assert sources[f"run:{ft.info.run_id}"] == ref
        assert by[(f"run:{ft.info.run_id}", 1.0, "unpruned")].data.metrics["ood/loss"] == pytest.approx(
            ft.data.metrics["ood/loss"], rel=1e-5
        )


def test_report_artifacts_on_the_alpha_launch(smoke):
    from flatlab.tracking import runs

    uri = f"sqlite:///{(smoke / 'mlflow.db').resolve()}"
    c = runs.client(uri)
    parent, _ = _children(c, uri, ALPHA)
    names = {Path(a.path).name for a in c.list_artifacts(parent.info.run_id, "report")}
    assert {"fig1_ood_vs_alpha.png", "fig3_sharpness_vs_alpha.png", "summary.json"} <= names
    assert "sharpness_correlation.md" in names  # Kendall's tau of sharpness against OOD accuracy
    assert sum(n.startswith("fig2_layerwise_interpolation_") for n in names) == 6
    assert sum(n.startswith("fig4_layerwise_") for n in names) == 6
    assert sum(n.startswith("fig5_pruned_vs_unpruned_") for n in names) == 6
    assert (smoke / ALPHA / "report" / "summary.json").is_file()


def test_flatlab_run_builds_the_report_after_the_alpha_study(smoke):
    text = (smoke / "after_run.txt").read_text()
    assert "report: 20 figures and summary.json" in text  # printed by flatlab run itself
    listed = set(text.splitlines())
    assert {"fig1_ood_vs_alpha.png", "fig3_sharpness_vs_alpha.png", "summary.json"} <= listed
