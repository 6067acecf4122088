"""Trial checkpoints are safetensors + JSON: exact round trips for every registered optimizer, a
bit-identical resume (from a snapshot written after training went on, as trials write them), and
refusal (naming the file) of pickles, crafted or old, and tampered files."""

from __future__ import annotations

import json
import math
import os
import pickle

import pytest
import torch

from flatlab.optim import OPTIMIZERS
from flatlab.study.validate import validate
from flatlab.train.checkpoint import (
    CHECKPOINT_FILES,
    STATE_FILE,
    TENSORS_FILE,
    CheckpointError,
    load_state,
    save_state,
    snapshot_state,
    written,
)
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload


@pytest.fixture(scope="module")
def digits():
    return build_workload("digits").load_data(0)


def spec(optimizer="sgd", epochs=3, **optimizer_params):
    return TrialSpec(
        workload="digits",
        optimizer=optimizer,
        epochs=epochs,
        seed=3,
        workload_params={"model": "cnn", "width": 4},
        optimizer_params=optimizer_params,
        trainer_params={"batch_size": 256},
    )


def assert_same_tree(a, b, path="state"):
    """Equal values of identical types all the way down (tuples stay tuples, int keys stay ints)."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu()), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same_tree(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, path


def test_tree_round_trip_keeps_types_and_bits(tmp_path):
    w = torch.randn(3, 4)
    state = {
        "model": {"w": w, "tied": w, "view": w[1], "b": torch.arange(5, dtype=torch.int64)},
        "groups": [{"betas": (0.9, 0.999), "params": [0, 1], "foreach": None, "nesterov": False, "name": "x"}],
        "per_param": {0: {"step": torch.tensor(3.0)}, 7: {}},
        "floats": [0.1, -0.0, float("inf"), float("nan"), 1e-310, 2**70],
        "__marker_like": {"__tensor__": "not a tensor"},
        "empty": torch.zeros(0, 2),
        "bytes": torch.tensor([0, 255], dtype=torch.uint8),
        "bf16": torch.tensor([1.5], dtype=torch.bfloat16),
    }
    save_state(state, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(CHECKPOINT_FILES)
    back = load_state(str(tmp_path))
    assert_same_tree(state, back)
    assert math.copysign(1.0, back["floats"][1]) == -1.0


def test_a_snapshot_writes_the_state_as_it_was_when_taken(tmp_path):
    w = torch.arange(12.0).reshape(3, 4)
    state = {"model": {"w": w, "tied": w, "row": w[1]}, "step": 7, "betas": (0.9, 0.999)}
    expected = {"model": {"w": w.clone(), "tied": w.clone(), "row": w[1].clone()}, "step": 7, "betas": (0.9, 0.999)}
    snap = snapshot_state(state)
    assert snap.nbytes == 2 * 12 * 4 + 4 * 4  # its own copies, float32: w twice (tied) and the row
    w.mul_(-1.0)  # training goes on: in-place updates of the live tensors
    state["step"] = 8
    snap.write(str(tmp_path))
    assert_same_tree(expected, load_state(str(tmp_path)))


def test_written_is_a_folder_for_the_block_only(tmp_path):
    snap = snapshot_state({"w": torch.ones(2)})
    with written(snap) as folder:
        assert sorted(os.listdir(folder)) == sorted(CHECKPOINT_FILES)
        assert torch.equal(load_state(folder)["w"], torch.ones(2))
    assert not os.path.exists(folder)
    with pytest.raises(RuntimeError, match="send failed"):
        with written(snap) as folder:
            raise RuntimeError("send failed")
    assert not os.path.exists(folder)  # removed however the block ends
    with written(None) as nothing:
        assert nothing is None


def test_unsupported_leaf_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match=r"set at 'a.b' cannot be checkpointed safely"):
        save_state({"a": {"b": {1, 2}}}, str(tmp_path))


@pytest.mark.parametrize("name", OPTIMIZERS.names())
def test_every_registered_optimizer_round_trips_and_resumes_bit_identically(name, digits, tmp_path, one_torch_thread):
    kw = {"mask_interval": 2, "curvature_beta": 0.5} if name.endswith("_ire") else {}  # resume mid-interval
    full = Trainer(spec(name, **kw), digits)
    ref = [full.run_epoch() for _ in range(3)]
    first = Trainer(spec(name, **kw), digits)
    first.run_epoch()
    first.save(str(tmp_path / "ckpt"))
    assert_same_tree(first.optimizer.state_dict(), load_state(str(tmp_path / "ckpt"))["optimizer"])
    snap = first.snapshot()  # as a trial checkpoints: the state copied now, written by another thread later
    first.run_epoch()  # ... while training goes on
    snap.write(str(tmp_path / "snap"))
    assert_same_tree(load_state(str(tmp_path / "ckpt")), load_state(str(tmp_path / "snap")))
    torch.manual_seed(999)  # a restarted worker has other global RNG states
    resumed = Trainer(spec(name, **kw), digits)
    resumed.load(str(tmp_path / "ckpt"))
    got = [resumed.run_epoch() for _ in range(2)]
    for a, b in zip(ref[1:], got):
        for k in ("epoch", "train/loss", "val/loss", "val/accuracy", "lr"):
            assert a[k] == b[k], k
    for (k, va), vb in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(va, vb), k
    assert_same_tree(full.optimizer.state_dict(), resumed.optimizer.state_dict())
    assert resumed.curve.points() == full.curve.points()


class _Payload:
    """Unpickling it creates ``marker`` (what a crafted checkpoint could do with any command)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_the_payload_would_run_if_unpickled(tmp_path):
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(_Payload(str(marker))))  # the control: a pickle load executes it
    assert marker.exists()


@pytest.mark.parametrize("form", ["trainer.pt only", "pickle as trainer.json", "pickle as safetensors"])
def test_crafted_pickle_checkpoint_is_refused_and_never_runs(form, digits, tmp_path):
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "checkpoint_000001"
    good = Trainer(spec(), digits)
    if form == "trainer.pt only":
        ckpt.mkdir()
        torch.save({"model": _Payload(str(marker))}, str(ckpt / "trainer.pt"))
        expected = r"lacks .*trainer\.safetensors.*trainer\.pt, a pickle"
    else:
        good.save(str(ckpt))
        target = STATE_FILE if form == "pickle as trainer.json" else TENSORS_FILE
        (ckpt / target).write_bytes(pickle.dumps(_Payload(str(marker))))
        expected = (
            r"trainer\.json: not a JSON trainer state"
            if target == STATE_FILE
            else r"trainer\.safetensors: not a valid safetensors"
        )
    with pytest.raises(CheckpointError, match=expected):
        Trainer(spec(), digits).load(str(ckpt))
    assert not marker.exists()


def test_tampered_json_is_refused_naming_the_file(digits, tmp_path):
    t = Trainer(spec(), digits)
    t.save(str(tmp_path))
    doc = json.loads((tmp_path / STATE_FILE).read_text())

    def write(d):
        (tmp_path / STATE_FILE).write_text(json.dumps(d))

    write({**doc, "format": "torch"})
    with pytest.raises(CheckpointError, match=r"trainer\.json: not a flatlab\.trainer-state version 1 file"):
        t.load(str(tmp_path))
    bad = json.loads(json.dumps(doc))
    bad["state"]["model"][next(iter(bad["state"]["model"]))] = {"__tensor__": "nowhere"}
    write(bad)
    with pytest.raises(CheckpointError, match=r"trainer\.json: refers to tensor 'nowhere'"):
        t.load(str(tmp_path))
    bad = json.loads(json.dumps(doc))
    bad["state"]["model"]["x"] = {"__reduce__": ["os.system", ["touch x"]]}
    write(bad)
    with pytest.raises(CheckpointError, match=r"unknown marker object with keys \['__reduce__'\]"):
        t.load(str(tmp_path))
    bad = json.loads(json.dumps(doc))
    del bad["state"]["rng"]
    write(bad)
    with pytest.raises(
        CheckpointError, match=r"trainer\.json: the checkpoint does not fit this trial \(KeyError: 'rng'\)"
    ):
        t.load(str(tmp_path))
    write(doc)
    t.load(str(tmp_path))  # the untouched file still loads


def test_checkpoint_of_another_optimizer_is_refused(digits, tmp_path):
    Trainer(spec("sgd"), digits).save(str(tmp_path))
    with pytest.raises(CheckpointError, match=r"does not fit this trial \(ValueError: SAM.load_state_dict"):
        Trainer(spec("sam"), digits).load(str(tmp_path))


def test_trial_with_a_crafted_checkpoint_fails_before_training(digits, tmp_path, monkeypatch):
    from ray import tune

    from flatlab import Arm, Study
    from flatlab.study import trainable

    marker = tmp_path / "pwned"
    ckpt = tmp_path / "checkpoint_000001"
    ckpt.mkdir()
    torch.save({"model": _Payload(str(marker))}, str(ckpt / "trainer.pt"))
    monkeypatch.setattr(trainable.tune, "get_checkpoint", lambda: tune.Checkpoint.from_directory(str(ckpt)))
    reported = []
    monkeypatch.setattr(trainable.tune, "report", lambda *a, **k: reported.append(a))
    study = validate(
        Study(
            name="c",
            workload="digits",
            workload_params={"model": "cnn", "width": 4},
            arms=(Arm("sgd", space={"lr": 0.05}),),
            num_trials=1,
            max_epochs=2,
        )
    )
    with pytest.raises(CheckpointError, match=r"checkpoint_000001.*trainer\.pt, a pickle"):
        trainable.run_trial({"arm": "sgd", "seed": 0, "lr": 0.05}, study=study, data=digits)
    assert not marker.exists() and reported == []
