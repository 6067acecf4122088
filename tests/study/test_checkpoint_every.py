"""`Study.checkpoint_every` through the trainable: which epochs carry a checkpoint (Tune's checkpoint
frequency, the last epoch always), a resume from one of them, the default time-based cadence, the
CLI override and Tune's result buffering in the runner's environment. No Ray: `run_trial` runs with a
fake tune session (report, get_checkpoint, get_context) that keeps a copy of every checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from ray import tune
from typer.testing import CliRunner

from flatlab import Arm, Study
from flatlab.errors import ConfigError
from flatlab.study import trainable, trial_loop
from flatlab.study.validate import validate
from flatlab.train.checkpoint import STATE_FILE
from flatlab.workloads import build_workload


@pytest.fixture(scope="module")
def digits():
    return build_workload("digits", model="mlp", width=8, depth=1).load_data(0)


def study(**kw) -> Study:
    base = dict(
        name="ck",
        workload="digits",
        workload_params={"model": "mlp", "width": 8, "depth": 1},
        arms=(Arm("sgd", space={"lr": 0.05, "momentum": 0.9}),),
        num_trials=1,
        max_epochs=10,
        scheduler="fifo",
        train={"batch_size": 256},
    )
    return validate(Study(**{**base, **kw}))


class FakeTune:
    """Stands in for ``ray.tune`` inside the trainable: records reports, copies checkpoints to ``keep``."""

    def __init__(self, keep: Path, resume_from: Path = None) -> None:
        self.keep, self.resume_from = keep, resume_from
        self.reports, self.checkpointed = [], []

    def report(self, metrics, checkpoint=None):
        self.reports.append(dict(metrics))
        if checkpoint is not None:
            epoch = int(metrics["epoch"])
            self.checkpointed.append(epoch)
            shutil.copytree(checkpoint.path, self.keep / f"checkpoint_{epoch:06d}")

    def get_checkpoint(self):
        return None if self.resume_from is None else tune.Checkpoint.from_directory(str(self.resume_from))

    def get_context(self):
        class Ctx:
            def get_trial_id(self):
                return ""  # no tracking: nothing is uploaded

        return Ctx()

    Checkpoint = tune.Checkpoint


def run(monkeypatch, s: Study, data, keep: Path, resume_from: Path = None) -> FakeTune:
    fake = FakeTune(keep, resume_from)
    monkeypatch.setattr(trainable, "tune", fake)
    trainable.run_trial({"arm": "sgd", "seed": 0}, study=s, data=data)
    return fake


def test_checkpoint_every_4_of_10_epochs_saves_4_8_10_and_resumes_from_8_bit_identically(
    monkeypatch, tmp_path, digits, one_torch_thread
):
    s = study(checkpoint_every=4)
    full = run(monkeypatch, s, digits, tmp_path)
    assert full.checkpointed == [4, 8, 10]
    assert [r["epoch"] for r in full.reports] == list(range(1, 11))  # every epoch still reported
    assert "val/accuracy" in full.reports[0] and full.reports[-1]["completed"] == 1
    assert all("completed" not in r for r in full.reports[:-1])
    # the checkpoint written at epoch 8 holds epoch 8's counters
    state = json.loads((tmp_path / "checkpoint_000008" / STATE_FILE).read_text())["state"]
    assert state["epoch"] == 8 and state["step"] == 8 * 5  # 1079 training rows / 256 -> 5 steps per epoch

    resumed = run(monkeypatch, s, digits, tmp_path / "again", resume_from=tmp_path / "checkpoint_000008")
    assert [r["epoch"] for r in resumed.reports] == [9, 10] and resumed.checkpointed == [10]
    for a, b in zip(full.reports[8:], resumed.reports):
        for key in ("train/loss", "val/loss", "val/accuracy", "lr", "test/loss"):
            assert a.get(key) == b.get(key), key  # bit-identical on CPU
    final = {n: t for n, t in _weights(tmp_path / "checkpoint_000010").items()}
    for n, t in _weights(tmp_path / "again" / "checkpoint_000010").items():
        assert torch.equal(t, final[n]), n


def _weights(directory: Path):
    from safetensors.torch import load_file

    return load_file(str(directory / "trainer.safetensors"))


def test_default_cadence_is_by_time_since_the_last_checkpoint(monkeypatch, tmp_path, digits, one_torch_thread):
    s = study(max_epochs=5)
    assert s.checkpoint_every is None
    monkeypatch.setattr(trial_loop, "CHECKPOINT_INTERVAL_S", 1e9)
    assert run(monkeypatch, s, digits, tmp_path / "never").checkpointed == [5]  # only the last epoch
    monkeypatch.setattr(trial_loop, "CHECKPOINT_INTERVAL_S", 0.0)
    assert run(monkeypatch, s, digits, tmp_path / "always").checkpointed == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "every, epoch, last, since_s, due",
    [
        (4, 4, False, 0.0, True),
        (4, 5, False, 99.0, False),
        (4, 10, True, 0.0, True),
        (1, 7, False, 0.0, True),
        (None, 3, False, 9.99, False),
        (None, 3, False, 10.0, True),
        (None, 1, True, 0.0, True),
    ],
)
def test_checkpoint_due(every, epoch, last, since_s, due):
    assert trial_loop.CHECKPOINT_INTERVAL_S == 10.0
    assert trial_loop.checkpoint_due(every, epoch, last, since_s) is due


def test_checkpoint_every_must_be_a_positive_int_or_none():
    with pytest.raises(ConfigError, match=r"checkpoint_every=0; expected None or an int in \[1, "):
        study(checkpoint_every=0)
    assert study(checkpoint_every=None).checkpoint_every is None


def test_cli_checkpoint_every_overrides_the_study(monkeypatch, tmp_path):
    import flatlab.study.runner as runner_mod
    from flatlab.cli.main import app

    file = tmp_path / "ck.py"
    file.write_text(
        "from flatlab import Arm, Study\n"
        "STUDY = Study(name='ck', workload='digits', arms=(Arm('sgd', space={'lr': 0.1}),), scheduler='fifo', "
        "checkpoint_every=3, max_epochs=2)\n"
    )
    seen = []

    def fake_run_study(s, opts, console=None):
        seen.append(s.checkpoint_every)
        raise ConfigError("stop here")  # the CLI prints it and exits 2: no Ray, no MLflow

    monkeypatch.setattr(runner_mod, "run_study", fake_run_study)
    res = CliRunner().invoke(app, ["run", str(file), "--root", str(tmp_path), "--checkpoint-every", "7"])
    assert res.exit_code == 2 and "stop here" in res.output
    res = CliRunner().invoke(app, ["run", str(file), "--root", str(tmp_path)])
    assert seen == [7, 3]
    res = CliRunner().invoke(app, ["run", str(file), "--root", str(tmp_path), "--checkpoint-every", "0"])
    assert res.exit_code == 2 and "--checkpoint-every" in res.output


def test_resume_keeps_the_launchs_checkpoint_every_unless_given(monkeypatch, tmp_path):
    import json

    import flatlab.study.runner as runner_mod
    from flatlab.cli.main import app

    file = tmp_path / "ck.py"
    file.write_text(
        "from flatlab import Arm, Study\n"
        "STUDY = Study(name='ck', workload='digits', arms=(Arm('sgd', space={'lr': 0.1}),), scheduler='fifo', "
        "checkpoint_every=3, max_epochs=2)\n"
    )
    record = tmp_path / "ck" / "launch.json"
    record.parent.mkdir()
    seen = []

    def fake_run_study(s, opts, console=None):
        seen.append(s.checkpoint_every)
        raise ConfigError("stop here")

    monkeypatch.setattr(runner_mod, "run_study", fake_run_study)

    def resume(*extra):
        return CliRunner().invoke(app, ["run", str(file), "--root", str(tmp_path), "--resume", *extra])

    record.write_text(json.dumps({"checkpoint_every": 7}))  # launched with --checkpoint-every 7
    assert resume().exit_code == 2 and resume("--checkpoint-every", "5").exit_code == 2
    record.write_text(json.dumps({"checkpoint_every": None}))  # launched with the default cadence (by time)
    resume()
    record.write_text(json.dumps({"overrides": {"trials": 1}}))  # a record from before the cadence was recorded
    resume()
    assert seen == [7, 5, None, 3]
    record.write_text(json.dumps({"checkpoint_every": "7"}))  # an edited record
    res = resume()
    assert res.exit_code == 2 and "checkpoint_every='7'; expected null or an int >= 1" in res.output and len(seen) == 4


def test_result_buffering_environment():
    # FLATLAB_RESULT_BUFFER_S seconds per batch (default 1); 0 turns buffering off.
    # Tune's controller reads these when Tuner.fit starts; run_study sets them (setdefault) before that
    assert trainable.tune_env(0.0) == {"TUNE_RESULT_BUFFER_LENGTH": "1"}
    assert trainable.tune_env(2.0) == {"TUNE_RESULT_BUFFER_LENGTH": "1000"}  # the batch's time is make_trainable's
    import inspect

    import flatlab.study.driver_log as driver_log
    import flatlab.study.runner as runner_mod

    assert "os.environ.setdefault(key, value)" in inspect.getsource(driver_log.quiet_libraries)
    src = inspect.getsource(runner_mod.StudyLaunch.run)
    assert src.index("quiet_libraries()") < src.index("self.open(") < src.index("self.tune()")
