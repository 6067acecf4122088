"""``studies/fmnist_equal_compute.py``: the six arms at one pass budget, with ``fmnist_flatness``'s design,
measures and spaces; each arm's epochs under the budget are the hand counts of its declared cost per step;
the ``cpu`` scale fits 90 minutes on 2 cores by the docstring's arithmetic; and the ``smoke`` scale runs end
to end under its pass budget, then answers ``flatlab compare --time-to-target`` and ``--at-equal passes``."""

import io
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from flatlab import Budget
from flatlab.cli.main import app
from flatlab.study.loader import load_module, load_studies
from flatlab.study.plan import plan
from flatlab.study.trial_spec import with_arm_epochs
from flatlab.workloads.registry import WORKLOADS

pytestmark = pytest.mark.skipif("fashion_mnist" not in WORKLOADS, reason="the fashion_mnist workload is not registered")

STUDIES = Path(__file__).resolve().parents[2] / "studies"
FILE = str(STUDIES / "fmnist_equal_compute.py")
SMALL_CNN_STEP_S = 0.009  # bench/fmnist_epoch_cost.py: small_cnn, one pass of 128, one thread


@pytest.fixture(scope="module")
def scales():
    return {scale: load_studies(FILE, scale)[0] for scale in ("cpu", "cpu-replicate", "smoke")}


def test_cpu_scale_is_fmnist_flatness_at_equal_passes(scales):
    module = load_module(FILE)
    (flat,) = load_studies(str(STUDIES / "fmnist_flatness.py"), "cpu")
    cpu = scales["cpu"]
    assert module.SCALES == ("cpu", "cpu-replicate", "smoke") and cpu.name == "fmnist_equal_compute"
    rep = scales["cpu-replicate"]  # the same design at fmnist_flatness's second study seed and final seeds
    assert (rep.name, rep.seed, rep.final_seeds) == ("fmnist_equal_compute_replicate", 7, (21, 22))
    assert (rep.arms, rep.budget, rep.train, rep.tunings) == (cpu.arms, cpu.budget, cpu.train, cpu.tunings)
    assert [a.name for a in cpu.arms] == ["sgd", "sam", "tsam", "sgd_ire", "adamw", "adamw_ire"]
    assert cpu.budget == Budget(passes=20 * 94) and cpu.budget.passes == 1880  # 12,000 / 128 = 94 steps an epoch
    assert cpu.target_metric == module.TARGET_ACCURACY == 0.87  # every final run of sgd and adamw reached it
    same = ("workload", "workload_params", "metric", "mode", "measures", "measure_examples", "final_seeds", "tunings")
    assert all(getattr(cpu, f) == getattr(flat, f) for f in same)
    assert cpu.train == flat.train and cpu.num_trials == flat.num_trials
    for arm in cpu.arms:
        assert arm.space == load_module(str(STUDIES / "fmnist_flatness.py")).ARMS[arm.name].space
    for s in scales.values():
        plan(s)


def test_each_arms_epochs_are_the_hand_counts_of_its_cost_per_step(scales):
    study = with_arm_epochs(scales["cpu"], 12000)
    # SGD/AdamW: 1 pass a step, 1880 steps = 20 epochs; SAM 2: 940 steps = 10; TSAM 2s = 6: 313 steps = 4 (3.3);
    # IRE: one more backward every K = 10 steps from the switch-on, 1726 steps = 19 epochs (18.4)
    assert dict(study.budget.arm_epochs) == {
        "sgd": 20,
        "sam": 10,
        "tsam": 4,
        "sgd_ire": 19,
        "adamw": 20,
        "adamw_ire": 19,
    }
    assert study.max_epochs == 20
    assert study.grace_of("sam") == 3 and study.grace_of("tsam") == 1  # a third of each arm's budget


def test_cpu_scale_fits_ninety_minutes_on_two_cores(scales):
    cpu = scales["cpu"]
    budget_s = cpu.budget.passes * SMALL_CNN_STEP_S  # one trial's training, any arm: 17 s
    asha = 1 / 3 + (2 / 3 - 1 / 3) / 2 + (1 - 2 / 3) / 4  # every trial to 1/3, half to 2/3, a quarter to the end
    assert asha == pytest.approx(0.583, abs=1e-3)
    budgets = len(cpu.arms) * (cpu.num_trials * asha + len(cpu.final_seeds))
    overhead = len(cpu.arms) * (cpu.num_trials + len(cpu.final_seeds)) * 7  # start, evaluate, measure, log a trial
    tuning_s = budgets * budget_s + overhead
    assert tuning_s == pytest.approx(690, rel=0.03)  # the docstring's "about 690 core-seconds"
    assert cpu.tunings * tuning_s / 2 <= 0.5 * 90 * 60  # half the budget: load doubles the time


@pytest.mark.integration
@pytest.mark.slow
def test_smoke_scale_runs_at_equal_passes_and_compare_answers_at_equal_compute(scales, smoke_root):
    from flatlab.study.runner import RunOptions, run_study
    from flatlab.tracking.trials import trials_frame

    study = scales["smoke"]
    outcome = run_study(study, RunOptions(root=smoke_root, num_cpus=2, source=FILE, log_models=False))
    assert not outcome.interrupted and outcome.num_errors == 0
    df = trials_frame(outcome.tracking_uri, study.name)
    final = df[df["stage"] == "final"]
    assert sorted(final["arm"]) == ["sam", "sam", "sgd", "sgd"]
    for _, row in final.iterrows():
        per_step = {"sgd": 1, "sam": 2}[row["arm"]]
        assert study.budget.passes - per_step < row["compute_total/passes"] <= study.budget.passes
    assert dict(zip(final["arm"], final["epochs"])) == {
        "sgd": 4,
        "sam": 2,
    }  # 960 rows / 32: 96 steps = 3.2 epochs, 48 = 1.6
    env = {"MLFLOW_TRACKING_URI": outcome.tracking_uri, "COLUMNS": "200"}
    runner = CliRunner()
    out = runner.invoke(app, ["compare", study.name, "--time-to-target", "--format", "csv"], env=env)
    assert out.exit_code == 0, out.output
    rows = pd.read_csv(io.StringIO(out.output)).set_index("arm")
    assert set(rows.index) == {"sgd", "sam"} and math.isfinite(rows.loc["sgd", "passes"])
    assert rows.loc["sgd", "passes"] <= study.budget.passes
    out = runner.invoke(app, ["compare", study.name, "--at-equal", "passes"], env=env)
    assert out.exit_code == 0, out.output
    assert "passes" in out.output and "sam" in out.output
