"""Every paper study file (``studies/ire_*.py``, ``studies/tsam_*.py``) loads and validates at both scales,
and its paper scale mirrors the paper's grid and settings (the TSAM and IRE papers)."""

from pathlib import Path

import pytest

from flatlab import Budget
from flatlab import space as sp
from flatlab.errors import ConfigError
from flatlab.optim import get_optimizer
from flatlab.study.loader import load_studies
from flatlab.study.trial_spec import with_arm_epochs

STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"
FILES = sorted(p.name for p in STUDIES_DIR.glob("*.py") if p.name.startswith(("ire_", "tsam_")))
EXPECTED_FILES = {
    "ire_fig2_wrn16_cifar10.py",
    "ire_table1_cnn_cifar.py",
    "ire_table3_vit_cifar100.py",
    "ire_fig3_transformer_wikitext2.py",
    "ire_fig4_llama.py",
    "tsam_table1_images.py",
    "tsam_glue.py",
    "tsam_table3_samples.py",
    "tsam_fig4_t_schedule.py",
    "ire_table2_resnet50_imagenet.py",
    "ire_table4_vit_imagenet.py",
    "tsam_fig2_flatness.py",
    "tsam_table2_objectives.py",
    "tsam_appc_sam_rho.py",
    "tsam_fig8_naive_sampling.py",
}
STEP_BUDGETS = {"ire_fig3_transformer_wikitext2.py", "ire_fig4_llama.py"}  # the IRE paper's LM budgets in steps
NO_OPTUNA = {
    "ire_fig4_llama.py",
    "tsam_table3_samples.py",
    "tsam_fig4_t_schedule.py",  # fixed comparisons / ablations
    "ire_table2_resnet50_imagenet.py",
    "ire_table4_vit_imagenet.py",
    "tsam_fig2_flatness.py",
    "tsam_table2_objectives.py",
    "tsam_appc_sam_rho.py",
    "tsam_fig8_naive_sampling.py",
}


def load(name, scale):
    return load_studies(str(STUDIES_DIR / name), scale)


def grid_values(study, arm, field):
    return list(study.arm(arm).dims[field].values)


def test_all_paper_study_files_exist():
    assert EXPECTED_FILES <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_file_loads_at_both_scales_and_smoke_is_small_and_offline(name):
    paper, smoke = load(name, "paper"), load(name, "smoke")
    assert paper and smoke
    assert all(s.searcher == "grid" for s in paper if not s.name.endswith("_optuna"))
    optuna = [s for s in paper if s.searcher == "optuna"]
    assert (len(optuna) == 1) == (name not in NO_OPTUNA)
    grids = [s for s in paper if s.searcher == "grid"]
    assert all(
        o.num_total_trials() < sum(g.num_total_trials() for g in grids) for o in optuna
    )  # smaller than the paper's grid
    for s in paper:
        assert s.resources.gpu >= 1
        assert "synthetic" not in str(s.workload_params.get("data_path"))
    # each scale has its own MLflow experiments: smoke runs never mix with paper runs
    assert all(s.name.endswith("_smoke") for s in smoke) and not any(s.name.endswith("_smoke") for s in paper)
    assert {s.name.removesuffix("_smoke") for s in smoke} <= {s.name for s in paper}
    for s in smoke:
        if name.startswith("tsam_") or name in STEP_BUDGETS:  # the papers' studies state their budget
            assert isinstance(s.budget, Budget), s.name
        if s.budget is not None and s.budget.unit in ("steps", "passes"):
            assert s.budget.amount <= 18, s.name  # a few steps (TSAM Table 1: TSAM's passes of one epoch)
        else:
            assert s.max_epochs <= 2
        assert s.resources.gpu == 0 and s.max_concurrent == 1
        assert s.workload_params.get("data_path") == "synthetic"
        assert s.num_total_trials() <= max(4, len(s.arms))  # one trial per arm at most, where arms are many
        twin = next(p for p in paper if p.name == s.name.removesuffix("_smoke"))
        assert [a.name for a in s.arms] == [a.name for a in twin.arms]  # same structure
    with pytest.raises(ConfigError, match=r"scale='huge' is not defined; valid scales: paper, smoke"):
        load(name, "huge")


def test_ire_fig2_grid():
    s = load("ire_fig2_wrn16_cifar10.py", "paper")[0]
    assert s.workload == "cifar10" and s.workload_params["model"] == "wrn16_8"
    assert [a.optimizer for a in s.arms] == ["sam", "sam_ire"]
    assert grid_values(s, "sam_ire", "gamma") == [0.8, 0.9, 0.95]
    assert grid_values(s, "sam_ire", "kappa") == [2, 5, 10]  # kappa = 0 is the sam arm, once per seed
    # panel (a): constant lr 0.1; panels (b)-(d): lr / 5 at epochs 20, 50 and 80
    assert grid_values(s, "sam_ire", "schedule") == grid_values(s, "sam", "schedule") == ["constant", "milestones"]
    assert s.train["milestones"] == [20, 50, 80] and s.train["step_factor"] == 0.2
    c = s.arm("sam_ire").constants()
    assert c["lr"] == 0.1 and c["switch_epoch"] == 30 and c["rho"] == 0.05 and c["momentum"] == 0.0
    assert s.max_epochs == 100 and s.arm("sam").constants() == {
        k: c[k] for k in ("rho", "momentum", "lr", "weight_decay")
    }
    assert s.seeds == (0, 1, 2) and s.num_total_trials() == (9 + 1) * 2 * 3
    assert s.measures == {"fisher_trace": {}} and s.measure_every == 5  # Tr(F) over training, the figure's curve


def test_ire_table1_grid():
    studies = {s.name: s for s in load("ire_table1_cnn_cifar.py", "paper")}
    for ds, rho, classes in (("cifar10", 0.05, 10), ("cifar100", 0.1, 100)):
        s = studies[f"ire_table1_cnn_{ds}"]
        assert [a.optimizer for a in s.arms] == ["sgd", "sgd_ire", "sam", "sam_ire"]
        assert grid_values(s, "sgd_ire", "gamma") == [0.99, 0.9, 0.8] and grid_values(s, "sam_ire", "kappa") == [1, 2]
        assert grid_values(s, "sgd", "model") == ["wrn28_10", "resnet56"]
        assert s.arm("sam").constants()["rho"] == rho
        # 0.1 above the label-smoothing floor (0.500 / 0.778 nats)
        assert s.arm("sgd_ire").constants()["switch_loss"] == pytest.approx({10: 0.600, 100: 0.878}[classes], abs=1e-3)
        assert s.train["batch_size"] == 128 and s.train["label_smoothing"] == 0.1 and s.seeds == (0, 1, 2)


def test_ire_table3_grid():
    s = load("ire_table3_vit_cifar100.py", "paper")[0]
    assert grid_values(s, "adamw_ire", "kappa") == [20, 50] and grid_values(s, "adamw", "model") == ["vit_t", "vit_s"]
    assert s.arm("adamw").constants()["lr"] == 1e-4 and s.workload_params["augment"] == "autoaugment"
    assert s.train["batch_size"] == 64
    # SAM and SAM-IRE over AdamW at the paper's lr 1e-4, as the adamw arms
    assert [a.optimizer for a in s.arms] == ["adamw", "adamw_ire", "sam_adamw", "sam_adamw_ire"]
    for arm in ("sam_adamw", "sam_adamw_ire"):
        c = s.arm(arm).constants()
        assert (c["lr"], c["weight_decay"], c["rho"]) == (1e-4, 5e-4, 0.1)
    assert grid_values(s, "sam_adamw_ire", "gamma") == [0.99, 0.9, 0.8]
    assert get_optimizer("sam_adamw").base == "adamw" and get_optimizer("sam_adamw_ire").base == "sam_adamw"
    optuna = load("ire_table3_vit_cifar100.py", "paper")[1]
    assert [a.optimizer for a in optuna.arms] == ["adamw", "adamw_ire", "sam_adamw", "sam_adamw_ire"]
    assert optuna.arm("sam_adamw").dims["lr"] == optuna.arm("adamw").dims["lr"]  # the same AdamW lr range


def test_ire_lm_studies():
    fig3 = load("ire_fig3_transformer_wikitext2.py", "paper")[0]
    assert fig3.workload == "lm/wikitext2" and fig3.metric == "val/loss" and fig3.mode == "min"
    assert grid_values(fig3, "adamw", "lr") == [1.5e-4, 3e-4, 6e-4, 1.2e-3, 1.8e-3, 3e-3]  # the paper's grid
    assert fig3.train["clip_norm"] == 1.0 and fig3.train["final_lr_factor"] == 0.05
    admire = load("ire_fig3_transformer_wikitext2.py", "paper")[1]  # chained: AdamW's best lr from the first study
    assert admire.name == "ire_fig3_transformer_wikitext2_admire" and [a.name for a in admire.arms] == [
        "adamw",
        "adamw_ire",
    ]
    for arm in ("adamw", "adamw_ire"):
        assert admire.arm(arm).dims["lr"] == sp.best_of("ire_fig3_transformer_wikitext2", arm="adamw", param="lr")
    assert grid_values(admire, "adamw_ire", "kappa") == [2, 5, 10] and admire.num_total_trials() == (1 + 9) * 3
    assert admire.reference_arm == "adamw"  # the speed-up, paired by seed
    assert load("ire_fig3_transformer_wikitext2.py", "paper")[2].reference_arm == "adamw"
    smoke_admire = load("ire_fig3_transformer_wikitext2.py", "smoke")[1]
    assert smoke_admire.arm("adamw").dims["lr"].study == "ire_fig3_transformer_wikitext2_smoke"
    fig4 = load("ire_fig4_llama.py", "paper")
    assert {(s.workload, s.workload_params["model"]) for s in fig4} == {
        ("lm/wikitext103", "llama_60m"),
        ("lm/minipile", "llama_119m"),
        ("lm/openwebtext", "llama_229m"),
    }
    assert len(fig4) == 3 * 2 * 2  # sizes x budgets x (lr grid, AdamW vs AdmIRE at its best lr)
    for grid, pair in zip(fig4[::2], fig4[1::2]):
        assert [a.optimizer for a in grid.arms] == ["adamw"] and grid_values(grid, "adamw", "lr") == [
            3e-4,
            6e-4,
            1.2e-3,
            1.8e-3,
        ]
        assert [a.optimizer for a in pair.arms] == ["adamw", "adamw_ire"] and pair.name == grid.name + "_admire"
        for arm in ("adamw", "adamw_ire"):
            assert pair.arm(arm).dims["lr"] == sp.best_of(grid.name, arm="adamw", param="lr")
        c = pair.arm("adamw").constants()
        assert (c["beta1"], c["beta2"], c["eps"], c["weight_decay"]) == (0.9, 0.95, 1e-16, 0.1)
        for s in (grid, pair):
            assert s.train["clip_norm"] == 1.0 and s.train["final_lr_factor"] == 0.05
            assert s.seeds == (0, 1, 2)  # a speed-up with an error bar, paired by seed
        assert pair.measures == {"hessian_trace": {"probes": 10}} and pair.measure_split == "train"  # Table 6: Tr(H)
    smoke = load("ire_fig4_llama.py", "smoke")
    for s in [*fig4[1::2], *smoke[1::2]]:  # the speed-up is measured against AdamW's final smoothed loss, per seed
        assert s.reference_arm == "adamw" and s.target_loss is None and "target_loss" not in s.workload_params


def test_tsam_table1_grid():
    studies = {s.name: s for s in load("tsam_table1_images.py", "paper")}
    datasets = ("cifar100", "dtd", "cifar100_noisy")
    assert set(studies) == {f"tsam_table1_{d}" for d in datasets} | {f"tsam_table1_{d}_matched" for d in datasets} | {
        "tsam_table1_optuna"
    }
    s, m = studies["tsam_table1_cifar100"], studies["tsam_table1_cifar100_matched"]
    assert [a.name for a in s.arms] == ["erm", "sam", "tsam"] and s.budget == Budget(epochs=200)  # equal epochs
    assert [(a.name, a.optimizer) for a in m.arms] == [
        ("esam1", "sam"),
        ("esam2", "esam2"),
        ("pgn", "pgn"),
        ("rsam", "rsam"),
    ]
    for arm in ("esam1", "esam2", "pgn", "rsam"):  # Appendix C's rho grid for SAM and its compute-matched variants
        assert grid_values(m, arm, "rho") == [0.05, 0.1, 0.5, 1, 5, 15]
    assert grid_values(s, "sam", "rho") == [0.05, 0.1, 0.5, 1, 5, 15] and m.arm("esam1").dims == s.arm("sam").dims
    assert grid_values(m, "pgn", "alpha") == [0.3, 0.5, 0.7, 0.9]
    assert m.arm("esam2").constants()["k"] == 5  # 6 passes a step: TSAM's 2s at s = 3
    assert grid_values(m, "rsam", "gamma") == [1, 2] and grid_values(m, "rsam", "noise_std") == [5e-4, 2.5e-3]
    # the compute-matched baselines at TSAM's passes per trial (s = 3): epochs x ceil(rows / 64) x 6, by hand
    hand = {"cifar100": 200 * 704 * 6, "dtd": 30 * 53 * 6, "cifar100_noisy": 200 * 704 * 6}  # 45,000 / 3,384 rows
    for d in datasets:
        matched, twin = studies[f"tsam_table1_{d}_matched"], studies[f"tsam_table1_{d}"]
        assert matched.budget == Budget(passes=hand[d]), d
        assert matched.workload_params == twin.workload_params and matched.train == twin.train
        # under that budget SAM (2 passes a step) trains 3x TSAM's epochs, ESAM2 (6) TSAM's epochs
        rows = (45_000, 3_384)[d == "dtd"]
        epochs = with_arm_epochs(matched, rows).budget.arm_epochs
        assert epochs == {
            "esam1": 3 * twin.max_epochs,
            "esam2": twin.max_epochs,
            "pgn": 3 * twin.max_epochs,
            "rsam": 3 * twin.max_epochs,
        }, d
    smoke = {s.name: s for s in load("tsam_table1_images.py", "smoke")}
    assert smoke["tsam_table1_cifar100_matched_smoke"].budget == Budget(passes=1 * 2 * 6)  # 32 rows of 16, s = 3
    assert smoke["tsam_table1_dtd_matched_smoke"].budget == Budget(passes=1 * 3 * 6)  # 47 rows of 16
    assert grid_values(s, "tsam", "t") == [0, 1, 5, 20, 100] and grid_values(s, "tsam", "rho") == [0.05, 0.1, 0.2]
    assert grid_values(s, "tsam", "s") == [3, 5] and grid_values(s, "erm", "lr") == [
        1e-4,
        3e-4,
        1e-3,
        3e-3,
        1e-2,
        3e-2,
        0.1,
    ]
    assert s.train == {"batch_size": 64, "schedule": "constant", "label_smoothing": 0.1, "test_every_epoch": True}
    for name in ("tsam_table1_cifar100", "tsam_table1_dtd", "tsam_table1_cifar100_noisy"):  # Figs. 3 and 7 per t
        assert studies[name].reports == {"curves_by": {"metrics": "test/accuracy,train/loss", "arm": "tsam", "by": "t"}}
    assert studies["tsam_table1_cifar100_noisy"].workload_params["label_noise"] == 0.2
    assert (
        studies["tsam_table1_dtd"].workload == "dtd"
        and studies["tsam_table1_dtd"].workload_params["pretrained"] is True
    )


def test_tsam_glue_and_ablations():
    glue = {s.name: s for s in load("tsam_glue.py", "paper")}
    assert glue["tsam_glue_cola"].metric == "val/matthews" and glue["tsam_glue_stsb"].metric == "val/pearson"
    assert glue["tsam_glue_mrpc"].metric == "val/f1" and glue["tsam_glue_rte"].metric == "val/accuracy"
    tasks = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")  # GLUE's nine, as the paper
    assert set(glue) == {f"tsam_glue_{t}" for t in tasks} | {"tsam_glue_optuna"}
    assert glue["tsam_glue_wnli"].workload == "glue/wnli" and glue["tsam_glue_wnli"].metric == "val/accuracy"
    for s in glue.values():
        assert s.train["batch_size"] == 64
    assert grid_values(glue["tsam_glue_rte"], "tsam", "s") == [3, 5] and glue["tsam_glue_rte"].num_total_trials() == 714
    samples = {s.name: s for s in load("tsam_table3_samples.py", "paper")}
    # Table 3 on the three settings of Table 1, each at the paper's best t there, lr and rho chained from it
    expected = {"cifar100": (20.0, "cifar100"), "dtd": (5.0, "dtd"), "cifar100_noisy": (1.0, "cifar100")}
    assert set(samples) == {f"tsam_table3_samples_{n}" for n in expected}
    for name, (t, workload) in expected.items():
        study = samples[f"tsam_table3_samples_{name}"]
        assert grid_values(study, "tsam", "s") == [3, 5] and study.workload == workload
        assert study.arm("tsam").constants()["t"] == t
        for field in ("lr", "rho"):
            assert study.arm("tsam").dims[field] == sp.best_of(f"tsam_table1_{name}", "tsam", field, where={"t": t})
    assert samples["tsam_table3_samples_cifar100_noisy"].workload_params["label_noise"] == 0.2
    sched = load("tsam_fig4_t_schedule.py", "paper")[0]
    assert grid_values(sched, "tsam", "t_schedule") == ["constant", "increase", "decrease"]
    # Fig. 4 on noisy CIFAR-100 at its best t = 1, lr and rho chained from Table 1's noisy grid
    assert sched.workload == "cifar100" and sched.workload_params == {"model": "resnet18", "label_noise": 0.2}
    assert sched.arm("tsam").constants()["t"] == 1.0
    for field in ("lr", "rho"):
        assert sched.arm("tsam").dims[field] == sp.best_of(
            "tsam_table1_cifar100_noisy", "tsam", field, where={"t": 1.0, "s": 3}
        )
    assert load("tsam_fig4_t_schedule.py", "smoke")[0].workload_params["label_noise"] == 0.2
    for name in ("tsam_table3_samples.py", "tsam_fig4_t_schedule.py"):  # smoke runs on its own: constants
        assert {s.arm("tsam").constants()["lr"] for s in load(name, "smoke")} == {0.03}


def test_ire_table2_grid():
    s = load("ire_table2_resnet50_imagenet.py", "paper")[0]
    assert s.workload == "imagenet" and s.workload_params["model"] == "resnet50"
    assert [a.optimizer for a in s.arms] == ["sgd", "sgd_ire", "sam", "sam_ire"]
    for arm in ("sgd_ire", "sam_ire"):
        assert grid_values(s, arm, "gamma") == [0.8, 0.6] and grid_values(s, arm, "kappa") == [2, 4]
        assert s.arm(arm).constants()["switch_loss"] == 1.5  # the paper's threshold, above smoothing's floor
    # the appendix recipe: lr 0.2, batch 1024, label smoothing 0.1, 200 epochs
    assert {s.arm(a).constants()["lr"] for a in ("sgd", "sgd_ire", "sam", "sam_ire")} == {0.2}
    assert s.train["batch_size"] == 1024 and s.train["label_smoothing"] == 0.1 and s.max_epochs == 200
    assert s.train["micro_batch_size"] == 256  # accumulation: the same update as one batch of 1024
    assert s.seeds == (0, 1, 2) and s.num_total_trials() == 30
    smoke = load("ire_table2_resnet50_imagenet.py", "smoke")[0]
    assert smoke.name == "ire_table2_resnet50_imagenet_smoke" and smoke.resources.gpu == 0


def test_ire_table4_vit_s16_imagenet_adamw_against_admire_with_randaugment_and_mixup():
    s = load("ire_table4_vit_imagenet.py", "paper")[0]
    assert [(a.name, a.optimizer) for a in s.arms] == [("adamw", "adamw"), ("adamw_ire", "adamw_ire")]
    assert s.workload == "imagenet" and s.workload_params["model"] == "vit_small_patch16_224"
    wp = s.workload_params
    assert (wp["augment"], wp["randaug_ops"], wp["randaug_magnitude"], wp["mixup_alpha"]) == ("randaug", 2, 10, 0.2)
    assert s.arm("adamw_ire").constants()["switch_loss"] == 1.5  # the paper's ImageNet threshold
    assert grid_values(s, "adamw_ire", "gamma") == [0.99, 0.9, 0.8] and grid_values(s, "adamw_ire", "kappa") == [20, 50]
    assert s.train["batch_size"] == 1024 and s.train["micro_batch_size"] == 256 and s.max_epochs == 90
    assert s.seeds == (0, 1, 2) and s.num_total_trials() == 21
    smoke = load("ire_table4_vit_imagenet.py", "smoke")[0]
    assert smoke.workload_params["model"] == "test_vit" and smoke.workload_params["data_path"] == "synthetic"
    assert smoke.workload_params["mixup_alpha"] == 0.2 and smoke.resources.gpu == 0


def test_tsam_fig2_sweeps_sigma_for_erm_sam_and_tsam():
    s = load("tsam_fig2_flatness.py", "paper")[0]
    assert [(a.name, a.optimizer) for a in s.arms] == [("erm", "sgd"), ("sam", "sam"), ("tsam", "tsam")]
    assert s.arm("tsam").constants()["t"] == 20  # the paper's best t on CIFAR-100 / ResNet-18
    # each arm at its tuned best in Table 1's CIFAR-100 grid (chained), TSAM's among the trials at t = 20
    src = "tsam_table1_cifar100"
    assert s.arm("erm").dims["lr"] == sp.best_of(src, "erm", "lr")
    assert [s.arm("sam").dims[p] for p in ("lr", "rho")] == [sp.best_of(src, "sam", p) for p in ("lr", "rho")]
    assert [s.arm("tsam").dims[p] for p in ("lr", "rho", "s")] == [
        sp.best_of(src, "tsam", p, where={"t": 20.0}) for p in ("lr", "rho", "s")
    ]
    nl = s.measures["neighbourhood_loss"]
    assert list(nl["sigmas"]) == sorted(nl["sigmas"]) and len(nl["sigmas"]) >= 5 and s.measure_split == "train"
    assert s.workload == "cifar100" and s.seeds == (0, 1, 2)
    assert load("tsam_fig2_flatness.py", "smoke")[0].name == "tsam_fig2_flatness_smoke"


def test_tsam_table2_crosses_three_models_with_three_objectives_on_train_and_test():
    s = load("tsam_table2_objectives.py", "paper")[0]
    assert [a.name for a in s.arms] == ["erm", "sam", "tsam"] and s.seeds == (0, 1, 2)
    assert list(s.measures) == ["erm_objective", "sam_objective", "tilted_objective"]
    # each arm at its tuned best in Table 1's CIFAR-100 grid (chained), TSAM's among the trials at t = 20, s = 3
    src, at = "tsam_table1_cifar100", {"t": 20.0, "s": 3}
    assert s.arm("erm").dims["lr"] == sp.best_of(src, "erm", "lr")
    assert [s.arm("sam").dims[p] for p in ("lr", "rho")] == [sp.best_of(src, "sam", p) for p in ("lr", "rho")]
    assert [s.arm("tsam").dims[p] for p in ("lr", "rho")] == [
        sp.best_of(src, "tsam", p, where=at) for p in ("lr", "rho")
    ]
    assert {k: s.arm("tsam").constants()[k] for k in ("t", "s")} == at
    # every model scored on the same objectives: one rho for all rows, TSAM's t and s
    assert s.measures["tilted_objective"] == {"t": 20.0, "s": 3, "rho": 0.1}
    assert s.measures["sam_objective"]["rho"] == 0.1
    assert s.measure_split == "train" and s.measure_extra_splits == ("test",) and s.measure_examples == 0
    assert s.reports == {"objectives": {"split": "train", "extra": "test"}}
    assert s.train == {"batch_size": 64, "schedule": "constant", "label_smoothing": 0.1}
    smoke = load("tsam_table2_objectives.py", "smoke")[0]
    assert smoke.arm("sam").constants()["lr"] == 0.01 and smoke.arm("tsam").constants()["rho"] == 0.1  # runs alone


def test_tsam_appendix_c_sam_rho_grid():
    s = load("tsam_appc_sam_rho.py", "paper")[0]
    assert [a.optimizer for a in s.arms] == ["sam"] and grid_values(s, "sam", "rho") == [0.05, 0.1, 0.5, 1, 5, 15]
    assert s.arm("sam").dims["lr"] == sp.best_of("tsam_table1_cifar100", "sam", "lr") and s.num_total_trials() == 18
    assert s.train == {"batch_size": 64, "schedule": "constant", "label_smoothing": 0.1}


def test_tsam_fig8_naive_uniform_sampling_up_to_s_10():
    s = load("tsam_fig8_naive_sampling.py", "paper")[0]
    assert [(a.name, a.optimizer) for a in s.arms] == [("tsam", "tsam"), ("naive", "tsam")]
    naive = s.arm("naive").constants()
    # no ascent step, each perturbation uniform in the ball of TSAM's tuned rho
    assert (naive["rho"], naive["noise"], naive["t"]) == (0.0, "uniform", 20.0)
    assert s.arm("naive").dims["noise_radius"] == sp.best_of("tsam_table1_cifar100", "tsam", "rho", where={"t": 20.0})
    assert grid_values(s, "naive", "s") == [3, 5, 10] and s.train["test_every_epoch"] is True
    assert s.reports["curves_by"] == {"metrics": "test/accuracy,train/loss", "arm": "naive", "by": "s"}
