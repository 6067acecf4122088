"""Feeding the accelerator (issue 15, item 4): pinned, non-blocking copies and on-device augmentation are
no-ops on CPU (results bitwise unchanged), and streamed inputs are decoded one mini-batch ahead."""

from __future__ import annotations

import torch

from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload
from flatlab.workloads.base import Data, Split, to_device
from flatlab.workloads.images import random_crop_flip


def test_to_device_on_cpu_returns_the_same_tensors():
    x = torch.arange(6).reshape(2, 3)
    assert to_device(x, torch.device("cpu")) is x
    d = {"a": x, "b": x.float()}
    moved = to_device(d, "cpu")
    assert moved["a"] is d["a"] and moved["b"] is d["b"]


def test_random_crop_flip_matches_a_per_image_reference():
    x = torch.randint(0, 256, (5, 3, 6, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    got = random_crop_flip(x, torch.Generator().manual_seed(4), pad=2)
    g = torch.Generator().manual_seed(4)  # the same draws, in the same order: offsets y, offsets x, flips
    oy = torch.randint(0, 5, (5,), generator=g)
    ox = torch.randint(0, 5, (5,), generator=g)
    flips = torch.rand(5, generator=g) < 0.5
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(5):
        ref = padded[i, :, oy[i] : oy[i] + 6, ox[i] : ox[i] + 7]
        assert torch.equal(got[i], ref.flip(-1) if flips[i] else ref)


def cifar_trainer(on_device: bool) -> Trainer:
    wl = build_workload(
        "cifar10", data_path="synthetic", synthetic_size=32, val_size=8, model="resnet18", width_mult=1 / 16
    )
    spec = TrialSpec(
        workload="cifar10",
        optimizer="sgd",
        epochs=1,
        seed=5,
        workload_params={
            "data_path": "synthetic",
            "synthetic_size": 32,
            "val_size": 8,
            "model": "resnet18",
            "width_mult": 1 / 16,
        },
        optimizer_params={"lr": 0.05},
        trainer_params={"batch_size": 16},
    )
    t = Trainer(spec, wl.load_data(0), workload=wl)
    assert t._augment_on_device is False  # never on CPU
    t._augment_on_device = on_device  # force the accelerator's order (copy, then augment) on CPU
    return t


def test_augmenting_after_the_copy_gives_bitwise_the_same_training_on_cpu():
    assert build_workload("cifar10", data_path="synthetic").augments_on_device is True
    assert build_workload("cifar10", data_path="synthetic", augment="autoaugment").augments_on_device is False
    host, device = cifar_trainer(False), cifar_trainer(True)
    a, b = host.run_epoch(), device.run_epoch()
    for k in ("train/loss", "train/accuracy", "val/loss", "val/accuracy"):
        assert a[k] == b[k], k
    for (ka, va), (kb, vb) in zip(host.model.state_dict().items(), device.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka


class LoggedInputs:
    """A stand-in for streamed inputs (like LazyImages): rows of a tensor, every get and prefetch logged."""

    def __init__(self, x: torch.Tensor, log: list) -> None:
        self.x, self.log = x, log

    @property
    def shape(self) -> torch.Size:
        return self.x.shape

    def __getitem__(self, idx):
        self.log.append(("get", torch.as_tensor(idx).tolist()))
        return self.x[idx]

    def prefetch(self, idx) -> None:
        self.log.append(("prefetch", torch.as_tensor(idx).tolist()))


def test_streamed_inputs_are_decoded_one_batch_ahead_of_the_step():
    data = build_workload("digits").load_data(0)
    log: list = []
    streamed = Data(train=Split(LoggedInputs(data.train.inputs[:100], log), data.train.targets[:100]), val=data.val)
    spec = TrialSpec(
        workload="digits",
        optimizer="sgd",
        epochs=1,
        seed=1,
        optimizer_params={"lr": 0.1},
        trainer_params={"batch_size": 32},
    )
    t = Trainer(spec, streamed)
    t.model.register_forward_pre_hook(lambda m, i: log.append(("step",)) if m.training else None)
    t.run_epoch()
    kinds = [e[0] for e in log]
    # get batch k, start decoding batch k+1, then train on batch k; the last batch has nothing after it
    assert kinds == ["get", "prefetch", "step"] * 3 + ["get", "step"]
    gets = [e[1] for e in log if e[0] == "get"]
    prefetched = [e[1] for e in log if e[0] == "prefetch"]
    assert prefetched == gets[1:] and sorted(sum(gets, [])) == list(range(100))
