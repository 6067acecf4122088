"""Multi-worker trials without starting anything: Resources(workers=...) validation and reservations,
the concurrency cap, the checkpoint a restarted trial resumes from, rank slices and SAM's ascent option."""

import pytest

from flatlab import Arm, Resources, Study
from flatlab.errors import ConfigError
from flatlab.study.validate import validate


def _study(resources):
    return Study(
        name="r",
        workload="digits",
        arms=(Arm("sgd", space={"lr": 0.1}),),
        num_trials=1,
        max_epochs=1,
        resources=resources,
    )


def test_workers_default_to_one_and_keep_the_single_process_reservation():
    assert Resources().workers == 1
    assert Resources(cpu=2, gpu=0.5).as_dict() == {"cpu": 2, "gpu": 0.5}
    assert Resources(cpu=2, gpu=0.5).request() == {"CPU": 2.0, "GPU": 0.5}
    assert Resources(cpu=2, gpu=0.5).concurrent_trials({"CPU": 8, "GPU": 2}) == 4  # both bound it: 8 // 2, 2 // 0.5
    assert Resources(cpu=2, gpu=0.5).concurrent_trials({"CPU": 5, "GPU": 2}) == 2
    assert Resources(cpu=2, gpu=0.5).concurrent_trials({"CPU": 8}) == 1  # no GPU: at least one (it waits)
    assert Resources(cpu=1).request() == {"CPU": 1.0} and Resources(cpu=1).concurrent_trials({"CPU": 2, "GPU": 1}) == 2


def test_a_multi_worker_trial_reserves_only_a_memory_token_and_its_workers_reserve_the_rest():
    r = Resources(cpu=2, gpu=1, workers=4)
    assert r.as_dict() == {"cpu": 0, "gpu": 0, "memory": 1}
    assert r.worker_dict() == {"CPU": 2.0, "GPU": 1.0}
    assert Resources(cpu=1, workers=2).worker_dict() == {"CPU": 1.0}


def test_concurrent_multi_worker_trials_fit_the_cluster():
    assert Resources(cpu=2, gpu=1, workers=4).request() == {"CPU": 8.0, "GPU": 4.0}
    assert Resources(cpu=1, workers=2).concurrent_trials({"CPU": 2}) == 1
    assert Resources(cpu=1, workers=2).concurrent_trials({"CPU": 7}) == 3
    assert Resources(cpu=2, gpu=1, workers=4).concurrent_trials({"CPU": 64, "GPU": 8}) == 2  # GPUs bound it
    assert Resources(cpu=4, workers=4).concurrent_trials({"CPU": 2}) == 1  # at least one (it waits)


@pytest.mark.parametrize(
    "resources, message",
    [
        (Resources(workers=0), r"Resources\(workers=0\); expected an int in \[1, 65536\]"),
        (Resources(workers=1.5), r"Resources\(workers=1.5\); expected an int"),
        (Resources(workers=True), r"Resources\(workers=True\); expected an int"),
        (Resources(gpu=0.5, workers=2), r"workers=2, gpu=0.5\); with workers > 1 each worker .* whole GPUs"),
    ],
)
def test_bad_workers_are_refused_naming_the_field(resources, message):
    with pytest.raises(ConfigError, match=message):
        validate(_study(resources))


def test_good_workers_validate():
    assert validate(_study(Resources(cpu=1, gpu=2, workers=8))).resources.workers == 8


def test_latest_checkpoint_is_the_newest_complete_one(tmp_path):
    from flatlab.study.ddp_trial import latest_checkpoint
    from flatlab.train.checkpoint import CHECKPOINT_FILES

    run = tmp_path / "ddp"
    assert latest_checkpoint(str(run)) is None  # no run yet
    for name, files in [
        ("checkpoint_2026-12-01_10-00-00.000001", CHECKPOINT_FILES),
        ("checkpoint_2026-12-01_10-00-05.000001", CHECKPOINT_FILES),
        ("checkpoint_2026-12-01_10-00-09.000001", CHECKPOINT_FILES[:1]),  # interrupted upload
    ]:
        (run / name).mkdir(parents=True)
        for f in files:
            (run / name / f).write_text("x")
    path, _ = latest_checkpoint(str(run))
    assert path == str(run / "checkpoint_2026-12-01_10-00-05.000001")


@pytest.mark.parametrize("n, slices", [(8, [(0, 4), (4, 8)]), (55, [(0, 28), (28, 55)]), (3, [(0, 2), (2, 3)])])
def test_rank_slices_cover_the_global_batch(n, slices):
    from flatlab.train.parallel import DataParallel

    got = []
    for rank in range(2):
        dp = DataParallel.__new__(DataParallel)  # no process group needed to slice
        dp.rank, dp.world = rank, 2
        s = dp.shard(n)
        got.append((s.start, s.stop))
    assert got == slices


def test_data_parallel_needs_a_process_group():
    from flatlab.train.parallel import DataParallel

    with pytest.raises(ValueError, match="world > 1 needs torch.distributed.init_process_group"):
        DataParallel(0, 2)
    with pytest.raises(ValueError, match="need 0 <= rank < world, got rank=2, world=2"):
        DataParallel(2, 2)
    assert DataParallel.from_environment().world == 1


def test_sam_ascent_option():
    import torch

    from flatlab.optim.registry import get_optimizer

    w = torch.nn.Parameter(torch.ones(2))
    assert get_optimizer("sam").create([w], lr=0.1).ascent == "global"
    assert get_optimizer("asam").create([w], lr=0.1, ascent="local").ascent == "local"
    with pytest.raises(ConfigError, match="ascent"):
        get_optimizer("sam").create([w], lr=0.1, ascent="remote")


def test_the_plan_shows_workers_and_what_each_reserves():
    from flatlab.study.plan import plan

    assert plan(validate(_study(Resources(cpu=2, gpu=1, workers=4))))["resources_per_trial"] == {
        "workers": 4,
        "per_worker": {"CPU": 2.0, "GPU": 1.0},
    }
    assert plan(validate(_study(Resources(cpu=2))))["resources_per_trial"] == {"cpu": 2, "gpu": 0}
