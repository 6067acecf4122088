"""``flatlab compare`` on a study whose trials measured at a training-loss target and trained on
(``measure_at_train_loss``): both the ``flat/*`` (the final models, every completed seed) and the
``flat_at_target/*`` rows (seeds that missed the target counted, without a value); the same frame read
as a ``stop_at_train_loss`` study keeps the old rule (``flat/*`` only from seeds that reached it)."""

import math

import pandas as pd
import pytest

from flatlab import Arm, Study
from flatlab.errors import ConfigError
from flatlab.tracking import compare as cmp
from flatlab.tracking.compare.table import MEASURE_AT_TARGET

# seed: (test/accuracy, flat/fisher_trace at the end, flat_at_target/fisher_trace or None = missed, epochs_to_target)
TRIALS = {
    "sgd": {1: (0.90, 10.0, 20.0, 4), 2: (0.92, 12.0, 24.0, 5), 3: (0.91, 11.0, None, None)},
    "sam": {1: (0.93, 8.0, 15.0, 3), 2: (0.94, 9.0, 19.0, 4), 3: (0.92, 7.0, 17.0, 4)},
}


def frame(target=0.3):
    rows = []
    for arm, seeds in TRIALS.items():
        for seed, (acc, end, at, epochs) in seeds.items():
            row = {"arm": arm, "seed": seed, "outcome": "completed", "stage": "final", "test/accuracy": acc,
                   "flat/fisher_trace": end, "flat/fisher_trace_stderr": 0.1, "train/target_reached": float(at is not None),
                   "run_id": f"{arm}{seed}", "start_time": seed}
            if at is not None:
                row.update({"flat_at_target/fisher_trace": at, "flat_at_target/fisher_trace_stderr": 0.2,
                            "train/epochs_to_target": float(epochs)})
            rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs.update({"metric": "val/accuracy", "mode": "max", MEASURE_AT_TARGET: target})
    return df


def test_both_sets_of_rows_and_the_miss_counted():
    c = cmp.compare_table(frame(), reference="sgd")
    assert c.quantities == ("test/accuracy", "flat/fisher_trace", "flat_at_target/fisher_trace", "train/epochs_to_target")
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

def test_a_stop_at_train_loss_frame_keeps_flat_rows_at_the_target():
    c = cmp.compare_table(frame(target=None), reference="sgd")
    end = c.row("flat/fisher_trace", "sgd")
    assert (end.summary.n, end.runs) == (2, 3)  # seed 3 missed: its flat/* is not at the target
    assert any("flat/* rows: measured at the training-loss target (stop_at_train_loss)" in n for n in c.notes)


def test_choosing_measures_by_name():
    c = cmp.compare_table(frame(), reference="sgd", measures=["fisher_trace"])
    assert c.quantities[1:3] == ("flat/fisher_trace", "flat_at_target/fisher_trace")
    c = cmp.compare_table(frame(), reference="sgd", measures=["flat_at_target/fisher_trace_stderr"])
    assert c.quantities[1:2] == ("flat_at_target/fisher_trace_stderr",) and "flat/fisher_trace" not in c.quantities
    with pytest.raises(ConfigError, match=r"measures flat/hessian_trace not recorded in the compared trials; measures there: "
                                        r"flat/fisher_trace, flat/fisher_trace_stderr, flat_at_target/fisher_trace"):
        cmp.compare_table(frame(), reference="sgd", measures=["hessian_trace"])


def test_every_seed_missing_the_target_still_counts_the_misses():
    df = frame().drop(columns=["flat_at_target/fisher_trace", "flat_at_target/fisher_trace_stderr", "train/epochs_to_target"])
    df["train/target_reached"] = 0.0
    df["train/epochs_to_target"] = math.nan
    c = cmp.compare_table(df, reference="sgd")
    assert c.quantities == ("test/accuracy", "flat/fisher_trace", "train/epochs_to_target")
    assert (c.row("flat/fisher_trace", "sam").summary.n, c.row("train/epochs_to_target", "sam").runs) == (3, 3)
    assert c.row("train/epochs_to_target", "sam").summary.n == 0


def test_trials_frame_reads_the_launchs_target(tmp_path):
    from mlflow.entities import Metric, Param

    from flatlab.tracking import runs
    from flatlab.tracking.param_text import flat_params
    from flatlab.tracking.results import trials_frame

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    exp = runs.get_or_create_experiment(uri, "toy", runs.artifact_location(tmp_path))
    c = runs.client(uri)
    parent = c.create_run(exp, tags={runs.TAG_ROLE: "study"}).info.run_id
    # the launch's params as study/runner.py writes them: the study's train dict under "train."
    params = flat_params({"metric": "val/accuracy", "mode": "max", "train": {"batch_size": 128, "measure_at_train_loss": 0.3}})
    c.log_batch(parent, params=[Param(k, v) for k, v in params.items()])
    for arm, seeds in TRIALS.items():
        for seed, (acc, end, at, epochs) in seeds.items():
            tags = {runs.PARENT: parent, runs.TAG_ROLE: "trial", runs.TAG_ARM: arm, runs.TAG_SEED: str(seed),
                    runs.TAG_OUTCOME: "completed", runs.TAG_STAGE: "final"}
            run_id = c.create_run(exp, tags=tags).info.run_id
            metrics = {"epoch": 10.0, "test/accuracy": acc, "flat/fisher_trace": end, "train/target_reached": float(at is not None)}
            if at is not None:
                metrics.update({"flat_at_target/fisher_trace": at, "train/epochs_to_target": float(epochs)})
            c.log_batch(run_id, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()])
            c.set_terminated(run_id)
    df = trials_frame(uri, "toy")
    assert df.attrs[MEASURE_AT_TARGET] == "0.3"
    got = cmp.compare_table(df, reference="sgd")
    assert (got.row("flat/fisher_trace", "sgd").summary.n, got.row("flat_at_target/fisher_trace", "sgd").summary.n) == (3, 2)


def test_the_mlflow_view_shows_both_sets():
    from flatlab.tracking.ui import study_columns

    s = Study(name="v", workload="digits", arms=(Arm("sgd", space={"lr": 0.1}),), measures={"fisher_trace": {}},
              train={"measure_at_train_loss": 0.3})
    cols = study_columns(s, test_metrics=("test/accuracy",))
    assert cols[-3:] == ["metrics.`flat/fisher_trace`", "metrics.`flat_at_target/fisher_trace`", "metrics.`train/epochs_to_target`"]
