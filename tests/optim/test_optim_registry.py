"""Every registered optimizer (parametrized over OPTIMIZERS.names(), so new entries are tested too):
builds from its defaults over ``model.named_parameters()`` (as the trainer does) and over plain
``model.parameters()``, steps a small BatchNorm CNN, updates BatchNorm statistics exactly once,
resumes bit-identically from a checkpoint, and rejects bad hyperparameters with a named ConfigError."""

from __future__ import annotations

import math
import re
import warnings
from typing import Any, Dict, List

import pytest
import torch
from _optim_testlib import assert_bitwise, closure_for, image_batch, params_of, roundtrip, small_cnn

from flatlab.errors import ConfigError
from flatlab.hparams import HParam
from flatlab.optim import OPTIMIZERS, Progress, get_optimizer

NAMES = OPTIMIZERS.names()
EXPECTED_METRICS = {
    "sgd": set(),
    "adamw": set(),
    "sam": {"opt/perturbed_loss"},
    "asam": {"opt/perturbed_loss"},
    "tsam": {"opt/perturbed_loss", "opt/perturbed_loss_max", "opt/tilted_loss"},
    "sgd_ire": {"opt/ire_active", "opt/flat_fraction", "opt/kappa"},
    "adamw_ire": {"opt/ire_active", "opt/flat_fraction", "opt/kappa"},
    "sam_ire": {"opt/perturbed_loss", "opt/ire_active", "opt/flat_fraction", "opt/kappa"},
    "sam_adamw": {"opt/perturbed_loss"},
    "tsam_adamw": {"opt/perturbed_loss", "opt/perturbed_loss_max", "opt/tilted_loss"},
    "sam_adamw_ire": {"opt/perturbed_loss", "opt/ire_active", "opt/flat_fraction", "opt/kappa"},
    "pgn": {"opt/perturbed_loss"},
    "rsam": {"opt/perturbed_loss"},
    "esam2": {"opt/perturbed_loss", "opt/ascent_fraction"},
}
# optimizers whose one updating pass runs at a randomly perturbed θ, as their released procedure does
NOISY_PRIMARY = {"rsam"}


def _step(opt, model, batch, step: int):
    if hasattr(opt, "on_progress"):
        opt.on_progress(Progress(step=step, epoch=step // 4, total_steps=20, steps_per_epoch=4))
    return opt.step(closure_for(model, batch))


def test_the_papers_optimizers_are_registered():
    assert set(EXPECTED_METRICS) <= set(NAMES)
    for name in NAMES:
        spec = get_optimizer(name)
        if spec.base is not None:  # a wrapper declares its base's hyperparameters first
            base = get_optimizer(spec.base)
            assert [h.name for h in spec.hparams][: len(base.hparams)] == [h.name for h in base.hparams]


@pytest.mark.parametrize("name", NAMES)
def test_builds_from_defaults_and_steps_a_batchnorm_cnn(name):
    model, batch = small_cnn(), image_batch()
    opt = get_optimizer(name).create(model.named_parameters())
    assert [g["param_names"] for g in opt.param_groups] == [[n for n, _ in model.named_parameters()]]
    before = params_of(model)
    loss = _step(opt, model, batch, 0)
    assert loss is not None and math.isfinite(float(loss))
    after = params_of(model)
    assert all(torch.isfinite(p).all() for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    metrics = opt.pop_metrics() if hasattr(opt, "pop_metrics") else {}
    assert all(k.startswith("opt/") and math.isfinite(v) for k, v in metrics.items())
    if name in EXPECTED_METRICS:
        assert set(metrics) == EXPECTED_METRICS[name]


def _plain_sgd_buffers(batch):
    ref = small_cnn()
    torch.optim.SGD(ref.parameters(), lr=0.1).step(closure_for(ref, batch))
    return dict(ref.named_buffers())


@pytest.mark.parametrize("name", NAMES)
def test_batchnorm_statistics_equal_one_plain_sgd_step(name):
    # TSAM's default primary pass runs at θ+δ_1 (the released procedure), so its statistics are those
    # of one pass there; with primary_pass='center' they are exactly a plain step's.
    spec, batch = get_optimizer(name), image_batch()
    centered = {"primary_pass": "center"} if "primary_pass" in {h.name for h in spec.hparams} else {}
    ref_bufs = _plain_sgd_buffers(batch)
    if name not in NOISY_PRIMARY:
        model = small_cnn()
        _step(spec.create(model.named_parameters(), **centered), model, batch, 0)
        bufs = dict(model.named_buffers())
        assert set(bufs) == set(ref_bufs) and any("running_mean" in k for k in bufs)
        for key in bufs:
            assert torch.equal(bufs[key], ref_bufs[key]), key  # incl. num_batches_tracked == 1
    if centered or name in NOISY_PRIMARY:
        noisy = small_cnn()
        kw = {"noise_std": 0.05} if name in NOISY_PRIMARY else {}  # RSAM's default λ moves the statistics little
        _step(spec.create(noisy.named_parameters(), **kw), noisy, batch, 0)
        for key, value in noisy.named_buffers():
            if key.endswith("num_batches_tracked"):
                assert int(value) == 1, key  # still exactly one updating pass
            else:  # ... at θ+δ_1: close to the plain step's statistics, not equal
                assert not torch.equal(value, ref_bufs[key]) and torch.allclose(value, ref_bufs[key], atol=0.5), key


@pytest.mark.parametrize("name", NAMES)
def test_plain_parameters_give_the_named_step(name, monkeypatch):
    # One code path: names change nothing but ASAM's scope, which without them falls back to ndim >= 2
    # (on small_cnn that differs from the official rule at the BatchNorm gains) and warns.
    spec, batch = get_optimizer(name), image_batch()
    named_model, plain_model = small_cnn(), small_cnn()
    torch.manual_seed(5)
    _step(spec.create(named_model.named_parameters()), named_model, batch, 0)
    torch.manual_seed(5)
    plain_opt = spec.create(plain_model.parameters())
    assert all("param_names" not in g for g in plain_opt.param_groups)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import flatlab.optim.sam as sam_module

        monkeypatch.setattr(sam_module, "_warned_unnamed", False)
        _step(plain_opt, plain_model, batch, 0)
    messages = [str(w.message) for w in caught]
    same = all(torch.equal(a, b) for a, b in zip(params_of(named_model), params_of(plain_model)))
    if name == "asam":
        assert not same and len(messages) == 1 and "ndim >= 2 are scaled instead" in messages[0]
    else:
        assert same and messages == []


def _checkpoint_overrides(name: str) -> Dict[str, Any]:
    # Exercise the state that must survive a checkpoint: IRE resumes mid-interval with an EMA.
    if name.endswith("_ire"):
        return {"mask_interval": 2, "curvature_beta": 0.5}
    return {}


def _batches() -> List:
    return [image_batch(seed=10 + i) for i in range(6)]


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_round_trip_resumes_bit_identically(name):
    spec, kw, batches = get_optimizer(name), _checkpoint_overrides(name), _batches()
    torch.manual_seed(123)
    model = small_cnn(seed=0)
    opt = spec.create(model.named_parameters(), **kw)
    for i in range(3):
        _step(opt, model, batches[i], i)
    saved = roundtrip({"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state()})
    for i in range(3, 6):
        _step(opt, model, batches[i], i)
    expected = params_of(model)

    fresh = small_cnn(seed=99)  # different init: everything must come from the checkpoint
    fresh_opt = spec.create(fresh.named_parameters(), **kw)
    fresh.load_state_dict(saved["model"])
    fresh_opt.load_state_dict(saved["opt"])
    torch.set_rng_state(saved["rng"])
    for i in range(3, 6):
        _step(fresh_opt, fresh, batches[i], i)
    assert_bitwise(params_of(fresh), expected)
    assert fresh_opt.param_groups is getattr(fresh_opt, "base", fresh_opt).param_groups


def test_ire_switch_state_survives_a_checkpoint():
    spec, batches = get_optimizer("sgd_ire"), _batches()
    model = small_cnn()
    opt = spec.create(model.parameters(), switch_loss=0.5)
    opt.on_progress(Progress(step=0, epoch=1, total_steps=9, steps_per_epoch=3, last_epoch_train_loss=0.4))
    opt.step(closure_for(model, batches[0]))
    assert opt.active
    fresh_opt = spec.create(small_cnn().parameters(), switch_loss=0.5)
    fresh_opt.load_state_dict(roundtrip(opt.state_dict()))
    fresh_opt.on_progress(Progress(step=1, epoch=2, total_steps=9, steps_per_epoch=3, last_epoch_train_loss=0.9))
    assert fresh_opt.active  # latched before the checkpoint, still on after it


def _bad_values(h: HParam) -> List[Any]:
    if h.choices is not None:
        return ["not-a-choice"]
    if h.kind is bool:
        return ["yes"]
    out: List[Any] = []
    if h.low is not None:
        out.append(h.low if h.low_open else h.low - 1)
    if h.high is not None:
        out.append(h.high if h.high_open else h.high + 1)
    if h.kind is int:
        out.append(1.5)
    return out


CASES = [(n, h.name, v) for n in NAMES for h in get_optimizer(n).hparams for v in _bad_values(h)]


@pytest.mark.parametrize("name,field,value", CASES, ids=[f"{n}-{f}={v!r}" for n, f, v in CASES])
def test_bad_values_raise_config_error_naming_the_field(name, field, value):
    with pytest.raises(ConfigError, match=re.escape(f"optimizer {name!r}: {field}={value!r} is not allowed; expected")):
        get_optimizer(name).create(small_cnn().parameters(), **{field: value})


@pytest.mark.parametrize("name", NAMES)
def test_unknown_hparam_lists_the_accepted_ones(name):
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) bogus; accepted: .*lr"):
        get_optimizer(name).create(small_cnn().parameters(), bogus=1)
