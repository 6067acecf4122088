"""``Study(tunings=2)`` on digits end to end, its driver killed with SIGKILL mid-search and resumed: each arm
is tuned twice (two Optuna studies with different sampler seeds, each tuning's own seeds), each tuning's best
configuration re-runs on that tuning's final seeds, every run carries its tuning, and in the end MLflow holds
exactly ``tunings x num_trials`` search trials per arm and none RUNNING. Then ``flatlab compare`` takes the
tuning as its unit of replication, and refuses tuning curves for this TPE/ASHA search."""

import csv
import io
import json
import subprocess

import pytest

from flatlab.study.tunings import tuning_seed
from flatlab.tracking import runs
from flatlab_testing import BIN, env, flatlab, write_study
from test_driver_kill import launch_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARMS, TUNINGS, N, EPOCHS, FINAL = ("sgd", "adamw"), 2, 3, 3, (1, 2)
TRIALS = f"tags.`{runs.TAG_ROLE}` = 'trial'"


def trial_runs(root):
    try:
        c = runs.client(runs.default_tracking_uri(root))
        exp = c.get_experiment_by_name("twotunings")
        return c.search_runs([exp.experiment_id], filter_string=TRIALS, max_results=1000) if exp else []
    except Exception:  # the store is being created
        return []


def mid_search(root):
    """Some search trials finished and one is running: a kill here leaves work in every state."""
    rs = trial_runs(root)
    return sum(r.info.status == "FINISHED" for r in rs) >= 3 and any(r.info.status == "RUNNING" for r in rs)


def test_two_tunings_killed_and_resumed_then_compared_over_tunings(tmp_path):
    import optuna

    study = write_study(
        tmp_path / "two.py",
        f"""
import time

from flatlab.workloads.digits import Digits
from flatlab.workloads.registry import register_workload


@register_workload
class SlowDigits(Digits):
    \"\"\"Digits whose evaluations take 0.2 s more, so a kill mid-search finds trials running.\"\"\"

    name = "slow_digits_tunings"

    def evaluate(self, model, split, batch_size=512):
        time.sleep(0.2)
        return super().evaluate(model, split, batch_size)


STUDY = Study(
    name="twotunings",
    workload="slow_digits_tunings",
    workload_params={{"width": 16}},
    arms=(
        Arm("sgd", space={{"lr": sp.loguniform(0.02, 0.3)}}),
        Arm("adamw", space={{"lr": sp.loguniform(1e-3, 1e-2)}}),
    ),
    num_trials={N},
    max_epochs={EPOCHS},
    grace_period=1,
    final_seeds={FINAL},
    tunings={TUNINGS},
    measures={{"fisher_trace": {{"samples": 32}}}},
    measure_examples=64,
    max_concurrent=2,
)
""",
    )
    root = tmp_path / "root"
    cmd = [str(BIN / "flatlab"), "run", str(study), "--root", str(root), "--num-cpus", "2"]
    launch_until(cmd, root, mid_search, "finished and running search trials")
    res = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=env(), timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]

    rs = trial_runs(root)
    assert all(r.info.status == "FINISHED" for r in rs), [(r.info.run_name, r.info.status) for r in rs]
    for arm in ARMS:
        for k in range(1, TUNINGS + 1):
            mine = [r for r in rs if r.data.tags[runs.TAG_ARM] == arm and r.data.tags[runs.TAG_TUNING] == str(k)]
            search = [r for r in mine if r.data.tags[runs.TAG_STAGE] == "search"]
            final = [r for r in mine if r.data.tags[runs.TAG_STAGE] == "final"]
            assert len(search) == N, (arm, k, [r.info.run_name for r in search])  # nothing lost, nothing twice
            assert sorted(int(r.data.tags[runs.TAG_SEED]) for r in final) == [tuning_seed(s, k) for s in FINAL]
            assert all(f" · t{k} · " in r.info.run_name for r in mine)
            assert {int(r.data.tags[runs.TAG_SEED]) for r in search} == {tuning_seed(0, k)}  # its own trial seeds
            done = [r for r in search if r.data.tags.get(runs.TAG_OUTCOME) == "completed"]
            best = max(done, key=lambda r: r.data.metrics["val/accuracy"])
            assert {r.data.params["lr"] for r in final} == {best.data.params["lr"]}  # its own best configuration

    launch = json.loads((root / "twotunings" / "launch.json").read_text())
    storage = f"sqlite:///{root / 'twotunings' / 'optuna.db'}"
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    prefix = launch["optuna_prefix"]
    assert names == {f"{prefix}.{a}" for a in ARMS} | {f"{prefix}.{a}@2" for a in ARMS}
    first = [optuna.load_study(study_name=f"{prefix}.sgd{s}", storage=storage).trials for s in ("", "@2")]
    assert all(len(t) == N for t in first)
    assert first[0][0].params["lr"] != first[1][0].params["lr"]  # different sampler seeds, different draws

    out = flatlab("compare", "twotunings", "--root", str(root), "--format", "markdown")
    assert out.returncode == 0, out.stderr
    assert "Shown over 2 tunings (p Holm < 0.05)" in out.stdout and "per tuning" in out.stdout
    assert "heterogeneity" in out.stdout and "| m |" in out.stdout
    margin = flatlab("compare", "twotunings", "--root", str(root), "--format", "csv", "--margin", "test/accuracy=0.5")
    assert margin.returncode == 0, margin.stderr
    rows = list(csv.DictReader(io.StringIO(margin.stdout)))
    acc = [r for r in rows if r["quantity"] == "test/accuracy" and r["label"]]
    assert acc and all(float(r["margin"]) == 0.5 and r["margin_source"] == "given" for r in acc)
    design = flatlab("compare", "twotunings", "--root", str(root), "--design", "--format", "markdown")
    assert design.returncode == 0, design.stderr
    assert "design of the comparison against" in design.stdout and "2 × " in design.stdout
    bad = flatlab("compare", "twotunings", "--root", str(root), "--margin", "test/accuracy=-1")
    assert bad.returncode == 2 and "expected QUANTITY=NUMBER with a positive number" in bad.stderr
    one = flatlab("compare", "twotunings", "--root", str(root), "--tuning", "2", "--format", "csv")
    assert one.returncode == 0 and one.stdout.count("\n") == 1 + 2 * 2  # header + 2 arms x (accuracy, fisher)
    curves = flatlab("compare", "twotunings", "--root", str(root), "--tuning-curves")
    assert curves.returncode == 2 and "need a pool of independent trials" in curves.stderr
    assert "searcher='optuna'" in curves.stderr and "--tunings 3" in curves.stderr
