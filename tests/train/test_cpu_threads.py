"""A trial's CPU threads and subnormal floats (flatlab.train.cpu_threads; issue 26).

The mode is per thread and inherited by the threads a thread starts, so each case runs in a fresh
Python process (the test process's own threads must keep IEEE subnormals for every other test). The
probes build subnormals from bit patterns and read results as integers: a float fill or comparison would
itself be flushed on a thread that flushes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from flatlab.train.cpu_threads import MODES, denormal_mode

PLATFORM = str(Path(__file__).resolve().parents[2] / "platform")

# A case: configure the threads, then report the mode and what a backward pass of a linear layer (weight
# gradient x^T·δ, δ = 2^-140 everywhere, as a saturated logit gradient) and an elementwise op write.
_CASE = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, {platform!r})
    import torch
    from flatlab.train.cpu_threads import configure, denormal_mode

    def subnormal_bits(t):  # entries whose exponent bits are 0 and mantissa is not: subnormal, read as integers
        b = t.contiguous().view(torch.int32)
        return int(((b & 0x7F800000) == 0).logical_and_((b & 0x7FFFFF) != 0).sum())

    def backward_pass():
        x = torch.ones(64, 3072)
        delta = torch.full((64, 512), 512, dtype=torch.int32).view(torch.float32)  # 2^-140
        return {{"weight_grad": subnormal_bits(x.t() @ delta), "halves": subnormal_bits(delta * 0.5)}}

    out = {{}}
    for step in {steps!r}:
        if step[0] == "compute":  # the thread pool starts here, under whatever mode is set
            torch.set_num_threads(step[1])
            backward_pass()
        else:
            out.setdefault("modes", []).append(configure(step[1], flush_denormal=step[0] == "flush"))
    out.update(backward_pass())
    out["total"] = {{"weight_grad": 3072 * 512, "halves": 64 * 512}}
    print(json.dumps(out))
    """
)


def _run(*steps) -> dict:
    code = _CASE.format(platform=PLATFORM, steps=list(steps))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _flush_supported() -> bool:
    # asks in a child process: setting the mode here would change this process's arithmetic
    code = "import torch, sys; sys.exit(0 if torch.set_flush_denormal(True) else 1)"
    return subprocess.run([sys.executable, "-c", code]).returncode == 0


needs_flush = pytest.mark.skipif(
    not _flush_supported(), reason="this CPU has no flush-to-zero mode (torch.set_flush_denormal)"
)


@needs_flush
def test_a_trial_set_up_before_computing_flushes_on_every_thread():
    out = _run(("flush", 2))
    assert out["modes"] == ["flush"]
    # both threads of the product flush: no subnormal left in the weight gradient nor the elementwise result
    assert out["weight_grad"] == 0 and out["halves"] == 0


def test_keeping_subnormals_keeps_them_on_every_thread():
    out = _run(("keep", 2))
    assert out["modes"] == ["keep"]
    assert out["weight_grad"] == out["total"]["weight_grad"] and out["halves"] == out["total"]["halves"]


@needs_flush
def test_a_pool_started_under_the_other_mode_is_reported_as_partial():
    # the threads started while subnormals were kept go on keeping them: the mode holds on the calling
    # thread only, and the probe sees it
    late = _run(("compute", 2), ("flush", 2))
    assert late["modes"] == ["partial"]
    assert 0 < late["weight_grad"] < late["total"]["weight_grad"]
    # and the other way round: threads started under flush go on flushing after keep is asked for
    back = _run(("flush", 2), ("keep", 2))
    assert back["modes"] == ["flush", "partial"]


def test_this_test_process_keeps_ieee_subnormals():
    # every other test computes with IEEE subnormals: nothing here may leave the flush mode set
    assert denormal_mode() == "keep" and "keep" in MODES
    assert torch.tensor([2.0**-140]).mul(0.5).item() == 2.0**-141
