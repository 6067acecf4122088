"""A 2-worker trial (Ray Train TorchTrainer, DDP over gloo) through `flatlab run` on digits: its MLflow
run records world_size = 2, rank 0 writes checkpoints, and after a failure at epoch 2 `--resume`
continues from the epoch-1 checkpoint (epoch 1 is not trained again)."""

import os
import subprocess

import pytest

from flatlab.tracking import logged_model, runs
from flatlab_testing import BIN, env, write_study
from test_services import FAIL_AFTER_FIRST_EPOCH

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _trial_run(c, name):
    exp = c.get_experiment_by_name(name)
    found = c.search_runs([exp.experiment_id], filter_string=f"tags.`{runs.TAG_ROLE}` = 'trial'")
    assert len(found) == 1
    return found[0]


def test_two_worker_trial_logs_world_size_checkpoints_and_resumes(tmp_path):
    study = write_study(
        tmp_path / "ddp2.py",
        """
        from flatlab import Resources

        STUDY = Study(
            name="ddp2", workload="digits", workload_params={"width": 16},
            arms=(Arm("sam", space={"lr": 0.05, "rho": 0.05}),), num_trials=1, max_epochs=2,
            scheduler="fifo", checkpoint_every=1, resources=Resources(cpu=1, workers=2),
        )
        """,
    )
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAIL_AFTER_FIRST_EPOCH)  # both ranks raise at epoch 2
    mark = tmp_path / "fail-now"
    mark.touch()
    e = env()
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(hook), e.get("PYTHONPATH", "")) if p)
    e["FLATLAB_TEST_FAIL_MARK"] = str(mark)
    e["RAY_ADDRESS"] = "local"
    root = tmp_path / "root"
    cmd = [str(BIN / "flatlab"), "run", str(study), "--root", str(root), "--num-cpus", "2"]

    first = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)
    assert first.returncode == 1, first.stdout + first.stderr  # its only trial failed (its own error: no retry)
    c = runs.client(runs.default_tracking_uri(root))
    run = _trial_run(c, "ddp2")
    assert run.info.status == "FAILED"
    assert run.data.metrics["world_size"] == 2.0
    epoch1 = [(m.step, m.value) for m in c.get_metric_history(run.info.run_id, "train/loss")]
    assert [s for s, _ in epoch1] == [1]
    ckpts = sorted(root.rglob("trainer.safetensors"))
    assert ckpts and all("ddp" in p.parts for p in ckpts)  # Ray Train's run folder inside the trial's
    assert (ckpts[0].parent / "trainer.json").exists()

    mark.unlink()
    second = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=e, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    run = c.get_run(run.info.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["world_size"] == 2.0 and run.data.metrics["epoch"] == 2.0
    assert 0.0 <= run.data.metrics["test/accuracy"] <= 1.0
    tags = run.data.tags  # where rank 0 of the resumed run ran, on record
    assert (tags["flatlab.device"], tags["flatlab.world_size"], tags["flatlab.workers"]) == ("cpu", "2", "2")
    assert tags["flatlab.resources"] == "cpu=1, gpu=0 per worker" and tags["flatlab.start_epoch"] == "1"
    assert tags["flatlab.cpu_denormals"] == "flush"  # rank 0 set its threads' mode before computing
    history = [(m.step, m.value) for m in c.get_metric_history(run.info.run_id, "train/loss")]
    # resumed from the epoch-1 checkpoint: epoch 1 is logged once (a restart from scratch logs it twice)
    assert [s for s, _ in history] == [1, 2] and history[0] == epoch1[0]
    # rank 0 logged the final model as the run's MLflow logged model (not a run artifact)
    assert logged_model.run_model_id(c, run.info.run_id) is not None
