"""IRE outside a trial flushes subnormal floats around its own step (flatlab.optim._subnormal) and gives the
caller's mode back; its result is the one a flushing caller (a trial) gets."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from _optim_testlib import assert_bitwise, params_of, twin
from torch import nn

import flatlab.optim.ire as ire_mod
from flatlab.optim import get_optimizer
from flatlab.optim._subnormal import flushed_subnormals, flushing_now, ieee_subnormals
from flatlab.train.closure import BatchClosure

SUBNORMAL = 1e-39  # float32: below 2^-126 ≈ 1.18e-38


@pytest.fixture
def caller_mode():
    """Sets the calling thread's mode for the test and puts the process's own back afterwards."""
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero mode")
    yield torch.set_flush_denormal
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("mode", [False, True])
def test_the_contexts_set_the_mode_and_give_the_callers_back_also_on_error(caller_mode, mode):
    caller_mode(mode)
    assert flushing_now() is mode
    with flushed_subnormals():
        assert flushing_now()
        with ieee_subnormals():
            assert not flushing_now()
            assert float(torch.tensor(SUBNORMAL) * 1.0) != 0.0
        assert flushing_now() and float(torch.tensor(SUBNORMAL) * 1.0) == 0.0
    assert flushing_now() is mode
    with pytest.raises(RuntimeError, match="inside"):
        with flushed_subnormals():
            raise RuntimeError("inside")
    assert flushing_now() is mode


def _model_and_batch():
    """A two-layer net whose second input feature is subnormal and whose weights on it start at 0: flushed,
    the feature reads as 0 and those weights get no gradient, so they stay 0; kept, they get a gradient of
    about 1e-40, which AdamW's normalised step turns into a move of about 1e-35."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():
        model[0].weight[:, 1] = 0.0
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 2, generator=g)
    x[:, 1] = SUBNORMAL
    return model, (x, torch.randint(0, 3, (16,), generator=g))


def _steps(opt, model, batch, n=3):
    torch.manual_seed(3)  # IRE samples labels from the model's softmax: the same draws in every run
    for _ in range(n):
        opt.step(BatchClosure(model, F.cross_entropy, *batch))


@pytest.mark.parametrize("mode", [False, True])
def test_admire_restores_the_callers_mode_and_steps_as_under_a_flushing_caller(caller_mode, mode, monkeypatch):
    model, batch = _model_and_batch()
    spec = get_optimizer("adamw_ire")
    flushing_model = twin(model, torch.optim.SGD(model.parameters(), lr=0.1))[0]
    kept_model = twin(model, torch.optim.SGD(model.parameters(), lr=0.1))[0]
    opt = spec.create(model.named_parameters(), kappa=1.0, mask_interval=2)
    caller_mode(mode)
    _steps(opt, model, batch)
    assert flushing_now() is mode  # the caller's mode is back

    reference = spec.create(flushing_model.named_parameters(), kappa=1.0, mask_interval=2)
    caller_mode(True)  # a trial's threads flush
    _steps(reference, flushing_model, batch)
    caller_mode(False)
    assert_bitwise(params_of(model), params_of(flushing_model))
    assert not model[0].weight[:, 1].any()

    # the case can fail: without the guard, AdmIRE under a caller that keeps subnormals moves the weights
    # on the subnormal feature
    monkeypatch.setattr(ire_mod, "flushed_subnormals", contextlib.nullcontext)
    unguarded = spec.create(kept_model.named_parameters(), kappa=1.0, mask_interval=2)
    _steps(unguarded, kept_model, batch)
    assert int(torch.count_nonzero(kept_model[0].weight[:, 1])) >= 4  # the units the ReLU lets through


def test_torchs_worker_threads_started_during_a_flushed_step_keep_ieee_subnormals(caller_mode):
    """A new thread takes its creator's mode: the first parallel op inside the block would start torch's pool
    flushing for good. In a fresh process (no pool yet), after one flushed block a parallel comparison over
    65,537 elements still sees a subnormal as non-zero."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "from flatlab.optim._subnormal import flushed_subnormals\n"
        "torch.set_num_threads(2)\n"
        "with flushed_subnormals():\n"
        "    torch.ones(1 << 17).sum()\n"
        "h = torch.zeros(65537); h[-1] = 1e-42\n"
        "print(int((h <= 0).sum()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "65536"
