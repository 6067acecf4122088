"""One answer to "which configuration of an arm is best", whoever asks: `flatlab compare`, `flatlab
results --best` (with and without `--by-config`), the final stage, `sp.best_of` and the steps-to-target
reference all name the same configuration of a grid study's trials, 2 configurations x 2 seeds, built so
that choosing by the best epoch, by the single best trial, or per seed would each name another one."""

import io
import time
from types import SimpleNamespace

import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from typer.testing import CliRunner

from flatlab import Arm, Study
from flatlab.cli.main import app
from flatlab.tracking import runs
from flatlab.tracking.artifacts import CURVE_METRIC

STUDY = "onegrid"
# arm sam, (rho, seed): final val/accuracy, best epoch's val/accuracy, test/accuracy, final smoothed train loss
SAM = {
    (0.05, 0): (0.90, 0.97, 0.70, 0.50),  # the best single trial, and the best epochs
    (0.05, 1): (0.80, 0.96, 0.72, 0.60),  # ... but the worst final value: mean final 0.85, mean best 0.965
    (0.1, 0): (0.88, 0.90, 0.80, 0.40),  # mean final 0.87: the best configuration by the rule
    (0.1, 1): (0.86, 0.89, 0.84, 0.45),  # mean best epoch 0.895
}
SGD = {0: (0.83, 0.85, 0.75, 0.70), 1: (0.81, 0.84, 0.77, 0.80)}
RULE, BEST_EPOCH = 0.1, 0.05  # the configuration each ranking picks


def study() -> Study:
    return Study(
        name=STUDY,
        workload="digits",
        arms=(Arm("sam"), Arm("sgd")),
        metric="val/accuracy",
        mode="max",
        seeds=(0, 1),
        final_seeds=(7,),
        reference_arm="sam",
    )


def trials():
    """(arm, rho, seed, final, best, test, loss) of every search trial."""
    rows = [("sam", rho, seed, *v) for (rho, seed), v in SAM.items()]
    return rows + [("sgd", None, seed, *v) for seed, v in SGD.items()]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("one")
    uri = runs.default_tracking_uri(root)
    exp = runs.get_or_create_experiment(uri, STUDY, runs.artifact_location(root))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    c.log_batch(parent, params=[Param("metric", "val/accuracy"), Param("mode", "max"), Param("reference_arm", "sam")])
    now = int(time.time() * 1000)
    ids = {}
    for i, (arm, rho, seed, final, best, test, loss) in enumerate(trials()):
        tags = {
            runs.PARENT: parent,
            runs.TAG_ROLE: "trial",
            runs.TAG_ARM: arm,
            runs.TAG_SEED: str(seed),
            runs.TAG_OUTCOME: "completed",
            runs.TAG_STAGE: "search",
            runs.TAG_TRIAL: f"t{i}",
        }
        run_id = c.create_run(exp, tags=tags, start_time=now + i).info.run_id
        config = {"arm": arm, "seed": seed, "lr": 0.1, **({"rho": rho} if rho is not None else {})}
        c.log_batch(run_id, params=[Param(k, str(v)) for k, v in runs.trial_params(config).items()])
        metrics = [
            Metric("epoch", 2.0, now, 2),
            Metric("val/accuracy", best, now, 1),
            Metric("val/accuracy", final, now, 2),
            Metric("best/val/accuracy", best, now, 2),
            Metric("test/accuracy", test, now, 2),
        ]
        metrics += [Metric(CURVE_METRIC, 2 * loss, now, 10), Metric(CURVE_METRIC, loss, now, 20)]
        c.log_batch(run_id, metrics=metrics)
        c.set_terminated(run_id, status="FINISHED")
        ids[run_id] = (arm, rho, seed)
    c.set_terminated(parent, status="FINISHED")
    return uri, exp, parent, ids


def test_compare_chooses_by_the_mean_final_value(store):
    from flatlab.analysis import compare as cmp
    from flatlab.tracking.trials import trials_frame

    uri, _, _, ids = store
    res = CliRunner().invoke(app, ["compare", STUDY, "--tracking-uri", uri, "--format", "csv"])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(io.StringIO(res.output)).set_index(["quantity", "arm"])
    assert table.loc[("test/accuracy", "sam"), "mean"] == pytest.approx((0.80 + 0.84) / 2)  # rho 0.1's test accuracy
    comparison = cmp.compare_table(trials_frame(uri, STUDY))
    assert comparison.reference == "sam"  # the study's reference_arm, recorded on the launch
    assert {ids[r][1] for r in comparison.seeds.loc[comparison.seeds["arm"] == "sam", "run_id"]} == {RULE}


def test_results_best_and_by_config_best_name_the_same_configuration(store):
    uri, _, _, _ = store
    res = CliRunner().invoke(app, ["results", STUDY, "--tracking-uri", uri, "--by-config", "--best", "--format", "csv"])
    assert res.exit_code == 0, res.output
    pooled = pd.read_csv(io.StringIO(res.output)).set_index("arm")
    assert pooled.loc["sam", "param.rho"] == RULE and pooled.loc["sam", "val/accuracy mean"] == pytest.approx(0.87)
    res = CliRunner().invoke(app, ["results", STUDY, "--tracking-uri", uri, "--best", "--format", "csv"])
    assert res.exit_code == 0, res.output
    best = pd.read_csv(io.StringIO(res.output)).set_index("arm")
    # the best configuration's best seed, not the best single trial (rho 0.05, seed 0: 0.90)
    assert (best.loc["sam", "param.rho"], best.loc["sam", "seed"]) == (RULE, 0)


def test_the_final_stage_reruns_the_same_configuration(store):
    from flatlab.study.final_stage import final_configs

    grid = [
        SimpleNamespace(
            config={"arm": arm, "seed": seed, "lr": 0.1, **({"rho": rho} if rho is not None else {})},
            metrics={"val/accuracy": final, "best/val/accuracy": best, "completed": 1, "epoch": 2},
            error=None,
        )
        for arm, rho, seed, final, best, _, _ in trials()
    ]
    configs = {c["arm"]: c for c in final_configs(study(), grid)}
    assert configs["sam"] == {"arm": "sam", "lr": 0.1, "rho": RULE, "seed": 7, "stage": "final"}
    assert configs["sgd"] == {"arm": "sgd", "lr": 0.1, "seed": 7, "stage": "final"}


def test_best_of_chains_from_the_same_configuration(store):
    from flatlab.study.chain import best_trial

    uri, _, _, ids = store
    run_id, metric, value = best_trial(uri, STUDY, "sam")
    assert ids[run_id] == ("sam", RULE, 0) and metric == "val/accuracy" and value == pytest.approx(0.88)


def test_the_steps_to_target_reference_is_the_same_configuration_for_every_seed(store):
    from flatlab.reports.speedup import log_steps_to_target
    from flatlab.tracking.trials import read_sample

    uri, _, parent, ids = store
    _, summary = log_steps_to_target(uri, parent, study(), read_sample(uri, STUDY, launch=parent))
    assert summary["errors"] == []
    assert {seed: ids[t["reference_run"]] for seed, t in summary["targets"].items()} == {
        0: ("sam", RULE, 0),
        1: ("sam", RULE, 1),
    }  # per seed, the best final value would take rho 0.05 for seed 0
    assert {seed: t["target"] for seed, t in summary["targets"].items()} == {0: 0.40, 1: 0.45}


def test_ranking_by_the_best_epoch_is_an_explicit_option(store):
    uri, _, _, _ = store
    res = CliRunner().invoke(
        app,
        [
            "results",
            STUDY,
            "--tracking-uri",
            uri,
            "--by-config",
            "--best",
            "--format",
            "csv",
            "--rank-by",
            "best-epoch",
        ],
    )
    assert res.exit_code == 0, res.output
    assert pd.read_csv(io.StringIO(res.output)).set_index("arm").loc["sam", "param.rho"] == BEST_EPOCH
    res = CliRunner().invoke(
        app, ["compare", STUDY, "--tracking-uri", uri, "--format", "markdown", "--rank-by", "best-epoch"]
    )
    assert res.exit_code == 0, res.output
    assert "best mean over its completed seeds of the best-epoch validation metric" in res.output
    res = CliRunner().invoke(app, ["results", STUDY, "--tracking-uri", uri, "--best", "--rank-by", "last"])
    assert res.exit_code == 2 and "--rank-by 'last' is not supported; expected one of final, best-epoch" in res.output
