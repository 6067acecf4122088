"""The smoothed training-loss curve (IRE paper, Fig. 4 steps-to-target) and the trainer's copy of it."""

import json
import math

import pytest
import torch

from flatlab.analysis.curve_points import first_step_at_or_below
from flatlab.errors import ConfigError
from flatlab.train.curve import LossCurve
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload


def feed(curve, losses):
    for x in losses:
        curve.update(torch.tensor(float(x), dtype=torch.float32))
    return curve


def test_ema_is_bias_corrected():
    pts = feed(LossCurve(0.5), [3.0, 2.5, 1.0, 1.0]).points()
    # e_t = 0.5 e_{t-1} + 0.5 x_t: 1.5, 2.0, 1.5, 1.25; divided by 1 - 0.5^t: 0.5, 0.75, 0.875, 0.9375
    assert [s for s, _ in pts] == [1, 2, 3, 4]
    assert [v for _, v in pts] == pytest.approx([3.0, 2.0 / 0.75, 1.5 / 0.875, 1.25 / 0.9375], rel=1e-15, abs=0)
    raw = feed(LossCurve(0.0), [3.0, 2.5, 1.0]).points()
    assert raw == [(1, 3.0), (2, 2.5), (3, 1.0)]


def test_update_keeps_the_ema_on_the_loss_device_as_a_tensor():
    c = feed(LossCurve(0.9), [2.0, 1.0])
    assert len(c._values) == 2 and all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in c._values)
    assert c._ema.dtype == torch.float64 and c._ema.device == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_update_never_syncs_with_the_host_on_cuda():
    c = LossCurve(0.9, max_points=4, device="cuda")
    loss = torch.tensor(2.0, device="cuda")
    torch.cuda.set_sync_debug_mode("error")  # any host sync raises
    try:
        for _ in range(20):
            c.update(loss)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert c.points()[-1] == (20, pytest.approx(2.0, rel=1e-12))


def test_downsampling_keeps_evenly_spaced_points_and_a_bounded_length():
    c = feed(LossCurve(0.0, max_points=4), range(1, 38))  # raw loss = step
    # held steps: 1..4; 5 points -> 2, 4 (stride 2) ... -> 8, 16, 24, 32 (stride 8) at step 37
    assert c.stride == 8 and len(c) == 4
    assert c.points() == [(8, 8.0), (16, 16.0), (24, 24.0), (32, 32.0), (37, 37.0)]
    assert feed(LossCurve(0.0, max_points=4), range(1, 33)).points()[-1] == (32, 32.0)  # on the grid: not repeated
    big = feed(LossCurve(0.0), [1.0] * 3000)
    assert big.stride == 4 and len(big) == 750 and len(big) <= big.max_points
    assert [s for s, _ in big.points()] == list(range(4, 3001, 4))


def test_points_end_with_the_latest_step():
    c = feed(LossCurve(0.5, max_points=2), [4.0, 2.0, 2.0])
    # steps 1, 2, 3 -> 3 points > 2 -> keep step 2, stride 2; step 3 is off the grid
    pts = c.points()
    assert pts[0][0] == 2 and pts[-1][0] == 3 and len(pts) == 2
    assert pts[-1][1] == pytest.approx((0.5 * (0.5 * 2.0 + 1.0) + 1.0) / (1 - 0.5**3), rel=1e-15)
    assert LossCurve().points() == []


def test_first_step_at_or_below():
    pts = [(1, 5.0), (2, 4.0), (4, 3.0), (8, 2.0)]
    assert first_step_at_or_below(pts, 3.5) == 4
    assert first_step_at_or_below(pts, 3.0) == 4  # <=
    assert first_step_at_or_below(pts, 9.0) == 1
    assert first_step_at_or_below(pts, 1.9) is None
    assert first_step_at_or_below([(1, math.nan), (3, 1.0)], 2.0) == 3
    assert first_step_at_or_below([], 1.0) is None


def test_state_dict_round_trip_continues_identically():
    g = torch.Generator().manual_seed(0)
    losses = (torch.rand(50, generator=g) * 3).tolist()
    full = feed(LossCurve(0.9, max_points=8), losses)
    first = feed(LossCurve(0.9, max_points=8), losses[:23])
    state = json.loads(json.dumps(first.state_dict()))  # plain Python numbers and lists
    resumed = LossCurve(0.9, max_points=8)
    resumed.load_state_dict(state)
    feed(resumed, losses[23:])
    assert resumed.points() == full.points() and resumed.state_dict() == full.state_dict()
    with pytest.raises(ValueError, match=r"checkpoint has smoothing=0.9, max_points=8; this curve has smoothing=0.5"):
        LossCurve(0.5, max_points=8).load_state_dict(state)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(smoothing=1.0), r"smoothing=1.0; expected a float in \[0, 1\)"),
        (dict(smoothing=-0.1), r"smoothing=-0.1"),
        (dict(smoothing=True), r"smoothing=True"),
        (dict(max_points=1), r"max_points=1; expected an int >= 2"),
        (dict(max_points=8.0), r"max_points=8.0"),
    ],
)
def test_bad_arguments_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        LossCurve(**kw)


# ---- the trainer's curve ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits():
    return build_workload("digits").load_data(0)


def spec(**trainer):
    return TrialSpec(
        workload="digits",
        optimizer="sgd",
        epochs=2,
        seed=3,
        workload_params={"model": "mlp", "width": 16},
        optimizer_params={"lr": 0.1, "momentum": 0.9},
        trainer_params={"batch_size": 128, **trainer},
    )


def test_trainer_updates_the_curve_once_per_step_with_the_batch_loss(digits, one_torch_thread):
    t = Trainer(spec(curve_smoothing=0.0), digits)
    m = t.run_epoch()
    pts = t.curve.points()
    assert [s for s, _ in pts] == list(range(1, 10)) and t.step == 9  # 1079 examples / 128
    sizes = [128] * 8 + [1079 - 8 * 128]
    assert sum(v * n for (_, v), n in zip(pts, sizes)) / 1079 == pytest.approx(m["train/loss"], rel=1e-12)
    with pytest.raises(ConfigError, match=r"curve_smoothing=1.0 is not allowed"):
        Trainer(spec(curve_smoothing=1.0), digits)


def test_trainer_resume_keeps_the_curve(digits, tmp_path, one_torch_thread):
    full = Trainer(spec(), digits)
    full.run_epoch(), full.run_epoch()
    first = Trainer(spec(), digits)
    first.run_epoch()
    first.save(str(tmp_path / "ckpt"))
    resumed = Trainer(spec(), digits)
    resumed.load(str(tmp_path / "ckpt"))
    resumed.run_epoch()
    assert len(full.curve.points()) == 18
    assert resumed.curve.points() == full.curve.points()

    old = first.state_dict()
    del old["curve"]  # a checkpoint from before the curve existed
    legacy = Trainer(spec(), digits)
    legacy.load_state_dict(old)
    assert legacy.curve.step == 9 and legacy.curve.points() == []
    legacy.run_epoch()
    assert [s for s, _ in legacy.curve.points()] == list(range(10, 19))


def test_accumulation_dtype_is_float64_except_on_mps():
    from flatlab.train.precision import accumulation_dtype

    assert accumulation_dtype("cpu") is torch.float64 and accumulation_dtype(torch.device("cuda", 1)) is torch.float64
    assert accumulation_dtype("mps") is torch.float32  # MPS has no float64
    assert LossCurve(0.9, device="cpu").dtype is torch.float64
