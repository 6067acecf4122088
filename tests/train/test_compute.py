"""Compute counting: each optimizer's declared passes (``step_passes``) against the forward and backward
calls the model actually received on the trainer's path, against hand counts, and the trainer's pass
budget (:mod:`flatlab.train.compute`)."""

from __future__ import annotations

import math
from typing import Dict

import pytest
import torch
from torch import nn

from flatlab.errors import ConfigError
from flatlab.optim.protocol import passes_of
from flatlab.train.compute import ComputeCounter, steps_within
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads.registry import build_workload

ROWS, BATCH = 1079, 128  # digits' training split: 9 steps per epoch, the last of 55 rows
STEPS = math.ceil(ROWS / BATCH)


class _CountBackward(torch.autograd.Function):
    """Identity on the model's output whose backward counts the backward passes through the model."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, box: Dict[str, int]) -> torch.Tensor:  # type: ignore[override]
        ctx.box = box
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        ctx.box["backward"] += 1
        return grad, None


class Counting(nn.Module):
    """Wraps the trainer's model: counts forward calls in train mode and backward passes through it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.box = {"forward": 0, "backward": 0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.box["forward"] += 1
        return _CountBackward.apply(self.inner(x), self.box)


@pytest.fixture(scope="module")
def digits():
    return build_workload("digits").load_data(0)


def spec(optimizer: str, epochs: int = 1, **kw) -> TrialSpec:
    return TrialSpec(
        workload="digits",
        optimizer=optimizer,
        epochs=epochs,
        seed=0,
        workload_params={"model": "mlp", "width": 8},
        optimizer_params={"lr": 0.05, **kw.pop("params", {})},
        trainer_params={"batch_size": BATCH, **kw.pop("trainer", {})},
        **kw,
    )


# optimizer, its parameters, hand count of (forward, backward) over one epoch of STEPS = 9 steps
CASES = [
    ("sgd", {}, (9, 9)),
    ("adamw", {"lr": 1e-3}, (9, 9)),
    ("sam", {}, (18, 18)),  # 2 passes per step
    ("asam", {}, (18, 18)),
    ("tsam", {"s": 1}, (18, 18)),  # 2s passes per step
    ("tsam", {"s": 3}, (54, 54)),
    ("tsam", {"s": 3, "primary_pass": "center"}, (54, 54)),
    ("sgd_ire", {"mask_interval": 2}, (9, 9 + 5)),  # refreshes at steps 0, 2, 4, 6, 8: one backward each
    ("adamw_ire", {"lr": 1e-3, "mask_interval": 4}, (9, 9 + 3)),  # AdmIRE: refreshes at 0, 4, 8
    ("sam_ire", {"mask_interval": 3}, (18, 18 + 3)),  # SAM-IRE: 2 + 2 per step, refreshes at 0, 3, 6
    ("sgd_ire", {"mask_interval": 2, "switch_step": 3}, (9, 9 + 3)),  # switched on at 3: refreshes at 3, 5, 7
]


@pytest.mark.parametrize("optimizer, params, hand", CASES, ids=[f"{c[0]}{c[1]}" for c in CASES])
def test_declared_passes_equal_the_model_calls_and_hand_counts(digits, optimizer, params, hand, one_torch_thread):
    predicted = Trainer(spec(optimizer, params=params), digits).optimizer  # a fresh run's declared cost
    ahead = [passes_of(predicted, i) for i in range(STEPS)]
    t = Trainer(spec(optimizer, params=params), digits)
    counting = Counting(t.net)
    t.net = counting
    m = t.run_epoch()
    assert (counting.box["forward"], counting.box["backward"]) == hand
    assert (t.compute.forward, t.compute.backward) == hand
    assert tuple(map(sum, zip(*ahead))) == hand  # predicted before the run, step by step
    assert m["compute/passes"] == m["compute/backward"] == hand[1] and m["compute/forward"] == hand[0]
    assert m["compute/examples"] == ROWS
    assert m["compute/eval_examples"] == len(digits.val)
    assert m["compute/train_s"] > 0 and m["compute/eval_s"] > 0 and m["compute/measure_s"] == 0


def test_counts_accumulate_over_epochs_and_survive_a_checkpoint(digits, tmp_path, one_torch_thread):
    t = Trainer(spec("sam", epochs=3), digits)
    t.run_epoch()
    t.save(str(tmp_path))
    resumed = Trainer(spec("sam", epochs=3), digits)
    resumed.load(str(tmp_path))
    m = resumed.run_epoch()
    assert m["compute/passes"] == 2 * 2 * STEPS and m["compute/examples"] == 2 * ROWS
    assert resumed.compute.train_s > t.compute.train_s


@pytest.mark.parametrize(
    "optimizer, passes, steps", [("sgd", 20, 20), ("sam", 20, 10), ("sam", 21, 10), ("tsam", 61, 10)]
)
def test_a_pass_budget_stops_at_the_step(digits, optimizer, passes, steps, one_torch_thread):
    t = Trainer(spec(optimizer, epochs=99, max_passes=passes), digits)
    assert t.max_steps == steps and t.epochs == math.ceil(steps / STEPS) and t.schedule.total_steps == steps
    while not t.finished:
        m = t.run_epoch()
    per_step = passes_of(t.optimizer, 0)[1]
    assert t.step == steps and passes - per_step < t.compute.passes <= passes
    assert m["compute/examples"] == ROWS * (steps // STEPS) + BATCH * (steps % STEPS)
    assert t.epoch == t.epochs


@pytest.mark.parametrize("optimizer", ["sgd", "sam", "tsam"])
def test_a_step_budget_runs_exactly_its_steps_whatever_they_cost(digits, optimizer, one_torch_thread):
    # 22 steps of 9 a epoch: 2 whole epochs and 4 steps of a third, whatever each step spends
    t = Trainer(spec(optimizer, epochs=99, max_steps=22, trainer={"warmup_steps": 5}), digits)
    assert (t.max_steps, t.epochs, t.schedule.total_steps, t.schedule.warmup_steps) == (22, 3, 22, 5)
    while not t.finished:
        m = t.run_epoch()
    assert t.step == 22 and t.epoch == 3
    assert t.compute.passes == 22 * passes_of(t.optimizer, 0)[1]  # 22, 44, 132
    assert m["compute/examples"] == 2 * ROWS + 4 * BATCH


def test_warmup_in_steps_replaces_the_epochs_and_both_are_refused(digits):
    t = Trainer(spec("sgd", epochs=4, trainer={"warmup_steps": 12}), digits)
    assert t.schedule.warmup_steps == 12 and t.schedule.total_steps == 4 * STEPS
    lrs = [t.schedule.factor(k) for k in (0, 5, 11, 12)]  # linear from 1/12 to 1, then cosine from 1
    assert lrs[:3] == pytest.approx([1 / 12, 6 / 12, 1.0]) and lrs[3] == pytest.approx(1.0)
    assert Trainer(spec("sgd", trainer={"warmup_epochs": 1.5}), digits).schedule.warmup_steps == 14  # round(13.5)
    with pytest.raises(ConfigError, match=r"warmup_steps=3 and warmup_epochs=0.5 are both set; set one"):
        Trainer(spec("sgd", trainer={"warmup_steps": 3, "warmup_epochs": 0.5}), digits)
    with pytest.raises(ConfigError, match=r"max_passes=10 and max_steps=10 are both set; set at most one"):
        Trainer(spec("sgd", max_passes=10, max_steps=10), digits)


def test_a_budget_below_one_step_is_refused(digits):
    with pytest.raises(
        ConfigError, match=r"max_passes=5 does not cover the first step of optimizer 'tsam' \(6 passes\)"
    ):
        Trainer(spec("tsam", max_passes=5), digits)


def test_steps_within_and_the_counter():
    assert steps_within(10, lambda i: 2) == 5
    assert steps_within(11, lambda i: 2) == 5
    assert steps_within(1, lambda i: 2) == 0
    assert steps_within(12, lambda i: 1 + (i % 3 == 0)) == 9  # 2,1,1,2,1,1,2,1,1 = 12
    c = ComputeCounter()
    c.add_step(2, 3, 64)
    c.load_state_dict(c.state_dict())
    assert c.metrics()["compute/passes"] == 3 and c.metrics("compute_total/")["compute_total/examples"] == 64
    c.load_state_dict(None)
    assert c.passes == 0 and c.train_s == 0.0


def test_passes_of_checks_the_hook():
    class Bad:
        def step_passes(self, step):
            return 0, 1

    assert passes_of(object(), 7) == (1, 1)
    with pytest.raises(ValueError, match=r"Bad.step_passes\(7\) = \(0, 1\); expected two ints >= 1"):
        passes_of(Bad(), 7)
