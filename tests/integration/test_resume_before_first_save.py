"""A driver killed after Tune wrote ``tuner.pkl`` and before it saved the experiment's first state: the
resume runs the whole budget. Ray answers ``Tuner.can_restore`` with True from ``tuner.pkl`` alone, and a
Tuner restored from it restarts the experiment with ``num_samples=1`` (Ray 2.60's ``_fit_resume`` passes
none): the search would then stop after one trial (and every later resume with it), the final stage
after one seed, without an error.

The kill is made exact, not timed: the driver process ends itself (``os._exit``, as SIGKILL would) right
after the Tuner of the search, or of the final stage, was built."""

import json
import os
import signal
import subprocess
import sys

import pytest

from flatlab.tracking import runs
from flatlab_testing import BIN, assert_final_stage_ran_the_best_search_trial, env, write_study

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N, EPOCHS, FINAL = 3, 2, 2

DIE_AFTER = """
import importlib, os, sys
import flatlab

def dies(build):
    def built(*args, **kwargs):
        build(*args, **kwargs)  # tuner.pkl is on disk; Tune has saved nothing else
        os._exit(9)
    return built

module = importlib.import_module("{module}")
setattr(module, "{target}", dies(getattr(module, "{target}")))
flatlab.run(sys.argv[1], root=sys.argv[2], num_cpus=2)
"""


def killed_launch(study, root, module, target):
    """Run ``study`` in a driver that dies right after ``<module>.<target>`` built a Tuner."""
    proc = subprocess.Popen(
        [sys.executable, "-c", DIE_AFTER.format(module=module, target=target), str(study), str(root)],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out, _ = proc.communicate(timeout=400)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever Ray left of that session
    except ProcessLookupError:
        pass
    assert proc.returncode == 9, out[-3000:]


@pytest.mark.parametrize(
    "module, target, stage",
    [("flatlab.study.tuner", "new_tuner", "search"), ("flatlab.study.runner", "final_stage_tuner", "final")],
)
def test_a_resume_after_a_kill_before_tunes_first_save_runs_the_whole_budget(tmp_path, module, target, stage):
    name = f"early{stage}"
    study = write_study(
        tmp_path / f"{name}.py",
        f"""
STUDY = Study(
    name="{name}",
    workload="digits",
    workload_params={{"model": "mlp", "width": 16, "depth": 1}},
    arms=(Arm("sgd", space={{"lr": sp.loguniform(0.02, 0.3)}}),),
    num_trials={N},
    max_epochs={EPOCHS},
    final_seeds=tuple(range(1, {FINAL} + 1)),
    scheduler="fifo",
    max_concurrent=2,
)
""",
    )
    root = tmp_path / "root"
    killed_launch(study, root, module, target)
    out = root / name
    experiment = json.loads((out / "launch.json").read_text())
    path = experiment["final_experiment_path"] if stage == "final" else experiment["experiment_path"]
    assert "tuner.pkl" in os.listdir(path) and not [f for f in os.listdir(path) if f.startswith("experiment_state")]

    res = subprocess.run(
        [str(BIN / "flatlab"), "run", str(study), "--root", str(root), "--num-cpus", "2", "--resume"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    c = runs.client(runs.default_tracking_uri(root))
    exp = c.get_experiment_by_name(name)
    trials = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    stages = sorted(r.data.tags[runs.TAG_STAGE] for r in trials)
    assert stages == ["final"] * FINAL + ["search"] * N, stages
    assert [(r.info.status, r.data.tags[runs.TAG_OUTCOME]) for r in trials] == [("FINISHED", "completed")] * (N + FINAL)
    assert json.loads((out / "launch.json").read_text())["status"] == "finished"
    assert_final_stage_ran_the_best_search_trial(trials)
