"""What MLflow's web UI is built from: run names, links, the default-view tag, statuses, metric steps and
timestamps, readable params (flatlab.tracking.ui, param_text, callback, artifacts)."""

import json
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.study.parent_run import study_columns
from flatlab.tracking import runs, ui
from flatlab.tracking.callback import MLflowTrialLogger
from flatlab.tracking.param_text import flat_params

STUDY = Study(
    name="uiview",
    workload="digits",
    train={"stop_at_train_loss": 0.05},
    arms=(
        Arm("sgd", space={"lr": sp.loguniform(0.01, 0.5), "momentum": 0.9}),
        Arm("sam", space={"lr": sp.loguniform(0.01, 0.5), "rho": sp.loguniform(0.01, 0.3)}),
    ),
    num_trials=2,
    max_epochs=3,
    measures={"fisher_trace": {}},
)


def test_run_names_show_arm_stage_and_seed_or_trial():
    assert ui.trial_run_name("sam", "final", 3, "a1b2c3d4") == "sam · final · seed 3"
    assert ui.trial_run_name("sam", "search", 0, "a1b2c3d4") == "sam · a1b2c3d4"
    # logged model names: MLflow refuses / : . % " ' in them
    assert ui.model_name("sam", "final", 3, "a1b2c3d4") == "sam-final-seed3"
    assert ui.model_name("a.b", "search", 0, "t:1") == "a_b-t_1"


def test_every_link_opens_the_training_view():
    base = "http://127.0.0.1:5000/"
    for url in (ui.runs_url(base, "7"), ui.run_url(base, "7", "r1", "model-metrics"), ui.models_url(base, "7")):
        fragment = urlparse(url).fragment  # MLflow's UI routes live after '#'
        assert parse_qs(fragment.split("?", 1)[1])["workflowType"] == ["machine_learning"], url
        assert url.startswith("http://127.0.0.1:5000/#/experiments/7/")
    assert parse_qs(ui.runs_url(base, "7").split("?", 1)[1])["viewStateShareKey"] == [ui.VIEW_KEY]
    assert ui.run_url(base, "7", "r1", "model-metrics").split("?")[0].endswith("/runs/r1/model-metrics")
    assert ui.where_to_look("http://h:5000", "7") == "MLflow: " + ui.runs_url("http://h:5000", "7")
    line = ui.where_to_look("sqlite:////x/mlflow.db", "7")
    mlflow = Path(sys.executable).parent / "mlflow"  # the venv's script, absolute: no activated venv needed
    assert mlflow.is_file()
    assert (
        f"MLflow UI: `{mlflow} server --backend-store-uri sqlite:////x/mlflow.db --host 127.0.0.1 --port 5000`" in line
    )
    assert ui.runs_url("http://127.0.0.1:5000", "7") in line


def test_default_view_is_an_experiment_tag_with_the_researchers_columns(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, STUDY.name, (tmp_path / "art").as_uri())
    c = runs.client(uri)
    view = ui.set_default_view(c, exp, STUDY, "parent1", study_columns(STUDY, test_metrics=["test/accuracy"]))
    tag = c.get_experiment(exp).tags["mlflow.sharedViewState.flatlab"]
    assert json.loads(tag) == view
    assert view["selectedColumns"] == [
        "metrics.`val/accuracy`",
        "metrics.`test/accuracy`",
        "metrics.`epoch`",
        "tags.`flatlab.outcome`",
        "params.`lr`",
        "params.`rho`",  # searched by some arm (momentum is fixed), each once
        "attributes.`Models`",
        "metrics.`flat/fisher_trace`",
        "metrics.`train/epochs_to_target`",
    ]
    assert view["columnOrder"] == ["attributes.`Run Name`"] + view["selectedColumns"]  # shown in this order
    assert view["runsExpanded"] == {"parent1": True}  # the launch's trials, when nested under it
    assert view["orderByKey"] == "metrics.`val/accuracy`" and view["orderByAsc"] is False  # best first (max)
    assert view["globalLineChartConfig"]["xAxisKey"] == "step"
    # the charts: the study metric's section first, MLflow's own sections last, in this order
    names = [s["name"] for s in view["compareRunSections"]]
    assert names == [
        "val",
        "train",
        "test",
        "flat",
        "train_step",
        "best/val",
        "time",
        "Model metrics",
        "System metrics",
    ]
    assert view["isAccordionReordered"] is True
    first = view["compareRunCharts"][0]
    assert (first["type"], first["metricKey"]) == ("LINE", "val/accuracy")
    assert first["metricSectionId"] == view["compareRunSections"][0]["uuid"]
    minimize = ui.default_view([], "val/loss", "min", "p")
    assert minimize["orderByAsc"] is True and minimize["compareRunSections"][0]["name"] == "val"
    assert ui.chart_sections("accuracy")[0] == "Model metrics"  # an unprefixed metric: MLflow's section


def test_statuses_pruned_is_finished_only_errors_and_divergence_fail():
    assert ui.OUTCOME_STATUS == {
        "completed": "FINISHED",
        "pruned": "FINISHED",
        "diverged": "FAILED",
        "error": "FAILED",
        "interrupted": "KILLED",
    }


def test_one_shot_metrics_are_the_summary_values_the_last_report_names():
    last = {
        "epoch": 12,
        "val/accuracy": 0.9,
        "test/accuracy": 0.8,
        "flat/fisher_trace": 3.0,
        runs.SUMMARY_KEY: "flat/fisher_trace,test/accuracy",
    }
    summary = runs.summary_keys(last)
    assert summary == {"test/accuracy", "flat/fisher_trace"}
    assert {
        k: runs.metric_step(k, 12, summary) for k in ("val/accuracy", "test/accuracy", "flat/fisher_trace", "epoch")
    } == {"val/accuracy": 12, "test/accuracy": 0, "flat/fisher_trace": 0, "epoch": 12}
    # a trainer that tests every epoch reports test/* per epoch: no summary key, a curve at step = epoch
    assert runs.summary_keys({"epoch": 3, "test/accuracy": 0.7}) == frozenset()
    assert runs.metric_step("test/accuracy", 3, runs.summary_keys({"epoch": 3})) == 3


def test_params_are_readable_values():
    params = flat_params(
        {
            "wl": {"model": "mlp", "width": 128},
            "final_seeds": [1, 2, 3],
            "measures": {"fisher_trace": {}, "neighbourhood_loss": {"sigma": 0.03, "draws": 20}},
            "metric": "val/accuracy",
        }
    )
    assert params == {
        "wl.model": "mlp",
        "wl.width": "128",
        "final_seeds": "1, 2, 3",
        "measures.fisher_trace": "(defaults)",
        "measures.neighbourhood_loss.sigma": "0.03",
        "measures.neighbourhood_loss.draws": "20",
        "metric": "val/accuracy",
    }
    assert not any("{" in v for v in params.values())
    # a trial's mapping values are flattened too; plain values stay str(value), as chained studies parse them
    trial = runs.trial_params({"arm": "sgd", "lr": 0.1, "aug": {"crop": 4}}, {"workload": {"sizes": (1, 2)}})
    assert trial == {"arm": "sgd", "aug.crop": "4", "lr": "0.1", "wl.sizes": "(1, 2)"}


class _Trial:
    def __init__(self, trial_id, config):
        self.trial_id, self.config, self.last_result = trial_id, config, {}


def test_trials_are_named_statused_and_timed_by_their_epochs(tmp_path):
    """Run names, statuses of a pruned and a completed trial, and each epoch's metrics at step = epoch with
    the time that epoch ended, although all reports arrive in one batch."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "named", (tmp_path / "art").as_uri())
    c = runs.client(uri)
    parent = c.create_run(exp).info.run_id
    cb = MLflowTrialLogger(uri, exp, parent, {}, {"sam": "sam"}, metric="val/accuracy", mode="max")
    final = _Trial("f1", {"arm": "sam", "seed": 3, runs.STAGE_KEY: runs.STAGE_FINAL})
    pruned = _Trial("a1b2c3d4", {"arm": "sam", "seed": 0})
    ends = {1: 1_700_000_000.25, 2: 1_700_000_060.5, 3: 1_700_000_121.0}  # seconds since 1970
    for t in (final, pruned):
        cb.on_trial_start(0, [], t)
    for epoch in (1, 2, 3):
        last = {"test/accuracy": 0.75, runs.SUMMARY_KEY: "test/accuracy"} if epoch == 3 else {}
        cb.on_trial_result(
            0, [], final, {"epoch": epoch, "val/accuracy": 0.5 + epoch / 10, runs.EPOCH_END_KEY: ends[epoch], **last}
        )
    cb.on_trial_result(0, [], pruned, {"epoch": 1, "val/accuracy": 0.3, runs.EPOCH_END_KEY: ends[1]})
    cb._last["f1"] = {"epoch": 3, "val/accuracy": 0.8, "completed": 1}
    cb._last["a1b2c3d4"] = {"epoch": 1, "val/accuracy": 0.3}  # stopped at its rung: no completion flag
    cb.on_trial_complete(0, [], final)
    cb.on_trial_complete(0, [], pruned)
    cb.close()
    got = {r.info.run_name: r for r in c.search_runs([exp], filter_string=f"tags.`{runs.PARENT}` = '{parent}'")}
    assert set(got) == {"sam · final · seed 3", "sam · a1b2c3d4"}
    done, stopped = got["sam · final · seed 3"], got["sam · a1b2c3d4"]
    assert (done.info.status, done.data.tags[runs.TAG_OUTCOME]) == ("FINISHED", "completed")
    assert (stopped.info.status, stopped.data.tags[runs.TAG_OUTCOME], stopped.data.tags["pruned"]) == (
        "FINISHED",
        "pruned",
        "true",
    )
    history = c.get_metric_history(done.info.run_id, "val/accuracy")
    assert [(m.step, m.timestamp) for m in history] == [(e, int(1000 * ends[e])) for e in (1, 2, 3)]
    assert {m.timestamp for m in c.get_metric_history(done.info.run_id, "best/val/accuracy")} == {
        int(1000 * t) for t in ends.values()
    }
    assert "epoch_end_time" not in done.data.metrics  # the time is the metrics' timestamp, not a metric
    # the final model's summary values at step 0 (MLflow draws them as one bar per run), timed at the end
    assert [(m.step, m.value, m.timestamp) for m in c.get_metric_history(done.info.run_id, "test/accuracy")] == [
        (0, 0.75, int(1000 * ends[3]))
    ]


def test_the_step_curve_has_its_own_section_and_interpolated_times(tmp_path):
    from flatlab.tracking.artifacts import CURVE_METRIC, log_curve

    assert CURVE_METRIC.split("/")[0] != "train"  # not in the per-epoch "train" section
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "curve", (tmp_path / "art").as_uri())
    c = runs.client(uri)
    run = c.create_run(exp).info.run_id
    # two epochs of 10 steps: started at t=100 s, epochs ended at 110 s and 130 s
    log_curve(c, run, [(5, 2.0), (10, 1.5), (15, 1.0), (20, 0.5)], times=[(0, 100.0), (10, 110.0), (20, 130.0)])
    got = [(m.step, m.value, m.timestamp) for m in c.get_metric_history(run, CURVE_METRIC)]
    assert got == [(5, 2.0, 105_000), (10, 1.5, 110_000), (15, 1.0, 120_000), (20, 0.5, 130_000)]


def test_a_run_logged_before_the_rename_still_gives_its_curve(tmp_path):
    from mlflow.entities import Metric

    from flatlab.reports.speedup import _curve
    from flatlab.tracking.artifacts import LEGACY_CURVE_METRIC

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "old", (tmp_path / "art").as_uri())
    c = runs.client(uri)
    run = c.create_run(exp).info.run_id
    c.log_batch(run, metrics=[Metric(LEGACY_CURVE_METRIC, v, 0, s) for s, v in ((1, 2.0), (2, 1.0))])
    assert _curve(c, run) == [(1, 2.0), (2, 1.0)]


def test_published_curves_place_a_summary_value_at_the_last_epoch(tmp_path):
    """flatlab curves reads per-epoch histories: a test metric logged once (step 0) belongs to epoch 3."""
    from mlflow.entities import Metric, Param

    from flatlab.reports.published_runs import epoch_values
    from flatlab.tracking.trials import trials_frame

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    exp = runs.get_or_create_experiment(uri, "pub", (tmp_path / "art").as_uri())
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_batch(parent, params=[Param("metric", "val/accuracy"), Param("mode", "max")])
    for seed in (0, 1):
        run = c.create_run(
            exp,
            tags={
                runs.PARENT: parent,
                runs.TAG_ARM: "sgd",
                runs.TAG_OUTCOME: "completed",
                runs.TAG_SEED: str(seed),
                runs.TAG_STAGE: "final",
            },
        ).info.run_id
        c.log_batch(
            run,
            metrics=[Metric("val/accuracy", 0.5 + e / 10, 1000 + e, e) for e in (1, 2, 3)]
            + [Metric("epoch", e, 1000 + e, e) for e in (1, 2, 3)]
            + [Metric("test/accuracy", 0.7, 1003, 0)],
        )
    frame, _ = epoch_values(uri, trials_frame(uri, "pub"), ["val/accuracy", "test/accuracy"])
    assert sorted(frame.loc[frame["metric"] == "test/accuracy", "epoch"]) == [3, 3]
    assert sorted(set(frame.loc[frame["metric"] == "val/accuracy", "epoch"])) == [1, 2, 3]


def test_the_serve_hint_without_an_mlflow_script_runs_the_module(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "my env" / "python"))
    assert ui.serve_hint("sqlite:///x.db") == (
        f"'{tmp_path}/my env/python' -m mlflow server --backend-store-uri sqlite:///x.db --host 127.0.0.1 --port 5000"
    )
