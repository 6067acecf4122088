"""``studies/fmnist_flatness.py`` builds and validates at every scale (what ``flatlab run --dry-run`` checks),
its scales share their arms and measures and differ only in size, the ``cpu`` scale (3 tunings) fits its
90-minute budget by the module's own sizing arithmetic, and the ``smoke`` scale runs end to end: flatness at the
training-loss target (``flat_at_target/*``) and at the end (``flat/*``), reported by ``flatlab compare``."""

import math
from pathlib import Path

import pytest

from flatlab.errors import ConfigError
from flatlab.study.loader import load_module, load_studies
from flatlab.study.plan import plan
from flatlab.workloads.registry import WORKLOADS

pytestmark = pytest.mark.skipif("fashion_mnist" not in WORKLOADS, reason="the fashion_mnist workload is not registered")

FILE = str(Path(__file__).resolve().parents[2] / "studies" / "fmnist_flatness.py")
ARMS = ["sgd", "sam", "asam", "tsam", "sgd_ire", "sam_ire", "adamw", "adamw_ire"]
# forward/backward passes per step relative to SGD (ALGORITHMS.md: SAM/ASAM 2, TSAM 2s, IRE ~1.1x its base)
PASSES = {
    "sgd": 1.0,
    "sam": 2.0,
    "asam": 2.0,
    "tsam": 6.0,
    "sgd_ire": 1.1,
    "sam_ire": 2.1,
    "adamw": 1.0,
    "adamw_ire": 1.1,
}
SMALL_CNN_STEP_S = 0.009  # bench/fmnist_epoch_cost.py, small_cnn, batch 128, one thread


@pytest.fixture(scope="module")
def scales():
    out = {}
    for scale in ("paper", "cpu", "cpu-replicate", "smoke"):
        (study,) = load_studies(FILE, scale)
        out[scale] = study
    return out


def test_scales_names_and_what_they_share(scales):
    module = load_module(FILE)
    assert module.SCALES == (
        "cpu",
        "cpu-replicate",
        "paper",
        "smoke",
    )  # the default runs here: `flatlab run studies/fmnist_flatness.py`
    assert {k: s.name for k, s in scales.items()} == {
        "paper": "fmnist_flatness_paper",
        "cpu": "fmnist_flatness",
        "cpu-replicate": "fmnist_flatness_replicate",
        "smoke": "fmnist_flatness_smoke",
    }
    paper, cpu, smoke = scales["paper"], scales["cpu"], scales["smoke"]
    rep = scales["cpu-replicate"]  # the same design at another study seed and other final seeds
    assert (rep.seed, rep.final_seeds) == (module.REPLICATE_SEED, module.REPLICATE_SEEDS) != (cpu.seed, cpu.final_seeds)
    assert (rep.workload_params, rep.train, rep.tunings, rep.num_trials) == (
        cpu.workload_params,
        cpu.train,
        cpu.tunings,
        cpu.num_trials,
    )
    assert [a.name for a in paper.arms] == ARMS
    assert [a.name for a in cpu.arms] == ["sgd", "sam", "tsam"] == list(module.CPU_ARMS)
    assert [a.name for a in smoke.arms] == ["sgd", "sam_ire"]
    for s in scales.values():
        plan(s)  # what --dry-run prints: every arm's space resolves
        assert s.workload == "fashion_mnist" and s.metric == "val/accuracy" and s.mode == "max"
        assert s.searcher == "optuna" and s.scheduler == "asha" and len(s.final_seeds) >= 2
        assert set(s.measures) == {"fisher_trace", "neighbourhood_loss"}
        assert s.measures["neighbourhood_loss"]["sigma"] == module.SIGMA
        assert "stop_at_train_loss" not in s.train  # it measures at the target and trains on to max_epochs
        for arm in s.arms:  # the same space at every scale: only the sizes differ
            assert arm.space == module.ARMS[arm.name].space
    assert paper.train["measure_at_train_loss"] == module.PAPER_TARGET_LOSS
    assert cpu.train["measure_at_train_loss"] == module.TARGET_LOSS == 0.35
    assert smoke.train["measure_at_train_loss"] == module.SMOKE_TARGET_LOSS < math.log(10)  # below the untrained loss
    with pytest.raises(
        ConfigError, match=r"scale='huge' is not defined; valid scales: cpu, cpu-replicate, paper, smoke"
    ):
        load_studies(FILE, "huge")


def test_paper_scale_is_deepobs_2c2d_on_a_gpu(scales):
    paper = scales["paper"]
    assert paper.workload_params == {"model": "2c2d"}  # DeepOBS's 50,000 / 10,000 split is the workload default
    assert paper.train["batch_size"] == 128 and paper.max_epochs == 100
    assert paper.resources.gpu == 1 and paper.max_concurrent is None
    assert len(paper.final_seeds) == 10 and paper.num_trials > scales["cpu"].num_trials and paper.grace_period == 10


def test_cpu_scale_is_the_nested_design_and_fits_two_launches_in_ninety_minutes(scales):
    cpu = scales["cpu"]
    assert cpu.workload_params == {"model": "small_cnn", "train_size": 12000, "val_size": 5000}
    assert cpu.resources.gpu == 0 and cpu.resources.cpu == 1 and cpu.max_concurrent == 2
    # docs/comparing.md: power comes from the tunings; m = 2 final seeds (the allocation, and the within-tuning noise
    # the heterogeneity test needs)
    assert cpu.tunings >= 6 and len(cpu.final_seeds) == 2 and cpu.num_trials >= 4
    steps = math.ceil(cpu.workload_params["train_size"] / cpu.train["batch_size"])  # 94 a epoch
    epoch_s = sum(PASSES[a.name] * steps * SMALL_CNN_STEP_S + 0.1 for a in cpu.arms)  # + 5,000 val images
    rungs = [3, 6]  # ASHA halving from grace 3: every trial to 3, half to 6, a quarter to 10
    asha_epochs = rungs[0] + sum((b - a) / 2 ** (i + 1) for i, (a, b) in enumerate(zip(rungs, rungs[1:] + [10])))
    assert asha_epochs == pytest.approx(5.5)
    per_trial = len(cpu.arms) * (cpu.num_trials + len(cpu.final_seeds))
    tuning = (cpu.num_trials * asha_epochs + len(cpu.final_seeds) * cpu.max_epochs) * epoch_s + 4 * per_trial
    assert cpu.tunings * tuning / 2 == pytest.approx(1213, rel=0.01)  # the docstring's "about 20 minutes"
    assert 2 * cpu.tunings * tuning / 2 <= 0.5 * 90 * 60  # two launches in half the budget: load doubles the time


def test_smoke_scale_is_tiny_and_offline(scales):
    smoke = scales["smoke"]
    assert smoke.workload_params["data_path"] == "synthetic" and smoke.resources.gpu == 0
    assert smoke.max_epochs <= 3 and smoke.num_total_trials() + len(smoke.arms) * len(smoke.final_seeds) <= 8
    ire = smoke.arm("sam_ire").constants()
    assert ire["switch_epoch"] < smoke.max_epochs  # IRE switches on inside the smoke run


@pytest.mark.integration
@pytest.mark.slow
def test_smoke_scale_runs_and_compare_reports_both_flatness_sets(scales, smoke_root):
    """Ray Tune end to end: 4 search and 4 final trials; each completed trial's ``flat/*`` (final model) and,
    where it reached the target, ``flat_at_target/*`` at the first epoch whose logged training loss was
    below it; ``compare_table`` reports the at-target rows with the misses counted as seeds run."""
    from flatlab.analysis.compare import compare_table
    from flatlab.study.runner import RunOptions, run_study
    from flatlab.tracking import runs
    from flatlab.tracking.trials import trials_frame

    study = scales["smoke"]
    target = study.train["measure_at_train_loss"]
    outcome = run_study(study, RunOptions(root=smoke_root, num_cpus=2, source=FILE, log_models=False))
    assert not outcome.interrupted and outcome.num_errors == 0
    df = trials_frame(outcome.tracking_uri, study.name)
    assert df.attrs["measure_at_train_loss"] == str(target)
    assert sorted(df["stage"].value_counts().items()) == [("final", 4), ("search", 4)]
    client = runs.client(outcome.tracking_uri)
    done = df[df["outcome"] == "completed"]
    assert (done[done["stage"] == "final"]["epochs"] == study.max_epochs).all()
    for _, row in done.iterrows():
        assert math.isfinite(row["flat/fisher_trace"]) and math.isfinite(row["flat/neighbourhood_loss"])
        losses = sorted((m.step, m.value) for m in client.get_metric_history(row["run_id"], "train/loss"))
        first = next((e for e, v in losses if v <= target), None)
        if first is None:
            assert row["train/target_reached"] == 0 and math.isnan(row["flat_at_target/fisher_trace"])
        else:
            assert row["train/target_reached"] == 1 and row["train/epochs_to_target"] == first
            assert math.isfinite(row["flat_at_target/fisher_trace"]) and math.isfinite(
                row["flat_at_target/neighbourhood_loss"]
            )
    final = done[done["stage"] == "final"]
    assert final["train/target_reached"].sum() >= 1  # the smoke target is reached by a tuned configuration
    c = compare_table(df)
    assert c.reference == "sgd" and c.source == "final"
    assert {"flat/fisher_trace", "flat_at_target/fisher_trace", "train/epochs_to_target"} <= set(c.quantities)
    for arm in ("sgd", "sam_ire"):
        mine = final[final["arm"] == arm]
        at = c.row("flat_at_target/fisher_trace", arm)
        assert at.runs == 2 and at.summary.n == int(mine["train/target_reached"].sum())  # misses run, give no value
        assert c.row("flat/fisher_trace", arm).summary.n == len(mine)
        if at.summary.n:
            assert at.summary.mean == pytest.approx(
                mine.loc[mine["train/target_reached"] == 1, "flat_at_target/fisher_trace"].mean()
            )
