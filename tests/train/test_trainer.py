import math

import numpy as np
import pytest
import torch

from flatlab.batch import sample_labels
from flatlab.errors import ConfigError
from flatlab.train.closure import BatchClosure
from flatlab.train.resolved import resolve_trainer
from flatlab.train.schedules import Schedule
from flatlab.train.trainer import Diverged, Trainer, TrialSpec
from flatlab.workloads import build_workload
from flatlab.workloads.base import TrainDefaults
from flatlab.workloads.digits import stratified_split


@pytest.fixture(scope="module")
def digits():
    return build_workload("digits").load_data(0)


def spec(**kw):
    args = dict(
        workload="digits",
        optimizer="sgd",
        epochs=4,
        seed=7,
        workload_params={"model": "cnn", "width": 4},
        optimizer_params={"lr": 0.05, "momentum": 0.9, "weight_decay": 5e-4},
        trainer_params={"batch_size": 128},
    )
    args.update(kw)
    return TrialSpec(**args)


def test_digits_split_is_stratified_fixed_and_disjoint(digits):
    assert (len(digits.train), len(digits.val), len(digits.test)) == (1079, 359, 359)
    assert np.bincount(digits.train.targets.numpy(), minlength=10).min() >= 100  # 60% of each class (>= 174)
    assert len(np.unique(digits.val.targets.numpy())) == 10
    a = stratified_split(np.repeat(np.arange(10), 50), (0.2, 0.2), seed=1)
    b = stratified_split(np.repeat(np.arange(10), 50), (0.2, 0.2), seed=1)
    assert all((x == z).all() for x, z in zip(a, b))
    assert len(set(a[0]) & set(a[1])) == 0 and len(a[0]) + len(a[1]) + len(a[2]) == 500
    assert np.bincount(np.repeat(np.arange(10), 50)[a[1]]).tolist() == [10] * 10
    assert float(digits.train.inputs.max()) == 1.0 and float(digits.train.inputs.min()) == 0.0


def test_two_runs_of_the_same_trial_are_identical(digits):
    runs = []
    for _ in range(2):
        t = Trainer(spec(epochs=2), digits)
        runs.append([t.run_epoch() for _ in range(2)])
    for a, b in zip(*runs):
        for k in ("train/loss", "train/accuracy", "val/loss", "val/accuracy", "lr"):
            assert a[k] == b[k], k


def test_resume_from_checkpoint_matches_uninterrupted_run(digits, tmp_path):
    full = Trainer(spec(), digits)
    ref = [full.run_epoch() for _ in range(4)]
    first = Trainer(spec(), digits)
    first.run_epoch(), first.run_epoch()
    first.save(str(tmp_path / "ckpt"))
    torch.manual_seed(12345)  # a restarted process has different global RNG state
    resumed = Trainer(spec(seed=7), digits)
    resumed.load(str(tmp_path / "ckpt"))
    got = [resumed.run_epoch() for _ in range(2)]
    for a, b in zip(ref[2:], got):
        for k in ("epoch", "train/loss", "val/loss", "val/accuracy", "lr"):
            assert a[k] == b[k], k
    for (ka, va), (kb, vb) in zip(full.model.state_dict().items(), resumed.model.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka


def test_divergence_raises(digits):
    t = Trainer(spec(optimizer_params={"lr": 1e6, "momentum": 0.9}, workload_params={"model": "mlp"}), digits)
    with pytest.raises(Diverged, match="training diverged at step"):
        for _ in range(4):
            t.run_epoch()


def test_epoch_reports_the_common_metrics(digits):
    m = Trainer(spec(epochs=1), digits).run_epoch()
    assert {"epoch", "train/loss", "train/accuracy", "val/loss", "val/accuracy", "lr", "time/epoch_s"} <= set(m)
    assert m["epoch"] == 1 and 0 <= m["val/accuracy"] <= 1
    assert all(type(v) in (int, float) for v in m.values()), m  # Tune refuses tensors in reported metrics


def test_optimizer_is_built_from_named_parameters_so_asam_uses_the_official_rule(digits):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning: the names reach ASAM
        t = Trainer(spec(epochs=1, optimizer="asam", optimizer_params={"lr": 0.05, "rho": 0.5}), digits)
        t.run_epoch()
    names = [n for n, _ in t.model.named_parameters()]
    assert [n for g in t.optimizer.param_groups for n in g["param_names"]] == names
    assert any("weight" in n for n, p in t.model.named_parameters() if p.ndim == 1)  # BatchNorm gains, scaled


def test_schedules_closed_forms():
    cos = Schedule("cosine", total_steps=110, steps_per_epoch=10, warmup_steps=10, final_factor=0.05)
    assert cos.factor(0) == pytest.approx(0.1) and cos.factor(9) == pytest.approx(1.0)
    assert cos.factor(10) == pytest.approx(1.0)
    assert cos.factor(60) == pytest.approx(0.05 + 0.95 * 0.5)  # half-way through the cosine
    assert cos.factor(110) == pytest.approx(0.05)
    step = Schedule("step", total_steps=100, steps_per_epoch=10, step_epochs=3, step_factor=0.1)
    assert [step.factor(s) for s in (0, 29, 30, 60)] == pytest.approx([1, 1, 0.1, 0.01])
    assert Schedule("constant", 10, 1).factor(9) == 1.0
    with pytest.raises(ValueError, match="schedule='linear' is not allowed"):
        Schedule("linear", 10, 1)


def test_milestones_schedule_divides_the_lr_by_five_at_epochs_20_50_80():
    # IRE paper, Fig. 2 (b-d): lr 0.1, / 5 at epochs 20, 50 and 80 of 100; 4 steps per epoch
    ms = Schedule("milestones", total_steps=400, steps_per_epoch=4, milestones=(20, 50, 80), step_factor=0.2)
    by_hand = {0: 1.0, 79: 1.0, 80: 0.2, 199: 0.2, 200: 0.04, 319: 0.04, 320: 0.008, 399: 0.008}
    assert {s: ms.factor(s) for s in by_hand} == pytest.approx(by_hand)
    torch_ref = torch.optim.lr_scheduler.MultiStepLR(
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), milestones=[20, 50, 80], gamma=0.2
    )
    for epoch in range(100):  # the same lr as torch's MultiStepLR, epoch by epoch
        assert 0.1 * ms.factor(4 * epoch) == pytest.approx(torch_ref.get_last_lr()[0], rel=1e-12)
        torch_ref.optimizer.step()
        torch_ref.step()
    with pytest.raises(ValueError, match="schedule='milestones' needs milestones"):
        Schedule("milestones", 10, 1)


def test_milestones_are_validated_before_a_trial_starts():
    with pytest.raises(
        ConfigError, match=r"milestones=\[50, 20\] is not allowed; expected None or a strictly increasing"
    ):
        resolve_trainer(TrainDefaults(), {"schedule": "milestones", "milestones": [50, 20]})
    with pytest.raises(ConfigError, match="schedule='milestones' needs milestones"):
        resolve_trainer(TrainDefaults(), {"schedule": "milestones"})
    assert resolve_trainer(TrainDefaults(), {"schedule": "milestones", "milestones": [20, 50]})["milestones"] == (
        20,
        50,
    )


def test_extra_pass_leaves_batchnorm_statistics_untouched(digits):
    torch.manual_seed(0)
    model = build_workload("digits", model="cnn", width=4).build_model().train()
    x, y = digits.train.inputs[:32], digits.train.targets[:32]
    c = BatchClosure(model, torch.nn.functional.cross_entropy, x, y)
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    loss_extra = c.extra()
    after = {k: v for k, v in model.state_dict().items() if k in before}
    assert all(torch.equal(before[k], after[k]) for k in before)
    grads_extra = [p.grad.clone() for p in model.parameters()]
    loss = c()
    assert torch.equal(loss, loss_extra)  # same batch statistics, same loss
    assert all(torch.equal(a, p.grad) for a, p in zip(grads_extra, model.parameters()))
    changed = [k for k in before if not torch.equal(before[k], model.state_dict()[k])]
    assert changed  # the primary pass does update them


def test_sampled_grads_reuse_the_forward_and_keep_true_gradients(digits):
    torch.manual_seed(0)
    model = build_workload("digits").build_model()
    x, y = digits.train.inputs[:64], digits.train.targets[:64]
    params = list(model.parameters())
    c = BatchClosure(model, torch.nn.functional.cross_entropy, x, y)
    c()
    ref = [p.grad.clone() for p in params]
    torch.manual_seed(1)
    loss, sampled = c.with_sampled_grads(params)
    assert all(torch.equal(a, p.grad) for a, p in zip(ref, params))
    # the sampled-label gradient equals a direct computation with the same labels
    torch.manual_seed(1)
    logits = model(x)
    labels = sample_labels(logits)
    direct = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, labels), params)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(sampled, direct))


def test_sampled_labels_follow_the_softmax():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.0, 0.0, 0.5, 0.5]]) + 1e-30).repeat(20000, 1)
    labels = sample_labels(logits).reshape(20000, 2)
    freq0 = torch.bincount(labels[:, 0], minlength=4).float() / 20000
    freq1 = torch.bincount(labels[:, 1], minlength=4).float() / 20000
    assert torch.allclose(freq0, torch.tensor([0.7, 0.2, 0.1, 0.0]), atol=0.015)  # ~4 binomial sd
    assert torch.allclose(freq1, torch.tensor([0.0, 0.0, 0.5, 0.5]), atol=0.015)
    assert labels.dtype == torch.int64 and sample_labels(torch.zeros(3, 5, 7)).shape == (3, 5)


def test_sampled_label_logit_grad_is_the_cross_entropy_gradient_of_the_same_draw():
    from flatlab.train.closure import sampled_label_logit_grad

    logits = torch.randn(6, 5, 11, dtype=torch.float64, requires_grad=True)  # (B, T, V) as for a language model
    torch.manual_seed(3)
    grad = sampled_label_logit_grad(logits)
    torch.manual_seed(3)
    labels = sample_labels(logits)  # the same RNG stream draws the same labels
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1))
    (direct,) = torch.autograd.grad(loss, logits)
    assert grad.shape == logits.shape and grad.dtype == logits.dtype
    assert torch.allclose(grad, direct, atol=1e-6)  # softmax in float32 inside: float32 accuracy
    assert torch.allclose(
        grad.sum(-1), torch.zeros(6, 5, dtype=torch.float64), atol=1e-7
    )  # rows of p - onehot sum to 0


def test_a_deferred_divergence_check_reports_the_exact_first_bad_step(digits):
    """Accelerators read the divergence flag every `check_every` steps; the reported step must not move."""

    def first_bad_step(check_every):
        t = Trainer(spec(optimizer_params={"lr": 1e6, "momentum": 0.9}, workload_params={"model": "mlp"}), digits)
        t.check_every = check_every
        with pytest.raises(Diverged) as info:
            for _ in range(4):
                t.run_epoch()
        return info.value, t.step

    now, steps_now = first_bad_step(1)  # CPU default: checked after every step
    later, steps_later = first_bad_step(7)
    assert now.step == later.step and not math.isfinite(now.loss) and not math.isfinite(later.loss)
    assert steps_now == now.step  # stopped at the bad step itself ...
    assert now.step <= steps_later <= now.step + 7  # ... or at the next check (every 7 steps, or the epoch's end)


@pytest.mark.parametrize(
    "name, params",
    [
        ("sgd", {"lr": 0.1, "momentum": 0.9}),
        ("sam", {"lr": 0.1, "momentum": 0.9, "rho": 0.05}),
        ("sgd_ire", {"lr": 0.1, "momentum": 0.9, "kappa": 2.0, "gamma": 0.5, "mask_interval": 1}),
    ],
)
def test_micro_batches_give_the_full_batch_step(digits, name, params):
    """Gradient accumulation over chunks of 24 (the last one 16) = one pass over 64, for every closure pass
    (SAM's extra pass and IRE's sampled-label gradient included). The MLP has no BatchNorm, so the chunks
    see the same normalisation as the whole batch."""
    from flatlab.optim import get_optimizer

    x, y = digits.train.inputs[:64], digits.train.targets[:64]
    after = []
    for micro in (None, 24):
        torch.manual_seed(0)
        model = build_workload("digits", model="mlp").build_model()
        opt = get_optimizer(name).create(model.parameters(), **params)
        seen = []
        closure = BatchClosure(
            model,
            torch.nn.functional.cross_entropy,
            x,
            y,
            micro_batch=micro,
            on_outputs=lambda out, t, seen=seen: seen.append(len(t)),
        )
        torch.manual_seed(1)  # the same label draws for IRE's curvature pass
        opt.step(closure)
        assert sum(seen) == 64 and len(seen) == (1 if micro is None else 3)
        after.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        assert (closure.outputs is None) == (micro is not None)
    assert torch.allclose(after[0], after[1], atol=1e-6, rtol=1e-5)


def test_micro_batched_sampled_gradients_sum_to_the_full_batch_ones(digits):
    x, y = digits.train.inputs[:64], digits.train.targets[:64]
    torch.manual_seed(0)
    model = build_workload("digits", model="mlp").build_model()
    params = list(model.parameters())
    grads = []
    for micro in (None, 16):
        torch.manual_seed(5)
        loss, sampled = BatchClosure(
            model, torch.nn.functional.cross_entropy, x, y, micro_batch=micro
        ).with_sampled_grads(params)
        grads.append((loss, sampled, [p.grad.clone() for p in params]))
    (l0, s0, g0), (l1, s1, g1) = grads
    assert torch.allclose(l0, l1, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g0, g1))  # the true-label gradient
    # sampled: each chunk draws its labels from the same RNG stream in order; with the CPU generator the
    # 4 draws of 16 uniforms equal one draw of 64, so the sampled gradients agree too
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(s0, s1))
