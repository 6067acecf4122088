"""A local launch whose trials need a resource this machine's Ray does not have fails before any trial,
saying which and what to do, instead of waiting for ever."""

import json

import pytest

from flatlab.tracking import runs
from flatlab_testing import flatlab, write_study

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_gpu_study_on_a_cpu_machine_fails_before_any_trial(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the local Ray instance has one to give")
    study = write_study(
        tmp_path / "gpu.py",
        """
from flatlab import Resources

STUDY = Study(name="gpu", workload="digits", workload_params={"width": 8}, arms=(Arm("sgd", space={"lr": 0.1}),),
              num_trials=2, max_epochs=1, resources=Resources(cpu=1, gpu=0.5))
""",
    )
    root = tmp_path / "root"
    res = flatlab("run", str(study), "--root", str(root), "--num-cpus", "2", timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        "error: study 'gpu': each trial needs GPU 0.5 (the local Ray instance has 0); no trial could ever start: "
        "run it on a Ray cluster that has GPUs (--address HOST:PORT), or train on CPU with Resources(cpu=1, gpu=0)"
    )
    c = runs.client(runs.default_tracking_uri(root))
    exp = c.get_experiment_by_name("gpu")
    assert c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'") == []
    (parent,) = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'study'")
    assert parent.info.status == "FAILED"
    assert json.loads((root / "gpu" / "launch.json").read_text())["status"] == "failed"
