"""A launch that fails after Ray has started (data loading, the searcher) ends its MLflow parent run
FAILED and its launch.json "failed", never RUNNING/"running"."""

import json

import pytest

from flatlab import Arm, Study
from flatlab import space as sp
from flatlab.study.runner import RunOptions, run_study
from flatlab.tracking import runs

pytestmark = pytest.mark.slow  # starts a local Ray (10-30 s on a busy machine)


def _study(name):
    return Study(
        name=name,
        workload="digits",
        workload_params={"width": 8},
        arms=(Arm("sgd", space={"lr": sp.loguniform(0.01, 0.1)}),),
        num_trials=1,
        max_epochs=1,
        grace_period=1,
    )


def _parent(root, name):
    uri = runs.default_tracking_uri(root.resolve())
    c = runs.client(uri)
    exp = c.get_experiment_by_name(name)
    parents = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'study'")
    assert len(parents) == 1
    return parents[0]


def test_failures_after_ray_started_end_the_launch_failed(tmp_path, monkeypatch):
    import ray

    import flatlab.study.tuner as tuner
    from flatlab.workloads.digits import Digits

    root = tmp_path / "root"
    real_load = Digits.load_data

    def broken_data(self, seed):
        assert ray.is_initialized()  # the failure comes after Ray's start
        raise RuntimeError("disk gone while loading")

    class BrokenSearcher:
        def __init__(self, *a, **k):
            raise RuntimeError("sampler seed out of range")

    try:
        # 1. while loading the data, as MLflow opens the launch in parallel
        monkeypatch.setattr(Digits, "load_data", broken_data)
        with pytest.raises(RuntimeError, match="disk gone"):
            run_study(_study("fail_data"), RunOptions(root=root, num_cpus=1))
        assert _parent(root, "fail_data").info.status == "FAILED"
        state = json.loads((root / "fail_data" / "launch.json").read_text())
        assert state["status"] == "failed" and state["parent_run_id"] == _parent(root, "fail_data").info.run_id

        # 2. building the searcher, after launch.json said "running"
        monkeypatch.setattr(Digits, "load_data", real_load)
        monkeypatch.setattr(tuner, "ArmSearcher", BrokenSearcher)  # as the launch builds its Tuner
        with pytest.raises(RuntimeError, match="sampler seed"):
            run_study(_study("fail_searcher"), RunOptions(root=root, num_cpus=1))
        assert _parent(root, "fail_searcher").info.status == "FAILED"
        assert json.loads((root / "fail_searcher" / "launch.json").read_text())["status"] == "failed"
    finally:
        ray.shutdown()
