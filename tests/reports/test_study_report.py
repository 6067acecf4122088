"""The study report on the parent run: best values per arm, learning curves, Optuna's plots, metric vs flatness."""

import json
import logging

import pytest

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.tracking import runs

LAUNCH = "rep-20260101-000000"
STUDY = Study(
    name="rep",
    workload="digits",
    arms=(
        Arm("sgd", space={"lr": sp.loguniform(0.01, 0.5), "momentum": sp.uniform(0.5, 0.95)}),
        Arm("adamw", space={"lr": 3e-3}),  # searches nothing: no Optuna study, no Optuna plots
    ),
    num_trials=3,
    max_epochs=3,
)
# (arm, trial, outcome, val/accuracy per epoch, test/accuracy, flat/fisher_trace, lr, momentum)
TRIALS = [
    ("sgd", "s1", "completed", [0.5, 0.7, 0.80], 0.78, 3.0, 0.05, 0.9),
    ("sgd", "s2", "completed", [0.6, 0.8, 0.90], 0.88, 2.0, 0.2, 0.6),
    ("sgd", "s3", "pruned", [0.95], None, None, 0.4, 0.7),  # best value, but stopped early: never "best"
    ("adamw", "a1", "completed", [0.4, 0.6, 0.70], 0.69, 4.0, 3e-3, None),
    ("adamw", "a2", "diverged", [0.1], None, None, 3e-3, None),
]


@pytest.fixture
def store(tmp_path):
    import optuna
    from mlflow.entities import Metric, Param

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, STUDY.name, (tmp_path / "art").as_uri())
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_batch(parent, params=[Param("metric", "val/accuracy"), Param("mode", "max")])
    out = tmp_path / STUDY.name
    out.mkdir()
    (out / "launch.json").write_text(json.dumps({"experiment_name": LAUNCH, "parent_run_id": parent}))
    storage = f"sqlite:///{out / 'optuna.db'}"
    st = optuna.create_study(study_name=f"{LAUNCH}.sgd", storage=storage, direction="maximize")
    dists = {
        "lr": optuna.distributions.FloatDistribution(0.01, 0.5, log=True),
        "momentum": optuna.distributions.FloatDistribution(0.5, 0.95),
    }
    for arm, tid, outcome, curve, test, flat, lr, mom in TRIALS:
        tags = {runs.PARENT: parent, runs.TAG_ARM: arm, runs.TAG_TRIAL: tid, runs.TAG_OUTCOME: outcome}
        run = c.create_run(exp, tags=tags).info.run_id
        metrics = [Metric("val/accuracy", v, 1000 + e, e + 1) for e, v in enumerate(curve)]
        metrics += [Metric("epoch", len(curve), 0, len(curve))]
        metrics += [Metric("test/accuracy", test, 0, 3), Metric("flat/fisher_trace", flat, 0, 3)] if test else []
        c.log_batch(run, metrics=metrics, params=[Param("arm", arm), Param("lr", str(lr))])
        c.set_terminated(run, "FINISHED" if outcome == "completed" else "KILLED" if outcome == "pruned" else "FAILED")
        if arm == "sgd":
            state = optuna.trial.TrialState.COMPLETE if outcome == "completed" else optuna.trial.TrialState.PRUNED
            st.add_trial(
                optuna.trial.create_trial(
                    params={"lr": lr, "momentum": mom},
                    distributions=dists,
                    value=curve[-1] if outcome == "completed" else None,
                    state=state,
                )
            )
    return uri, c, parent, out


def launched(uri, client, parent, out):
    """The launch as the post-study pipeline hands it to the report: its Optuna studies as launch.json
    names them, the default view's columns of the study."""
    from flatlab.reports.launched import Launched
    from flatlab.study.parent_run import study_columns

    return Launched(
        STUDY,
        uri,
        client.get_run(parent).info.experiment_id,
        parent,
        out,
        out / "logs" / "flatlab.log",
        optuna_studies={"sgd": f"{LAUNCH}.sgd", "adamw": f"{LAUNCH}.adamw"},
        columns=lambda tests: study_columns(STUDY, tests),
    )


def test_report_logs_best_per_arm_and_every_plot(store, caplog):
    import matplotlib

    from flatlab.reports.study_report import log_study_report
    from flatlab.tracking.trials import trials_frame

    uri, c, parent, out = store
    style = dict(matplotlib.rcParams)
    with caplog.at_level(logging.INFO, logger="flatlab.reports.study_report"):
        logged = log_study_report(launched(uri, c, parent, out), trials_frame(uri, STUDY.name))
    assert dict(matplotlib.rcParams) == style  # Optuna's ggplot style does not leak into the caller's plots
    assert c.get_run(parent).data.metrics == {}  # one table, no per-arm metrics crowding the trials' charts
    table = json.loads(open(c.download_artifacts(parent, "report/best_per_arm.json", str(out))).read())
    # the best COMPLETED search trial of each arm (s3's 0.95 was pruned; adamw's a2 diverged)
    assert table["columns"] == [
        "arm",
        "trial",
        "epochs",
        "val/accuracy",
        "test/accuracy",
        "flat/fisher_trace",
        "search val/accuracy mean",
        "search seeds",
        "params",
        "run_id",
    ]
    # each configuration ran one seed here, so the score is that trial's final val/accuracy
    assert [row[:8] for row in table["data"]] == [
        ["sgd", "sgd · s2", 3, 0.90, 0.88, 2.0, 0.90, 1],
        ["adamw", "adamw · a1", 3, 0.70, 0.69, 4.0, 0.70, 1],
    ]
    assert [row[8] for row in table["data"]] == ["lr=0.2", "lr=0.003"]
    assert c.get_run(parent).data.tags["mlflow.loggedArtifacts"]  # MLflow's mark of a table its UI renders
    arts = {a.path for a in c.list_artifacts(parent, "report")}
    assert arts == {
        "report/learning_curves.png",
        "report/parallel_coordinate_sgd.png",
        "report/best_per_arm.json",
        "report/param_importances_sgd.png",
        "report/metric_vs_flatness.png",
    }
    assert set(logged) >= arts
    for path in arts - {"report/best_per_arm.json"}:  # real PNGs
        local = c.download_artifacts(parent, path, str(out))
        assert open(local, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "arm 'adamw': it searches no parameter" in caplog.text  # the reason it has no Optuna plots
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("study report: ")][-1]
    assert summary == (
        f"study report: 4 plots on the parent run (report/); 1 skipped (reasons in {out / 'logs' / 'flatlab.log'})"
    )  # which log: the study's


def test_learning_curves_draw_one_line_per_trial_and_panel_per_arm(store, tmp_path):
    from matplotlib.figure import Figure

    from flatlab.reports.study_report import plot_learning_curves
    from flatlab.tracking.trials import trials_frame

    uri, c, parent, out = store
    drawn = {}
    real = Figure.savefig

    def capture(fig, path, **kw):
        drawn.update(
            {
                ax.get_title(): [line.get_xydata().tolist() for line in ax.get_lines()]
                for ax in fig.axes
                if ax.get_visible()
            }
        )
        return real(fig, path, **kw)

    Figure.savefig = capture
    try:
        plot_learning_curves(
            c, trials_frame(uri, STUDY.name), "val/accuracy", tmp_path / "c.png", arms=["sgd", "adamw"]
        )
    finally:
        Figure.savefig = real
    assert set(drawn) == {"sgd (3 trials)", "adamw (2 trials)"}
    assert sorted(drawn["sgd (3 trials)"]) == [
        [[1, 0.5], [2, 0.7], [3, 0.8]],
        [[1, 0.6], [2, 0.8], [3, 0.9]],
        [[1, 0.95]],
    ]


def test_skips_are_logged_never_raised(store, caplog):
    from flatlab.reports.study_report import log_study_report
    from flatlab.tracking.trials import trials_frame

    uri, c, parent, out = store
    (out / "optuna.db").unlink()  # e.g. a grid study: no Optuna studies
    trials = trials_frame(uri, STUDY.name)
    with caplog.at_level(logging.INFO, logger="flatlab.reports.study_report"):
        log_study_report(launched(uri, c, parent, out), trials)
        missing = launched("sqlite:///" + str(out / "missing.db"), c, parent, out)
        assert log_study_report(missing, trials) == []  # no store: no raise
    assert "no Optuna studies" in caplog.text
    assert {a.path for a in c.list_artifacts(parent, "report")} == {
        "report/learning_curves.png",
        "report/metric_vs_flatness.png",
        "report/best_per_arm.json",
    }


def test_best_per_arm_params_one_per_line():
    import pandas as pd

    from flatlab.analysis.report import best_per_arm_table

    df = pd.DataFrame(
        [
            {
                "arm": "sam",
                "outcome": "completed",
                "stage": "search",
                "epochs": 3,
                "run_id": "r1",
                "trial_id": "t1",
                "seed": 0,
                "val/accuracy": 0.9,
                "param.lr": "0.1",
                "param.weight_decay": "0.000512345",
                "param.rho": None,
            }
        ]
    )
    df.attrs["metric"], df.attrs["mode"] = "val/accuracy", "max"
    assert best_per_arm_table(df, "val/accuracy")["params"].tolist() == ["lr=0.1\nweight_decay=0.0005123"]


def test_best_per_arm_score_is_the_configurations_mean_over_its_seeds():
    # one configuration, two seeds (val/loss 0.4 and 0.2, lower is better): the row is its best trial
    # (0.2) and the score is the mean the rule chose it by, 0.3 over 2 seeds
    import pandas as pd

    from flatlab.analysis.report import best_per_arm_table

    df = pd.DataFrame(
        [
            {
                "arm": "sgd",
                "outcome": "completed",
                "stage": "search",
                "epochs": 3,
                "run_id": f"r{i}",
                "trial_id": f"t{i}",
                "seed": i,
                "val/loss": v,
                "param.lr": "0.1",
            }
            for i, v in enumerate((0.4, 0.2))
        ]
    )
    df.attrs["metric"], df.attrs["mode"] = "val/loss", "min"
    table = best_per_arm_table(df, "val/loss")
    assert table[["val/loss", "search val/loss mean", "search seeds"]].values.tolist() == [[0.2, 0.3, 2]]


@pytest.mark.parametrize(
    "values, pngs, reason",
    [
        ([0.9, 0.8, 0.7], ["parallel_coordinate_sgd.png", "param_importances_sgd.png"], None),
        ([0.94, 0.94, 0.94], ["parallel_coordinate_sgd.png"], "its 3 completed trials share one val/accuracy (0.94)"),
    ],
)
def test_importances_are_skipped_with_a_reason_when_every_trial_scores_the_same(tmp_path, values, pngs, reason):
    import optuna

    from flatlab.reports.study_report import _arm_plots

    st = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for v in values:
        st.enqueue_trial({"lr": 0.1 * (1 + len(st.trials))})
        st.optimize(lambda trial, v=v: v + 0 * trial.suggest_float("lr", 0.01, 1.0), n_trials=1)
    skipped = []
    paths = _arm_plots(st, "sgd", "val/accuracy", tmp_path, skipped)
    assert [p.name for p in paths] == pngs and all(p.stat().st_size > 0 for p in paths)
    assert skipped == ([f"importances of arm 'sgd': {reason}"] if reason else [])
