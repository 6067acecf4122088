"""Peak extra memory of the optimizers, measured by the bench itself (bench/optimizer_overhead.py
--memory-only: CPU peak RSS on its probe MLP with two 3072×3072 weights, glibc's mmap threshold fixed at
64 KiB so every tensor from that size up is its own mapping and the peak counts the live ones exactly).

Run in a subprocess: fixing the mmap threshold would slow every later allocation of this test session.
"""

import json
import subprocess
import sys

import pytest


def run_bench(optimizer_bench, out, *args):
    """The bench run in a subprocess with ``--threads 1 --json out`` and ``args``: its JSON report."""
    cmd = [sys.executable, optimizer_bench.__file__, *args, "--threads", "1", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    if "could not be fixed" in done.stdout:
        pytest.skip("glibc's mmap threshold cannot be fixed here (not glibc)")
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def memory(optimizer_bench, tmp_path_factory):
    if not optimizer_bench._reset_peak_rss():
        pytest.skip("peak RSS cannot be reset here (needs Linux /proc/self/clear_refs)")
    out = tmp_path_factory.mktemp("bench") / "memory.json"
    rows = run_bench(optimizer_bench, out, "--memory-only", "--only", "SAM / SGD,TSAM,SGD-IRE")["memory"]
    return {r["optimizer / base"]: (r["state copies"], r["peak extra copies"], r["result"]) for r in rows}


def test_sam_and_tsam_peak_extra_memory(memory):
    assert memory["SAM / SGD"][:2] == (1.0, pytest.approx(1.0, abs=0.05))  # θ only
    # ASAM also holds the adaptively scaled gradient while it perturbs: one transient copy
    assert memory["ASAM / SGD"][:2] == (1.0, pytest.approx(2.0, abs=0.05))
    for s in (3, 8):
        # θ kept between steps; during the step the tilted-gradient accumulator (the first perturbed
        # gradient, taken over); the noise is drawn into the parameters, so no third copy
        assert memory[f"TSAM s={s} / SGD"] == (1.0, pytest.approx(2.0, abs=0.05), "PASS")


def test_ire_refresh_memory_is_the_sampled_gradient_plus_bounded_select(memory):
    # state: θ_old, the lerp weights and the bool mask (2.25 copies); at the refresh the sampled-label
    # gradient (1 copy), one tensor's new mask while its old one is held (0.125 here) and the radix
    # select's bounded pieces (~0.15). Before the select ran in pieces, a bucket holding most entries
    # cost three more copies (8.0 in all).
    state, peak, _ = memory["SGD-IRE / SGD (K=10)"]
    assert state == 2.25
    assert 3.35 < peak < 3.7


def test_memory_after_timing_is_measured_in_a_fresh_process(optimizer_bench, memory, tmp_path):
    # A full run times first. Measured in that same process, SGD-IRE's peak read 3.50 instead of 3.53
    # (AdmIRE's, when it still kept θ_old, 2.38-2.50 instead of 2.25): the timing runs leave large free
    # chunks in glibc's heap, and malloc serves requests from them without mapping new pages, so the
    # peak RSS depended on what ran before. The bench now measures memory in a child process; its rows
    # must be a --memory-only run's.
    args = ("--models", "cnn", "--only", "SGD-IRE / SGD,AdmIRE", "--repeats", "1", "--warmup", "1")
    report = run_bench(optimizer_bench, tmp_path / "run.json", *args)
    assert [r["optimizer / base"] for r in report["time"]] == ["SGD-IRE / SGD (K=10)", "AdmIRE / AdamW (K=10)"]
    for timing in report["time"]:  # the unrounded figures behind the printed text, as numbers
        (block,) = timing["block ratios"]  # --repeats 1
        assert timing["ratio (wall)"] == round(block, 3)
        assert (timing["interval"], timing["interval coverage"], timing["target ratio"]) == ([block, block], 0.0, 1.1)
    rows = {r["optimizer / base"]: (r["model"], r["state copies"], r["peak extra copies"]) for r in report["memory"]}
    # the peak varies by about 0.01 copy (0.75 MB of 75) from run to run: 3.52 against 3.53 was seen
    sgd_ire, reference = rows["SGD-IRE / SGD (K=10)"], memory["SGD-IRE / SGD (K=10)"]
    assert sgd_ire[:2] == ("probe", reference[0]) and sgd_ire[2] == pytest.approx(reference[1], abs=0.02)
    # AdmIRE on the CPU: its step is amplified inside AdamW's update, so no θ_old; s = 1 + κ·n in the
    # parameters' dtype and the bool masks (1.25 copies). Its update holds one temporary of a tensor's size
    # where AdamW's holds two (its denominator's divisions in place; the probe's tensors are half a copy
    # each), so the peak is below state + AdamW's: 1.03 (1.25 while it allocated both, as torch does)
    assert rows["AdmIRE / AdamW (K=10)"][:2] == ("probe", 1.25)
    assert rows["AdmIRE / AdamW (K=10)"][2] == pytest.approx(1.03, abs=0.05)
