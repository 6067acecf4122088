"""The trainer's ``clip_norm``: applied after every backward pass, so each optimizer steps with clipped
gradients (SAM's ascent and final gradient, IRE's base step included)."""

import pytest
import torch

from flatlab.errors import ConfigError
from flatlab.optim.registry import get_optimizer
from flatlab.train.closure import BatchClosure
from flatlab.train.trainer import Trainer, TrialSpec
from flatlab.workloads import build_workload


def grad_norm(model):
    return torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None)).item()


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(32, 6) * 10, torch.randint(0, 3, (32,))
    return model, x, y


def test_every_closure_pass_clips_the_true_gradient():
    model, x, y = _setup()
    BatchClosure(model, torch.nn.functional.cross_entropy, x, y)()
    assert grad_norm(model) > 0.5  # large enough for the clip to act
    c = BatchClosure(model, torch.nn.functional.cross_entropy, x, y, clip_norm=0.01)
    c()
    assert grad_norm(model) == pytest.approx(0.01, rel=1e-4)
    c.extra()
    assert grad_norm(model) == pytest.approx(0.01, rel=1e-4)
    params = list(model.parameters())
    _, sampled = c.with_sampled_grads(params)
    assert grad_norm(model) == pytest.approx(0.01, rel=1e-4)
    assert torch.sqrt(sum((g**2).sum() for g in sampled)).item() > 0.01  # the ranking gradient is left alone


@pytest.mark.parametrize(
    "name, params, bound",
    [
        ("sgd", {"lr": 1.0, "momentum": 0.0}, 1.0),
        ("sam", {"lr": 1.0, "momentum": 0.0, "rho": 0.5}, 1.0),
        (
            "sgd_ire",
            {"lr": 1.0, "momentum": 0.0, "kappa": 2.0, "gamma": 0.5},
            3.0,
        ),  # flat coordinates move (1 + kappa)x
    ],
)
def test_each_optimizer_steps_with_the_clipped_gradient(name, params, bound):
    model, x, y = _setup()
    opt = get_optimizer(name).create(model.parameters(), **params)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    opt.step(BatchClosure(model, torch.nn.functional.cross_entropy, x, y, clip_norm=0.01))
    step = (torch.cat([p.detach().flatten() for p in model.parameters()]) - before).norm().item()
    assert 0 < step <= 0.01 * bound * (1 + 1e-5)


def test_trainer_reads_clip_norm_and_validates_it():
    params = {
        "data_path": "synthetic",
        "synthetic_tokens": 512,
        "n_layers": 1,
        "width": 16,
        "n_heads": 2,
        "context": 16,
    }
    data = build_workload("lm/wikitext2", **params).load_data(0)
    spec = TrialSpec(
        workload="lm/wikitext2",
        optimizer="adamw",
        epochs=1,
        workload_params=params,
        optimizer_params={"lr": 1e-3},
        trainer_params={"batch_size": 8, "clip_norm": 1.0},
    )
    t = Trainer(spec, data)
    assert t.hp["clip_norm"] == 1.0
    t.run_epoch()
    bad = TrialSpec(
        workload="lm/wikitext2", optimizer="adamw", epochs=1, workload_params=params, trainer_params={"clip_norm": 0.0}
    )
    with pytest.raises(ConfigError, match=r"clip_norm=0.0 is not allowed; expected float in \(0, inf\) or None"):
        Trainer(bad, data)
