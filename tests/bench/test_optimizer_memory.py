"""Peak extra memory of the optimizers, measured as the bench measures it (CPU peak RSS on its probe MLP).

The probe's two weights are 3072×3072 float32 (37.7 MB each, above glibc's largest mmap threshold), so
every parameter-sized tensor is its own mapping and the process's peak RSS counts the live ones.
"""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_PATH = Path(__file__).resolve().parents[2] / "bench" / "optimizer_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("optimizer_overhead_bench_mem", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not module._reset_peak_rss():
        pytest.skip("peak RSS cannot be reset here (needs Linux /proc/self/clear_refs)")
    return module


def _peak(bench, name, steps=2, **hparams):
    model, loss_fn, x, y = bench.probe_workload(torch.device("cpu"))
    case = bench.Case(name, name, tuple(hparams.items()))
    return bench.peak_extra_copies(case, model, loss_fn, x, y, torch.device("cpu"), warmup=1, steps=steps)


def test_sam_and_tsam_peak_extra_memory(bench):
    state, peak = _peak(bench, "sam")
    assert state == 1.0 and peak == pytest.approx(1.0, abs=0.15)  # θ only
    for s in (3, 8):
        # θ kept between steps; during the step the tilted-gradient accumulator (the first perturbed
        # gradient, taken over); the noise is drawn into the parameters, so no third copy
        state, peak = _peak(bench, "tsam", s=s)
        assert state == 1.0 and peak == pytest.approx(2.0, abs=0.15)


def test_ire_refresh_memory_is_the_sampled_gradient_plus_bounded_select(bench):
    # every step refreshes the mask; state: θ_old, the lerp weights and the bool mask (2.25 copies);
    # transient: the sampled-label gradient (1 copy), the new masks while the old ones are held (0.25)
    # and the radix select's pieces (bounded; ~0.1 copy here). Before the select ran in pieces, a
    # bucket holding most entries cost three more copies.
    state, peak = _peak(bench, "sgd_ire", mask_interval=1)
    assert state == 2.25
    assert 3.0 < peak < 4.2
