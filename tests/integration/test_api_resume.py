"""`flatlab.run(path, resume=True)` resumes exactly as `flatlab run path --resume` does: at the budget
the launch was started with, not the study file's."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from flatlab.tracking import runs
from flatlab_testing import env, write_study

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RUN = (
    "import sys, flatlab; out = flatlab.run(sys.argv[1], root=sys.argv[2], num_cpus=2, {}); "
    "print('interrupted', out[0].interrupted)"
)


def python(code, *args):
    return [sys.executable, "-c", code, *args]


def test_the_api_resumes_an_interrupted_launch_at_its_budget(tmp_path):
    # The file says 20 epochs and 8 trials; the launch runs 3 trials of 40 epochs (fifo: nothing prunes).
    study = write_study(
        tmp_path / "api.py",
        """
STUDY = Study(
    name="apires",
    workload="digits",
    workload_params={"model": "mlp", "width": 16, "depth": 1},
    arms=(Arm("sgd", space={"lr": sp.loguniform(0.01, 0.2)}),),
    num_trials=8,
    max_epochs=20,
    scheduler="fifo",
    max_concurrent=1,
    train={"batch_size": 8},  # ~10 s a trial: the Ctrl-C below lands inside one
)
""",
    )
    root = tmp_path / "root"
    uri = runs.default_tracking_uri(root)
    epochs, n = 40, 3
    proc = subprocess.Popen(
        python(RUN.format(f"trials={n}, epochs={epochs}"), str(study), str(root)),
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 400
    finished = []
    while time.monotonic() < deadline and not finished:
        time.sleep(1.0)
        if proc.poll() is not None:
            pytest.fail(f"flatlab.run exited early ({proc.returncode}):\n{proc.stdout.read()}")
        try:
            c = runs.client(uri) if (root / "mlflow.db").exists() else None
            exp = c.get_experiment_by_name("apires") if c else None
            if exp:
                rs = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
                running = [
                    r for r in rs if r.info.status == "RUNNING" and 0 < r.data.metrics.get("epoch", 0) < epochs - 5
                ]
                if running:  # a trial finished and the next one is mid-way
                    finished = [r for r in rs if r.info.status == "FINISHED"]
        except Exception:
            pass
    assert finished, "no trial finished before the deadline"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground process group
    out, _ = proc.communicate(timeout=180)
    assert "interrupted True" in out, out
    launch = json.loads((root / "apires" / "launch.json").read_text())
    assert launch["status"] == "killed"
    assert launch["overrides"] == {"trials": n, "epochs": epochs, "final_seeds": None, "tunings": None, "scale": None}

    res = subprocess.run(
        python(RUN.format("resume=True"), str(study), str(root)), env=env(), capture_output=True, text=True, timeout=900
    )
    assert res.returncode == 0 and "interrupted False" in res.stdout, res.stdout + res.stderr
    c = runs.client(uri)
    exp = c.get_experiment_by_name("apires")
    after = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    assert len(after) == n
    assert [(r.info.status, r.data.tags[runs.TAG_OUTCOME]) for r in after] == [("FINISHED", "completed")] * n
    for r in after:  # every trial at the launch's 40 epochs, every epoch logged once
        steps = [m.step for m in c.get_metric_history(r.info.run_id, "epoch")]
        assert steps == list(range(1, epochs + 1)), (r.data.tags[runs.TAG_TRIAL], steps)
        assert [m.step for m in c.get_metric_history(r.info.run_id, "val/accuracy")] == steps
    parents = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'study'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    launch = json.loads((root / "apires" / "launch.json").read_text())
    assert launch["status"] == "finished" and launch["overrides"]["epochs"] == epochs
