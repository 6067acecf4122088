import pytest

from flatlab.errors import UnknownNameError
from flatlab.optim.registry import OPTIMIZERS, get_optimizer
from flatlab.workloads.registry import WORKLOADS, get_workload


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(
        UnknownNameError,
        match=r"unknown optimizer 'adam' \(did you mean 'adamw' or 'asam'\?\); valid optimizers: .*adamw, .*sgd",
    ):
        get_optimizer("adam")
    with pytest.raises(
        UnknownNameError,
        match=r"unknown workload 'cifar' \(did you mean 'cifar10' or 'cifar100'\?\); valid workloads: .*digits",
    ):
        get_workload("cifar")
    with pytest.raises(UnknownNameError, match=r"unknown optimizer 'zzz'; valid optimizers"):  # nothing close: no hint
        get_optimizer("zzz")


@pytest.mark.parametrize("name", WORKLOADS.names())
def test_every_workload_builds_and_evaluates(name):
    cls = get_workload(name)
    wl = cls(**getattr(cls, "smoke_params", {}))  # tiny, synthetic, offline
    data = wl.load_data(0)
    model = wl.build_model()
    out = wl.evaluate(model, data.val)
    assert "loss" in out and all(f"val/{k}" in wl.metrics for k in out)
    assert "train/loss" in wl.metrics
    if "accuracy" in out:
        assert 0.0 <= out["accuracy"] <= 1.0


@pytest.mark.parametrize("name", OPTIMIZERS.names())
def test_every_optimizer_declares_lr_and_builds_from_defaults(name):
    import torch

    spec = get_optimizer(name)
    assert "lr" in [h.name for h in spec.hparams]
    model = torch.nn.Linear(3, 2)
    opt = spec.create(model.parameters())
    assert opt.param_groups[0]["lr"] == next(h.default for h in spec.hparams if h.name == "lr")
