"""The alpha-study report: trials grouped into per-model curves, figures and summary numbers."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from flatlab.errors import ConfigError
from flatlab.interpolation.report import collect_curves, launch_sources, write_report

REF_A = "mlflow:ft/adamw?lr=0.001&augment=none"
REF_B = "mlflow:ft/adamw?lr=0.01&augment=randaug"
OOD_ACC = {REF_A: (0.5, 0.8, 0.6), REF_B: (0.5, 0.4, 0.3)}  # A gains 0.3 in the interior; B is a failure mode


def frame():
    rows = []
    for ref, accs in OOD_ACC.items():
        for prune in (False, True):
            for alpha, acc in zip((1.0, 0.0, 0.5), (accs[2], accs[0], accs[1])):  # unsorted on purpose
                row = {
                    "arm": "pruned" if prune else "unpruned",
                    "status": "FINISHED",
                    "param.finetuned": ref,
                    "param.prune": str(prune),
                    "interp/alpha": alpha,
                    "ood/accuracy": acc - (0.1 * prune * alpha),
                    "ood/loss": 1 - acc,
                    "val/accuracy": 0.9,
                    "val/loss": 0.2,
                }
                if not prune:
                    row.update(
                        {
                            "flat/avg_sharpness": 0.1 + alpha,
                            "flat/avg_sharpness_stderr": 0.01,
                            "flat/layer_sharpness/visual.transformer.resblocks.0": alpha,
                            "flat/layer_sharpness/head": 0.5,
                            "layer_interp/ood/accuracy/head": 0.5 + 0.1 * alpha,
                            "layer_interp/ood/loss/head": 0.5,
                            "layer_interp/val/accuracy/head": 0.9 - 0.1 * alpha,
                            "layer_interp/val/loss/head": 0.2,
                        }
                    )
                else:
                    row["prune/straggler/visual.ln_post"] = 1.0
                rows.append(row)
    rows.append({**rows[0], "status": "FAILED", "ood/accuracy": 0.0})  # ignored
    return pd.DataFrame(rows)


def test_curves_group_by_model_and_variant():
    curves = collect_curves(frame())
    assert [c.key for c in curves] == [REF_A, REF_B]
    a = curves[0]
    assert a.label == "lr=0.001, augment=none"
    assert a.unpruned.alphas == (0.0, 0.5, 1.0) and a.unpruned.accuracy["ood"] == OOD_ACC[REF_A]
    assert a.pruned.accuracy["ood"] == pytest.approx((0.5, 0.75, 0.5))
    assert [e.value for e in a.sharpness] == pytest.approx([0.1, 0.6, 1.1])
    assert a.layerwise["visual.transformer.resblocks.0"] == (0.0, 0.5, 1.0) and a.layer_definition == "finetuned"
    assert list(a.layer_interpolation) == ["head"]
    assert a.layer_interpolation["head"].accuracy == {"ood": (0.5, 0.55, 0.6), "val": (0.9, 0.85, 0.8)}
    assert a.stragglers == ("visual.ln_post",)
    assert a.unpruned.gain() == pytest.approx(0.3) and not a.unpruned.failure_mode()
    assert curves[1].unpruned.failure_mode()


def test_runs_resolved_at_launch_keep_the_labels_and_order_of_their_references():
    runs = {REF_A: "run:ffff0000", REF_B: "run:0000ffff"}  # the runs sort the other way round
    df = frame()
    df["param.finetuned"] = df["param.finetuned"].map(runs)
    launch = {
        "unpruned.finetuned.0": runs[REF_A],
        "unpruned.finetuned.0.source": REF_A,
        "unpruned.finetuned.1": runs[REF_B],
        "unpruned.finetuned.1.source": REF_B,
        "metric": "ood/accuracy",
    }
    assert launch_sources(launch) == {runs[REF_A]: REF_A, runs[REF_B]: REF_B}
    curves = collect_curves(df, sources=launch_sources(launch))
    assert [(c.key, c.label) for c in curves] == [
        (runs[REF_A], "lr=0.001, augment=none"),
        (runs[REF_B], "lr=0.01, augment=randaug"),
    ]
    assert [c.label for c in collect_curves(df)] == ["run 0000ffff", "run ffff0000"]  # without the launch's params


def test_report_files(tmp_path):
    figures, summary_path = write_report(collect_curves(frame()), tmp_path)
    names = sorted(p.name for p in figures)
    assert names == sorted(
        [
            "fig1_ood_vs_alpha.png",
            "fig2_layerwise_interpolation_0_lr_0.001_augment_none.png",
            "fig2_layerwise_interpolation_1_lr_0.01_augment_randaug.png",
            "fig3_sharpness_vs_alpha.png",
            "fig4_layerwise_0_lr_0.001_augment_none.png",
            "fig4_layerwise_1_lr_0.01_augment_randaug.png",
            "fig5_pruned_vs_unpruned_0_lr_0.001_augment_none.png",
            "fig5_pruned_vs_unpruned_1_lr_0.01_augment_randaug.png",
        ]
    )
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in figures)
    summary = json.loads(summary_path.read_text())
    first = summary["models"][0]
    assert first["unpruned"]["summary"]["ood/gain"] == pytest.approx(0.3)
    assert summary["models"][1]["unpruned"]["summary"]["ood/failure_mode"] == 1.0
    assert first["stragglers"] == ["visual.ln_post"] and first["layer_sharpness"] == "finetuned"
    assert first["layer_interpolation"]["head"]["summary"]["ood/gain"] == pytest.approx(0.1)


def test_tau_of_sharpness_against_ood_accuracy_per_model_over_its_alphas(tmp_path):
    from flatlab.interpolation.report import attach_correlation, sharpness_correlation

    df = frame()
    prediction = sharpness_correlation(df)
    curves = collect_curves(df)
    attach_correlation(curves, prediction)
    a, b = curves
    # by hand, model A: sharpness 0.1 < 0.6 < 1.1 against OOD accuracy 0.5, 0.8, 0.6 over alpha 0, 0.5, 1:
    # pairs (0, 0.5) and (0, 1) concordant, (0.5, 1) discordant: tau = (2 - 1) / 3
    assert a.kendall_tau["flat/avg_sharpness"] == pytest.approx(1 / 3)
    assert b.kendall_tau["flat/avg_sharpness"] == pytest.approx(-1.0)  # B's accuracy falls as sharpness rises
    assert a.kendall_tau["flat/layer_sharpness/visual.transformer.resblocks.0"] == pytest.approx(1 / 3)
    assert a.kendall_tau["flat/layer_sharpness/head"] != a.kendall_tau["flat/layer_sharpness/head"]  # constant
    write_report(curves, tmp_path, correlation=prediction)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["models"][1]["kendall_tau"]["flat/avg_sharpness"] == pytest.approx(-1.0)
    assert summary["models"][0]["kendall_tau"]["flat/layer_sharpness/head"] is None
    assert "ood/accuracy" in (tmp_path / "sharpness_correlation.md").read_text()
    assert sharpness_correlation(df.drop(columns=[c for c in df.columns if c.startswith("flat/")])) is None


def test_not_an_alpha_study():
    with pytest.raises(ConfigError, match=r"trials report no 'param.alpha'; is it an alpha study"):
        collect_curves(pd.DataFrame([{"status": "FINISHED", "arm": "sgd", "val/accuracy": 0.5}]))
    with pytest.raises(ConfigError, match=r"no FINISHED trials"):
        collect_curves(frame().assign(status="FAILED"))


def test_the_declared_report_uses_the_trials_it_is_handed_and_matches_the_on_demand_one(tmp_path, monkeypatch):
    from mlflow.entities import Metric, Param

    from flatlab.interpolation import report as interp
    from flatlab.reports import declared
    from flatlab.reports.declared import REPORTS, ReportInput
    from flatlab.tracking import runs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "alpha", runs.artifact_location(tmp_path))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    for _, row in frame().iterrows():
        run = c.create_run(exp, tags={runs.PARENT: parent, runs.TAG_ARM: row["arm"]}).info.run_id
        params = [Param(k[len("param.") :], str(v)) for k, v in row.items() if k.startswith("param.")]
        metrics = [Metric(k, float(v), 0, 0) for k, v in row.items() if "/" in k and pd.notna(v)]
        c.log_batch(run, metrics=metrics, params=params)
        c.set_terminated(run, row["status"])
    on_demand = interp.interpolation_report(uri, "alpha", out_dir=tmp_path / "cli")
    handed = ReportInput.latest(uri, "alpha", tmp_path / "declared")

    def no_read(*args, **kwargs):
        raise AssertionError("the declared report read the trials itself")

    monkeypatch.setattr(declared, "read_sample", no_read)
    monkeypatch.setattr(declared, "parent_runs", no_read)
    lines = REPORTS.get("interpolation").run(handed, {"split": "ood"})
    assert lines[0].endswith(f"in {tmp_path / 'declared'}, logged under report/ on run {parent}")
    assert on_demand.parent_run_id == parent
    declared = json.loads((tmp_path / "declared" / "summary.json").read_text())
    assert declared == json.loads(on_demand.summary_path.read_text()) and len(declared["models"]) == 2
    assert "summary.json" in {a.path.split("/")[-1] for a in c.list_artifacts(parent, "report")}
