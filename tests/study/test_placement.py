"""Where a trial runs, on record, and never a silent CPU fallback or a silent wait."""

import json
import re
from pathlib import Path

import pytest

from flatlab import Resources
from flatlab.study.placement import (
    DeviceUnavailableError,
    choose_device,
    describe_resources,
    local_shortfall,
    placement,
    waiting_for,
)
from flatlab.study.validate import validate
from flatlab.tracking.placement_tags import PLACEMENT_KEY, encode, placement_tags

BROKEN = lambda: (False, "torch.cuda.is_available() is False; torch built with CUDA 13.0")  # noqa: E731
WORKS = lambda: (True, "")  # noqa: E731


def test_the_device_follows_the_reservation_and_cuda():
    assert choose_device(Resources(cpu=2), status=BROKEN) == ("cpu", None)  # no GPU reserved: CUDA not asked
    assert choose_device(Resources(cpu=1, gpu=0.5), status=WORKS) == ("cuda", None)
    with pytest.raises(
        DeviceUnavailableError,
        match=re.escape(
            "the trial reserved gpu=0.5 but CUDA is not usable on node 10.0.0.7 (ab12) (torch.cuda.is_available() is "
            "False; torch built with CUDA 13.0); fix the node's CUDA (driver, CUDA_VISIBLE_DEVICES, a CUDA build of "
            "torch), or train on CPU: Resources(..., gpu=0), or Resources(..., cpu_fallback=True)"
        ),
    ):
        choose_device(Resources(cpu=1, gpu=0.5), where="node 10.0.0.7 (ab12)", status=BROKEN)
    device, warning = choose_device(Resources(cpu=1, gpu=1, cpu_fallback=True), where="node x", status=BROKEN)
    assert device == "cpu" and warning == (
        "the trial reserved gpu=1 but CUDA is not usable on node x (torch.cuda."
        "is_available() is False; torch built with CUDA 13.0); it trains on CPU "
        "(Resources(cpu_fallback=True))"
    )


def test_cpu_fallback_must_be_a_bool():
    from flatlab import Arm, Study
    from flatlab.errors import ConfigError

    with pytest.raises(ConfigError, match=r"resources=Resources\(cpu_fallback='yes'\); expected True or False"):
        validate(
            Study(
                name="s",
                workload="digits",
                arms=(Arm("sgd", space={"lr": 0.1}),),
                resources=Resources(cpu_fallback="yes"),
            )
        )


def test_flush_denormal_must_be_a_bool():
    from flatlab import Arm, Study
    from flatlab.errors import ConfigError

    assert Resources().flush_denormal is True  # a trial's CPU threads flush subnormals unless told not to
    with pytest.raises(ConfigError, match=r"resources=Resources\(flush_denormal=1\); expected True .* or False"):
        validate(
            Study(
                name="s",
                workload="digits",
                arms=(Arm("sgd", space={"lr": 0.1}),),
                resources=Resources(flush_denormal=1),
            )
        )


def test_the_placement_of_this_process_and_its_tags():
    record = placement(
        "cpu", Resources(cpu=2, gpu=0, workers=3), world_size=3, start_epoch=4, fallback="why", denormals="partial"
    )
    assert record == {
        "device": "cpu",
        "world_size": "3",
        "workers": "3",
        "resources": "cpu=2, gpu=0 per worker",
        "start_epoch": "4",
        "cpu_fallback": "why",
        "cpu_denormals": "partial",
    }  # no Ray here: no node, no GPU ids
    tags = placement_tags(encode({**record, "node": "n1", "gpu_ids": "0", "unknown": "x"}))
    assert tags == {
        "flatlab.device": "cpu",
        "flatlab.world_size": "3",
        "flatlab.workers": "3",
        "flatlab.resources": "cpu=2, gpu=0 per worker",
        "flatlab.start_epoch": "4",
        "flatlab.cpu_fallback": "why",
        "flatlab.node": "n1",
        "flatlab.gpu_ids": "0",
        "flatlab.cpu_denormals": "partial",
    }
    assert placement_tags("not json") == {} and placement_tags(None) == {} and placement_tags(json.dumps([1])) == {}
    assert describe_resources(Resources(cpu=1, gpu=0.5)) == "cpu=1, gpu=0.5"
    assert PLACEMENT_KEY == "flatlab/placement"


def test_a_local_instance_without_the_resource_is_an_error_with_the_ways_out():
    assert local_shortfall("s", Resources(cpu=1, gpu=0.5), {"CPU": 2.0, "GPU": 1.0}) is None
    assert local_shortfall("s", Resources(cpu=1, gpu=0.5), {"CPU": 2.0}) == (
        "study 's': each trial needs GPU 0.5 (the local Ray instance has 0); no trial could ever start: run it on a "
        "Ray cluster that has GPUs (--address HOST:PORT), or train on CPU with Resources(cpu=1, gpu=0)"
    )
    msg = local_shortfall("s", Resources(cpu=2, workers=2), {"CPU": 2.0})
    assert msg.startswith(
        "study 's': each trial needs CPU 4 (the local Ray instance has 2); no trial could ever start: "
        "give the local instance more CPUs (--num-cpus)"
    )


def test_what_a_pending_trial_waits_for():
    assert waiting_for({"CPU": 1.0, "GPU": 0.5}, {"CPU": 3.0}, {"CPU": 4.0}) == "GPU (each needs 0.5; 0 of 0 free)"
    assert waiting_for({"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 8.0}) == "CPU (each needs 2; 1 of 8 free)"
    assert waiting_for({"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}) == ""


def test_the_progress_line_says_what_pending_trials_wait_for_once_nothing_runs(monkeypatch, capsys):
    import ray

    from flatlab.study.progress import ProgressPrinter

    class Pending:
        status = "PENDING"
        trial_id = "t1"
        config = {"arm": "sgd"}

        class placement_group_factory:
            required_resources = {"CPU": 1.0, "GPU": 0.5}

    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
    printer = ProgressPrinter(2, "val/accuracy", "max", every_s=0.0)
    printer._t0 -= 1.0  # past start-up
    printer.on_step_end(0, [Pending(), Pending()])
    out = capsys.readouterr().out
    assert "0 done / 0 running / 2 pending" in out and out.rstrip().endswith(
        "| 2 pending wait for GPU (each needs 0.5; 0 of 0 free)"
    )


def test_a_cpu_fallback_is_a_warning_line_once_per_placement(capsys):
    from flatlab.study.progress import ProgressPrinter

    class Trial:
        trial_id = "t1"
        config = {"arm": "sgd"}

    printer = ProgressPrinter(1, "val/accuracy", "max", every_s=1e9)
    placed = encode({"device": "cpu", "cpu_fallback": "the trial reserved gpu=0.5 but ..."})
    for epoch in (1, 2):
        printer.on_trial_result(0, [], Trial(), {PLACEMENT_KEY: placed, "epoch": epoch})
    lines = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert lines == ["warning: trial t1: the trial reserved gpu=0.5 but ..."]


def test_the_suggested_cpu_resources_fit_and_other_scales_are_named():
    msg = local_shortfall("s", Resources(cpu=4, gpu=1), {"CPU": 2.0}, scales=("cpu", "smoke"))
    assert msg == (
        "study 's': each trial needs CPU 4 (the local Ray instance has 2), GPU 1 (the local Ray instance has 0); no "
        "trial "
        "could ever start: run it on a Ray cluster that has GPUs (--address HOST:PORT), or train on CPU with "
        "Resources(cpu=2, gpu=0), or another scale of this file: --scale cpu|smoke"
    )
    assert "Resources(cpu=1, gpu=0)" in local_shortfall("s", Resources(cpu=1, gpu=1), {"CPU": 8.0})  # never raised


SCALED = """
from flatlab import Arm, Resources, Study

SCALES = ("paper", "smoke", "cpu", "big")
NEEDS = {"paper": Resources(cpu=4, gpu=1), "smoke": Resources(cpu=1), "cpu": Resources(cpu=2), "big": Resources(cpu=8)}


def build(scale):
    return Study(name=f"s_{scale}", workload="digits", arms=(Arm("sgd", space={"lr": 0.1}),), num_trials=1,
                 max_epochs=1, resources=NEEDS[scale])
"""


def test_scales_that_fit_the_local_instance(tmp_path):
    from flatlab.study.prepare import scales_that_fit

    path = tmp_path / "scaled.py"
    path.write_text(SCALED)
    assert scales_that_fit(str(path), "paper", {"CPU": 2.0}) == ["smoke", "cpu"]
    assert scales_that_fit(str(path), None, {"CPU": 2.0}) == ["smoke", "cpu"]  # None: the default, paper
    assert scales_that_fit(str(path), "smoke", {"CPU": 8.0, "GPU": 1.0}) == ["paper", "cpu", "big"]
    assert scales_that_fit(str(tmp_path / "missing.py"), None, {"CPU": 2.0}) == []


def test_a_local_launch_of_deepobs_fmnist_on_two_cpus_names_the_cpu_scale(monkeypatch):
    import ray

    from flatlab.errors import ConfigError
    from flatlab.study.loader import load_studies
    from flatlab.study.ray_start import check_local_resources
    from flatlab.study.runner import RunOptions

    path = str(Path(__file__).resolve().parents[2] / "studies" / "deepobs_fmnist.py")
    (study,) = load_studies(path, scale="paper")
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, "memory": 1e9})
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "study 'deepobs_fmnist_2c2d': each trial needs CPU 4 (the local Ray instance has 2), GPU 1 (the local Ray "
            "instance has 0); no trial could ever start: run it on a Ray cluster that has GPUs (--address HOST:PORT), "
            "or train on CPU with Resources(cpu=2, gpu=0), or another scale of this file: --scale cpu"
        )
        + "$",
    ):
        check_local_resources(study, RunOptions(source=path, overrides={"scale": "paper"}))
