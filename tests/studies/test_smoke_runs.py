"""Every paper study file's ``smoke`` scale runs end to end through Ray Tune on CPU and logs to MLflow.

All runs of this module share one local Ray (started by the first run, 2 CPUs) and one MLflow
database; each smoke study runs one trial at a time. The cheapest files run by default, the others
are marked ``slow`` (all of them together take about three minutes on two cores).
"""

import json
import math
from pathlib import Path

import pytest

from flatlab.study.loader import load_studies
from flatlab.tracking import runs
from flatlab.tracking.artifacts import CURVE_METRIC
from flatlab.workloads import get_workload

pytestmark = pytest.mark.integration

STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"
FAST = ("ire_fig2_wrn16_cifar10.py", "tsam_fig4_t_schedule.py", "tsam_table2_objectives.py")
SLOW = (
    "ire_table1_cnn_cifar.py",
    "ire_table3_vit_cifar100.py",
    "ire_fig3_transformer_wikitext2.py",
    "ire_fig4_llama.py",
    "tsam_table1_images.py",
    "tsam_glue.py",
    "tsam_table3_samples.py",
    "ire_table2_resnet50_imagenet.py",
    "ire_table4_vit_imagenet.py",
    "tsam_fig2_flatness.py",
    "tsam_appc_sam_rho.py",
    "tsam_fig8_naive_sampling.py",
)


def test_every_paper_study_file_is_covered():
    files = {p.name for p in STUDIES_DIR.glob("*.py") if p.name.startswith(("ire_", "tsam_"))}
    assert files == set(FAST) | set(SLOW)


def run_smoke(name, root):
    from flatlab.study.runner import RunOptions, run_study

    path = str(STUDIES_DIR / name)
    for study in load_studies(path, "smoke"):
        outcome = run_study(study, RunOptions(root=root, num_cpus=2, source=path, log_models=False))
        assert not outcome.interrupted and outcome.num_errors == 0, study.name
        client = runs.client(outcome.tracking_uri)
        children = client.search_runs(
            [outcome.experiment_id], filter_string=f"tags.`{runs.PARENT}` = '{outcome.parent_run_id}'"
        )
        assert len(children) == study.num_total_trials(), study.name
        assert {r.data.tags[runs.TAG_ARM] for r in children} == {a.name for a in study.arms}
        trains = get_workload(study.workload).trains
        for r in children:
            assert r.info.status == "FINISHED" and r.data.tags[runs.TAG_OUTCOME] == "completed", (
                study.name,
                r.data.tags,
            )
            assert math.isfinite(r.data.metrics[study.metric]), (study.name, study.metric)
            assert "train/loss" in r.data.metrics and "time/epoch_s" in r.data.metrics
            if trains:  # the worker logs the smoothed training-loss curve at the last epoch
                assert client.get_metric_history(r.info.run_id, CURVE_METRIC), (study.name, r.info.run_id)
            if study.reference_arm is not None:  # logged after Tune (flatlab.reports.speedup)
                reached = r.data.tags.get("flatlab.target_reached")
                own = r.data.tags[runs.TAG_ARM] == study.reference_arm
                assert reached == "true" or (reached == "false" and not own), (
                    study.name,
                    r.data.tags,
                )  # the reference reaches its own final loss
                if reached == "true":
                    steps = client.get_metric_history(r.info.run_id, CURVE_METRIC)[-1].step
                    assert 1 <= r.data.metrics["train/steps_to_target"] <= steps, study.name
                    assert r.data.metrics["train/speedup"] > 0, study.name
        assert client.get_run(outcome.parent_run_id).info.status == "FINISHED"
        if "objectives" in study.reports:  # TSAM Table 2: a table per split, a row per arm, every cell filled
            text = (Path(root) / study.name / "report" / "objectives.md").read_text()
            for split in ("train", "test"):
                assert f"{split} split: rows = trained model" in text, text
            for arm in study.arms:
                rows = [line for line in text.splitlines() if line.startswith(f"| {arm.name} |")]
                assert len(rows) == 2 and all(" - " not in row for row in rows), text
        if "curves_by" in study.reports:  # TSAM Figs. 3, 7 and 8: a curve per value, a point per epoch
            curves = study.reports["curves_by"]
            for metric in curves["metrics"].split(","):
                path = Path(root) / study.name / "report" / f"curves_{curves['by']}_{metric.replace('/', '_')}.json"
                values = json.loads(path.read_text())["values"]
                assert values and all(len(v["points"]) == study.max_epochs for v in values), (path, values)


@pytest.mark.parametrize("name", FAST)
def test_smoke_scale_runs(name, smoke_root):
    run_smoke(name, smoke_root)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_smoke_scale_runs_slow(name, smoke_root):
    run_smoke(name, smoke_root)
