"""``flatlab compare`` on a study with a training-loss target, one rule for both kinds: the ``flat/*``
rows are the final models (every completed seed) and the ``flat_at_target/*`` rows the seeds that
reached the target (the misses counted, without a value). ``measure_at_train_loss`` trials log both;
``stop_at_train_loss`` trials stop at the target, so their ``flat/*`` is at the target where reached and
after the last epoch where missed: an arm that missed keeps its final flatness in the table, and every
output names the arms and seeds that missed, with the target, above the table."""

import math

import pandas as pd
import pytest

from flatlab import Arm, Study
from flatlab.analysis import compare as cmp
from flatlab.analysis.compare import multi
from flatlab.analysis.compare.at_target import MEASURE_AT_TARGET, STOP_AT_TARGET
from flatlab.errors import ConfigError

# seed: (test/accuracy, flat/fisher_trace at the end, flat_at_target/fisher_trace or None = missed, epochs_to_target)
TRIALS = {
    "sgd": {1: (0.90, 10.0, 20.0, 4), 2: (0.92, 12.0, 24.0, 5), 3: (0.91, 11.0, None, None)},
    "sam": {1: (0.93, 8.0, 15.0, 3), 2: (0.94, 9.0, 19.0, 4), 3: (0.92, 7.0, 17.0, 4)},
}


def frame(target=0.3):
    rows = []
    for arm, seeds in TRIALS.items():
        for seed, (acc, end, at, epochs) in seeds.items():
            row = {
                "arm": arm,
                "seed": seed,
                "outcome": "completed",
                "stage": "final",
                "test/accuracy": acc,
                "flat/fisher_trace": end,
                "flat/fisher_trace_stderr": 0.1,
                "train/target_reached": float(at is not None),
                "run_id": f"{arm}{seed}",
                "start_time": seed,
            }
            if at is not None:
                row.update(
                    {
                        "flat_at_target/fisher_trace": at,
                        "flat_at_target/fisher_trace_stderr": 0.2,
                        "train/epochs_to_target": float(epochs),
                    }
                )
            rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs.update({"metric": "val/accuracy", "mode": "max", MEASURE_AT_TARGET: target})
    return df


def test_both_sets_of_rows_and_the_miss_counted():
    c = cmp.compare_table(frame(), reference="sgd")
    assert c.quantities == (
        "test/accuracy",
        "flat/fisher_trace",
        "flat_at_target/fisher_trace",
        "train/epochs_to_target",
    )
    assert c.higher_is_better["flat_at_target/fisher_trace"] is False
    end = c.row("flat/fisher_trace", "sgd")  # the final models: seed 3 missed the target but has a value
    assert (end.summary.n, end.runs, end.summary.mean) == (3, 3, pytest.approx(11.0))
    at = c.row("flat_at_target/fisher_trace", "sgd")  # seed 3 counted as run, no value
    assert (at.summary.n, at.runs, at.summary.mean) == (2, 3, pytest.approx(22.0))
    d = c.row("flat_at_target/fisher_trace", "sam").diff  # seeds 1, 2: 15-20, 19-24
    assert d.estimate.n == 2 and d.estimate.mean == pytest.approx(-5.0) and (d.arm_better, d.ref_better) == (2, 0)
    assert c.row("flat/fisher_trace", "sam").diff.estimate.mean == pytest.approx(-3.0)  # seeds 1-3: -2, -3, -4
    body = {(r[0], r[1]): r for r in cmp.cells(c)}
    assert body[("flat_at_target/fisher_trace", "sgd")][2] == "2/3" and body[("flat/fisher_trace", "sgd")][2] == "3/3"
    assert body[("train/epochs_to_target", "sgd")][2] == "2/3 reached"
    notes = " ".join(c.notes)
    assert "flat_at_target/* rows: measured at the first epoch whose mean training loss was <= 0.3" in notes
    assert "flat/* rows: the final models" in notes and "stop_at_train_loss" not in notes
    assert "sgd: seed 3 completed without reaching the target (train/epochs_to_target)." in notes


def test_at_target_rows_are_their_own_holm_family_and_render_as_flatness():
    from rich.console import Console
    from scipy import stats

    df = frame()
    df.loc[(df["arm"] == "sam") & (df["seed"] == 2), "flat_at_target/fisher_trace"] = 18.0  # differences -5, -6
    c = cmp.compare_table(df, reference="sgd")
    (sam,) = c.family("flat_at_target/fisher_trace")  # one non-reference arm: one test, Holm leaves p as it is
    p = stats.ttest_rel([15.0, 18.0], [20.0, 24.0]).pvalue  # the seeds both reached the target: 1 and 2
    assert sam.arm == "sam" and sam.diff.p == pytest.approx(p) and sam.p_holm == pytest.approx(p)
    console = Console(record=True, width=160)
    cmp.render(c, console)
    out = console.export_text()
    assert "flat_at_target/fisher_trace (lower = flatter; 1 test, Holm-adjusted)" in out
    assert "train/epochs_to_target (lower is better; " in out  # not a flatness measure
    assert "(flat/*, flat_at_target/*: lower = flatter)" in " ".join(cmp.caption(c))


# The walkthrough's study: stop_at_train_loss 0.1, 8 epochs, final seeds 1 and 2. sgd reached the target
# (and stopped there), asam never did: its flat/* are of the model after epoch 8, as MLflow holds them.
# seed: (test/accuracy, flat/hessian_trace, epochs_to_target or None = missed)
STOPPED = {"sgd": {1: (0.972, 8.78, 5), 2: (0.975, 13.08, 6)}, "asam": {1: (0.903, 32.3, None), 2: (0.914, 27.0, None)}}


def stopped_frame(trials=STOPPED, target="0.1"):
    rows = []
    for arm, seeds in trials.items():
        for seed, (acc, flat, epochs) in seeds.items():
            row = {
                "arm": arm,
                "seed": seed,
                "outcome": "completed",
                "stage": "final",
                "test/accuracy": acc,
                "flat/hessian_trace": flat,
                "flat/hessian_trace_stderr": 0.5,
                "train/target_reached": float(epochs is not None),
                "epochs": epochs or 8,
                "run_id": f"{arm}{seed}",
                "start_time": seed,
            }
            if epochs is not None:
                row["train/epochs_to_target"] = float(epochs)
            rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs.update({"metric": "val/accuracy", "mode": "max", MEASURE_AT_TARGET: None, STOP_AT_TARGET: target})
    return df


MISSED = (
    "Training-loss target missed (stop_at_train_loss: mean training loss <= 0.1): asam 2 of 2 completed seeds. "
    "Those seeds have no flat_at_target/* value; their flat/* values are of the model after their last epoch, "
    "at a higher training loss than the target."
)


def test_an_arm_that_missed_a_stop_at_train_loss_target_keeps_its_final_flatness():
    c = cmp.compare_table(stopped_frame(), reference="sgd")
    assert c.quantities == (
        "test/accuracy",
        "flat/hessian_trace",
        "flat_at_target/hessian_trace",
        "train/epochs_to_target",
    )
    end = c.row("flat/hessian_trace", "asam")  # the final models: asam's after epoch 8, sgd's at the target
    assert (end.summary.n, end.runs, end.summary.mean) == (2, 2, pytest.approx(29.65))
    assert end.summary.std == pytest.approx(math.sqrt(2 * 2.65**2))  # 32.3 and 27.0 around 29.65
    d = end.diff  # seed 1: 32.3 - 8.78, seed 2: 27.0 - 13.08
    assert (
        d.estimate.n == 2
        and d.estimate.mean == pytest.approx((23.52 + 13.92) / 2)
        and (d.arm_better, d.ref_better) == (0, 2)
    )
    at = c.row("flat_at_target/hessian_trace", "asam")  # at the matched training loss: counted, no value
    assert (at.summary.n, at.runs, at.diff.estimate.n) == (0, 2, 0)
    assert c.row("flat_at_target/hessian_trace", "sgd").summary.mean == pytest.approx(10.93)
    assert c.warnings == (MISSED,)
    assert any(
        n.startswith(
            "flat_at_target/* rows: the flat/* of the seeds that reached mean training loss <= 0.1, "
            "where stop_at_train_loss ended them"
        )
        for n in c.notes
    )
    body = {(r[0], r[1]): r for r in cmp.cells(c)}
    assert body[("flat/hessian_trace", "asam")][2:4] == ["2/2", "29.65 ± 3.748"]
    assert body[("flat_at_target/hessian_trace", "asam")][2:4] == ["0/2", "-"]
    assert c.seeds.set_index(["arm", "seed"]).loc[("asam", 1), "flat/hessian_trace"] == pytest.approx(32.3)
    chosen = cmp.compare_table(stopped_frame(), reference="sgd", measures=["hessian_trace"])
    assert chosen.quantities[1:3] == ("flat/hessian_trace", "flat_at_target/hessian_trace")


def test_the_missed_target_is_shown_above_the_table_in_every_text_output():
    from rich.console import Console

    c = cmp.compare_table(stopped_frame(), reference="sgd", study="walk")
    md = cmp.to_markdown(c)
    assert md.index(f"> **{MISSED}**") < md.index("| quantity |")  # above the table, not only under it
    console = Console(record=True, width=400)
    cmp.render(c, console)
    lines = console.export_text().splitlines()
    assert lines[:2] == ["walk: test/accuracy and flatness vs sgd", MISSED]
    assert MISSED in cmp.to_latex(c).replace(r"\_", "_")  # first in the caption
    assert MISSED not in cmp.caption(c)  # said once, above the table


def test_a_stop_at_train_loss_study_where_every_seed_reached_the_target_shows_one_set_of_rows():
    reached = {
        arm: {seed: (acc, flat, epochs or 7) for seed, (acc, flat, epochs) in seeds.items()}
        for arm, seeds in STOPPED.items()
    }
    c = cmp.compare_table(stopped_frame(reached), reference="sgd")
    assert c.quantities == ("test/accuracy", "flat/hessian_trace", "train/epochs_to_target") and c.warnings == ()
    assert c.row("flat/hessian_trace", "asam").summary.n == 2  # the same numbers as at the target: shown once
    assert (
        "flat/* rows: measured at mean training loss <= 0.1 (stop_at_train_loss), where every completed seed "
        "stopped: flatness at a matched training loss."
    ) in c.notes
    assert "> **" not in cmp.to_markdown(c)


def test_a_measure_at_train_loss_miss_is_named_above_the_table_too():
    c = cmp.compare_table(frame(), reference="sgd")
    assert c.warnings == (
        "Training-loss target missed (measure_at_train_loss: mean training loss <= 0.3): sgd 1 of 3 "
        "completed seeds. Those seeds have no flat_at_target/* value; their flat/* values are of the model "
        "after their last epoch, at a higher training loss than the target.",
    )


def test_the_summary_of_several_studies_names_the_misses():
    other = stopped_frame(
        {arm: {s: (acc - 0.1, flat, 4) for s, (acc, flat, _) in seeds.items()} for arm, seeds in STOPPED.items()}
    )
    s = multi.summary_from_frames({"walk": stopped_frame(), "other": other}, reference="sgd")
    assert s.notes[0] == f"walk: {MISSED}"
    assert not any(n.startswith("other:") for n in s.notes)
    ratio = s.frame.set_index(["arm", "workload"])["flat/hessian_trace ratio"]
    assert math.isnan(ratio[("asam", "walk")])  # compared at the matched training loss, where asam has no value
    assert ratio[("asam", "other")] == pytest.approx(29.65 / 10.93)


def test_choosing_measures_by_name():
    c = cmp.compare_table(frame(), reference="sgd", measures=["fisher_trace"])
    assert c.quantities[1:3] == ("flat/fisher_trace", "flat_at_target/fisher_trace")
    c = cmp.compare_table(frame(), reference="sgd", measures=["flat_at_target/fisher_trace_stderr"])
    assert c.quantities[1:2] == ("flat_at_target/fisher_trace_stderr",) and "flat/fisher_trace" not in c.quantities
    with pytest.raises(
        ConfigError,
        match=r"measures flat/hessian_trace not recorded in the compared trials; measures there: "
        r"flat/fisher_trace, flat/fisher_trace_stderr, flat_at_target/fisher_trace",
    ):
        cmp.compare_table(frame(), reference="sgd", measures=["hessian_trace"])


def test_every_seed_missing_the_target_still_counts_the_misses():
    df = frame().drop(
        columns=["flat_at_target/fisher_trace", "flat_at_target/fisher_trace_stderr", "train/epochs_to_target"]
    )
    df["train/target_reached"] = 0.0
    df["train/epochs_to_target"] = math.nan
    c = cmp.compare_table(df, reference="sgd")
    assert c.quantities == ("test/accuracy", "flat/fisher_trace", "train/epochs_to_target")
    assert (c.row("flat/fisher_trace", "sam").summary.n, c.row("train/epochs_to_target", "sam").runs) == (3, 3)
    assert c.row("train/epochs_to_target", "sam").summary.n == 0


def _launch(tmp_path, study: str, train: dict, trials):
    """A study's launch in a fresh MLflow store, as study/runner.py records it (its train dict under
    "train."), with one completed final-stage trial per ``(arm, seed, metrics)`` of ``trials``; the URI."""
    from mlflow.entities import Metric, Param

    from flatlab.tracking import runs
    from flatlab.tracking.param_text import flat_params

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, study, runs.artifact_location(tmp_path))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    params = flat_params({"metric": "val/accuracy", "mode": "max", "train": train})
    c.log_batch(parent, params=[Param(k, v) for k, v in params.items()])
    for arm, seed, metrics in trials:
        tags = {
            runs.PARENT: parent,
            runs.TAG_ROLE: "trial",
            runs.TAG_ARM: arm,
            runs.TAG_SEED: str(seed),
            runs.TAG_OUTCOME: "completed",
            runs.TAG_STAGE: "final",
        }
        run_id = c.create_run(exp, tags=tags).info.run_id
        c.log_batch(run_id, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()])
        c.set_terminated(run_id)
    return uri


def test_trials_frame_reads_the_launchs_target(tmp_path):
    from flatlab.tracking.trials import trials_frame

    trials = []
    for arm, seeds in TRIALS.items():
        for seed, (acc, end, at, epochs) in seeds.items():
            metrics = {
                "epoch": 10.0,
                "test/accuracy": acc,
                "flat/fisher_trace": end,
                "train/target_reached": float(at is not None),
            }
            if at is not None:
                metrics.update({"flat_at_target/fisher_trace": at, "train/epochs_to_target": float(epochs)})
            trials.append((arm, seed, metrics))
    uri = _launch(tmp_path, "toy", {"batch_size": 128, "measure_at_train_loss": 0.3}, trials)
    df = trials_frame(uri, "toy")
    assert df.attrs[MEASURE_AT_TARGET] == "0.3"
    got = cmp.compare_table(df, reference="sgd")
    assert (got.row("flat/fisher_trace", "sgd").summary.n, got.row("flat_at_target/fisher_trace", "sgd").summary.n) == (
        3,
        2,
    )


def test_the_mlflow_view_shows_both_sets():
    from flatlab.study.parent_run import study_columns

    s = Study(
        name="v",
        workload="digits",
        arms=(Arm("sgd", space={"lr": 0.1}),),
        measures={"fisher_trace": {}},
        train={"measure_at_train_loss": 0.3},
    )
    cols = study_columns(s, test_metrics=("test/accuracy",))
    assert cols[-3:] == [
        "metrics.`flat/fisher_trace`",
        "metrics.`flat_at_target/fisher_trace`",
        "metrics.`train/epochs_to_target`",
    ]


def test_compare_from_mlflow_shows_the_final_flatness_of_a_stop_at_train_loss_arm_that_missed(tmp_path):
    from typer.testing import CliRunner

    from flatlab.cli.main import app
    from flatlab.tracking.trials import trials_frame

    trials = []
    for arm, seeds in STOPPED.items():
        for seed, (acc, flat, epochs) in seeds.items():
            metrics = {
                "epoch": float(epochs or 8),
                "test/accuracy": acc,
                "flat/hessian_trace": flat,
                "train/target_reached": float(epochs is not None),
            }
            if epochs is not None:
                metrics["train/epochs_to_target"] = float(epochs)
            trials.append((arm, seed, metrics))
    uri = _launch(tmp_path, "walk", {"batch_size": 64, "stop_at_train_loss": 0.1}, trials)
    df = trials_frame(uri, "walk")
    assert df.attrs[STOP_AT_TARGET] == "0.1" and df.attrs[MEASURE_AT_TARGET] is None
    got = cmp.compare_table(df, reference="sgd")
    assert got.row("flat/hessian_trace", "asam").summary.mean == pytest.approx(29.65) and got.warnings == (MISSED,)
    res = CliRunner().invoke(app, ["compare", "walk", "--tracking-uri", uri, "--format", "markdown"])
    assert res.exit_code == 0, res.output
    assert f"> **{MISSED}**" in res.output and "| flat/hessian_trace | asam | 2/2 | 29.65 ± 3.748 |" in res.output
