"""Mixed precision (issue 15, item 1): bf16 autocast over every pass of a step, fp16 with per-pass loss
scaling whose overflowing steps are skipped for every registered optimizer, the loss scaler's rule, and
the trainer's ``precision`` parameter (metrics, checkpoints, ConfigError)."""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flatlab.errors import ConfigError
from flatlab.optim import get_optimizer
from flatlab.optim.registry import OPTIMIZERS
from flatlab.train.closure import BatchClosure
from flatlab.train.precision import LossScaler, Precision
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload

# Settings that make every optimizer's step do its full work on a tiny model: TSAM with 2 samples, IRE
# on from the first step, its mask refreshed every 2nd step (the compared step holds the fp32 mask; the
# mask a bf16 refresh picks is tested on its own).
EXTRA: Dict[str, Dict[str, Any]] = {
    "tsam": {"s": 2, "noise_radius": 0.05},
    "sgd_ire": {"mask_interval": 2, "kappa": 1.0},
    "adamw_ire": {"mask_interval": 2, "kappa": 1.0},
    "sam_ire": {"mask_interval": 2, "kappa": 1.0},
}


def registered() -> List[str]:
    names = OPTIMIZERS.names()
    assert {"sgd", "adamw", "sam", "asam", "tsam", "sgd_ire", "adamw_ire", "sam_ire"} <= set(names)
    return sorted(names)


def model(seed: int = 0) -> nn.Module:
    """Linear-BN-ReLU-Linear on 16 features, 5 classes (BatchNorm: the extra passes' hooks are exercised).

    No bias before the BatchNorm: its true gradient is 0, so its computed one is rounding noise whose
    sign (all that AdamW's first step keeps) would differ between precisions.
    """
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32, bias=False), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 5))


def batch(n: int = 64):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 16, generator=g), torch.randint(0, 5, (n,), generator=g)


def build(name: str, net: nn.Module):
    params = {"lr": 0.05, **EXTRA.get(name, {})}
    return get_optimizer(name).create(net.named_parameters(), **params)


def one_step(name: str, precision: Precision | None, **closure_kw):
    """A fresh model, one fp32 step (optimizer state: momentum, Adam moments, IRE's mask), then one step
    on another batch in ``precision``; returns (that step's update per tensor, its closure)."""
    net = model()
    opt = build(name, net)
    x, y = batch()
    torch.manual_seed(11)  # TSAM's noise and IRE's sampled labels: the same draws in every precision
    opt.step(BatchClosure(net, F.cross_entropy, x, y, **closure_kw))
    before = [p.detach().clone() for p in net.parameters()]
    torch.manual_seed(12)
    c = BatchClosure(net, F.cross_entropy, x.flip(0) * 1.5, y.flip(0), precision=precision, **closure_kw)
    opt.step(c)
    return [p.detach() - b for p, b in zip(net.parameters(), before)], c


def rel_err(a: List[torch.Tensor], b: List[torch.Tensor]) -> float:
    num = sum(float((x - y).pow(2).sum()) for x, y in zip(a, b)) ** 0.5
    den = sum(float(y.pow(2).sum()) for y in b) ** 0.5
    return num / den


# bf16 keeps 8 significant bits (unit roundoff 2^-9 ≈ 2e-3); the forward and backward of two width-32
# layers and a BatchNorm compound that to about 1 % of the gradient (measured: 0.3-2 % relative L2 error
# of the step's update over the registered optimizers, TSAM's tilt and AdamW's normalisation the
# largest), so 5 % is a bound with room that still catches a pass left in the wrong precision or a
# wrongly scaled gradient. fp16 keeps 11 bits (measured: 0.03-0.7 %): 2 %.
BF16_TOL = 0.05
FP16_TOL = 0.02


@pytest.mark.parametrize("name", registered())
def test_bf16_step_is_close_to_the_fp32_step(name):
    ref, _ = one_step(name, None)
    got, c = one_step(name, Precision("bf16"))
    err = rel_err(got, ref)
    assert 0 < err < BF16_TOL, err  # > 0: autocast really ran the passes in bf16
    assert c.loss.dtype == torch.float32
    assert not c.overflowed


@pytest.mark.parametrize("name", registered())
def test_normal_fp16_step_on_cpu_is_close_to_fp32_and_keeps_the_scale(name):
    ref, _ = one_step(name, None)
    prec = Precision("fp16")
    got, c = one_step(name, prec)
    assert not c.overflowed
    assert 0 < rel_err(got, ref) < FP16_TOL
    prec.scaler.update(c.overflowed)
    assert prec.scaler.scale == 2.0**16 and prec.scaler.growth_tracker == 1


@pytest.mark.parametrize("name", ["sgd_ire", "sam_ire"])
def test_a_bf16_mask_refresh_marks_nearly_the_same_flat_coordinates(name):
    """IRE's mask is a discrete choice (the ⌊γ·p⌋ smallest h, h from labels SAMPLED from the softmax): a
    coordinate near the threshold, or a label whose uniform draw falls near a CDF boundary, may flip. The
    masks agree on at least 90 % of the coordinates (measured: about 95 %)."""
    masks = []
    for prec in (None, Precision("bf16")):
        net = model()
        opt = build(name, net)
        torch.manual_seed(11)
        opt.step(BatchClosure(net, F.cross_entropy, *batch(), precision=prec))
        masks.append(torch.cat([opt.state[p]["mask"].flatten() for p in net.parameters()]))
    agree = float((masks[0] == masks[1]).float().mean())
    assert 0.9 <= agree and int(masks[1].sum()) >= int(0.8 * masks[1].numel())


def test_bf16_passes_hand_float32_gradients_and_losses_to_the_optimizers():
    net = model()
    seen = []
    net[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    c = BatchClosure(net, F.cross_entropy, *batch(), precision=Precision("bf16"))
    loss = c()
    extra = c.extra()
    _, sampled = c.with_sampled_grads(list(net.parameters()))
    assert seen == [torch.bfloat16] * 3  # every pass's forward under autocast
    assert loss.dtype == extra.dtype == torch.float32
    assert all(p.grad.dtype == torch.float32 for p in net.parameters())
    assert all(g.dtype == torch.float32 for g in sampled)


def snapshot(opt) -> Any:
    return copy.deepcopy(opt.state_dict())


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


class PassCounter:
    """A gradient hook on one parameter: counts backward passes and makes pass number ``inject`` inf."""

    def __init__(self, p: torch.Tensor, inject: int = 0) -> None:
        self.passes, self.inject = 0, inject
        p.register_hook(self)

    def __call__(self, g: torch.Tensor) -> torch.Tensor:
        self.passes += 1
        return g * float("inf") if self.passes == self.inject else g


def passes_per_step(name: str) -> int:
    """Gradient computations reaching one weight in an optimizer's SECOND step (IRE's sampled-label
    gradient counts as one, in the same pass as the true-label one)."""
    net = model()
    opt = build(name, net)
    opt.step(BatchClosure(net, F.cross_entropy, *batch(), precision=Precision("fp16")))
    counter = PassCounter(net[3].weight)
    opt.step(BatchClosure(net, F.cross_entropy, *batch(), precision=Precision("fp16")))
    return counter.passes


@pytest.mark.parametrize("name", registered())
@pytest.mark.parametrize("where", ["huge scale", "inf in the last pass"])
def test_fp16_overflow_skips_the_whole_step_and_halves_the_scale(name, where):
    net = model()
    opt = build(name, net)
    prec = Precision("fp16")
    x, y = batch()
    opt.step(BatchClosure(net, F.cross_entropy, x, y, precision=prec))  # a normal step first: state to protect
    prec.scaler.update(False)
    params = [p.detach().clone() for p in net.parameters()]
    buffers = [b.clone() for b in net.buffers()]
    state = snapshot(opt)
    metrics_before = copy.deepcopy(opt.pop_metrics()) if hasattr(opt, "pop_metrics") else None
    if where == "huge scale":
        prec.scaler.scale = 2.0**40  # loss x 2^40: the fp16 activations' gradients overflow in the first pass
        expected = 2.0**39
    else:
        n = passes_per_step(name)
        PassCounter(net[3].weight, inject=n)  # SAM's ascent pass, TSAM's last sample, IRE's only pass ...
        expected = 2.0**15
    c = BatchClosure(net, F.cross_entropy, x, y, precision=prec)
    opt.step(c)
    prec.scaler.update(c.overflowed)
    assert c.overflowed
    assert all(torch.equal(a, p) for a, p in zip(params, net.parameters()))  # parameters unchanged, bit for bit
    assert same(snapshot(opt), state)  # momentum / Adam moments and steps / IRE mask and counters unchanged
    assert all(p.grad is None for p in net.parameters())
    assert prec.scaler.scale == expected and prec.scaler.growth_tracker == 0 and prec.scaler.pop_skipped() == 1
    if metrics_before is not None:
        assert opt.pop_metrics() == {}  # nothing recorded for the skipped step
    # BatchNorm running statistics: the primary pass still ran (as in a plain AMP step that is skipped)
    assert len(buffers) == len(list(net.buffers()))


@pytest.mark.parametrize("name, inject", [("sam_ire", 2), ("sgd_ire", 1)])
def test_ire_refresh_is_undone_when_its_step_overflows(name, inject):
    """SAM-IRE: the mask is refreshed from the primary pass, then SAM's ascent pass overflows; SGD-IRE: the
    sampled-label gradient itself overflows. The old mask and curvature EMA must be back, the step
    counter too, and the next step refreshes again."""
    net = model()
    opt = get_optimizer(name).create(net.named_parameters(), lr=0.05, mask_interval=2, kappa=1.0, curvature_beta=0.5)
    prec = Precision("fp16")
    x, y = batch()
    opt.step(BatchClosure(net, F.cross_entropy, x, y, precision=prec))
    masks = {p: opt.state[p]["mask"].clone() for p in net.parameters()}
    curv = {p: opt.state[p]["curvature"].clone() for p in net.parameters()}
    opt.step(BatchClosure(net, F.cross_entropy, x * 3, y, precision=prec))  # 2nd step: mask held (K = 2)
    PassCounter(net[3].weight, inject=inject)  # in the refresh step
    steps = opt._steps
    c = BatchClosure(net, F.cross_entropy, -x, y, precision=prec)
    opt.step(c)
    assert c.overflowed and opt._steps == steps
    for p in net.parameters():
        assert torch.equal(opt.state[p]["mask"], masks[p])
        assert torch.equal(opt.state[p]["curvature"], curv[p])
    assert opt._since_refresh == 2  # still due: the next step refreshes


def test_fp16_unscales_each_pass_once_with_micro_batches_and_clips_the_true_gradient():
    net = model()
    c = BatchClosure(net, F.cross_entropy, *batch(), precision=Precision("fp16"), micro_batch=16)
    c()
    g16 = [p.grad.clone() for p in net.parameters()]
    c.extra()  # a second pass of the same closure: unscaled once more, not twice
    g16b = [p.grad.clone() for p in net.parameters()]
    ref_net = model()
    BatchClosure(ref_net, F.cross_entropy, *batch(), micro_batch=16)()
    ref = [p.grad for p in ref_net.parameters()]
    assert rel_err(g16, ref) < 0.05 and rel_err(g16b, ref) < 0.05  # a missed or doubled 2^16 would be off by 65536x
    clipped = BatchClosure(model(), F.cross_entropy, *batch(), precision=Precision("fp16"), clip_norm=0.01)
    clipped()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in clipped.model.parameters()]))
    assert float(norm) == pytest.approx(0.01, rel=1e-4)  # clipped after unscaling (else it would be 0.01 / 2^16)


def test_loss_scaler_rule_and_round_trip():
    s = LossScaler(init_scale=8.0, growth_interval=3)
    for overflow in (False, False, False):
        s.update(overflow)
    assert (s.scale, s.growth_tracker) == (16.0, 0)  # grows after 3 finite steps
    s.update(False)
    s.update(True)
    assert (s.scale, s.growth_tracker, s.pop_skipped(), s.pop_skipped()) == (8.0, 0, 1, 0)
    t = LossScaler()
    t.load_state_dict(s.state_dict())
    assert (t.scale, t.growth_tracker) == (8.0, 0)
    with pytest.raises(ConfigError, match=r"backoff_factor < 1.*backoff_factor=2\.0"):
        LossScaler(backoff_factor=2.0)
    with pytest.raises(ConfigError, match=r"precision='fp8' is not allowed; expected one of fp32, bf16, fp16"):
        Precision("fp8")


@pytest.fixture(scope="module")
def digits():
    return build_workload("digits").load_data(0)


def spec(**trainer):
    return TrialSpec(
        workload="digits",
        optimizer="sam",
        epochs=1,
        seed=3,
        workload_params={"model": "cnn", "width": 4},
        optimizer_params={"lr": 0.05},
        trainer_params={"batch_size": 256, **trainer},
    )


def test_trainer_precision_parameter(digits, tmp_path):
    with pytest.raises(ConfigError, match=r"precision.*fp32.*bf16.*fp16"):
        Trainer(spec(precision="fp64"), digits)
    fp32 = Trainer(spec(), digits).run_epoch()
    assert "train/skipped_steps" not in fp32
    bf16 = Trainer(spec(precision="bf16"), digits).run_epoch()
    assert (
        bf16["train/loss"] == pytest.approx(fp32["train/loss"], rel=0.05) and bf16["train/loss"] != fp32["train/loss"]
    )
    t = Trainer(spec(precision="fp16"), digits)
    t.precision.scaler.scale = 2.0**60  # overflows: halved after every skipped step until it fits
    m = t.run_epoch()
    assert m["train/skipped_steps"] >= 1 and m["train/loss_scale"] == 2.0 ** (60 - m["train/skipped_steps"])
    t.save(str(tmp_path / "ck"))
    back = Trainer(spec(precision="fp16"), digits)
    back.load(str(tmp_path / "ck"))
    assert back.precision.scaler.scale == t.precision.scaler.scale
