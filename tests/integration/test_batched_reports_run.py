"""Batched reports through `flatlab run` (a local Ray, MLflow on SQLite), with a batch long enough
(FLATLAB_RESULT_BUFFER_S=120) that only flatlab's early ends can close it: a trial that raises at epoch 2
still has epoch 1 in MLflow, and a trial ASHA stops at a rung trained no epoch past it (every epoch a
worker trained is an epoch MLflow logged)."""

import os
import subprocess
from collections import Counter

import pytest

from flatlab.tracking import runs
from flatlab_testing import BIN, env, run_epoch_hook, write_study
from test_services import FAIL_AFTER_FIRST_EPOCH

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Appends "<lr> <epoch>" to $FLATLAB_TEST_EPOCH_LOG for every epoch a worker trains.
COUNT_EPOCHS = run_epoch_hook(
    "FLATLAB_TEST_EPOCH_LOG",
    """
    out = original(self)
    with open(VALUE, "a") as f:
        f.write(f"{self.spec.optimizer_params['lr']!r} {self.epoch}\\n")
    return out
""",
)


def _run(tmp_path, study, hook_source, expect=0, **extra_env):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(hook_source)
    e = env()
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), e.get("PYTHONPATH", "")) if p)
    e["FLATLAB_RESULT_BUFFER_S"] = "120"
    e.update(extra_env)
    root = tmp_path / "root"
    res = subprocess.run(
        [str(BIN / "flatlab"), "run", str(study), "--root", str(root), "--num-cpus", "2"],
        capture_output=True,
        text=True,
        env=e,
        timeout=600,
    )
    assert res.returncode == expect, res.stdout + res.stderr
    return runs.client(runs.default_tracking_uri(root))


def _trial_runs(c, name):
    exp = c.get_experiment_by_name(name)
    return c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")


def test_a_failing_trial_delivers_its_batched_epochs(tmp_path):
    study = write_study(
        tmp_path / "fails.py",
        """
        STUDY = Study(name="fails", workload="digits", workload_params={"width": 16},
                      arms=(Arm("sgd", space={"lr": 0.05}),), num_trials=1, max_epochs=3, scheduler="fifo")
        """,
    )
    mark = tmp_path / "fail-now"
    mark.touch()
    c = _run(
        tmp_path, study, FAIL_AFTER_FIRST_EPOCH, expect=1, FLATLAB_TEST_FAIL_MARK=str(mark)
    )  # its only trial failed
    (run,) = _trial_runs(c, "fails")
    assert run.info.status == "FAILED" and "injected trial failure" in run.data.tags[runs.TAG_ERROR]
    # epoch 1 was batched, not sent, when epoch 2 raised (no checkpoint ends the batch: the default
    # cadence checkpoints after 10 s); it reaches MLflow all the same
    assert [m.step for m in c.get_metric_history(run.info.run_id, "train/loss")] == [1]


def test_asha_stops_a_trial_at_its_rung_not_after(tmp_path):
    study = write_study(
        tmp_path / "rungs.py",
        """
        STUDY = Study(name="rungs", workload="digits", workload_params={"width": 16},
                      arms=(Arm("sgd", space={"lr": sp.grid([0.3, 0.1, 0.03, 0.01, 0.003, 0.001])}),),
                      searcher="grid", max_epochs=8, scheduler="asha", grace_period=1, reduction_factor=2,
                      max_concurrent=1)
        """,
    )
    log = tmp_path / "epochs.log"
    c = _run(tmp_path, study, COUNT_EPOCHS, FLATLAB_TEST_EPOCH_LOG=str(log))
    trained = Counter(float(line.split()[0]) for line in log.read_text().split("\n") if line)
    logged = {float(r.data.params["lr"]): int(r.data.metrics["epoch"]) for r in _trial_runs(c, "rungs")}
    outcomes = Counter(r.data.tags.get(runs.TAG_OUTCOME) for r in _trial_runs(c, "rungs"))
    assert outcomes["pruned"] >= 1  # six trials, one at a time, rungs at 1, 2, 4: ASHA stops some
    assert dict(trained) == logged  # no trial trained an epoch that Tune dropped
    assert all(n in (1, 2, 4, 8) for n in logged.values())  # each stopped at a rung (or finished)
