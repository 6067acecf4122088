"""``studies/deepobs_fmnist.py`` builds at both scales (what ``flatlab run --dry-run`` validates) and
re-runs exactly the settings of its published reference (``studies/published/deepobs_fmnist_2c2d.json``).

Needs the ``fashion_mnist`` workload (issue 22, items 1-2); skipped where it is not registered yet.
"""

from pathlib import Path

import pytest

from flatlab.analysis.curve_sets import load_curves
from flatlab.errors import ConfigError
from flatlab.study.loader import load_studies
from flatlab.study.plan import plan
from flatlab.workloads.registry import WORKLOADS

pytestmark = pytest.mark.skipif("fashion_mnist" not in WORKLOADS, reason="the fashion_mnist workload is not registered")

REPO = Path(__file__).resolve().parents[2]
FILE = str(REPO / "studies" / "deepobs_fmnist.py")
REFERENCE = REPO / "studies" / "published" / "deepobs_fmnist_2c2d.json"


@pytest.fixture(scope="module")
def scales():
    return {scale: load_studies(FILE, scale)[0] for scale in ("paper", "cpu")}


def test_both_scales_build_and_declare_the_reference(scales):
    for s in scales.values():
        assert s.published.path == str(REFERENCE)
        assert s.published.arms == {
            "sgd": "fmnist_2c2d/sgd",
            "momentum": "fmnist_2c2d/momentum",
            "adam": "fmnist_2c2d/adam",
        }
        assert plan(s)["published"]["path"] == str(REFERENCE)
        assert s.workload == "fashion_mnist" and s.workload_params == {"model": "2c2d", "val_size": 0}
        assert s.train == {"batch_size": 128, "schedule": "constant", "test_every_epoch": True}
        assert s.searcher == "grid" and s.scheduler == "fifo" and not s.final_seeds
        assert s.num_total_trials() == 3 * len(s.seeds)  # one fixed configuration per arm, every seed
    assert scales["paper"].name == "deepobs_fmnist_2c2d" and scales["cpu"].name == "deepobs_fmnist_2c2d_cpu"
    with pytest.raises(ConfigError, match=r"scale='huge' is not defined; valid scales: paper, cpu"):
        load_studies(FILE, "huge")


def test_each_arm_runs_its_curves_published_settings(scales):
    curves = load_curves(str(REFERENCE))
    for s in scales.values():
        for arm, curve in s.published.arms.items():
            published = curves.curves[curve].meta["settings"]
            c = s.arm(arm).constants()
            assert c["lr"] == published["learning_rate"], arm
            assert c["weight_decay"] == 0.0 and published["weight_decay"] is None
            assert s.train["batch_size"] == published["batch_size"] and published["lr_sched_epochs"] is None
            hp = published["hyperparams"]
            if arm == "sgd":
                assert s.arm(arm).optimizer == "sgd" and c["momentum"] == 0.0 and hp == {}
            elif arm == "momentum":
                assert s.arm(arm).optimizer == "sgd" and (c["momentum"], c["nesterov"]) == (
                    hp["momentum"],
                    hp["use_nesterov"],
                )
            else:
                assert s.arm(arm).optimizer == "adamw"
                assert (c["beta1"], c["beta2"], c["eps"]) == (hp["beta1"], hp["beta2"], hp["epsilon"])
    paper = scales["paper"]
    assert paper.max_epochs == 100 == curves.curves["fmnist_2c2d/sgd"].meta["settings"]["num_epochs"]
    published_seeds = {r.seed for c in curves.curves.values() for r in c.runs}
    assert set(paper.seeds) == published_seeds == {45, 47, 50}


def test_the_cpu_scale_is_small(scales):
    cpu = scales["cpu"]
    assert cpu.resources.gpu == 0 and cpu.resources.cpu == 1 and cpu.max_concurrent == 2
    assert cpu.max_epochs <= 2 and cpu.seeds == (45, 47)
    assert cpu.num_total_trials() * cpu.max_epochs <= 12  # trial-epochs of 469 steps each
