"""``studies/fmnist_tuning_curves.py``: a random-search pool (every trial to the end, flatness in each) that
fits its 60-minute budget by the module's own arithmetic, and whose ``smoke`` scale runs end to end, after
which ``flatlab compare --tuning-curves`` and ``--correlation`` draw its curves and print Kendall's tau."""

import math
from pathlib import Path

import pytest

from flatlab.study.loader import load_module, load_studies
from flatlab.workloads.registry import WORKLOADS
from flatlab_testing import flatlab

pytestmark = pytest.mark.skipif("fashion_mnist" not in WORKLOADS, reason="the fashion_mnist workload is not registered")

FILE = str(Path(__file__).resolve().parents[2] / "studies" / "fmnist_tuning_curves.py")
PASSES = {"sgd": 1.0, "sam": 2.0, "sgd_ire": 1.1}  # forward/backward passes per step relative to SGD
SMALL_CNN_STEP_S = 0.009  # bench/fmnist_epoch_cost.py, small_cnn, batch 128, one thread


def test_cpu_scale_is_an_iid_pool_that_fits_an_hour():
    module = load_module(FILE)
    (cpu,) = load_studies(FILE, "cpu")
    assert module.SCALES == ("cpu", "smoke") and cpu.name == "fmnist_tuning_curves"
    assert [a.name for a in cpu.arms] == ["sgd", "sam", "sgd_ire"]
    assert cpu.searcher == "random" and cpu.scheduler == "fifo" and cpu.final_seeds == ()
    assert set(cpu.measures) == {"fisher_trace", "neighbourhood_loss"} and cpu.num_trials >= 20
    steps = math.ceil(cpu.workload_params["train_size"] / cpu.train["batch_size"])
    train = sum(PASSES[a.name] * steps * SMALL_CNN_STEP_S + 0.1 for a in cpu.arms) * cpu.max_epochs * cpu.num_trials
    overhead = 8 * len(cpu.arms) * cpu.num_trials  # measure, evaluate, start and log each trial
    assert (train + overhead) == pytest.approx(2300, rel=0.03)  # the docstring's core-seconds
    assert (train + overhead) / 2 <= 0.75 * 60 * 60


@pytest.mark.integration
@pytest.mark.slow
def test_smoke_pool_runs_and_compare_draws_its_tuning_curves(tmp_path):
    root = tmp_path / "root"
    run = flatlab("run", FILE, "--scale", "smoke", "--root", str(root), "--num-cpus", "2", timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp_path / "out"
    curves = flatlab(
        "compare", "fmnist_tuning_curves_smoke", "--root", str(root), "--tuning-curves", "--output", str(out)
    )
    assert curves.returncode == 0, curves.stderr
    assert "val/accuracy" in curves.stdout and "p_beats_sgd" in curves.stdout
    written = sorted(p.name for p in (out / "tuning_curves").iterdir())
    assert "tuning_curve_flat_fisher_trace.png" in written and "tuning_curve_val_accuracy.csv" in written
    corr = flatlab(
        "compare", "fmnist_tuning_curves_smoke", "--root", str(root), "--correlation", "--format", "markdown"
    )
    assert corr.returncode == 0, corr.stderr
    assert "Kendall τ" in corr.stdout and "flat/fisher_trace" in corr.stdout and "all arms" in corr.stdout
